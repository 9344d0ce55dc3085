"""`dsd_jax.map_budget`: on a CPU, a compile that would cross the process's memory-map limit
(`vm.max_map_count`, where XLA:CPU's compile dies of a segmentation fault) raises a clear
error instead, and nothing compiled before is lost. The limit is lowered on the engine's
own budget, never on the system."""

import contextlib
import gc

import pytest

from dsd_jax import SamplingParams, map_budget
from dsd_jax.map_budget import DEFAULT_MAPS, MapBudget, MapLimitError, maps_in_use
from conftest import make_engine

pytestmark = pytest.mark.skipif(MapBudget().limit is None, reason="needs /proc (Linux)")


@contextlib.contextmanager
def collector_off():
    """No garbage collection meanwhile: another engine's maps freed under a compile make its
    reading low (`MapBudget.measure` then records nothing)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.own_programs  # its steps compile: measured
def test_a_compile_past_the_map_limit_raises_and_loses_nothing(tiny_pair):
    """The garbage collector is off while the first step is measured: another engine's maps
    freed under its compile made it read nothing (once in twenty-four fresh clones)."""
    engine = make_engine(*tiny_pair, method="draft_model", num_speculative_tokens=2, max_seq_len=32)
    programs = engine.programs
    with collector_off():
        programs.step(0, 4)
    taken = programs._maps.per_program[("step", 0)]
    assert taken > 0  # a compiled program holds maps of its own
    system_limit = programs._maps.limit
    programs._maps.limit = 1  # room for no program, whatever other engines free meanwhile
    with pytest.raises(MapLimitError, match=r"program \('step', 1, 4\) needs about \d+ more memory maps.*"
                                            r"vm\.max_map_count.*sysctl -w vm\.max_map_count"):
        programs.step(1, 4)
    assert not programs.is_compiled("step", 1, 4) and programs.is_compiled("step", 0, 4)
    programs._maps.limit = system_limit
    out = engine.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=6))  # still serves
    assert len(out[0].token_ids) == 6


@pytest.mark.own_programs  # its steps compile: measured
def test_a_warmup_that_cannot_fit_its_steps_fails_before_compiling_them(tiny_pair):
    """`compile_all` prices everything left once a step has been measured: with room for three
    steps, the warm-up of 3 buckets x K 0..3 (12 steps, one of them compiled to measure it)
    fails at its first check, before compiling anything more. The garbage collector is off
    meanwhile, so that no other engine's maps are freed under the test."""
    engine = make_engine(*tiny_pair, method="draft_model", num_speculative_tokens=3, max_seq_len=32,
                         batch_buckets=(1, 2, 4))
    programs = engine.programs
    with collector_off():
        programs.step(3, 1)  # the largest K: what a step takes here
        per_step = programs._maps.per_program[("step", 3)]
        programs._maps.limit = maps_in_use() + 3 * per_step
        with pytest.raises(MapLimitError, match=r"this engine's \d+ remaining programs"):
            engine.warmup(run=False)
    assert list(programs._compiled) == [("step", 3, 1)]


def test_estimates_follow_what_each_kind_took():
    budget = MapBudget(limit=10 ** 9)
    assert budget.estimate(("step", 2, 4)) == DEFAULT_MAPS  # nothing measured yet
    budget.per_program.update({("step", 0): 400, ("step", 3): 1100, ("prefill",): 250})
    assert budget.estimate(("step", 3, 64)) == 1100  # a step's K, whatever its bucket
    assert budget.estimate(("step", 5, 1)) == 1100  # a K not compiled yet: the most any step took
    assert budget.estimate(("prefill", 4, 64)) == 250
    assert budget.estimate(("admit", 4)) == 1100  # a kind not seen yet: the most any program took
    assert budget.measured_a_step()
    assert budget.check([("step", 1, 1)] * 3, "three steps") > 0  # far below the limit: the maps held


def test_where_the_limit_cannot_be_read_nothing_is_checked(monkeypatch, tmp_path):
    monkeypatch.setattr(map_budget, "LIMIT_FILE", str(tmp_path / "absent"))
    budget = MapBudget()
    assert budget.limit is None
    assert budget.check([("step", 1, 1)] * 10 ** 6, "a million steps") is None  # nothing to compare with
    budget.measure(("step", 1, 1), None)
    assert budget.per_program == {}


def test_the_cli_says_it_as_an_error_not_a_traceback(monkeypatch):
    from dsd_jax import cli
    from dsd_jax.cli import bench_commands

    def over_the_limit(args):
        raise MapLimitError("compiling program ('step', 3, 64) needs about 1200 more memory maps")

    monkeypatch.setattr(bench_commands, "cmd_demo", over_the_limit)
    with pytest.raises(SystemExit, match=r"^dsd-jax demo: error: compiling program .* memory maps$"):
        cli.main(["demo"])
