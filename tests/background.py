"""Subprocess suites that overlap the rest of the test session.

The mesh and multi-process cases need processes of their own (the CPU device count is
fixed when a backend starts). They take minutes, mostly compiling on one core, so
`conftest.py` starts them as soon as collection has picked their test module, and
their fixtures wait for the results: they run while the in-process tests do.
Output goes to files, not pipes, so a chatty child never blocks on a full pipe.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _child_env() -> dict:
    # the children choose their own device counts and compile options
    return {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")}


def _mesh_argvs() -> list[list[str]]:
    return [[sys.executable, os.path.join(HERE, "mesh_cases.py")]]


def _multihost_argvs() -> list[list[str]]:
    port = str(_free_port())
    return [[sys.executable, os.path.join(HERE, "multihost_cases.py"), port, str(i)] for i in range(2)]


JOBS = {"test_mesh.py": _mesh_argvs, "test_multihost.py": _multihost_argvs}


class Job:
    """Processes started together; `results()` waits (bounded) and parses their
    `RESULTS {json}` lines, one per process."""

    def __init__(self, argvs: list[list[str]]):
        self._logs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in argvs]
        self.procs = [subprocess.Popen(argv, env=_child_env(), stdout=out, stderr=err, text=True)
                      for argv, (out, err) in zip(argvs, self._logs)]
        self._results = None

    def results(self, timeout: float = 900.0) -> list[dict]:
        if self._results is None:
            try:
                for p in self.procs:
                    p.wait(timeout=timeout)  # bounded: a hung collective fails the test
            finally:
                self.kill()
            self._results = [self._parse(p, out, err) for p, (out, err) in zip(self.procs, self._logs)]
        return self._results

    @staticmethod
    def _parse(proc, out, err) -> dict:
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        assert proc.returncode == 0, f"{proc.args[1]} exited {proc.returncode}:\n{stderr[-4000:]}"
        line = [ln for ln in stdout.splitlines() if ln.startswith("RESULTS ")][-1]
        return json.loads(line[len("RESULTS "):])

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


_started: dict[str, Job] = {}


def start(test_files) -> None:
    """Starts the jobs of these collected test modules (once)."""
    for name in set(test_files) & set(JOBS):
        if name not in _started:
            _started[name] = Job(JOBS[name]())


def results(test_file: str) -> list[dict]:
    """The job's results, starting it now if collection did not (e.g. a single test id)."""
    start([test_file])
    return _started[test_file].results()


def stop_all() -> None:
    for job in _started.values():
        job.kill()
