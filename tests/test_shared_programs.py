"""Engines of the same structure alive together share their compiled programs
(`dsd_jax.shared_programs`): the second compiles nothing and keeps its own weights; any
difference in structure compiles its own; dropped engines free theirs."""

import dataclasses
import gc

import pytest

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models, shared_programs
from dsd_jax.compilation import compilation_count
from dsd_jax.drafters.base import Drafter
from dsd_jax.drafters.ngram import NGram
from models.checkpoint import cast
from conftest import FixedK, greedy_reference, make_engine, scaled, tiny_config

DRAFT = tiny_config(num_layers=1, hidden_size=16, intermediate_size=32, num_heads=2, num_kv_heads=1)
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [[1, 2, 3], [7, 7], [5, 9, 11, 2]]


@pytest.fixture(scope="module")
def other_pair():
    """Models of the tiny pair's structure with other weights."""
    return scaled(models.init_model(tiny_config(), seed=5), 3.0), models.init_model(DRAFT, seed=6)


@pytest.fixture(scope="module")
def first_target(tiny_pair):
    return scaled(tiny_pair[0], 3.0)


@pytest.fixture(scope="module")
def first(first_target, tiny_pair):
    engine = make_engine(first_target, tiny_pair[1], method="draft_model", max_seq_len=48)
    engine.warmup(run=False)
    return engine


def test_an_engine_of_the_same_structure_compiles_nothing_and_keeps_its_own_weights(first, first_target,
                                                                                    other_pair):
    target, draft = other_pair
    engine = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=4),
                        max_batch_size=4, max_seq_len=48, prefill_chunk=16, batch_buckets=(4,),
                        controller=FixedK([2, 4, 0, 3]), share_prefixes=False)
    before = compilation_count()
    assert engine.warmup(run=False) == 10
    assert compilation_count() == before
    assert engine.programs.step(4, 4) is first.programs.step(4, 4)
    for eng, model in ((engine, target), (first, first_target)):
        outs = eng.generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == [greedy_reference(model, p, 12) for p in PROMPTS]


@pytest.mark.parametrize("change", [
    dict(max_seq_len=64), dict(draft_sampling="argmax"), dict(acceptance="drafter_invariant"),
    dict(matmul_precision="highest"), dict(backend="interpret"), dict(dtype="bfloat16"),
])
def test_engines_of_another_structure_compile_their_own(first, first_target, tiny_pair, change):
    gc.collect()  # a dropped engine of earlier tests, not yet collected, still shares its programs
    change = dict(change)
    target, draft = first_target, tiny_pair[1]
    if change.pop("dtype", None):
        target, draft = cast(target, "bfloat16"), cast(draft, "bfloat16")
    engine_kw = {k: change.pop(k) for k in ("max_seq_len", "matmul_precision", "backend") if k in change}
    spec = dict(method="draft_model", num_speculative_tokens=4, **change)
    engine = SpecEngine(target, draft, SpecConfig(**spec), max_batch_size=4,
                        max_seq_len=engine_kw.pop("max_seq_len", 48), prefill_chunk=16,
                        batch_buckets=(4,), controller=FixedK([1]), **engine_kw)
    before = compilation_count()
    assert engine.programs.admit(4) is not first.programs.admit(4)
    assert compilation_count() > before


def test_dropped_engines_free_their_programs(other_pair):
    gc.collect()  # (engines of earlier tests)
    held = shared_programs.held()
    engine = make_engine(*other_pair, method="ngram", max_seq_len=32)
    engine.programs.admit(4)
    assert shared_programs.held() == held + 1
    del engine
    gc.collect()
    assert shared_programs.held() == held


def test_not_shared_engines_neither_take_nor_give(first, first_target, tiny_pair):
    """Inside `not_shared()` (code patched at run time, a run that must compile) an engine of
    `first`'s structure compiles its own and leaves the table as it was; after, it shares."""
    def same_structure():
        return make_engine(first_target, tiny_pair[1], method="draft_model", max_seq_len=48)

    with shared_programs.not_shared():
        with shared_programs.not_shared():
            pass  # nested blocks: sharing stays off until the outermost ends
        held, before = shared_programs.held(), compilation_count()
        apart = same_structure()
        assert apart.programs.admit(4) is not first.programs.admit(4)
        assert compilation_count() > before and shared_programs.held() == held
    assert same_structure().programs.admit(4) is first.programs.admit(4)


def test_a_drafter_shares_programs_only_where_its_class_says_so():
    assert NGram(1, 3).program_key() == NGram(1, 3).program_key() != NGram(2, 3).program_key()
    assert Drafter().program_key() is None

    @dataclasses.dataclass(frozen=True, eq=False)
    class MyNGram(NGram):  # may read more than its fields: not shared unless it says so
        pass
    assert MyNGram(1, 3).program_key() is None
