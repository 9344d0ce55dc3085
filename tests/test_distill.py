"""Draft distillation on rollouts: the padded sequence forward, the batch masks, and a
stale draft's acceptance recovered after the target moves (as it does every RL step)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dsd_jax import SamplingParams, models
from dsd_jax.compilation import compilation_count
from dsd_jax.distill import DraftDistiller, rollout_batch, sequence_logits, token_logps
from dsd_jax.engine import RequestOutput
from conftest import make_engine, scaled, tiny_config


def test_sequence_logits_equal_the_cached_forward_and_ignore_padding(tiny_pair):
    target = scaled(tiny_pair[0], 3.0)
    tokens = jnp.asarray([[5, 9, 2, 7, 11, 3]], jnp.int32)
    kv = models.init_kv_cache(target.config, 1, 8)
    cached, _ = target(tokens, jnp.arange(6, dtype=jnp.int32)[None], kv, attn_backend="xla")
    full = sequence_logits(target, tokens, jnp.ones_like(tokens, bool))
    np.testing.assert_allclose(full, cached, atol=1e-4)
    # the same sequence left-padded (prompt) and right-padded (completion) scores the same
    padded = jnp.asarray([[0, 0, 5, 9, 2, 7, 11, 3, 0]], jnp.int32)
    a = token_logps(target, tokens[:, :3], tokens[:, 3:], pad_id=0)
    b = token_logps(target, padded[:, :5], padded[:, 5:], pad_id=0)
    np.testing.assert_allclose(a, b[:, :3], atol=1e-5)
    want = jax.nn.log_softmax(cached[0, 2:5], -1)[jnp.arange(3), tokens[0, 3:]]
    np.testing.assert_allclose(a[0], want, atol=1e-4)


def test_rollout_batch_marks_the_completion_positions():
    outs = [RequestOutput(0, [1, 2, 3], [4, 5], "length"), RequestOutput(1, [7], [8, 9, 10], "stop"),
            RequestOutput(2, [3], [], "stop")]
    b = rollout_batch(outs, length_multiple=8)
    assert b.tokens.shape == (2, 8)  # the empty completion is dropped
    assert b.tokens[0, :5].tolist() == [1, 2, 3, 4, 5] and b.mask[0].sum() == 5
    # logits at t predict token t+1: positions 2, 3 predict the completion 4, 5
    assert np.flatnonzero(b.loss_mask[0]).tolist() == [2, 3]
    assert np.flatnonzero(b.loss_mask[1]).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="no completed tokens"):
        rollout_batch([outs[2]])


def acceptance(engine, prompts) -> float:
    """Mean committed tokens per step at K=3 (1.0: every draft rejected)."""
    engine.stats.reset()
    engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=16, seed=7))
    return engine.metrics()["mean_accepted_len"]


def test_distillation_recovers_acceptance_after_the_target_moves(tiny_pair):
    """A draft distilled to the target accepts well; the target takes a "policy step"
    (its weights perturbed) and acceptance falls; distilling on the new rollouts brings it
    back, through set_params (nothing recompiles)."""
    target = scaled(tiny_pair[0], 3.0)
    draft = models.init_model(tiny_config(num_layers=1, hidden_size=32, intermediate_size=64,
                                          num_heads=2, num_kv_heads=1, head_dim=16), seed=3)
    engine = make_engine(target, draft, method="draft_model", num_speculative_tokens=3,
                         max_batch_size=16, max_seq_len=32, batch_buckets=(16,))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 64, size=int(n)).tolist() for n in rng.integers(3, 9, size=8)]
    distiller = DraftDistiller(target, draft, learning_rate=1e-2, rows=16)

    def rollouts():
        return engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=16, n=2))

    for _ in range(2):
        distiller.refresh(engine, rollouts(), steps=30)
    fresh = acceptance(engine, prompts)
    graph, params = nnx.split(target)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(params))))
    moved = jax.tree.map(lambda x: x + 1.5 * jnp.std(x) * jax.random.normal(next(keys), x.shape)
                         if x.ndim == 2 else x, params)
    engine.set_params(target=moved)
    stale = acceptance(engine, prompts)
    metrics = [distiller.refresh(engine, rollouts(), steps=30) for _ in range(2)]
    before = compilation_count()
    recovered = acceptance(engine, prompts)
    assert compilation_count() == before
    assert metrics[0]["loss_after"] < metrics[0]["loss_before"]
    print(f"accepted length: fresh {fresh:.2f}, stale {stale:.2f}, recovered {recovered:.2f}")
    assert stale < fresh - 0.3, (fresh, stale)
    assert recovered > stale + 0.3, (fresh, stale, recovered)


def test_distiller_refuses_what_it_cannot_train(tiny_pair):
    """Named errors, before anything runs: an EAGLE-3 head as the draft, an engine with no
    draft model, an EAGLE-3 engine, an engine built from another draft, rollouts without a
    completion token. A refresh that fails midway keeps the engine's draft and drops the
    optimizer state (its buffers went to the failed steps), so the next refresh works."""
    import dataclasses

    from dsd_jax.models.eagle3 import Eagle3Config, init_eagle3
    target, draft = tiny_pair
    t = target.config
    fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(type(t))}
    head = init_eagle3(Eagle3Config(**{**fields, "num_layers": 1}, draft_vocab_size=32,
                                    aux_layers=(0, 0, 1)), 0)
    with pytest.raises(ValueError, match="trains a draft Transformer, not an EAGLE-3 head"):
        DraftDistiller(target, head)
    small = dict(max_batch_size=2, max_seq_len=32, batch_buckets=(2,), num_speculative_tokens=2)
    outs = [RequestOutput(0, [1, 2, 3], [4, 5], "length"), RequestOutput(1, [6], [7], "stop")]
    distiller = DraftDistiller(target, draft, rows=2)
    with pytest.raises(ValueError, match="this engine has no draft model to distil"):
        distiller.refresh(make_engine(target, None, method="suffix", **small), outs, steps=1)
    with pytest.raises(ValueError, match="not an EAGLE-3 head"):
        distiller.refresh(make_engine(target, head, method="eagle3", **small), outs, steps=1)
    other = models.init_model(tiny_config(num_layers=1, hidden_size=32, intermediate_size=64,
                                          num_heads=2, num_kv_heads=1, head_dim=16), seed=3)
    with pytest.raises(ValueError, match="engine's draft is not the draft this DraftDistiller"):
        distiller.refresh(make_engine(target, other, method="draft_model", **small), outs, steps=1)
    engine = make_engine(target, draft, method="draft_model", **small)
    with pytest.raises(ValueError, match="no completed tokens"):
        distiller.refresh(engine, [RequestOutput(0, [1, 2], [], "stop")], steps=1)

    kept = jax.tree.leaves(engine._draft_params)
    step, calls = distiller._step, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("step failed")
        return step(*args)

    distiller._step = failing
    with pytest.raises(RuntimeError, match="step failed"):
        distiller.refresh(engine, outs, steps=3)
    assert distiller.opt_state is None
    assert all(a is b for a, b in zip(kept, jax.tree.leaves(engine._draft_params)))
    distiller._step = step
    assert distiller.refresh(engine, outs, steps=2)["steps"] == 2
    assert distiller.opt_state is not None
    assert any(not np.array_equal(a, b) for a, b in zip(kept, jax.tree.leaves(engine._draft_params)))
