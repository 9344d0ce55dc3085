"""The subprocess jobs' turn-taking (`background.py`), on a folder of its own: the mesh job
waits for the other test processes to leave the tests they are in at normal priority, and
their next ones run lowered beneath it, or wait for its end where they cannot be lowered
and while it runs a second time."""

import os
import subprocess
import sys
import threading
import time

import pytest

import background


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(background.RUN_DIR, str(tmp_path))  # not the real run's: nothing pauses
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    monkeypatch.setattr(background, "_lowered_from", [])  # nor is this process lowered
    monkeypatch.setattr(background, "WAIT_S", 20.0)  # a wrong wait fails, not hangs
    return tmp_path


@pytest.fixture
def lowering(monkeypatch):
    """Lowering this process's priority, faked: (calls, restores)."""
    calls = []

    def lower():
        if not background._lowered_from:
            calls.append("lower")
            background._lowered_from.append(0)
        return True
    monkeypatch.setattr(background, "_lower_priority", lower)
    monkeypatch.setattr(background, "_restore_priority", lambda: (calls.append("restore"),
                                                                  background._lowered_from.clear()))
    return calls


def _finish(path, after_s):
    def later():
        time.sleep(after_s)
        os.makedirs(path, exist_ok=True)
        background._write_json(os.path.join(path, "done.json"), {"argvs": [], "launches": []})
    threading.Thread(target=later, daemon=True).start()


def test_a_job_is_claimed_once(run_dir):
    assert background._claim("test_x.py") and not background._claim("test_x.py")


def test_a_test_runs_lowered_while_the_mesh_job_runs_and_restored_after(run_dir, lowering):
    with background.busy():  # nothing requested: normal priority
        assert (run_dir / "busy.gw7").exists() and lowering == []
    (run_dir / "first.request").touch()
    start = time.monotonic()
    with background.busy():
        assert (run_dir / "low.gw7").exists() and not (run_dir / "busy.gw7").exists()
        assert lowering == ["lower"] and time.monotonic() - start < 0.5  # no wait
    _finish(run_dir / background.MESH_JOB, after_s=0.0)
    time.sleep(0.2)
    with background.busy():  # lowered still; restored once this test is over
        assert (run_dir / "low.gw7").exists()
    assert lowering == ["lower", "restore"]
    with background.busy():
        assert (run_dir / "busy.gw7").exists()


@pytest.mark.parametrize("why", ["cannot_lower", "second_run"])
def test_a_test_waits_out_the_mesh_job_where_it_cannot_run_lowered(run_dir, lowering, monkeypatch, why):
    (run_dir / "first.request").touch()
    if why == "cannot_lower":
        monkeypatch.setattr(background, "_lower_priority", lambda: False)
    else:
        (run_dir / "alone.request").touch()
    _finish(run_dir / background.MESH_JOB, after_s=1.0)
    start = time.monotonic()
    with background.busy():
        waited = time.monotonic() - start
    assert waited >= 0.9 and not os.path.exists(run_dir / "busy.gw7")
    with background.busy():  # the job has ended: no wait
        pass


def test_lowering_leaves_the_launchers_thread_and_its_children_at_normal_priority(tmp_path):
    """On Linux, for real, in a process of its own: every thread but the launcher goes to
    nice 19, a thread made later by a lowered one starts there, and the launcher's child
    process runs at the priority it had."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("per-thread priorities are Linux's")
    script = f"""
import os, subprocess, sys, threading
sys.path.insert(0, {os.path.dirname(background.__file__)!r})
import background
os.environ[background.RUN_DIR] = {str(tmp_path)!r}
started, go, out = threading.Event(), threading.Event(), {{}}
def launcher():
    background._launchers.add(threading.get_native_id())
    started.set(); go.wait()
    out["child"] = subprocess.run([sys.executable, "-c", "import os; print(os.nice(0))"],
                                  capture_output=True, text=True).stdout.strip()
def made_later():
    out["later"] = os.getpriority(os.PRIO_PROCESS, 0)
t = threading.Thread(target=launcher); t.start(); started.wait()
open(os.path.join({str(tmp_path)!r}, "first.request"), "w").close()
with background.busy():
    out["main"] = os.getpriority(os.PRIO_PROCESS, 0)
    u = threading.Thread(target=made_later); u.start(); u.join()
go.set(); t.join()
print(out["main"], out["later"], out["child"])
"""
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    main, later, child = map(int, got.stdout.split())
    assert (main, later) == (19, 19) and child == os.getpriority(os.PRIO_PROCESS, 0)


def test_waiting_for_a_job_is_not_work(run_dir):
    with background.busy():
        with background.idle():
            assert not (run_dir / "busy.gw7").exists()
        assert (run_dir / "busy.gw7").exists()


def test_the_mesh_job_waits_for_the_tests_at_normal_priority_and_its_rerun_for_all(run_dir, monkeypatch):
    launched = []
    monkeypatch.setattr(background, "_mine", {})  # the fake job is not this session's to stop
    monkeypatch.setattr(background, "_launchers", set())
    monkeypatch.setattr(background, "Job", lambda name, retry_rendezvous_abort, before_retry: launched.append(
        (time.monotonic(), name, retry_rendezvous_abort, before_retry)) or _NoProcesses())
    (run_dir / "busy.gw3").touch()  # another worker is in a test at normal priority
    (run_dir / "low.gw4").touch()  # and another, lowered
    (run_dir / "test_notebook.py").mkdir()  # an eager job that is still running
    _finish(run_dir / "test_notebook.py", after_s=0.5)

    def leave(mark, after_s):
        threading.Thread(target=lambda: (time.sleep(after_s), os.remove(run_dir / mark)), daemon=True).start()
    leave("busy.gw3", 1.0)
    start = time.monotonic()
    background._run_first(background.MESH_JOB)
    (at, name, retried, before_retry), = launched
    assert name == background.MESH_JOB and retried and 0.9 <= at - start < 5  # not for low.gw4
    assert (run_dir / "first.request").exists() and not (run_dir / "alone.request").exists()
    assert threading.get_native_id() in background._launchers
    leave("low.gw4", 1.0)
    start = time.monotonic()
    before_retry()  # a second run waits for every test process
    assert (run_dir / "alone.request").exists() and time.monotonic() - start >= 0.9


class _NoProcesses:
    def finish(self):
        pass


def test_a_job_aborted_at_a_rendezvous_runs_again_and_the_run_keeps_both_launches(run_dir, monkeypatch):
    """A real child that XLA:CPU 'aborts' at a rendezvous on its first launch: the job runs
    again, its results are the second launch's, the first launch's stderr is kept, and the
    run's summary says when each ran and why there were two."""
    background._write_json(str(run_dir / "started.json"), time.time())
    script = run_dir / "child.py"
    script.write_text(f"""import os, sys
first = not os.path.exists({str(run_dir / 'ran')!r})
open({str(run_dir / 'ran')!r}, "w").close()
if first:
    print({background.RENDEZVOUS_ABORT!r} + " 0", file=sys.stderr)
    sys.exit(1)
print('RESULTS {{"ok": true}}')
""")
    monkeypatch.setitem(background.JOBS, "test_fake.py", lambda: [[sys.executable, str(script)]])
    monkeypatch.setattr(background, "EAGER", background.EAGER + ("test_fake.py",))
    before = []
    assert background._claim("test_fake.py")
    background.Job("test_fake.py", retry_rendezvous_abort=True, before_retry=lambda: before.append(1)).finish()
    assert before == [1] and background.results("test_fake.py") == [{"ok": True}]
    assert background.RENDEZVOUS_ABORT in (run_dir / "test_fake.py" / "0.err.1").read_text()
    line, = [ln for ln in background.summary() if ln.startswith("test_fake.py")]
    assert line.count("started at") == 2 and "exit [1] (XLA:CPU aborted it" in line and "exit [0]" in line
