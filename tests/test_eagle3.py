"""EAGLE-3 heads: loading the published key layout, the drafter's bookkeeping against a
from-scratch recomputation, and losslessness through the engine (greedy and sampled)."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dsd_jax import SamplingParams, SpecConfig, models, sampling
from dsd_jax.compilation import compilation_count
from dsd_jax.drafters.base import DraftContext
from dsd_jax.drafters.eagle3 import Eagle3
from dsd_jax.models import eagle3 as e3
from dsd_jax.models.eagle3 import Eagle3Config, load_eagle3, save_eagle3
from conftest import FixedK, greedy_reference, make_engine, scaled, tiny_config
from test_spec_sampling import (N_SAMPLES, PROMPT, SAMPLING, VOCAB, empirical_joint, exact_joint,
                                tv_threshold)

AUX = (0, 1, 3)  # a 4-layer target is too shallow for the default (2, L//2, L-3)


def head_tensors(cfg: dict, seed: int, scale: float = 0.3, d2t=None) -> dict:
    """Random weights under the Hugging Face EAGLE-3 keys (linear weights [out, in])."""
    rng = np.random.default_rng(seed)
    d, f, vd = cfg["hidden_size"], cfg["intermediate_size"], cfg["draft_vocab_size"]
    hq = cfg["num_attention_heads"] * cfg["head_dim"]
    hkv = cfg["num_key_value_heads"] * cfg["head_dim"]
    n_aux = len(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    shapes = {"fc.weight": (d, n_aux * d), "midlayer.self_attn.q_proj.weight": (hq, 2 * d),
              "midlayer.self_attn.k_proj.weight": (hkv, 2 * d),
              "midlayer.self_attn.v_proj.weight": (hkv, 2 * d),
              "midlayer.self_attn.o_proj.weight": (d, hq), "midlayer.mlp.gate_proj.weight": (f, d),
              "midlayer.mlp.up_proj.weight": (f, d), "midlayer.mlp.down_proj.weight": (d, f),
              "lm_head.weight": (vd, d)}
    out = {k: (scale * rng.standard_normal(s)).astype(np.float32) for k, s in shapes.items()}
    for k in ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight",
              "midlayer.post_attention_layernorm.weight", "norm.weight"):
        out[k] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    if d2t is None:  # every other target id from 1 up, then the rest: a non-trivial map
        ids = np.sort(rng.choice(cfg["vocab_size"], vd, replace=False))
        d2t = ids - np.arange(vd)
    out["d2t"] = np.asarray(d2t, np.int64)
    t2d = np.zeros(cfg["vocab_size"], bool)
    t2d[np.arange(vd) + out["d2t"]] = True
    out["t2d"] = t2d
    return out


def head_config(vocab: int, draft_vocab: int, aux=AUX) -> dict:
    t = tiny_config()
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "num_hidden_layers": 1, "vocab_size": vocab, "draft_vocab_size": draft_vocab,
            "hidden_size": t.hidden_size, "intermediate_size": 48,
            "num_attention_heads": t.num_heads, "num_key_value_heads": t.num_kv_heads,
            "head_dim": t.head_dim, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(aux)}}


def write_head(path, cfg: dict, tensors: dict):
    from safetensors.numpy import save_file
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file(tensors, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def target():
    return scaled(models.init_model(tiny_config(num_layers=4), seed=0), 3.0)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory):
    cfg = head_config(64, 48)
    return write_head(tmp_path_factory.mktemp("eagle3") / "head", cfg, head_tensors(cfg, seed=1))


@pytest.fixture(scope="module")
def head(head_dir):
    return load_eagle3(head_dir)


# --------------------------------------------------------------------------- loading

def test_load_maps_the_published_keys(head_dir, head):
    from safetensors.numpy import load_file
    raw = load_file(str(head_dir / "model.safetensors"))
    assert isinstance(head.config, Eagle3Config) and head.config.aux_layers == AUX
    np.testing.assert_array_equal(head.fc[...], raw["fc.weight"].T)
    np.testing.assert_array_equal(head.wk[...], raw["midlayer.self_attn.k_proj.weight"].T)
    np.testing.assert_array_equal(head.hidden_norm[...], raw["midlayer.hidden_norm.weight"])
    np.testing.assert_array_equal(head.lm_head[...], raw["lm_head.weight"].T)
    np.testing.assert_array_equal(head.target_ids(jnp.arange(48)), np.flatnonzero(raw["t2d"]))
    # save -> load is the identity, and writes the same keys
    out = save_eagle3(head, head_dir.parent / "resaved")
    again = load_eagle3(out)
    for a, b in zip(jax.tree.leaves(nnx.state(head)), jax.tree.leaves(nnx.state(again))):
        np.testing.assert_array_equal(a, b)
    assert set(load_file(out + "/model.safetensors")) == set(raw)


def test_default_feature_layers_follow_the_target():
    cfg = Eagle3Config(**{**tiny_config(num_layers=1).__dict__}, draft_vocab_size=64)
    assert cfg.target_aux_layers(tiny_config(num_layers=8)) == (2, 4, 5)
    assert cfg.target_aux_layers(tiny_config(num_layers=32)) == (2, 16, 29)
    with pytest.raises(ValueError, match="hidden_size 32 != target hidden_size 64"):
        cfg.target_aux_layers(tiny_config(num_layers=8, hidden_size=64))
    with pytest.raises(ValueError, match="not layers of a 2-layer target"):
        cfg.target_aux_layers(tiny_config(num_layers=2))


@pytest.mark.parametrize("case, match", [
    ("missing", "missing tensor 'midlayer.mlp.up_proj.weight'"),
    ("shape", r"'fc.weight' has shape \(32, 64\), expected \(32, 96\)"),
    ("d2t_range", "d2t maps draft id 47 to target id 64, outside"),
    ("d2t_dup", "maps two draft ids to the same target id"),
    ("t2d", "t2d does not mark exactly"),
    ("extra", "tensor\\(s\\) an EAGLE-3 head does not use: 'midlayer.extra.weight'"),
    ("no_d2t", "no 'd2t' tensor but a reduced draft vocabulary"),
    ("layers", "one decoder layer; config.json says num_hidden_layers=2"),
    ("truncated", r"cannot read '.*model\.safetensors' \(corrupt or truncated safetensors file\?\)"),
    ("int_tensor", r"tensor 'fc\.weight' in '.*model\.safetensors' has dtype int32, expected a floating"),
    ("draft_vocab_str", r"config.json: draft_vocab_size must be an integer, got '48' \(str\)"),
    ("layers_null", "config.json: num_hidden_layers must be an integer, got null"),
    ("eagle_config_list", r"config.json: eagle_config must be an object, got \[0, 1, 3\]"),
    ("aux_str", r"eagle_aux_hidden_state_layer_ids must be a list of layer indices, got '0,1,3'"),
    ("aux_bad", r"aux_layers must be non-negative layer indices, got \(0, 'one', 3\)"),
    ("aux_disagree", r"config.json: eagle_aux_hidden_state_layer_ids \[0, 1, 2\] and "
                     r"eagle_config.eagle_aux_hidden_state_layer_ids \[0, 1, 3\] disagree"),
    ("norm_before_residual", "config.json: norm_before_residual=true is not supported"),
    ("norm_before_fc", "config.json: eagle_config.norm_before_fc=true is not supported"),
    ("no_aux_hidden_state", "config.json: eagle_config.use_aux_hidden_state=false is not supported"),
])
def test_bad_checkpoints_are_clear_errors(tmp_path, case, match):
    cfg = head_config(64, 48)
    t = head_tensors(cfg, seed=2)
    if case == "missing":
        del t["midlayer.mlp.up_proj.weight"]
    elif case == "shape":
        t["fc.weight"] = t["fc.weight"][:, :64]
    elif case == "d2t_range":
        t["d2t"][-1] = 64 - 47
    elif case == "d2t_dup":
        t["d2t"][1] = t["d2t"][0] - 1
    elif case == "t2d":
        t["t2d"] = ~t["t2d"]
    elif case == "extra":
        t["midlayer.extra.weight"] = np.zeros(3, np.float32)
    elif case == "no_d2t":
        del t["d2t"], t["t2d"]
    elif case == "layers":
        cfg["num_hidden_layers"] = 2
    elif case == "int_tensor":
        t["fc.weight"] = (t["fc.weight"] * 100).astype(np.int32)
    elif case == "draft_vocab_str":
        cfg["draft_vocab_size"] = "48"
    elif case == "layers_null":
        cfg["num_hidden_layers"] = None
    elif case == "eagle_config_list":
        cfg["eagle_config"] = list(AUX)
    elif case == "aux_str":
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": "0,1,3"}
    elif case == "aux_bad":
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, "one", 3]}
    elif case == "aux_disagree":
        cfg["eagle_aux_hidden_state_layer_ids"] = [0, 1, 2]
    elif case == "norm_before_residual":
        cfg["norm_before_residual"] = True
    elif case == "norm_before_fc":
        cfg["eagle_config"]["norm_before_fc"] = True
    elif case == "no_aux_hidden_state":
        cfg["eagle_config"]["use_aux_hidden_state"] = False
    path = write_head(tmp_path / case, cfg, t)
    if case == "truncated":
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match=match):
        load_eagle3(path)


def test_feature_layer_ids_are_read_as_vllm_reads_them(tmp_path):
    """The top-level ids (speculators and SpecForge exports) before eagle_config's; both
    may be given if they agree; an empty list is unset; the plain switches' values load."""
    cfg = head_config(64, 48)
    t = head_tensors(cfg, seed=2)
    del cfg["eagle_config"]
    cases = [({"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}, (0, 2, 3)),
             ({"eagle_aux_hidden_state_layer_ids": [0, 2, 3],
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 3]}}, (0, 2, 3)),
             ({"eagle_aux_hidden_state_layer_ids": [],
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}, (1, 2, 3)),
             ({"norm_before_residual": False, "eagle_config": {"use_aux_hidden_state": True}}, None)]
    for i, (extra, aux) in enumerate(cases):
        assert load_eagle3(write_head(tmp_path / str(i), {**cfg, **extra}, t)).config.aux_layers == aux


def test_save_refuses_an_existing_head(tmp_path, head):
    out = save_eagle3(head, tmp_path / "h")
    before = (tmp_path / "h" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match=r"save_eagle3: .* already holds a checkpoint \(config\.json, "
                                         r"model\.safetensors\); pass overwrite=True"):
        save_eagle3(head, out, dtype="bfloat16")
    assert (tmp_path / "h" / "model.safetensors").read_bytes() == before
    save_eagle3(head, out, dtype="bfloat16", overwrite=True)
    assert load_eagle3(out).config.dtype == "float32"  # loads in the dtype asked for, from bf16 weights
    assert json.loads((tmp_path / "h" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="existing file, not a directory"):
        save_eagle3(head, tmp_path / "file")


def die_mid_weights(monkeypatch):
    """From now on a weights file written through `models.eagle3.atomic_write` gets a third
    of its bytes, then the process dies (KeyboardInterrupt). Returns the real atomic_write."""
    real = e3.atomic_write

    class Cut:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[:len(data) // 3])
            raise KeyboardInterrupt

    def killed(path, write, mode="w"):
        real(path, (lambda f: write(Cut(f))) if path.endswith(".safetensors") else write, mode)

    monkeypatch.setattr(e3, "atomic_write", killed)
    return real


def test_save_replaces_each_file_whole(tmp_path, head, monkeypatch):
    """An overwrite writes new files renamed over the old ones, never into them: a save
    killed midway (a trainer checkpoint) leaves the head that was there loadable."""
    out = tmp_path / "h"
    save_eagle3(head, out)
    names = ("model.safetensors", "config.json")
    old = {n: (out / n).read_bytes() for n in names}
    for n in names:  # a second name for each file: an in-place write would change it too
        (tmp_path / n).hardlink_to(out / n)
    real = die_mid_weights(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        save_eagle3(head, out, dtype="bfloat16", overwrite=True)
    assert {n: (out / n).read_bytes() for n in names} == old
    monkeypatch.setattr(e3, "atomic_write", real)
    save_eagle3(head, out, dtype="bfloat16", overwrite=True)
    assert {n: (tmp_path / n).read_bytes() for n in names} == old
    assert all((out / n).read_bytes() != old[n] for n in names)
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary files left
    assert load_eagle3(out).config.dtype == "float32"


def test_missing_directory_and_wrong_draft(tmp_path, target, tiny_pair):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_eagle3(tmp_path / "nope")
    with pytest.raises(ValueError, match="needs an EAGLE-3 head as the draft"):
        make_engine(target, tiny_pair[1], method="eagle3")


# --------------------------------------------------------------------------- bookkeeping

@functools.lru_cache(maxsize=None)
def _reference_programs(graph, S: int):
    """The from-scratch head in three jitted pieces, built once per (head graph, sequence
    length) and shared by every `reference_q` call (jits defined inside it, and the eager
    `lax.cond` of the sampling code, compiled again on every call)."""
    @jax.jit
    def window(hstate, embed, feats, tokens, L):
        head = nnx.merge(graph, hstate)
        pos = jnp.arange(S - 1)
        pos = jnp.where(pos <= L - 2, pos, -1)[None]
        kv = models.init_kv_cache(head.config, 1, S)
        h, logits, kv = head(head.project(feats[None, :S - 1]), tokens[None, 1:], pos, kv, embed)
        return h[:, L - 2], logits[:, L - 2], kv

    @jax.jit
    def chained(hstate, embed, h, d, pos, kv):
        h, logits, kv = nnx.merge(graph, hstate)(h[:, None], d[None, None], pos[None, None], kv, embed)
        return h[:, 0], logits[:, 0], kv

    @jax.jit
    def probs(hstate, logits, temperature):
        t = temperature[None]
        proc = sampling.processed_logits(nnx.merge(graph, hstate).target_logits(logits), t,
                                         jnp.array([0]), jnp.array([1.0]))
        return sampling.probs_from_processed(proc, t)[0]

    return window, chained, probs


def reference_q(head, embed, feats, tokens, L, drafts, temperature):
    """q of each draft from scratch: the head over true entries 0..L-2 (the features of
    the full sequence, `feats` [S, F]) in a fresh cache, then chained on the given drafts."""
    graph, hstate = nnx.split(head)
    window, chained, probs = _reference_programs(graph, tokens.shape[0])
    h, logits, kv = window(hstate, embed, feats, jnp.asarray(tokens), L)
    qs = []
    for i, d in enumerate(drafts):
        qs.append(np.asarray(probs(hstate, logits, jnp.float32(temperature))))
        h, logits, kv = chained(hstate, embed, h, jnp.int32(d), jnp.int32(L - 1 + i), kv)
    return np.stack(qs)


def test_proposals_match_a_from_scratch_head(target, head):
    """Chunked prefill, K = 0 rounds (features stored, head not run), catch-up, the K+1
    window and garbage features of rejected positions: every q the drafter proposes equals
    the head run from scratch over the true features."""
    drafter = Eagle3.build(SpecConfig(method="eagle3"), (nnx.graphdef(head), head.config), "xla")
    graph, params = nnx.split(target)
    hparams = (nnx.state(head), target.embed[...])
    rng = np.random.default_rng(0)
    N, cap = 2, 64
    seqs = rng.integers(0, 64, size=(N, cap)).astype(np.int32)
    kv = models.init_kv_cache(target.config, N, cap)
    allpos = jnp.broadcast_to(jnp.arange(cap), (N, cap))
    _, _, feats = models.forward(graph, params, jnp.asarray(seqs), allpos, kv, aux_layers=AUX)
    state = drafter.init_state(N, cap)
    observe = jax.jit(drafter.observe)
    prefill = jax.jit(drafter.prefill)
    propose = jax.jit(drafter.propose, static_argnums=3)
    lengths = np.array([13, 6])
    for start in (0, 8):  # two prompt chunks of 8; model positions stop before the pending token
        pos = start + np.arange(8)[None].repeat(N, 0)
        pos = np.where(pos < lengths[:, None] - 1, pos, -1)
        p = jnp.asarray(pos)
        state = observe(state, feats[:, start:start + 8], p, jnp.arange(N))
        state = prefill(hparams, state, jnp.asarray(seqs[:, start:start + 8]), p, jnp.arange(N))
    state = drafter.admit(state, jnp.arange(N), jnp.asarray(lengths))
    temps = jnp.array([1.0, 0.7], jnp.float32)
    embed = target.embed[...]
    for K in (2, 0, 0, 3, 1, 4, 0, 4, 2):
        L = jnp.asarray(lengths)
        ctx = DraftContext(jnp.asarray(seqs), L, jnp.ones(N, bool), temps, jnp.zeros(N, jnp.int32),
                           jnp.ones(N), jnp.arange(N, dtype=jnp.uint32))
        if K:
            drafts, q, state = propose(hparams, state, ctx, K)
            for r in range(N):
                ref = reference_q(head, embed, feats[r], seqs[r], int(lengths[r]),
                                  np.asarray(drafts[r]), float(temps[r]))
                np.testing.assert_allclose(np.asarray(q[r]), ref, atol=2e-5, err_msg=f"K={K} row {r}")
        # verify: features of [pending, d_1..d_K]; only the accepted prefix is the truth
        n_acc = rng.integers(0, K + 1, size=N)
        vpos = lengths[:, None] - 1 + np.arange(K + 1)
        true = np.asarray(feats)[np.arange(N)[:, None], vpos]
        garbage = rng.standard_normal(true.shape).astype(np.float32) * 100
        f = np.where((np.arange(K + 1)[None] <= n_acc[:, None])[..., None], true, garbage)
        state = observe(state, jnp.asarray(f), jnp.asarray(vpos), None)
        lengths = lengths + n_acc + 1


# --------------------------------------------------------------------------- the engine

PROMPTS = [[1, 2, 3], [5], list(range(7, 25)), [3, 3, 3, 3, 9, 3, 3, 3], [9, 9], [4, 6, 8, 10, 12]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=14)


@pytest.fixture(scope="module")
def engine(target, head):
    # bucket 2 < 4 slots: the drafter's rows 0..B-1 of a larger state
    return make_engine(target, head, method="eagle3", max_batch_size=4, batch_buckets=(2, 4))


@pytest.fixture(scope="module")
def plain_greedy(target):
    """Plain greedy decoding of PROMPTS (a from-scratch forward per token), computed once."""
    return [greedy_reference(target, prompt, GREEDY.max_tokens) for prompt in PROMPTS]


@pytest.mark.parametrize("schedule", [[1], [2], [3], [4], [0, 3, 0, 0, 4, 1, 2, 0, 0, 0, 4]])
def test_greedy_matches_plain_decoding(engine, plain_greedy, schedule):
    """Six requests on four slots: queued requests join while others run."""
    engine.controller = FixedK(schedule)
    outs = engine.generate(PROMPTS, GREEDY)
    assert [out.token_ids for out in outs] == plain_greedy


def test_bfloat16_greedy_matches_plain_decoding(head_dir):
    """bf16 on the CPU backend, B >= 2, K >= 2: XLA:CPU has no bf16 x bf16 -> f32 kernel
    for the transposed LM-head dot of the chained draft steps (it crashed in generate)."""
    target = scaled(models.init_model(tiny_config(num_layers=4, dtype="bfloat16"), seed=0), 3.0)
    head = load_eagle3(head_dir, dtype="bfloat16")
    prompts, sp = PROMPTS[:4], SamplingParams(temperature=0.0, max_tokens=8)
    plain = make_engine(target, None, method="none", num_speculative_tokens=0, batch_buckets=(4,))
    expected = [o.token_ids for o in plain.generate(prompts, sp)]
    engine = make_engine(target, head, method="eagle3", controller=FixedK([2, 4, 3]),
                         batch_buckets=(4,))
    assert [o.token_ids for o in engine.generate(prompts, sp)] == expected


def test_no_compilation_after_warmup(engine, target):
    engine.controller = FixedK([0, 4, 2, 0, 1, 3])
    engine.warmup()
    before = compilation_count()
    for n in (1, 4, 7):
        engine.generate([[1 + i, 2, 3] for i in range(n)], SamplingParams(temperature=0.0, max_tokens=9))
    engine.set_params(target=scaled(target, 1.01))
    engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=9))
    engine.set_params(target=target)
    assert compilation_count() == before


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    """An 8-token target and a head proposing 6 of its ids (q = 0 on the other two)."""
    target = scaled(models.init_model(tiny_config(vocab_size=VOCAB), seed=3), 6.0)
    cfg = head_config(VOCAB, 6, aux=(0, 1))
    t = head_tensors(cfg, seed=4, scale=1.0, d2t=[0, 0, 1, 1, 1, 2])
    return target, load_eagle3(write_head(tmp_path_factory.mktemp("e3v") / "h", cfg, t))


@pytest.mark.parametrize("draft_sampling", ["sample", "argmax"])
def test_sampled_output_matches_target_distribution(small_vocab, draft_sampling):
    target, head = small_vocab
    engine = make_engine(target, head, method="eagle3", draft_sampling=draft_sampling,
                         max_batch_size=64, batch_buckets=(64,))
    # two settings per mode, all three over both modes (each run is 2000 requests)
    cases = ([("temperature", 4), ("top_p", 1)] if draft_sampling == "sample"
             else [("top_k", 4), ("temperature", 1)])
    for name, k in cases:
        sp = SAMPLING[name]
        engine.controller = FixedK([k])
        params = [SamplingParams(**{**sp.__dict__, "seed": 1000 * k + i}) for i in range(N_SAMPLES)]
        outs = engine.generate([PROMPT] * N_SAMPLES, params)
        exact = exact_joint(target, sp)
        tv = 0.5 * np.abs(empirical_joint(outs) - exact).sum()
        threshold = tv_threshold(exact, N_SAMPLES)
        assert tv < threshold, (name, k, draft_sampling, tv, threshold)
    # power: first-position acceptance is 1 - TV(p, q) under rejection sampling; a head this
    # far from the target would fail the test if its drafts were emitted unchecked
    acc = engine.metrics()["acceptance_per_position"][0]
    assert 1 - acc > 2 * threshold, (acc, threshold)


def test_drafter_invariant_equals_plain_sampling(small_vocab):
    target, head = small_vocab
    prompts = [[1, 5, 2], [3], [2, 2, 7, 1, 2, 2, 7, 1, 2]]
    params = [SamplingParams(temperature=1.0, max_tokens=20, seed=11),
              SamplingParams(temperature=0.7, top_k=4, max_tokens=20, seed=12),
              SamplingParams(temperature=1.0, top_p=0.8, max_tokens=20, seed=13)]
    plain = make_engine(target, None, method="none", num_speculative_tokens=0, batch_buckets=(4,))
    expected = [o.token_ids for o in plain.generate(prompts, params)]
    engine = make_engine(target, head, method="eagle3", acceptance="drafter_invariant",
                         num_speculative_tokens=2, controller=FixedK([2, 0, 1, 0, 0, 2, 1, 0]),
                         batch_buckets=(4,))
    assert [o.token_ids for o in engine.generate(prompts, params)] == expected


@pytest.fixture(scope="module")
def builtin_head():
    return Eagle3.load_model(SpecConfig(method="eagle3", model="builtin"))


def test_builtin_head_fits_the_builtin_target(builtin_head):
    from safetensors import safe_open
    from dsd_jax.models.builtin import BUILTIN_DIR
    head = builtin_head
    target_cfg = models.ModelConfig.from_dict(json.loads((BUILTIN_DIR / "target" / "config.json").read_text()))
    assert head.config.target_aux_layers(target_cfg) == (2, 4, 5)
    assert head.config.draft_vocab_size < head.config.vocab_size
    with safe_open(str(BUILTIN_DIR / "eagle3" / "model.safetensors"), "np") as f:
        assert str(f.get_tensor("fc.weight").dtype) == "bfloat16"  # shipped small
    with pytest.raises(ValueError, match="must be 'builtin' or an EAGLE-3 head directory"):
        SpecConfig(method="eagle3", model="/no/such/head")


@pytest.mark.parametrize("program", [("step", 0, 4), ("step", 2, 2), ("step", 4, 4),
                                     ("prefill", 2, 16), ("move", 1), ("slot_rows", 1)])
def test_no_whole_cache_work(engine, program):
    """As tests/test_hlo_structure.py for the draft model: the head's cache and the feature
    buffer are only ever updated in place (K = 0 included, where features are stored)."""
    from test_hlo_structure import _shape_str, whole_cache_ops
    st = engine.state
    shapes = {_shape_str(x) for cache in (st.target_kv, st.drafter.kv) for x in cache.k + cache.v}
    shapes.add(_shape_str(st.drafter.features))
    hlo = getattr(engine.programs, program[0])(*program[1:]).as_text()
    bad = whole_cache_ops(hlo, shapes)
    assert not bad, f"{program}: whole-cache ops in the compiled HLO:\n" + "\n".join(bad)


def test_engine_loads_the_head_its_spec_names(builtin_head, target):
    """SpecConfig(method="eagle3", model=...) without draft=: the engine loads the head, in
    the target's dtype; model unset: the built-in head, only for the built-in target."""
    from dsd_jax import SpecEngine
    for dtype in ("float32", "bfloat16"):
        builtin_target, _, _ = models.builtin(dtype)
        for model in ("builtin", None):
            spec = SpecConfig(method="eagle3", model=model, num_speculative_tokens=2)
            engine = SpecEngine(builtin_target, None, spec, max_batch_size=1, max_seq_len=64)
            assert engine.draft_config == builtin_head.config.replace(dtype=dtype)
            assert engine.state.drafter.features.dtype == jnp.dtype(dtype)
    for model in (None, "builtin"):  # named or by default, the built-in head fits its target only
        with pytest.raises(ValueError, match=r"'eagle3' needs an EAGLE-3 head trained for this target: "
                                             r"pass SpecConfig\(model=<head directory>\) or draft="):
            SpecEngine(target, None, SpecConfig(method="eagle3", model=model), max_batch_size=1,
                       max_seq_len=64)


def test_engine_refuses_a_head_for_another_target(target, head):
    """Checked when the engine is built, not at the first generate (the feature layers
    are only read while tracing)."""
    from dsd_jax.models.eagle3 import init_eagle3
    narrow = init_eagle3(Eagle3Config(**{**tiny_config(num_layers=1, hidden_size=16, num_heads=2,
                                                       num_kv_heads=1).__dict__},
                                      draft_vocab_size=48, aux_layers=AUX))
    with pytest.raises(ValueError, match="head hidden_size 16 != target hidden_size 32"):
        make_engine(target, narrow, method="eagle3")
    deep = init_eagle3(head.config.replace(aux_layers=(0, 1, 9)))
    with pytest.raises(ValueError, match=r"feature layers \(0, 1, 9\) are not layers of a 4-layer target"):
        make_engine(target, deep, method="eagle3")


def test_memory_report_sizes_the_head(engine, head):
    """The head's own params (not a Transformer's: fc, a layer over [embedding, hidden], the
    draft-vocabulary LM head), its one-layer cache and the feature buffer, as allocated."""
    nbytes = lambda tree: sum(x.nbytes for x in jax.tree.leaves(tree))  # noqa: E731
    report, st = engine.memory_report(), engine.state
    assert report["params"]["draft"] == nbytes(nnx.state(head))
    assert report["kv_cache"]["draft"] == nbytes(st.drafter.kv) > 0 and len(st.drafter.kv.k) == 1
    assert report["features"] == st.drafter.features.nbytes == 4 * engine.capacity * 3 * 32 * 4
    assert report["total"] == sum(report["params"].values()) + nbytes(st)


def test_bench_runs_the_head_beside_the_draft_model(target, head, tiny_pair):
    """`run_bench` with both drafters in one process: every output checked against vanilla's,
    eagle3-dynamic on a profile of its own engine. One batch bucket of 4 slots and K <= 4 for
    the head: the module engine's shapes, so its programs come from the compilation cache."""
    from dsd_jax import bench
    rng = np.random.default_rng(5)
    prompts = [rng.integers(1, 64, size=int(rng.integers(4, 10))).tolist() for _ in range(6)]
    rows = bench.run_bench(target, scaled(tiny_pair[1], 3.0), None, prompts, eagle3=head,
                           configs="static-1,eagle3-static-2,eagle3-dynamic", batch_sizes=[1, 4],
                           batch_buckets=[4], max_seq_len=64, prefill_chunk=16, max_k=4, repeats=1,
                           max_tokens=6, prompt_len=10, rows_per_point=2, workloads=("sweep",), quick=True,
                           log=None)
    meta = rows[-1]
    assert meta["configs"] == ["vanilla", "static-1", "eagle3-static-2", "eagle3-dynamic"]
    assert meta["max_k_by_method"] == {"draft_model": 1, "eagle3": 4} and meta["lossless"] is True
    assert set(meta["profiles"]) == {"eagle3"} and meta["profile"] is None
    assert {(r["batch_size"], r["config"]) for r in rows[:-1]} == {
        (b, c) for b in (1, 4) for c in meta["configs"]}
    assert all(r["lossless"] and r["mismatched_requests"] == 0 for r in rows[:-1])
    dyn = [r for r in rows[:-1] if r["config"] == "eagle3-dynamic"]
    assert all(set(map(int, r["k_hist"])) <= set(range(5)) and "itl_mape" in r["controller"] for r in dyn)
    assert set(bench.summarize(rows)["stops_paying_at"]) == {
        "draft_model (best static K)", "eagle3 (best static K)", "eagle3-dynamic"}
