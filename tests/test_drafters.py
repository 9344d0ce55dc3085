"""The drafter interface: a new method is one module plus one registration.

`RepeatLast` below is a complete drafter ("repeat the last committed token"); the tests
register it, run it through every program (all K and batch buckets, prefill, admit,
move) and check that greedy output stays identical to plain decoding.
"""

import dataclasses

import jax.numpy as jnp
import pytest

from dsd_jax import SamplingParams, SpecConfig, drafters
from dsd_jax.drafters.base import Drafter, Proposal, gather_tokens
from conftest import FixedK, greedy_reference, make_engine, scaled


class RepeatLast(Drafter):
    """Proposes the last committed token K times (one-hot q, no state)."""

    def propose(self, params, state, ctx, K):
        last = gather_tokens(ctx.tokens, ctx.length[:, None] - 1)
        return Proposal(jnp.repeat(last, K, axis=1), None, state)


PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [3, 3, 3, 3],
           [9, 9], [4, 6, 8, 10, 12]]


@pytest.fixture(scope="module")
def repeat_last():
    drafters.register("repeat_last", RepeatLast)
    yield "repeat_last"
    drafters.unregister("repeat_last")


@pytest.fixture(scope="module")
def target(tiny_pair):
    return scaled(tiny_pair[0], 3.0)


def test_toy_drafter_runs_every_program_and_stays_lossless(repeat_last, target):
    schedule = [0, 1, 2, 3, 3, 0, 1]
    engine = make_engine(target, None, controller=FixedK(schedule), max_batch_size=4,
                         batch_buckets=(1, 2, 4), method=repeat_last, num_speculative_tokens=3)
    assert isinstance(engine.drafter, RepeatLast)
    # every (K, bucket) step program, every prefill chunk, admit and move
    assert engine.warmup() == len(engine.programs._compiled)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    outs = engine.generate(PROMPTS, params)  # 6 requests on 4 slots: slots are freed and moved
    for out, prompt in zip(outs, PROMPTS):
        assert out.token_ids == greedy_reference(target, prompt, params.max_tokens)
    assert engine.stats.accepted_per_pos.sum() > 0  # the target repeats itself sometimes


def test_toy_drafter_is_invariant_under_coupled_sampling(repeat_last, target):
    """Drafter-invariant acceptance: sampled output equals plain sampling token for token."""
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=3)
    spec = make_engine(target, None, controller=FixedK([2, 3, 0]), method=repeat_last,
                       num_speculative_tokens=3, acceptance="drafter_invariant")
    plain = make_engine(target, None, method="none", num_speculative_tokens=0)
    assert ([o.token_ids for o in spec.generate(PROMPTS, params)]
            == [o.token_ids for o in plain.generate(PROMPTS, params)])


def test_registry_errors(repeat_last):
    assert repeat_last in drafters.names() and "draft_model" in drafters.names()
    with pytest.raises(ValueError, match="already registered"):
        drafters.register("repeat_last", type("Other", (Drafter,), {}))
    with pytest.raises(ValueError, match="already registered"):
        drafters.register("ngram", RepeatLast)
    with pytest.raises(TypeError, match="subclass"):
        drafters.register("not_a_drafter", object)
    with pytest.raises(ValueError, match="method must be one of"):
        SpecConfig(method="no_such_method")
    with pytest.raises(ValueError, match="unknown speculative method"):
        drafters.get("no_such_method")


def test_method_needing_a_model_says_so(tiny_pair):
    with pytest.raises(ValueError, match="'draft_model' needs a draft model"):
        make_engine(tiny_pair[0], None, method="draft_model")


def test_draft_model_refuses_an_eagle3_head(tiny_pair):
    """"draft_model" is the default method: given an EAGLE-3 head it must say so at
    construction, not fail while tracing the head as a Transformer."""
    from dsd_jax.models.eagle3 import Eagle3Config, init_eagle3
    t = tiny_pair[0].config
    fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(type(t))}
    cfg = Eagle3Config(**{**fields, "num_layers": 1}, draft_vocab_size=t.vocab_size // 2,
                       aux_layers=(0, 0, t.num_layers - 1))
    with pytest.raises(ValueError, match="given an EAGLE-3 head.*method='eagle3'"):
        make_engine(tiny_pair[0], init_eagle3(cfg, 0), method="draft_model")
