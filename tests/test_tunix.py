"""The Tunix adapter against Tunix itself: conventions of its own vanilla rollout, logprobs
of its `compute_per_token_logps`, group sampling, weight syncs under its transfer guards,
mapping errors, and a real GRPO learner end to end (examples/grpo_tunix.py)."""

import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import qwix
from flax import nnx
from tunix.generate import tokenizer_adapter
from tunix.models.llama3 import model as llama3
from tunix.models.qwen3 import model as qwen3
from tunix.rl import common
from tunix.rl import utils as rl_utils
from tunix.rl.rollout import base_rollout, vanilla_rollout

from dsd_jax import SamplingParams, SpecConfig, param_mapping
from dsd_jax.compilation import compilation_count
from dsd_jax.distill import token_logps
from dsd_jax.integrations.tunix import SpecRollout, from_tunix
from xla_flags import fast_compile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(29)]
PAD, BOS, EOS = 0, 1, 2


class Words:
    def encode(self, text, **kw):
        return [WORDS.index(w) for w in text.split()]

    def decode(self, ids, **kw):
        return " ".join(WORDS[i] for i in ids)

    def bos_id(self):
        return BOS

    def eos_id(self):
        return EOS

    def pad_id(self):
        return PAD


TOKENIZER = tokenizer_adapter.TokenizerAdapter(Words())


def noisy(model, seed, scale=0.25):
    """Tunix initialises MLP kernels to zero: give every matrix random weights."""
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(state))))
    nnx.update(model, jax.tree.map(
        lambda x: x + scale * jax.random.normal(next(keys), x.shape) if x.ndim > 1 else x, state))
    return model


def tiny_llama(seed=0, tied=False):
    cfg = llama3.ModelConfig(num_layers=2, vocab_size=len(WORDS), embed_dim=32, hidden_dim=64,
                             num_heads=4, head_dim=8, num_kv_heads=2, rope_theta=10000,
                             norm_eps=1e-5, weight_tying=tied)
    return noisy(llama3.Llama3(cfg, rngs=nnx.Rngs(seed)), seed)


def tiny_qwen(seed=0):
    cfg = qwen3.ModelConfig(num_layers=1, vocab_size=len(WORDS), embed_dim=32, hidden_dim=64,
                            num_heads=4, head_dim=8, num_kv_heads=2, rope_theta=1_000_000,
                            norm_eps=1e-6, use_tied_embedding=True)
    return noisy(qwen3.Qwen3(cfg, rngs=nnx.Rngs(seed)), seed)


def lora_llama(seed=0, rank=4, alpha=8.0):
    """`tiny_llama` with qwix LoRA on every projection (q, k, v, o, gate, up, down), its
    adapters random (qwix starts lora_b at zero: the adapters would change nothing)."""
    tokens = jnp.ones((1, 4), jnp.int32)
    model = qwix.apply_lora_to_model(
        tiny_llama(seed), qwix.LoraProvider(module_path=".*_proj", rank=rank, alpha=alpha),
        tokens, jnp.arange(4)[None], None, jnp.ones((1, 4, 4), bool), rngs=nnx.Rngs(seed))
    adapters = nnx.state(model, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(adapters))))
    nnx.update(model, jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), adapters))
    return model


def config(**kw):
    base = dict(max_tokens_to_generate=10, max_prompt_length=8, kv_cache_size=32,
                temperature=0.8, top_p=1.0, return_logprobs=True)
    base.update(kw)
    return base_rollout.RolloutConfig(**base)


@contextlib.contextmanager
def sync_guards():
    """Tunix's transfer guards around a weight sync (no host copies either way), stricter:
    implicit transfers too."""
    with jax.transfer_guard("disallow"), jax.transfer_guard_host_to_device("disallow_explicit"), \
            jax.transfer_guard_device_to_host("disallow_explicit"):
        yield


def train_and_sync(rollout, trainer, kind, step):
    """A jitted "training step" on the trainer's `kind` params (nnx.Param, or the LoRA
    adapters), then Tunix's sync of them under `sync_guards`: (the compilations the sync
    made, the state synced)."""
    nnx.update(trainer, step(nnx.state(trainer, kind)))
    state = nnx.state(trainer, kind)
    before = compilation_count()
    with sync_guards():
        rollout.update_params(state, (kind,))
    return compilation_count() - before, state


def tunix_logps(module, out, cfg, temperature):
    comp = np.full((len(out.tokens), cfg.max_tokens_to_generate), PAD, np.int32)
    for i, t in enumerate(out.tokens):
        comp[i, :len(t)] = t
    return np.asarray(common.compute_per_token_logps(
        *nnx.split(module), prompt_tokens=jnp.asarray(out.left_padded_prompt_tokens),
        completion_tokens=jnp.asarray(comp), pad_id=PAD, eos_id=EOS, temperature=temperature))


def assert_logprobs_match(module, out, cfg, temperature, atol=1e-5):
    """Rollout logprobs equal Tunix's recomputation (before any generated pad id, which
    Tunix masks out of its recomputation)."""
    theirs = tunix_logps(module, out, cfg, temperature)
    compared = 0
    for i, t in enumerate(out.tokens):
        n = before_pad(t)
        np.testing.assert_allclose(out.logprobs[i][:n], theirs[i, :n], atol=atol)
        compared += n
    assert compared >= len(out.tokens)  # the comparison is not vacuous


@pytest.fixture(scope="module")
def policy():
    return tiny_llama(0)


@pytest.fixture(scope="module")
def rollout(policy):
    return SpecRollout(rollout_actor=policy, tokenizer=TOKENIZER, mesh=None,
                       rollout_config=config(), max_batch_size=8, prefill_chunk=16,
                       spec=SpecConfig(method="suffix", num_speculative_tokens=2,
                                       acceptance="drafter_invariant"))


PROMPTS = ["w3 w4 w5", "w7 w8", "w3 w4 w5 w6 w9 w10"]


def test_conversion_reproduces_tunix_forward():
    """Llama3 (tied and untied) and Qwen3: our converted model's per-token log-probabilities
    equal Tunix's on padded rows (left-padded prompts, right-padded completions)."""
    prompt = jnp.asarray([[0, 0, 1, 5, 6], [1, 7, 8, 9, 10]], jnp.int32)
    completion = jnp.asarray([[11, 12, 13, 0], [14, 15, 16, 17]], jnp.int32)
    for module in (tiny_llama(1), tiny_llama(2, tied=True), tiny_qwen(3)):
        ours = from_tunix(module, check=False)
        theirs = common.compute_per_token_logps(
            *nnx.split(module), prompt_tokens=prompt, completion_tokens=completion,
            pad_id=PAD, eos_id=EOS, temperature=0.7)
        np.testing.assert_allclose(token_logps(ours, prompt, completion, PAD, 0.7), theirs,
                                   atol=1e-5)


def test_conversion_check_catches_a_convention_we_do_not_reproduce(monkeypatch):
    """`from_tunix` compares both forwards: the RoPE base Tunix 0.1.7 really applies is
    1e6 whatever its config says; with the config's value the check fails loudly."""
    from dsd_jax.integrations import tunix as adapter
    module = tiny_llama(1)
    from_tunix(module)  # passes
    monkeypatch.setattr(adapter, "TUNIX_APPLIED_ROPE_THETA", float(module.config.rope_theta))
    with pytest.raises(ValueError, match="differ from Tunix's"):
        from_tunix(module)


def before_pad(tokens) -> int:
    """Tokens up to and including the first generated pad id: after it Tunix's sampler and
    its recomputation drop that token from the context (masks from the pad id); we keep it."""
    t = list(tokens)
    return t.index(PAD) + 1 if PAD in t else len(t)


def test_greedy_rollout_equals_tunix_vanilla(policy, rollout):
    """Greedy (top_p None, as Tunix's sampler reads it): tokens, text, left-padded prompts,
    EOS cut and logprobs all equal Tunix's own VanillaRollout's."""
    c = policy.config
    vanilla = vanilla_rollout.VanillaRollout(policy, TOKENIZER, base_rollout.CacheConfig(
        cache_size=32, num_layers=c.num_layers, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim))
    ref = vanilla.generate(PROMPTS, config(top_p=None))
    # an EOS that a greedy path really emits (in a row without a pad), so the cut is exercised
    row = next(i for i, t in enumerate(ref.tokens) if PAD not in t.tolist())
    eos = int(ref.tokens[row][3])
    cut = ref.tokens[row].tolist().index(eos)
    cfg = config(top_p=None, eos_tokens=[eos])
    ref = vanilla.generate(PROMPTS, cfg)
    out = rollout.generate(PROMPTS, cfg)
    assert len(ref.tokens[row]) == cut
    compared = 0
    for a, b, text, ref_text, lp, ref_lp in zip(out.tokens, ref.tokens, out.text, ref.text,
                                                out.logprobs, ref.logprobs):
        assert isinstance(a, np.ndarray) and a.dtype == np.int32
        assert eos not in a.tolist() and len(a) <= cfg.max_tokens_to_generate
        n = before_pad(b)
        assert a.tolist()[:n] == b.tolist()[:n]
        np.testing.assert_allclose(lp[:n], ref_lp[:n], atol=1e-5)
        if n == len(b):
            assert len(a) == len(b) and text == ref_text
            compared += 1
    assert compared >= 2
    np.testing.assert_array_equal(out.left_padded_prompt_tokens, ref.left_padded_prompt_tokens)
    assert out.left_padded_prompt_tokens.shape == (3, cfg.max_prompt_length)
    assert_logprobs_match(policy, out, cfg, temperature=1.0)  # greedy: raw logits
    assert rollout.pad_id() == PAD and rollout.eos_id() == EOS
    # a prompt longer than max_prompt_length widens the block to a power of two, as vanilla
    long = " ".join(f"w{i}" for i in range(3, 13))
    wide, ref_wide = rollout.generate([long], cfg), vanilla.generate([long], cfg)
    assert wide.left_padded_prompt_tokens.shape == ref_wide.left_padded_prompt_tokens.shape == (1, 16)
    n = before_pad(ref_wide.tokens[0])
    assert wide.tokens[0].tolist()[:n] == ref_wide.tokens[0].tolist()[:n]


def test_sampled_logprobs_follow_grpo_convention(policy, rollout):
    """Sampling at T: logprobs are log_softmax(logits / T) of the unfiltered logits, what
    Tunix recomputes in the GRPO loss, also when top-k / top-p filter the sampling."""
    for cfg in (config(temperature=0.8), config(temperature=1.3, top_k=5, top_p=0.9)):
        out = rollout.generate(PROMPTS * 2, cfg)
        assert all(len(t) <= cfg.max_tokens_to_generate for t in out.tokens)
        assert_logprobs_match(policy, out, cfg, temperature=cfg.temperature)
    # get_per_token_logps is Tunix's at temperature 1, like vanilla's
    out = rollout.generate(PROMPTS, config(return_logprobs=False))
    assert out.logprobs is None
    comp = np.zeros((3, 10), np.int32)
    for i, t in enumerate(out.tokens):
        comp[i, :len(t)] = t
    mine = rollout.get_per_token_logps(out.left_padded_prompt_tokens, comp)
    theirs = common.compute_per_token_logps(
        *nnx.split(policy), prompt_tokens=jnp.asarray(out.left_padded_prompt_tokens),
        completion_tokens=jnp.asarray(comp), pad_id=PAD, eos_id=EOS)
    np.testing.assert_allclose(mine, theirs, atol=1e-5)


def test_repeated_prompts_become_groups(rollout):
    """GRPO's repeated prompts become SamplingParams(n=run) requests, outputs in order; with a
    seed, completion r of the call draws from seed + r, and under acceptance
    "drafter_invariant" (the fixture's; the documented way to reproducible groups) a group
    member equals a single request with that seed, although with method "suffix" its
    siblings draft for it."""
    calls = []
    inner = rollout.front.generate

    def spy(prompts, sampling, **kw):
        calls.append([(len(p), sp.n, sp.seed) for p, sp in zip(prompts, sampling)])
        return inner(prompts, sampling, **kw)

    a, b = "w3 w4 w5", "w7 w8"
    prompts = [a, a, a, b, b, a]
    rollout.front.generate = spy
    try:
        out = rollout.generate(prompts, config(seed=100))
    finally:
        del rollout.front.generate
    assert calls == [[(4, 3, 100), (3, 2, 103), (4, 1, 105)]]
    ids_a, ids_b = [BOS] + TOKENIZER.encode(a), [BOS] + TOKENIZER.encode(b)
    assert [r.tolist() for r in out.left_padded_prompt_tokens[:3]] == [[PAD] * 4 + ids_a] * 3
    singles = rollout.engine.generate([ids_a, ids_b], [rollout._sampling(config(), 1, 101),
                                                       rollout._sampling(config(), 1, 104)])
    assert out.tokens[1].tolist() == singles[0].token_ids
    assert out.tokens[4].tolist() == singles[1].token_ids
    assert out.tokens[0].tolist() != out.tokens[1].tolist()  # siblings draw different noise


def test_a_temperature_below_the_greedy_threshold_keeps_tunix_logprobs(policy, rollout):
    """0 < T < GREEDY_BELOW with top_p given: the engine samples greedily there and its
    logprobs are the raw ones, while Tunix's convention is log_softmax(logits / T) (about 0
    for the argmax token): they are rescored at T."""
    from dsd_jax.sampling import GREEDY_BELOW
    cfg = config(temperature=GREEDY_BELOW / 10, top_p=1.0)
    out = rollout.generate(PROMPTS, cfg)
    assert_logprobs_match(policy, out, cfg, temperature=cfg.temperature)


def test_concurrent_calls_run_together_and_each_gets_its_own(rollout):
    """Tunix's agentic learner calls the rollout from a thread per episode (asyncio's
    run_in_executor, up to max_concurrency at once): the calls share the engine's batch
    (`dsd_jax.threaded`) and each gets what it gets alone. The learner passes one string
    per call (`AgenticRLLearner._model_call`), not a list: one prompt, as a list of it."""
    cfg = config(top_p=None)
    episodes = list(PROMPTS) + [[p] for p in PROMPTS]

    async def all_at_once():
        loop = asyncio.get_running_loop()
        return await asyncio.gather(*[loop.run_in_executor(None, rollout.generate, e, cfg) for e in episodes])

    together = asyncio.run(all_at_once())
    for episode, got in zip(episodes, together):
        alone = rollout.generate([episode] if isinstance(episode, str) else episode, cfg)
        assert len(got.tokens) == len(alone.tokens) == 1
        assert [t.tolist() for t in got.tokens] == [t.tolist() for t in alone.tokens]
        np.testing.assert_array_equal(got.left_padded_prompt_tokens, alone.left_padded_prompt_tokens)
        np.testing.assert_allclose(got.logprobs[0], alone.logprobs[0], atol=1e-5)


def test_any_integer_seed_is_taken(rollout):
    """Tunix's sampler takes any integer seed; ours passed it as is, so seed=-1, or 2**32 - 2
    with a group of 4 (seeds past 2**32 - 1), raised from the engine. Integer seeds are
    reduced modulo 2**31 as JAX-key seeds are (one in range is kept)."""
    from dsd_jax.integrations.tunix import _seed_int
    assert [_seed_int(s) for s in (None, 0, 100, 2 ** 31 - 1, np.int64(7))] == [None, 0, 100, 2 ** 31 - 1, 7]
    prompts = ["w3 w4 w5"] * 4
    for seed, reduced in ((2 ** 32 - 2, 2 ** 31 - 2), (-1, 2 ** 31 - 1)):
        assert _seed_int(seed) == reduced
        out, ref = rollout.generate(prompts, config(seed=seed)), rollout.generate(prompts, config(seed=reduced))
        assert [t.tolist() for t in out.tokens] == [t.tolist() for t in ref.tokens]


def test_too_many_eos_tokens_are_named(rollout):
    """More than 8 eos_tokens failed as the engine's "at most 8 stop_token_ids": the error
    names eos_tokens; a repeated id counts once."""
    with pytest.raises(ValueError, match=r"rollout_config.eos_tokens has 9 distinct ids; at most 8"):
        rollout.generate(PROMPTS, config(eos_tokens=list(range(2, 11))))
    out = rollout.generate(PROMPTS, config(top_p=None, eos_tokens=[EOS] * 9))
    assert all(EOS not in t.tolist() for t in out.tokens)


@pytest.mark.parametrize("field, value, match", [
    ("eos_tokens", [2, 500], r"rollout_config.eos_tokens holds 500, not a token id of the policy's vocabulary"),
    ("eos_tokens", [-1], r"rollout_config.eos_tokens holds -1"),
    ("max_tokens_to_generate", 0, r"rollout_config.max_tokens_to_generate must be an integer >= 1, got 0"),
])
def test_bad_rollout_config_values_are_named(rollout, field, value, match):
    """They failed with the engine's messages ("request 0: stop_token_ids has 500", "max_tokens
    must be >= 1"), naming fields a Tunix user never set and a grouped run's index."""
    with pytest.raises(ValueError, match=match):
        rollout.generate(PROMPTS, config(**{field: value}))


def test_prompt_errors_name_the_callers_index(rollout, monkeypatch):
    """The engine sees one prompt per run of equal ones: its errors counted runs, so the
    fourth prompt after a repeated one was "prompt 2"."""
    tokenize = rollout._tokenize
    monkeypatch.setattr(rollout, "_tokenize", lambda text: {"oops": [BOS, 999], "": []}[text]
                        if text in ("oops", "") else tokenize(text))
    with pytest.raises(ValueError, match=r"prompt 3 has token ids outside the policy's vocabulary \[0, 32\)"):
        rollout.generate(["w3 w4", "w3 w4", "w5", "oops"], config())
    with pytest.raises(ValueError, match=r"prompt 3 is empty"):
        rollout.generate(["w3 w4", "w3 w4", "w5", ""], config())


def test_an_eagle3_head_is_a_draft_as_is(policy, rollout):
    """draft= an EAGLE-3 head: not taken for a Tunix module; the default method is "eagle3",
    and greedy output equals the suffix rollout's (both lossless)."""
    import dataclasses

    from dsd_jax.models.eagle3 import Eagle3Config, init_eagle3
    t = rollout.engine.target_config
    fields = {f.name: getattr(t, f.name) for f in dataclasses.fields(type(t))}
    head = init_eagle3(Eagle3Config(**{**fields, "num_layers": 1}, draft_vocab_size=t.vocab_size // 2,
                                    aux_layers=(0, 0, t.num_layers - 1)), 0)
    with_head = SpecRollout(rollout_actor=policy, tokenizer=TOKENIZER, mesh=None, rollout_config=config(),
                            max_batch_size=4, prefill_chunk=16, draft=head)
    assert with_head.engine.spec.method == "eagle3"
    cfg = config(top_p=None)
    a, b = with_head.generate(PROMPTS, cfg), rollout.generate(PROMPTS, cfg)
    assert [x.tolist() for x in a.tokens] == [x.tolist() for x in b.tokens]


def test_distillation_skips_an_empty_rollout_and_never_traps_later_calls(policy):
    """distill_steps > 0 with a vLLM-style spec dict: rollouts whose completions are all
    empty (EOS first) leave nothing to distil on, so the round after the next sync is
    skipped and noted, and generation goes on; the next sync distils on the rollouts since;
    a round that raises does so from one call only, the following call generates."""
    from dsd_jax import models
    with pytest.raises(ValueError, match="distill_steps needs a draft model"):
        SpecRollout(rollout_actor=policy, tokenizer=TOKENIZER, rollout_config=config(),
                    spec={"method": "suffix"}, distill_steps=2)
    draft = models.init_model(models.ModelConfig(
        vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
        num_kv_heads=1, head_dim=8), seed=1)
    r = SpecRollout(rollout_actor=policy, tokenizer=TOKENIZER, rollout_config=config(),
                    max_batch_size=2, prefill_chunk=16, batch_buckets=(2,), draft=draft,
                    spec={"method": "draft_model", "num_speculative_tokens": 2},
                    distill_steps=2, distill={"rows": 2})
    assert r.engine.spec.method == "draft_model"
    prompt, cfg = ["w3 w4 w5"], config(top_p=None)
    # the first token, from the engine itself: the rollout's calls are the distillation data
    first = r.engine.generate([r._tokenize(prompt[0])], SamplingParams(temperature=0.0, max_tokens=1))[0].token_ids[0]
    assert [len(t) for t in r.generate(prompt, config(top_p=None, eos_tokens=[first])).tokens] == [0]
    sync = lambda: r.update_params(nnx.state(policy, nnx.Param))
    sync()
    for _ in range(2):
        assert len(r.generate(prompt, cfg).tokens[0]) > 0
    assert r.distill_log == [{"skipped": "no completed tokens"}]
    sync()
    r.generate(prompt, cfg)
    assert len(r.distill_log) == 2 and r.distill_log[1]["steps"] == 2

    def broken(*args, **kwargs):
        raise RuntimeError("distillation broke")

    r._distiller.refresh = broken
    sync()
    with pytest.raises(RuntimeError, match="distillation broke"):
        r.generate(prompt, cfg)
    assert r.distill_log[-1] == {"error": "RuntimeError: distillation broke"}
    assert len(r.generate(prompt, cfg).tokens[0]) > 0


def test_update_params_under_transfer_guards_compiles_nothing(policy):
    """A sync from the trainer's module (a jitted step's output on device) under Tunix's
    transfer guards: zero compilations, the new weights served (logprobs equal Tunix's on
    them), and the next rollout compiles nothing either."""
    trainer = tiny_llama(0)
    r = SpecRollout(rollout_actor=trainer, tokenizer=TOKENIZER, mesh=None,
                    rollout_config=config(), max_batch_size=4, prefill_chunk=16,
                    spec=SpecConfig(method="ngram", num_speculative_tokens=2))
    cfg = config(temperature=0.9)
    r.generate(PROMPTS, cfg)
    step = jax.jit(lambda s: jax.tree.map(lambda x: x * 1.05 + 0.002, s))
    assert train_and_sync(r, trainer, nnx.Param, step)[0] == 0
    before = compilation_count()
    out = r.generate(PROMPTS, cfg)
    assert compilation_count() == before
    assert_logprobs_match(trainer, out, cfg, temperature=0.9)
    # Tunix hands back our own `model()` state when it offloads: taken as it is
    before = compilation_count()
    r.update_params(nnx.state(r.model(), nnx.Param))
    assert compilation_count() == before


def test_mapping_errors_name_the_leaf(rollout, policy):
    state = nnx.state(policy, nnx.Param)
    named, _ = param_mapping.flatten(state)
    engine = rollout.engine
    missing = {k: v for k, v in named.items() if k != "layers.1.attn.k_proj.w"}
    with pytest.raises(ValueError, match=r"no leaf 'layers\.1\.attn\.k_proj\.w' \(for our 'layers\.1\.wk'\)"):
        param_mapping.set_params_from(engine, param_mapping.TUNIX_LLAMA3, missing)
    wrong = dict(named, **{"layers.0.attn.o_proj.w": jnp.zeros((4, 8, 31))})
    with pytest.raises(ValueError, match=r"'layers\.0\.attn\.o_proj\.w' of shape \(4, 8, 31\).*'layers\.0\.wo'"):
        param_mapping.set_params_from(engine, param_mapping.TUNIX_LLAMA3, wrong)
    extra = dict(named, **{"layers.0.attn.o_proj.bias": jnp.zeros((32,))})
    with pytest.raises(ValueError, match=r"unused: 'layers\.0\.attn\.o_proj\.bias'"):
        param_mapping.set_params_from(engine, param_mapping.TUNIX_LLAMA3, extra)
    partial = param_mapping.ParamMapping("partial", [r for r in param_mapping.TUNIX_LLAMA3.rules
                                                     if r.ours != "lm_head"])
    with pytest.raises(ValueError, match=r"does not cover our leaf 'lm_head'"):
        param_mapping.set_params_from(engine, partial, named)
    with pytest.raises(ValueError, match="built from a policy without LoRA adapters"):
        rollout.update_params(state, (nnx.LoRAParam,))
    with pytest.raises(ValueError, match="unsupported Tunix model class"):
        SpecRollout(rollout_actor=nnx.Linear(2, 2, rngs=nnx.Rngs(0)), tokenizer=TOKENIZER,
                    rollout_config=config())
    with pytest.raises(ValueError, match="max_seq_len"):
        rollout.generate(PROMPTS, config(max_tokens_to_generate=40))
    # the engine still serves its old weights after every refusal
    out = rollout.generate(PROMPTS, config(top_p=None))
    assert_logprobs_match(policy, out, config(top_p=None), temperature=1.0)


def test_a_lora_policy_is_served_merged_and_synced_by_its_adapters(policy):
    """A qwix LoRA policy: the engine serves base + (alpha / rank) a.b (logprobs equal
    Tunix's forward of the LoRA module, and differ from the base model's); a trainer step
    moves the adapters only, and syncing just them (Tunix's filter nnx.LoRAParam) under its
    transfer guards compiles nothing and serves the new policy. Syncing the same adapters
    again gives bit-identical weights (each merge starts from the kept base)."""
    trainer = lora_llama(0)
    r = SpecRollout(rollout_actor=trainer, tokenizer=TOKENIZER, rollout_config=config(), max_batch_size=4,
                    prefill_chunk=16, spec=SpecConfig(method="ngram", num_speculative_tokens=2), lora_alpha=8.0)
    assert len(r._lora.base) == 14  # 7 adapted projections x 2 layers, the rest not copied
    cfg = config(temperature=0.9)
    out = r.generate(PROMPTS, cfg)
    assert_logprobs_match(trainer, out, cfg, temperature=0.9)
    base = tunix_logps(policy, out, cfg, 0.9)  # policy: tiny_llama(0), the unadapted weights
    assert max(np.abs(lp - base[i, :len(lp)]).max() for i, lp in enumerate(out.logprobs)) > 0.1
    step = jax.jit(lambda s: jax.tree.map(lambda x: x * 1.2 + 0.01, s))
    compiles, adapters = train_and_sync(r, trainer, nnx.LoRAParam, step)
    assert compiles == 0
    once = jax.device_get(r.engine._target_params)
    r.update_params(adapters, (nnx.LoRAParam,))
    assert all((a == b).all() for a, b in zip(jax.tree.leaves(once), jax.tree.leaves(jax.device_get(r.engine._target_params))))
    out = r.generate(PROMPTS, cfg)
    assert_logprobs_match(trainer, out, cfg, temperature=0.9)
    # the whole state (base weights and adapters) is taken as well, every weight from it
    shift = jax.jit(lambda s: jax.tree.map(lambda x: x + 0.01, s))
    nnx.update(trainer, shift(nnx.state(trainer, nnx.Param)))  # norms and embeddings too
    r.update_params(nnx.state(trainer, nnx.Param), (nnx.Param,))
    assert_logprobs_match(trainer, r.generate(PROMPTS, cfg), cfg, temperature=0.9)
    # Tunix compares model()'s leaves with the trainer's one by one (a different count
    # raises), and hands model()'s state back when it offloads
    assert not rl_utils.is_sharing_weights(trainer, r.model())
    r.update_params(nnx.state(r.model()))
    assert_logprobs_match(trainer, r.generate(PROMPTS, cfg), cfg, temperature=0.9)


def test_a_bfloat16_lora_policy_passes_the_forward_check_and_serves_its_law():
    """bfloat16: the merged weight rounds once where qwix's forward rounds x.W and x.a.b
    apart, within the check's tolerance; the rollout logprobs follow the LoRA module's."""
    trainer = lora_llama(0)
    nnx.update(trainer, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(trainer, nnx.Param)))
    r = SpecRollout(rollout_actor=trainer, tokenizer=TOKENIZER, rollout_config=config(), max_batch_size=4,
                    prefill_chunk=16, spec=SpecConfig(method="ngram", num_speculative_tokens=2), lora_alpha=8.0)
    assert {x.dtype for x in jax.tree.leaves(r.engine._target_params)} == {jnp.dtype(jnp.bfloat16)}
    cfg = config(temperature=0.9)
    assert_logprobs_match(trainer, r.generate(PROMPTS, cfg), cfg, temperature=0.9, atol=0.15)


def test_lora_mistakes_are_named_and_change_nothing():
    trainer = lora_llama(0)
    with pytest.raises(ValueError, match="LoRA adapters .*give lora_alpha="):
        SpecRollout(rollout_actor=trainer, tokenizer=TOKENIZER, rollout_config=config())
    with pytest.raises(ValueError, match="lora_alpha is not the provider's"):  # the forward check
        SpecRollout(rollout_actor=trainer, tokenizer=TOKENIZER, rollout_config=config(), lora_alpha=2.0)
    with pytest.raises(ValueError, match="lora_alpha is given but the policy has no LoRA adapters"):
        SpecRollout(rollout_actor=tiny_llama(0), tokenizer=TOKENIZER, rollout_config=config(), lora_alpha=8.0)
    for alpha in (-1.0, "16", "sixteen", [16]):  # a string or list failed in float(), or "16" passed
        with pytest.raises(ValueError, match=rf"lora_alpha must be a positive number, got {re.escape(repr(alpha))}"):
            SpecRollout(rollout_actor=trainer, tokenizer=TOKENIZER, rollout_config=config(), lora_alpha=alpha,
                        check=False)
    r = SpecRollout(rollout_actor=trainer, tokenizer=TOKENIZER, rollout_config=config(), max_batch_size=4,
                    prefill_chunk=16, spec=SpecConfig(method="ngram", num_speculative_tokens=2), lora_alpha=8.0)
    named, _ = param_mapping.flatten(nnx.state(trainer, nnx.LoRAParam))
    cases = [
        ({k: v for k, v in named.items() if k != "layers.1.mlp.up_proj.kernel_lora_b"},
         r"'layers\.1\.mlp\.up_proj\.kernel_lora_a' has no 'layers\.1\.mlp\.up_proj\.kernel_lora_b'"),
        ({k: v for k, v in named.items() if not k.startswith("layers.0.attn.q_proj")},
         r"missing \['layers\.0\.attn\.q_proj\.w'\]"),
        (dict(named, **{"layers.0.attn.q_proj.w_lora_b": jnp.zeros((3, 4, 8))}),
         r"'layers\.0\.attn\.q_proj\.w': lora_a \(32, 4\) and lora_b \(3, 4, 8\) do not share a rank"),
        (dict(named, **{"layers.0.attn.q_proj.w_lora_b": jnp.zeros((4, 2, 8))}),
         r"'layers\.0\.attn\.q_proj\.w': its product has shape \(32, 2, 8\).*'layers\.0\.wq' has shape \(32, 32\)"),
        (dict(named, **{"layers.0.attn.x_proj.w_lora_a": jnp.zeros((32, 4)),
                        "layers.0.attn.x_proj.w_lora_b": jnp.zeros((4, 32))}), r"unexpected \['layers\.0\.attn\.x_proj\.w'\]"),
    ]
    cfg = config(temperature=0.9)
    for state, why in cases:
        with pytest.raises(ValueError, match=why):
            r.update_params(state, (nnx.LoRAParam,))
    assert_logprobs_match(trainer, r.generate(PROMPTS, cfg), cfg, temperature=0.9)  # still served


@pytest.mark.parametrize("lora_rank, rollout_devices", [(0, 1), (4, 2)])
def test_grpo_learner_end_to_end(tmp_path, lora_rank, rollout_devices):
    """Tunix's GRPOLearner, 2 steps, SpecRollout on devices of its own: weights equal the
    trainer's after every sync, no sync compiles anything, rollout logprobs equal Tunix's
    recomputation, GRPO groups arrive as n=G requests. With LoRA (rank 4, the engine
    tensor-parallel over 2 devices) Tunix trains and syncs the adapters only, and the
    engine's weights are the merge."""
    out = tmp_path / "grpo.json"
    env = dict(os.environ, XLA_FLAGS=fast_compile())
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "grpo_tunix.py"),
                           "--steps", "2", "--max-tokens", "8", "--distill-steps", "2",
                           "--lora", str(lora_rank), "--rollout-devices", str(rollout_devices),
                           "--json", str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["syncs"] == 2 and r["sync_compiles"] == [0, 0]
    # a merge sharded over 2 devices may round a float32 ulp apart from this one's by hand
    assert max(r["sync_max_abs_diff"]) <= (0.0 if rollout_devices == 1 else 1e-6)
    if lora_rank:  # the adapters moved the weights the check compares
        assert len(r["lora_max_abs_delta"]) == 2 and min(r["lora_max_abs_delta"]) > 1e-3
    else:
        assert r["lora_max_abs_delta"] == []
    # every compilation is a (K, bucket) program's first use: nothing compiles twice
    assert r["generate_compiles"] == r["generate_new_programs"] and r["generate_compiles"][0] > 0
    assert r["groups"] == [[4, 4], [4, 4]]
    assert max(r["logprob_max_abs_diff"]) < 1e-5 and r["logprob_tokens_compared"] > 20
    assert len(r["distill"]) == 1 and r["distill"][0]["loss_after"] < r["distill"][0]["loss_before"]


def test_memory_lets_a_revisited_prompt_draft_from_last_epochs_rollouts(policy):
    """memory=True: each call's completions become the references of the next call's same
    prompts, so a greedy second epoch is drafted from the first (every draft accepted, from
    the first token on), with the tokens and logprobs unchanged; a method that reads no
    references refuses it."""
    spec = SpecConfig(method="suffix", num_speculative_tokens=4)
    plain = SpecRollout(rollout_actor=policy, tokenizer=TOKENIZER, rollout_config=config(),
                        max_batch_size=4, prefill_chunk=16, spec=spec)
    r = SpecRollout(rollout_actor=policy, tokenizer=TOKENIZER, rollout_config=config(),
                    max_batch_size=4, prefill_chunk=16, spec=spec, memory=True)
    cfg = config(top_p=None, max_tokens_to_generate=12)
    ref = plain.generate(PROMPTS, cfg)
    first = r.generate(PROMPTS, cfg)
    assert len(r.memory) == len(PROMPTS)
    r.engine.reset_metrics()
    second = r.generate(PROMPTS, cfg)
    for out in (first, second):
        assert [t.tolist() for t in out.tokens] == [t.tolist() for t in ref.tokens]
        for lp, ref_lp in zip(out.logprobs, ref.logprobs):
            np.testing.assert_allclose(lp, ref_lp, atol=1e-6)
    # every step but the last (cut by max_tokens) commits K + 1 = 5 tokens of every row
    assert r.engine.metrics()["steps"] == 3 < plain.engine.metrics()["steps"]
    with pytest.raises(ValueError, match="does not read them"):
        SpecRollout(rollout_actor=policy, tokenizer=TOKENIZER, rollout_config=config(),
                    spec=SpecConfig(method="ngram"), memory=True)
    with pytest.raises(ValueError, match="memory must be a RolloutMemory"):
        SpecRollout(rollout_actor=policy, tokenizer=TOKENIZER, rollout_config=config(), memory=[])
