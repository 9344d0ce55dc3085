"""The subprocess jobs' turn-taking (`background.py`), on a folder of its own: a job that
runs alone waits for the other test processes to leave their tests, and they wait for
its end before their next one."""

import os
import threading
import time

import pytest

import background


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(background.RUN_DIR, str(tmp_path))  # not the real run's: nothing pauses
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw7")
    return tmp_path


def _finish(path, after_s):
    def later():
        time.sleep(after_s)
        os.makedirs(path, exist_ok=True)
        background._write_json(os.path.join(path, "done.json"), {"returncodes": [], "argvs": []})
    threading.Thread(target=later, daemon=True).start()


def test_a_job_is_claimed_once(run_dir):
    assert background._claim("test_x.py") and not background._claim("test_x.py")


def test_a_test_waits_out_a_job_that_runs_alone(run_dir):
    (run_dir / "alone.request").touch()
    _finish(run_dir / background.ALONE, after_s=1.0)
    start = time.monotonic()
    with background.busy():
        assert (run_dir / "busy.gw7").exists()
        waited = time.monotonic() - start
    assert waited >= 0.9 and not (run_dir / "busy.gw7").exists()
    with background.busy():  # the job has ended: no wait
        pass


def test_waiting_for_a_job_is_not_work(run_dir):
    with background.busy():
        with background.idle():
            assert not (run_dir / "busy.gw7").exists()
        assert (run_dir / "busy.gw7").exists()


def test_the_alone_job_waits_for_the_other_processes_to_leave_their_tests(run_dir, monkeypatch):
    launched = []
    monkeypatch.setattr(background, "_mine", {})  # the fake job is not this session's to stop
    monkeypatch.setattr(background, "Job", lambda name, retry_rendezvous_abort: launched.append(
        (time.monotonic(), name, retry_rendezvous_abort)) or _NoProcesses())
    (run_dir / "busy.gw3").touch()  # another worker is in a test
    (run_dir / "test_notebook.py").mkdir()  # an eager job that is still running
    _finish(run_dir / "test_notebook.py", after_s=0.5)
    threading.Thread(target=lambda: (time.sleep(1.0), os.remove(run_dir / "busy.gw3")), daemon=True).start()
    start = time.monotonic()
    background._run_alone(background.ALONE)
    assert (run_dir / "alone.request").exists()
    (at, name, retried), = launched
    assert name == background.ALONE and retried and at - start >= 0.9


class _NoProcesses:
    def finish(self):
        pass
