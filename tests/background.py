"""Subprocess suites: the mesh and multi-process cases, and the notebook.

The mesh and multi-process cases need processes of their own (the CPU device count is
fixed when a backend starts); the notebook runs in a kernel of its own. They take
minutes, mostly compiling on one core, while the in-process tests leave the second core
mostly idle. The multi-process and notebook jobs start as soon as collection has picked
their test modules, and run while the in-process tests do. The mesh job starts when its
fixture asks, once the others have finished: three times in
full-suite runs on 2 cores, three of its four fake devices' threads waited at an XLA:CPU
all-reduce for a fourth that never came (the same op each time; synchronous dispatch
did not help), never when it ran alone. It runs alone now, and once more if XLA:CPU
aborts it at a collective rendezvous. Output goes to files, not pipes, so a chatty child
never blocks on a full pipe.
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


def _notebook_argvs() -> list[list[str]]:
    return [[sys.executable, os.path.join(HERE, "notebook_run.py")]]


JOBS = {"test_mesh.py": _mesh_argvs, "test_multihost.py": _multihost_argvs,
        "test_notebook.py": _notebook_argvs}
EAGER = {"test_multihost.py", "test_notebook.py"}  # started at collection, beside the in-process tests
RENDEZVOUS_ABORT = "Termination timeout for `all reduce"  # XLA:CPU gave up on a collective


class Job:
    """Processes started together; `results()` waits (bounded) and parses their
    `RESULTS {json}` lines, one per process."""

    def __init__(self, argvs: list[list[str]], retry_rendezvous_abort: bool = False):
        self._argvs, self._retry = argvs, retry_rendezvous_abort
        self._results, self._done = None, False
        self._launch()

    def _launch(self) -> None:
        self._logs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in self._argvs]
        self.procs = [subprocess.Popen(argv, env=_child_env(), stdout=out, stderr=err, text=True)
                      for argv, (out, err) in zip(self._argvs, self._logs)]

    def _wait(self, timeout: float) -> None:
        try:
            for p in self.procs:
                p.wait(timeout=timeout)  # bounded: a hung collective fails the test
        finally:
            self.kill()

    def _aborted_at_rendezvous(self) -> bool:
        for p, (_, err) in zip(self.procs, self._logs):
            err.seek(0)
            if p.returncode != 0 and RENDEZVOUS_ABORT in err.read():
                return True
        return False

    def finish(self, timeout: float = 900.0) -> None:
        """Waits for the processes (bounded), running them once more if XLA:CPU aborted a
        retried job at a collective rendezvous."""
        if self._done:
            return
        self._wait(timeout)
        if self._retry and self._aborted_at_rendezvous():
            print(f"{self._argvs[0][1]}: XLA:CPU aborted at a collective rendezvous; running it again",
                  file=sys.stderr)
            self._launch()
            self._wait(timeout)
        self._done = True

    def results(self, timeout: float = 900.0) -> list[dict]:
        if self._results is None:
            self.finish(timeout)
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


def start(test_files, eager_only: bool = True) -> None:
    """Starts the jobs of these test modules (once): only the eager ones at collection."""
    for name in sorted(set(test_files) & set(JOBS)):
        if name not in _started and (name in EAGER or not eager_only):
            if name not in EAGER:  # runs alone: the eager jobs finish first
                for job in list(_started.values()):
                    try:
                        job.finish()
                    except subprocess.TimeoutExpired:
                        pass  # killed; its own tests report it
            _started[name] = Job(JOBS[name](), retry_rendezvous_abort=name not in EAGER)


def results(test_file: str) -> list[dict]:
    """The job's results, starting it now if collection did not."""
    start([test_file], eager_only=False)
    return _started[test_file].results()


def stop_all() -> None:
    for job in _started.values():
        job.kill()
