"""Two processes under `jax.distributed` (localhost, gloo), 2 CPU devices each, one 2x2
mesh: "data" across the processes, "model" within each (`multihost_cases.py`). Every
process must dispatch the same K every step, and the tokens must equal one device's."""

import pytest

import background
from multihost_prompts import COUPLED, GREEDY, PROMPTS, engine


@pytest.fixture(scope="module")
def processes():
    return background.results("test_multihost.py")  # started at collection (`background.py`)


@pytest.fixture(scope="module")
def single_device():
    e = engine()
    return {"broadcast": [o.token_ids for o in e.generate(PROMPTS, GREEDY)],
            "allgather": [o.token_ids for o in e.generate(PROMPTS, COUPLED)]}


def test_two_processes_four_devices(processes):
    assert [(r["process"], r["devices"], r["local"]) for r in processes] == [(0, 4, 2), (1, 4, 2)]


@pytest.mark.parametrize("strategy", ["broadcast", "allgather"])
def test_every_process_dispatches_the_same_k(processes, strategy):
    """The controller's K follows each process's own clock; agreement keeps it one K."""
    ks = [r[strategy]["ks"] for r in processes]
    assert ks[0] == ks[1]
    assert len(set(ks[0])) > 1  # K did change during the run


@pytest.mark.parametrize("strategy", ["broadcast", "allgather"])
def test_tokens_equal_one_device(processes, single_device, strategy):
    """Greedy (broadcast run) and drafter-invariant sampling (allgather run)."""
    for r in processes:
        assert r[strategy]["tokens"] == single_device[strategy]


def test_fingerprints_of_weights_split_over_processes_equal_one_devices(processes):
    """A 1x4 mesh puts "model" across the processes: no process can fetch a whole weight, and
    fingerprinting (the profile check at construction, `profile_engine`) raised."""
    for r in processes:
        assert r["fingerprints_model_across"] == engine().fingerprints()


def test_an_engine_on_its_own_processs_devices_runs_alone(processes, single_device):
    """No mesh, or a mesh of this process's devices: no agreement, so the processes run
    different requests without waiting on each other (each waited 120 s, then failed); a
    mesh holding none of this process's devices is refused when the engine is built."""
    for r in processes:
        mine = 1 if r["process"] == 0 else len(single_device["broadcast"])
        for name in ("local_mesh", "no_mesh"):
            assert r[name] == {"agreement": False, "tokens": single_device["broadcast"][:mine]}
    assert processes[0]["foreign_mesh"] is None
    assert "the mesh holds none of this process's devices (process 1" in processes[1]["foreign_mesh"]
