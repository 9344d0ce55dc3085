"""Subprocess suites: the mesh and multi-process cases, and the notebook.

The mesh and multi-process cases need processes of their own (the CPU device count is
fixed when a backend starts); the notebook runs in a kernel of its own. They take
minutes, mostly compiling on one core. The suite runs its in-process tests on pytest-xdist
workers (`-n auto`, by file), so these jobs are shared by every test process of a run:
the first process to claim a job (a folder in the run's folder) starts it, its output goes
to files there, and `done.json` marks its end for whichever process reads the results.

All three start when collection ends, in a thread of the claiming process, and run while
the in-process tests do. The mesh job first waits for the other two to finish, and then
runs with the CPU to itself whenever it wants it: while it runs, the test processes run at
the lowest priority (nice 19; on Linux nice is per thread, and every thread but the job's
launcher is lowered), so a fake device's thread that wakes takes a core from them at once,
and they use what the job leaves idle (it keeps about one core of two busy). It starts
once every test process has left the test it was in at normal priority.

It runs beside them because its engines wait for every program's outputs on an XLA:CPU
mesh (`programs._Waited`). Unwaited, collective programs dispatched one after another left
three of the four fake devices' threads at an all-reduce for a fourth that never came:
three times in full-suite runs, twice in two tries beside nice-19 test processes, and in
plain JAX with nothing else running (docs/design.md, section 11); waiting, the job ran
beside two test files twice without it. Where a process cannot lower its threads'
priority, and while the job runs a second time (XLA:CPU aborted it at a collective
rendezvous), the test processes wait for its end instead. Output goes to files, not
pipes, so a chatty child never blocks on a full pipe. Every wait is bounded. The run's
terminal summary says when each launch of each job started and how long it ran (`summary`).
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
MESH_JOB = "test_mesh.py"  # started once the eager jobs end, the test processes lowered beneath it
NICE = 19  # the test processes' priority while the mesh job runs
RENDEZVOUS_ABORT = "Termination timeout for `all reduce"  # XLA:CPU gave up on a collective


# -- the run's folder -------------------------------------------------------------------

def create_run_dir() -> None:
    """Called once per run, by the process that starts it (xdist's controller, or the only
    process): workers inherit the folder through the environment."""
    os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="dsd_jax_tests_")
    _write_json(run_path("started.json"), time.time())  # the jobs' times are told from here


def remove_run_dir() -> None:
    folder = os.environ.pop(RUN_DIR, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def run_path(*parts: str) -> str:
    """A path in the run's folder, shared by every process of the run."""
    return os.path.join(os.environ[RUN_DIR], *parts)


def _me() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _mark() -> str:
    """This process's mark while in a test: `low.` once it has lowered its priority."""
    return run_path(("low." if _lowered_from else "busy.") + _me())


def _wait_for(ready, what: str, timeout: float | None = None) -> None:
    timeout = WAIT_S if timeout is None else timeout
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
    (each launch's times and its processes' exit statuses, the last launch's the job's)
    beside their output. A first launch's output is kept beside the second's (`{i}.err.1`)."""

    def __init__(self, name: str, retry_rendezvous_abort: bool = False, before_retry=None):
        self.name, self._retry, self._before_retry = name, retry_rendezvous_abort, before_retry
        self._argvs = JOBS[name]()
        self._launches: list[dict] = []
        self._launch()

    def _launch(self) -> None:
        def log(i, stream):
            path = run_path(self.name, f"{i}.{stream}")
            if os.path.exists(path):
                os.replace(path, f"{path}.{len(self._launches)}")
            return open(path, "w+")
        self._logs = [(log(i, "out"), log(i, "err")) for i in range(len(self._argvs))]
        self._launches.append({"started": time.time()})
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
            self._launches[-1].update(ended=time.time(), returncodes=[p.returncode for p in self.procs])

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
                self._launches[-1]["aborted_at_rendezvous"] = True
                if self._before_retry:
                    self._before_retry()
                self._launch()
                self._wait()
        finally:  # even if a relaunch failed: readers get an exit status now, not a timeout
            for out, err in self._logs:
                out.close()
                err.close()
            _write_json(run_path(self.name, "done.json"),
                        {"argvs": self._argvs, "launches": self._launches})

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
        os.mkdir(run_path(name))
        return True
    except FileExistsError:
        return False


def _done(name: str) -> bool:
    return os.path.exists(run_path(name, "done.json"))


def start(test_files) -> None:
    """Starts the jobs of these test modules, unless another process of the run has; a
    thread of this process waits for each (the mesh job's first waits for the others)."""
    for name in EAGER + (MESH_JOB,):  # the eager ones first: the mesh job waits for those claimed
        if name in test_files and _claim(name):
            if name == MESH_JOB:
                thread = threading.Thread(target=_run_first, args=(name,), daemon=True)
            else:
                job = _mine[name] = Job(name)
                thread = threading.Thread(target=job.finish, daemon=True)
            _finishers.append(thread)
            thread.start()


def _run_first(name: str) -> None:
    """The mesh job, once the eager jobs have ended and no test process is in a test at
    normal priority (their next tests run lowered, or wait where they cannot be)."""
    _launchers.add(threading.get_native_id())  # its children take this thread's priority
    _wait_for(lambda: all(_done(e) for e in EAGER if os.path.isdir(run_path(e))), "the eager jobs")
    _request("first", marks=("busy.",))
    job = _mine[name] = Job(name, retry_rendezvous_abort=True,
                            before_retry=lambda: _request("alone", marks=("busy.", "low.")))
    job.finish()


def _request(kind: str, marks) -> None:
    """Posts `kind.request` and waits for the test processes to leave the tests they were in
    under these marks."""
    open(run_path(f"{kind}.request"), "w").close()
    _wait_for(lambda: not [f for f in os.listdir(run_path()) if f.startswith(marks)],
              "the other test processes to leave their tests", timeout=JOB_TIMEOUT_S)


def results(test_file: str) -> list[dict]:
    """The job's results (one dict per process, from its `RESULTS {json}` line), starting
    it now if no process of the run has."""
    if _claim(test_file):
        if test_file == MESH_JOB:
            with idle():
                _run_first(test_file)
        else:
            _mine[test_file] = Job(test_file)
            _mine[test_file].finish()
    with idle():
        _wait_for(lambda: _done(test_file), f"{test_file}'s job")
    with open(run_path(test_file, "done.json")) as f:
        done = json.load(f)
    return [_parse(run_path(test_file, str(i)), argv, rc)
            for i, (argv, rc) in enumerate(zip(done["argvs"], done["launches"][-1]["returncodes"]))]


def summary() -> list[str]:
    """A line per job of this run: when each launch started and how long it ran (seconds
    from the run's start), and why a job ran twice; for the run's end, whose folder goes."""
    with open(run_path("started.json")) as f:
        t0 = json.load(f)
    lines = []
    for name in EAGER + (MESH_JOB,):
        if not _done(name):
            continue
        with open(run_path(name, "done.json")) as f:
            launches = json.load(f)["launches"]
        runs = [f"started at {run['started'] - t0:.0f} s, ran {run['ended'] - run['started']:.0f} s, "
                f"exit {run['returncodes']}"
                + (" (XLA:CPU aborted it at a collective rendezvous)" if run.get("aborted_at_rendezvous") else "")
                for run in launches]
        lines.append(f"{name}: " + "; then ".join(runs))
    return lines


def _parse(prefix: str, argv: list[str], returncode: int) -> dict:
    with open(f"{prefix}.out") as out, open(f"{prefix}.err") as err:
        stdout, stderr = out.read(), err.read()
    assert returncode == 0, f"{argv[1]} exited {returncode}:\n{stderr[-4000:]}"
    line = [ln for ln in stdout.splitlines() if ln.startswith("RESULTS ")][-1]
    return json.loads(line[len("RESULTS "):])


# -- making way for the mesh job ------------------------------------------------------------

_launchers: set[int] = set()  # native ids of this process's threads that start the mesh job
_lowered_from: list[int] = []  # this process's priority before it lowered its threads


def _threads() -> list[int] | None:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # not Linux: nice is the whole process's, the job's launcher included
        return None


def _lower_priority() -> bool:
    """Every thread of this process but the mesh job's launcher to nice `NICE` (threads made
    later take their maker's); False where that cannot be done."""
    if _lowered_from:
        return True
    threads = _threads()
    if threads is None:
        return False
    try:
        before = os.getpriority(os.PRIO_PROCESS, 0)
        for tid in threads:
            if tid not in _launchers:
                os.setpriority(os.PRIO_PROCESS, tid, max(before, NICE))
    except OSError:
        return False
    _lowered_from.append(before)
    return True


def _restore_priority() -> None:
    """Back to the priority before, where the system lets a process raise its own."""
    try:
        for tid in _threads() or ():
            os.setpriority(os.PRIO_PROCESS, tid, _lowered_from[0])
    except OSError:
        return  # stays low: nothing runs beside the tests any more
    _lowered_from.clear()


def _requested(kind: str) -> bool:
    return os.path.exists(run_path(f"{kind}.request")) and not _done(MESH_JOB)


@contextlib.contextmanager
def busy():
    """Around each test: marks this process in a test. While the mesh job runs the test
    runs at the lowest priority (marked `low.`), or, where this process cannot lower its
    priority and while the job runs a second time, waits for the job's end."""
    while True:
        mark = _mark()
        open(mark, "w").close()  # marked first, then checked: the job's launcher checks the other way
        if not _requested("first"):
            break
        if not _requested("alone") and _lower_priority():
            if mark.startswith(run_path("low.")):
                break
            os.remove(mark)  # and marked again, as low
            continue
        os.remove(mark)
        _wait_for(lambda: _done(MESH_JOB), f"{MESH_JOB}'s job, which runs alone")
    try:
        yield
    finally:
        os.remove(mark)
        if _lowered_from and _done(MESH_JOB):
            _restore_priority()


@contextlib.contextmanager
def idle():
    """Waiting for a job is not work: the mesh job need not wait for this process."""
    mark = _mark()
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
