"""Subprocess suites: the mesh and multi-process cases, and the notebook.

The mesh and multi-process cases need processes of their own (the CPU device count is
fixed when a backend starts); the notebook runs in a kernel of its own. They take
minutes, mostly compiling on one core. The suite runs its in-process tests on pytest-xdist
workers (`-n auto`, by file), so these jobs are shared by every test process of a run:
the first process to claim a job (a folder in the run's folder) starts it, its output goes
to files there, and `done.json` marks its end for whichever process reads the results.

The multi-process and notebook jobs start as soon as collection has picked their test
modules, and run while the in-process tests do. The mesh job starts when its fixture asks,
once the others have finished, and runs alone: three times in full-suite runs on 2 cores,
three of its four fake devices' threads waited at an XLA:CPU all-reduce for a fourth that
never came (the same op each time; synchronous dispatch did not help), never when it ran
alone. Nor does giving it the CPU first: beside test processes at nice 19 it hung within
minutes (traced in docs/design.md, section 11). To run it alone, its claimant posts a
request and waits for the other test processes to leave their current test; each of them
checks for a request before every test and waits for the job's end. The job also runs
once more if XLA:CPU aborts it at a collective rendezvous. Output goes to files, not
pipes, so a chatty child never blocks on a full pipe. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RUN_DIR = "DSD_JAX_TESTS_RUN_DIR"  # environment: the run's folder, shared by its workers
JOB_TIMEOUT_S = 900.0  # one launch of a job
WAIT_S = 2 * JOB_TIMEOUT_S + 300.0  # for a job's results (it may run twice) or a pause


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
EAGER = ("test_multihost.py", "test_notebook.py")  # started at collection, beside the in-process tests
ALONE = "test_mesh.py"
RENDEZVOUS_ABORT = "Termination timeout for `all reduce"  # XLA:CPU gave up on a collective


# -- the run's folder -------------------------------------------------------------------

def create_run_dir() -> None:
    """Called once per run, by the process that starts it (xdist's controller, or the only
    process): workers inherit the folder through the environment."""
    os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="dsd_jax_tests_")


def remove_run_dir() -> None:
    folder = os.environ.pop(RUN_DIR, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def _path(*parts: str) -> str:
    return os.path.join(os.environ[RUN_DIR], *parts)


def _me() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _busy_mark() -> str:
    return _path(f"busy.{_me()}")


def _wait_for(ready, what: str, timeout: float = WAIT_S) -> None:
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.2)


def _write_json(path: str, value) -> None:
    tmp = f"{path}.{_me()}.tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)  # readers never see half a file


# -- jobs -------------------------------------------------------------------------------

class Job:
    """Processes started together; `finish()` waits for them (bounded), once more if
    XLA:CPU aborted a retried job at a collective rendezvous, and writes `done.json`
    (each process's exit status) beside their output."""

    def __init__(self, name: str, retry_rendezvous_abort: bool = False):
        self.name, self._retry = name, retry_rendezvous_abort
        self._argvs = JOBS[name]()
        self._launch()

    def _launch(self) -> None:
        def log(i, stream):
            return open(_path(self.name, f"{i}.{stream}"), "w+")
        self._logs = [(log(i, "out"), log(i, "err")) for i in range(len(self._argvs))]
        self.procs = [subprocess.Popen(argv, env=_child_env(), stdout=out, stderr=err, text=True)
                      for argv, (out, err) in zip(self._argvs, self._logs)]

    def _wait(self) -> None:
        try:
            for p in self.procs:
                p.wait(timeout=JOB_TIMEOUT_S)  # bounded: a hung collective fails the test
        except subprocess.TimeoutExpired:
            pass
        finally:
            self.kill()

    def _aborted_at_rendezvous(self) -> bool:
        for p, (_, err) in zip(self.procs, self._logs):
            err.seek(0)
            if p.returncode != 0 and RENDEZVOUS_ABORT in err.read():
                return True
        return False

    def finish(self) -> None:
        try:
            self._wait()
            if self._retry and self._aborted_at_rendezvous():
                print(f"{self.name}: XLA:CPU aborted at a collective rendezvous; running it again",
                      file=sys.stderr)
                self._launch()
                self._wait()
        finally:  # even if a relaunch failed: readers get an exit status now, not a timeout
            for out, err in self._logs:
                out.close()
                err.close()
            _write_json(_path(self.name, "done.json"),
                        {"returncodes": [p.returncode for p in self.procs], "argvs": self._argvs})

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


_mine: dict[str, Job] = {}  # the jobs this process claimed
_finishers: list[threading.Thread] = []


def _claim(name: str) -> bool:
    """True for the one process of the run that gets to start this job."""
    try:
        os.mkdir(_path(name))
        return True
    except FileExistsError:
        return False


def _done(name: str) -> bool:
    return os.path.exists(_path(name, "done.json"))


def start(test_files) -> None:
    """Starts the eager jobs of these test modules, unless another process of the run has;
    a thread of this process waits for them."""
    for name in EAGER:
        if name in test_files and _claim(name):
            job = _mine[name] = Job(name)
            _finishers.append(threading.Thread(target=job.finish, daemon=True))
            _finishers[-1].start()


def _run_alone(name: str) -> None:
    with idle():
        _wait_for(lambda: all(_done(e) for e in EAGER if os.path.isdir(_path(e))), "the eager jobs")
        open(_path("alone.request"), "w").close()
        _wait_for(lambda: not [f for f in os.listdir(_path()) if f.startswith("busy.")],
                  "the other test processes to leave their tests", timeout=JOB_TIMEOUT_S)
    job = _mine[name] = Job(name, retry_rendezvous_abort=True)
    job.finish()


def results(test_file: str) -> list[dict]:
    """The job's results (one dict per process, from its `RESULTS {json}` line), starting
    it now if no process of the run has."""
    if _claim(test_file):
        if test_file == ALONE:
            _run_alone(test_file)
        else:
            _mine[test_file] = Job(test_file)
            _mine[test_file].finish()
    with idle():
        _wait_for(lambda: _done(test_file), f"{test_file}'s job")
    with open(_path(test_file, "done.json")) as f:
        done = json.load(f)
    return [_parse(_path(test_file, str(i)), argv, rc)
            for i, (argv, rc) in enumerate(zip(done["argvs"], done["returncodes"]))]


def _parse(prefix: str, argv: list[str], returncode: int) -> dict:
    with open(f"{prefix}.out") as out, open(f"{prefix}.err") as err:
        stdout, stderr = out.read(), err.read()
    assert returncode == 0, f"{argv[1]} exited {returncode}:\n{stderr[-4000:]}"
    line = [ln for ln in stdout.splitlines() if ln.startswith("RESULTS ")][-1]
    return json.loads(line[len("RESULTS "):])


# -- taking turns with a job that runs alone ------------------------------------------------

@contextlib.contextmanager
def busy():
    """Around each test: marks this process busy, after waiting out a job that runs alone."""
    mark = _busy_mark()
    while True:
        open(mark, "w").close()  # marked first, then checked: the claimant checks the other way
        if not os.path.exists(_path("alone.request")) or _done(ALONE):
            break
        os.remove(mark)
        _wait_for(lambda: _done(ALONE), f"{ALONE}'s job, which runs alone")
    try:
        yield
    finally:
        os.remove(mark)


@contextlib.contextmanager
def idle():
    """Waiting for a job is not work: a job that runs alone need not wait for this process."""
    mark = _busy_mark()
    was_busy = os.path.exists(mark)
    if was_busy:
        os.remove(mark)
    try:
        yield
    finally:
        if was_busy:
            open(mark, "w").close()


def stop_all(wait: bool = True) -> None:
    """At the end of this process's session: its eager jobs may still serve another
    process's tests, so they are waited for (bounded; not after an interrupt), then
    anything left is killed."""
    for t in _finishers if wait else ():
        t.join(timeout=WAIT_S)
    for job in _mine.values():
        job.kill()
