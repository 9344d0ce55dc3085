"""benchmarks/device_check.py: the CPU smoke run end to end (interpret mode, tiny shapes),
its cases kept equal to tests/test_kernels.py, the roofline arithmetic and the K schedule."""

from __future__ import annotations

import json
import os
import re

import jax
import numpy as np
import pytest

from dsd_jax import device_check as dc
from dsd_jax.profile import Profile


def test_cpu_smoke_end_to_end(tmp_path):
    out = tmp_path / "dc"
    assert dc.main(["--cpu-smoke", "--out", str(out)]) == 0
    res = json.loads((out / "device_check.json").read_text())
    assert res["mode"] == "cpu-smoke" and set(dc.SECTIONS) <= set(res)
    k = res["kernels"]
    assert k["backend"] == "interpret" and k["passed"] == k["total"] > 0
    for row in res["timings"]["attention"] + res["timings"]["rejection"]:
        assert row["xla"]["us"] > 0 and row["interpret"]["us"] > 0, row
    assert res["timings"]["attention"][0]["kernel"]["us"] > 0
    assert res["timings"]["rejection"][0]["kernel"]["us"] > 0  # the pass over the vocabulary alone
    sweep = res["timings"]["rejection"][0]["gpu_splits"]  # the GPU sampler's tiling, interpreted
    assert [v["default"] for v in sweep] == [True] and sweep[0]["us"] > 0
    assert res["timings"]["chain_overhead_us"] > 0  # a trivial call's share, beside the kernels
    e2e = res["e2e"]
    assert e2e["tokens_identical"] is True, e2e
    assert e2e["synthetic"]["interpret"]["kernel_backends"] == {"attention": "interpret",
                                                                "rejection": "interpret"}
    prof = res["profile"]
    assert "error" not in prof, prof
    assert prof["acceptance"] == list(dc.VLLM_ACCEPTANCE[:1])
    assert prof["k_schedule_ranges"]["16"][0][:2] == [2, 2]
    loaded = Profile.load(prof["profile_path"])
    assert loaded.meta["acceptance_source"] == "given" and loaded.acceptance == [0.681]
    assert loaded.meta["acceptance_given"] == list(dc.VLLM_ACCEPTANCE)  # the whole published curve
    target_floor, draft_floor = prof["floor"]  # each model against its floors, at the profiled B
    assert (target_floor["role"], target_floor["B"]) == ("target", 2)
    assert target_floor["measured_ms"] == loaded.meta["latency_ms_raw"][0][0][0]  # the K=0 step, raw
    assert draft_floor["role"] == "draft" and draft_floor["measured_ms"] is None  # max_k 1: no increment
    assert draft_floor["in_step"]["K"] == 1 and "share_ms" in draft_floor["in_step"]  # B=2 was profiled
    for row in prof["floor"]:
        assert row["bare_forward_ms"] > 0 and row["roofline_ms"] is None  # no HBM peak on a CPU
        assert row["bare_kernels"] > 0
    assert target_floor["step_kernels"] > target_floor["bare_kernels"]  # the K=0 round: attention, cache, bookkeeping
    report = (out / "device_check.txt").read_text()
    for heading in ("## Kernels on the device", "## Kernel timings", "## End to end",
                    "## ITL(B, K) profile", "vLLM PR, profiled on an H100", "a trivial call in such a chain",
                    "steps against their floors", "the drafter's share of a K=1 step",
                    "at each number of vocab splits"):
        assert heading in report


@pytest.mark.parametrize("tied", [True, False])
def test_floor_bytes_and_bare_step(tied, monkeypatch):
    """The roofline counts every weight a step reads (not an untied embedding table), and the
    bare step is the model's own forward and greedy pick with attention replaced by its queries."""
    import jax.numpy as jnp
    from flax import nnx
    from conftest import scaled, tiny_config
    from dsd_jax import kernels
    from dsd_jax.models import init_model
    from dsd_jax.models.transformer import init_kv_cache
    model = scaled(init_model(tiny_config(tie_word_embeddings=tied), seed=0), 4.0)
    cfg = model.config
    params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    embed = 0 if tied else cfg.vocab_size * cfg.hidden_size
    assert dc.weight_bytes(model) == (params - embed) * 4
    assert dc.kv_bytes(cfg, 3, 10) == 3 * 10 * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4
    tokens = jnp.arange(0, 48, 3, dtype=jnp.int32)
    graphdef, state = nnx.split(model)
    bare = dc.bare_step(graphdef, state, tokens)
    monkeypatch.setattr(kernels, "attend_and_write", lambda q, k, v, pos, kc, vc, rows, backend: (q, kc, vc))
    logits, _ = model(tokens[:, None], jnp.zeros((16, 1), jnp.int32), init_kv_cache(cfg, 16, 4))
    want = jnp.argmax(logits[:, 0], -1)
    assert bare.tolist() == want.tolist() and len(set(want.tolist())) > 1
    # every matmul is done at full width, the keys' and values' too (nothing else reads them):
    # q, k, v, o, gate, up, down a layer and the LM head
    loop, params = dc.bare_loop(model)
    hlo = loop.lower(params, tokens).compile().as_text()
    widths = sorted(int(m) for m in re.findall(r"= f32\[16,(\d+)\]\{[^}]*\} dot\(", hlo))
    kv = cfg.num_kv_heads * cfg.head_dim
    per_layer = [kv, kv, cfg.num_heads * cfg.head_dim, cfg.hidden_size, cfg.intermediate_size,
                 cfg.intermediate_size, cfg.hidden_size]
    assert widths == sorted(per_layer * cfg.num_layers + [cfg.vocab_size]), widths


def test_fused_bare_step_is_the_bare_step_with_fewer_matmuls():
    """The floors' fused variant (wq|wk|wv and gate|up, one matmul each) picks the bare
    step's tokens, with 4 matmuls a layer where the bare step has 7; both are timed,
    interleaved, and the report shows the variant beside the bare forward."""
    import jax.numpy as jnp
    from flax import nnx
    from conftest import scaled, tiny_config
    from dsd_jax.models import init_model
    model = scaled(init_model(tiny_config(qkv_bias=True, qk_norm=True), seed=0), 4.0)
    cfg = model.config
    tokens = jnp.arange(0, 48, 3, dtype=jnp.int32)
    graphdef, state = nnx.split(model)
    want = dc.bare_step(graphdef, state, tokens)
    got = dc.bare_step(graphdef, state, tokens, dc.fused_projections(model))
    assert got.tolist() == want.tolist() and len(set(want.tolist())) > 1
    loop, params = dc.bare_loop(model, fused=True)
    hlo = loop.lower(params, tokens).compile().as_text()
    widths = sorted(int(m) for m in re.findall(r"= f32\[16,(\d+)\]\{[^}]*\} dot\(", hlo))
    qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
    per_layer = [qkv, cfg.hidden_size, 2 * cfg.intermediate_size, cfg.hidden_size]
    assert widths == sorted(per_layer * cfg.num_layers + [cfg.vocab_size]), widths
    (bare_ms, bare_kernels), (fused_ms, fused_kernels) = dc.time_bare_forwards(model, 4, 2, (False, True))
    assert bare_ms > 0 and fused_ms > 0 and fused_kernels < bare_kernels
    row = dc.floor_point(model, "target", 4, 16, None, 2, None)
    assert row["fused_kernels"] < row["bare_kernels"]
    assert "fused projections (wq|wk|wv, gate|up)" in "\n".join(dc.format_floor([row]))


def test_draft_token_cost_from_the_profile():
    """One more draft token: ITL(K+1) - ITL(K) over K >= 1 (K = 0 -> 1 also starts the draft)."""
    from dsd_jax.device_check.profile import _draft_token_ms, _k0_ms
    prof = _profile([[6.4, 6.4, 8.0, 9.5], [5.6, 7.2, 8.7, 10.2], [7.0, 9.0, 11.0, 13.0],
                     [11.0, 20.0, 29.0, 38.0]])
    assert _draft_token_ms(prof, 1) == pytest.approx(1.55)
    assert _draft_token_ms(prof, 256) == pytest.approx(9.0)
    assert _draft_token_ms(prof, 32) is None and _k0_ms(prof, 32) is None  # not profiled
    assert _k0_ms(prof, 16) == 5.6


def test_cases_are_the_cpu_tests():
    import test_kernels as tk
    gpu_attn = [c[1:] for c in tk.ATTN_CASES if c[0] == "gpu"]
    assert [(*c[:6], np.dtype(c[6]).name, *c[7:]) for c in gpu_attn] == [tuple(c) for c in dc.ATTN_CASES]
    assert [tuple(c) for c in tk.REJ_CASES] == [tuple(c) for c in dc.REJ_CASES]
    assert {n: tuple(v) for n, v in tk.MODELS.items()} == dc.TIMING_MODELS
    assert {np.dtype(k).name: v for k, v in tk.TOL.items()} == dc.TOL


def test_roofline_matches_roofline_md():
    # ROOFLINE.md §1, B 8, T 5, L 2048: KV 67.1 MB, q/o + pack 1.31 MB, partials 6.39 MB, 74.8 MB
    r = dc.attention_roofline(8, 5, 32, 8, 2048, 128, itemsize=2, splits=3, r_pad=32)
    assert r["kv_bytes"] == 67_108_864 and r["qo_bytes"] == 1_310_720
    assert r["partial_bytes"] == 6_389_760 and round(r["bytes"] / 1e6, 1) == 74.8
    assert r["flops"] == 4 * 8 * 5 * 32 * 2048 * 128
    assert round(r["ideal_bytes"] / 3.35e12 * 1e6, 1) == 20.4       # "ideal 20.4" us
    r1 = dc.attention_roofline(1, 5, 32, 8, 2048, 128, itemsize=2, splits=8, r_pad=32)
    assert round(r1["bytes"] / 1e6, 1) == 10.7 and r1["ideal_bytes"] / 3.35e12 * 1e6 == pytest.approx(2.5, abs=0.06)
    # §2, B 8, K 4: dense 57.5 MB, one-hot 41.0 MB
    assert round(dc.rejection_roofline(8, 4, 128256, False)["bytes"] / 1e6, 1) == 57.5
    assert round(dc.rejection_roofline(8, 4, 128256, True)["bytes"] / 1e6, 1) == 41.0
    assert dc.hardware_peaks("NVIDIA H100 80GB HBM3") == (3.35e12, 990e12)
    assert dc.hardware_peaks("NVIDIA H100 PCIe")[0] == 2.0e12
    assert dc.hardware_peaks("cpu") is None


def _profile(latency_ms):
    return Profile(device_kind="test", platform="cpu", jax_version="0", method="draft_model",
                   fingerprints={}, batch_sizes=[1, 16, 64, 256], ks=[0, 1, 2, 3],
                   context_lengths=[512], latency_ms=[latency_ms], acceptance=[0.7, 0.4, 0.2])


def test_k_schedule_from_goodput():
    # step time grows with K much faster at large B: the best K falls from 3 to 0
    lat = [[10, 11, 12, 13], [12, 13, 14, 15], [20, 30, 40, 50], [40, 70, 100, 130]]
    rows = dc.k_schedule(_profile(lat), dc.VLLM_ACCEPTANCE)
    assert [r["best_k"] for r in rows] == [3, 3, 1, 0]
    al = 1 + np.cumsum([0, 0.681, 0.391, 0.204])
    assert rows[2]["goodput_tok_per_ms_row"] == pytest.approx(list(al / np.array(lat[2])), abs=1e-4)
    assert dc.schedule_ranges(rows) == [[1, 16, 3], [64, 64, 1], [256, 256, 0]]
    # the engine's controller, with the same acceptance as its prior, agrees here
    prof = _profile(lat)
    prof.acceptance = list(dc.VLLM_ACCEPTANCE[:3])
    assert [r["best_k"] for r in dc.controller_schedule(prof)] == [3, 3, 1, 0]


def test_given_acceptance_needs_max_k_values():
    class E:
        max_k = 3
    with pytest.raises(ValueError, match="at least max_k=3"):
        dc.profile_with_acceptance(E(), [0.5, 0.2])


def test_script_is_a_thin_wrapper():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "benchmarks", "device_check.py")).read()
    assert "from dsd_jax.device_check import main" in text


def test_divergence_gap_on_a_tiny_model():
    from dsd_jax.models import synthetic
    model = synthetic("tiny-llama", dtype="float32")
    prompts = [[5, 6, 7], [1, 2, 3, 4]]
    gap = dc._divergence_gap(model, prompts, [[9, 9], [8, 7, 6]], [None, 2], "float32")
    assert gap["request"] == 1 and gap["position"] == 2 and gap["top2_gap"] >= 0.0


def test_report_names_a_speculative_divergence_and_its_gap():
    row = {"pair": "builtin", "k": 3, "prompts": 4, "max_tokens": 32, "identical": {},
           "spec_vs_plain": {"k": 3, "kernel_backends": {"attention": "pallas", "rejection": "xla"},
                             "identical": False, "matmul_precision": "default",
                             "first_divergence": [None, 7, None, None],
                             "top2_gap": {"request": 1, "position": 7, "near_tie": True}}}
    text = dc.format_report({"e2e": {"builtin": row}})
    assert "against plain greedy at matmul precision default: identical False" in text
    assert "first divergence [None, 7, None, None]" in text and "a near-tie (rounding)" in text
    row["spec_vs_plain"] = {"error": "boom"}
    assert "speculative against plain greedy: ERROR boom" in dc.format_report({"e2e": {"builtin": row}})


def test_time_budget_skips_sections(tmp_path):
    assert dc.main(["--cpu-smoke", "--out", str(tmp_path), "--sections", "kernels,timings",
                    "--time-budget", "-1", "--profile-pair", "qwen3-8b,qwen3-0.6b"]) == 0
    res = json.loads((tmp_path / "device_check.json").read_text())
    assert res["kernels"]["error"].startswith("skipped") and res["timings"]["error"].startswith("skipped")
    assert res["settings"]["profile_pair"] == ["qwen3-8b", "qwen3-0.6b"]
    with pytest.raises(ValueError, match="unknown sections"):
        dc.run(str(tmp_path), dc.Settings.cpu_smoke(), sections=("kernel",))
    assert "## kernels: ERROR skipped" in (tmp_path / "device_check.txt").read_text()


def test_precompile_steps_in_threads():
    import dsd_jax as dsd
    from dsd_jax.models import synthetic
    target, draft = synthetic("tiny-llama", seed=0), synthetic("tiny-llama-draft", seed=1)
    engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=1), max_batch_size=2,
                            max_seq_len=22, batch_buckets=(1, 2))
    # K = 0 only (no draft in the programs: quick to compile); the second bucket in a thread
    assert dc.precompile_steps(engine, range(1), (1, 2), threads=2).startswith("2 programs, 2 threads; the first alone ")
    assert sorted(k for k in engine.programs._compiled if k[0] == "step") == [
        ("step", 0, 1), ("step", 0, 2)]
    assert engine.programs._fallback is False  # restored (CPU: no fallback)


def test_engine_programs_lower_for_cuda_with_pallas(monkeypatch):
    """What the GPU run compiles, checked from this host: the engine's step (K = 0 and 3)
    and prefill programs with backend="pallas" lower for CUDA at Llama-3.1-8B / 3.2-1B head
    shapes (one layer, narrow MLP, small vocabulary), every attention and the rejection
    sampler a Triton call."""
    import functools

    import jax

    import dsd_jax as dsd
    from dsd_jax.kernels import attention_pallas, rejection_pallas
    from dsd_jax.models import synthetic

    real = attention_pallas.resolve_platform

    def as_gpu(platform=None, interpret=False):
        return "gpu" if platform is None else real(platform, interpret)

    monkeypatch.setattr(attention_pallas, "resolve_platform", as_gpu)
    monkeypatch.setattr(rejection_pallas, "resolve_platform", as_gpu)
    small = dict(num_layers=1, vocab_size=4096, hidden_size=256, intermediate_size=256)
    target = synthetic("llama-3.1-8b", **small)   # heads as the real ones: 32 x 128, 8 KV
    draft = synthetic("llama-3.2-1b", **small)    # 32 x 64, 8 KV
    eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=3), max_batch_size=8,
                         max_seq_len=256, batch_buckets=(8,), backend="pallas", prefill_chunk=32)
    p = eng.programs

    from lowering import lower_for  # tests/lowering.py: jax >= 0.11 needs an abstract GPU

    def lower(fn, *args):  # as tests/test_kernels.py: jaxlib lowers Pallas for cuda on a CPU host
        return lower_for("cuda", fn, *args).as_text()

    step = lambda k: jax.jit(p._step_shards(functools.partial(p._rounds, k, 8)), donate_argnums=2)
    # K = 0: one target attention; K = 3: draft catch-up, window and 3 proposals, target
    # verify (one layer each), and the rejection sampler
    assert lower(step(0), *p._args, p._host(())).count("triton") >= 1
    text = lower(step(3), *p._args, p._host(()))
    assert text.count("verify_attention_triton") >= 3 and "rejection" in text
    ints = p._per_shard(8)
    assert "triton" in lower(p._prefill, *p._args, ints, p._per_shard(8, 32), ints, ints, ints, ints)


def test_e2e_builtin_pair_plumbing():
    """The built-in pair's e2e path (the smoke run skips it): XLA against XLA here."""
    s = dc.Settings.cpu_smoke(backend="xla", e2e_batch=1, e2e_max_tokens=2, e2e_k=1)
    r = dc.e2e_builtin(s)
    assert r["tokens_identical"] is True and r["xla"]["greedy"]["tokens"] == 2
    # speculative against plain greedy at the default precision: lossless on this CPU
    sp = r["spec_vs_plain"]
    assert sp["identical"] is True and sp["k"] == 1 and "first_divergence" not in sp, sp
    assert "speculative (K=1" in dc.format_report({"e2e": {"builtin": r}})
    assert re.fullmatch(r"\d+ programs, 8 threads; the first alone [\d.]+ s, the other \d+ in [\d.]+ s",
                        r["xla"]["precompiled"]), r["xla"]["precompiled"]


def test_e2e_saves_the_first_pair_before_the_second(tmp_path, monkeypatch, capsys):
    """A call whose timeout kills the synthetic pair keeps the built-in pair's result: `run`
    rewrites the JSON after it, and each pair says on stderr when it starts."""
    from dsd_jax.device_check import e2e

    row = {"pair": "builtin", "k": 3, "prompts": 4, "max_tokens": 32,
           "identical": {"pallas/greedy": True}, "tokens_identical": True}

    def builtin(s, deadline=None):
        e2e.progress("e2e builtin pair ...")
        return row

    def synthetic(s):
        saved = json.loads((tmp_path / "device_check.json").read_text())
        assert saved["e2e"] == {"builtin": row}
        raise KeyboardInterrupt  # as a call's timeout would end it: nothing after this is written

    monkeypatch.setattr(e2e, "e2e_builtin", builtin)
    monkeypatch.setattr(e2e, "e2e_synthetic", synthetic)
    with pytest.raises(KeyboardInterrupt):
        dc.run(str(tmp_path), dc.Settings.cpu_smoke(builtin=True), ["e2e"], mode="cpu-smoke")
    assert json.loads((tmp_path / "device_check.json").read_text())["e2e"]["builtin"]["tokens_identical"]
    assert "device_check:   e2e builtin pair ..." in capsys.readouterr().err


def test_programs_keep_the_engines_matmul_precision():
    """An engine's programs compile at the matmul precision in effect when it was built (or
    its `matmul_precision=`): in precompile's worker threads too (the context is
    thread-local: they had lost it, and a GPU's f32 dots ran in TF32 in one backend's prefill
    only), and whatever context a later call runs in (programs are compiled once and kept:
    a context around `generate` after `warmup` was silently ignored)."""
    import jax

    import dsd_jax as dsd
    from dsd_jax.models import synthetic
    target = synthetic("tiny-llama", seed=0, dtype="float32")
    kw = dict(max_batch_size=2, max_seq_len=22, batch_buckets=(1, 2))
    highest = "operand_precision={highest,highest}"

    def hlo(engine, b=1):
        return engine.programs._compiled[("step", 0, b)].as_text()

    with jax.default_matmul_precision("highest"):
        built_under = dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), **kw)
    assert dc.precompile_steps(built_under, range(1), (1, 2), threads=2).startswith("2 programs, 2 threads; the first alone ")
    for b in (1, 2):  # bucket 2 compiled in a worker thread
        assert "dot(" in hlo(built_under, b) and highest in hlo(built_under, b), b
    plain = dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), **kw)
    with jax.default_matmul_precision("highest"):
        plain.programs.step(0, 1)
    assert "dot(" in hlo(plain) and highest not in hlo(plain)
    explicit = dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), matmul_precision="highest", **kw)
    explicit.programs.step(0, 1)
    assert highest in hlo(explicit)
    with pytest.raises(ValueError, match="matmul_precision 'bogus' is not a jax.default_matmul_precision"):
        dsd.SpecEngine(target, None, dsd.SpecConfig(method="none"), matmul_precision="bogus", **kw)


def test_run_creates_the_output_folder_first(tmp_path):
    """A section writes into --out before the report does (profile.json): a fresh folder
    given to `--sections profile` lost the finished profile at its end."""
    out = tmp_path / "fresh" / "dc"
    dc.run(str(out), dc.Settings.cpu_smoke(), sections=(), log=lambda m: None)
    assert out.is_dir()


def test_rejection_timing_chain_does_every_call():
    """The chained rejection calls each read their own p, q and g: given the same buffers,
    XLA merged the passes over the vocabulary into one (10 calls timed as 1)."""
    import jax
    import jax.numpy as jnp
    B, K, V = 2, 3, 1024
    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    p = jax.nn.softmax(jax.random.normal(ks[0], (B, K + 1, V)), -1)
    q = jax.nn.softmax(jax.random.normal(ks[1], (B, K, V)), -1)
    d = jax.random.randint(ks[2], (B, K), 0, V, jnp.int32)
    u, g = jax.random.uniform(ks[3], (B, K)), jax.random.gumbel(ks[4], (B, K + 1, V))
    flops = {}
    for n in (1, 4):
        per_call = [tuple(jnp.copy(a) for a in (p, q, d, g)) for _ in range(n)]
        chained = jax.jit(dc.chained_calls(dc.rejection_chain_step("xla")))
        cost = chained.lower(u, (jnp.float32(1e-30),), per_call).compile().cost_analysis()
        flops[n] = (cost[0] if isinstance(cost, list) else cost)["flops"]
    assert flops[4] == pytest.approx(4 * flops[1], rel=0.01)


def test_divergence_verdict_in_ulps_of_the_pairs_dtype():
    # a top logit of 9.5 (binade 8): a near-tie within 4 bf16 ulps (0.25), or 2^-13 of 8 in float32
    assert dc.top2_gap(9.5, 9.3, "bfloat16")["near_tie"] and not dc.top2_gap(9.5, 9.2, "bfloat16")["near_tie"]
    assert dc.top2_gap(9.5, 9.3, "bfloat16")["gap_in_ulps"] == pytest.approx(3.2)
    assert dc.top2_gap(9.5, 9.4995, "float32")["near_tie"] and not dc.top2_gap(9.5, 9.498, "float32")["near_tie"]
    res = {"e2e": {"synthetic": {"pair": "p", "k": 3, "prompts": 2, "max_tokens": 4, "identical": {"x": False},
                                 "greedy_divergence_top2_gap": {"top2_gap": 0.01, "near_tie": True}}}}
    assert "a near-tie (rounding)" in dc.format_report(res)
    res["e2e"]["synthetic"]["greedy_divergence_top2_gap"]["near_tie"] = False
    assert "NOT a near-tie" in dc.format_report(res)


def test_section_deadlines_share_the_time_left():
    secs = list(dc.SECTIONS)
    assert dc.section_deadline(secs, None) is None
    assert dc.section_deadline(secs, 100.0, now=0.0) == 100.0  # the kernel checks: all of it
    assert dc.section_deadline(secs[1:], 100.0, now=0.0) == pytest.approx(30.0)  # 3 of 3 + 3 + 4
    assert dc.section_deadline(secs[2:], 100.0, now=40.0) == pytest.approx(40 + 60 * 3 / 7)
    assert dc.section_deadline(secs[3:], 100.0, now=50.0) == 100.0
    assert dc.section_deadline(["timings"], 100.0, now=0.0) == 100.0  # the last takes the rest
    assert dc.section_deadline(secs[1:], 100.0, now=120.0) == 120.0  # none left


def test_time_budget_cuts_items_and_the_report_says_so(tmp_path):
    """Past a section's deadline its items are skipped, not run; the profile still compiles
    the programs of the first batch size of its order (every K, side by side), times it, and
    holds only that."""
    import time
    past = time.perf_counter() - 1
    s = dc.Settings.cpu_smoke()
    k = dc.check_kernels(s, deadline=past)
    assert k["total"] == 0 and k["skipped"] == len(s.attn_cases) + len(s.rej_cases)
    t = dc.time_kernels(s, deadline=past)
    assert t["attention"] and all(r["skipped"] == dc.SKIPPED for r in t["attention"] + t["rejection"])
    e = dc.end_to_end(s, deadline=past)
    assert e["tokens_identical"] is False and e["synthetic"] == {"skipped": dc.SKIPPED}
    p = dc.profile_pair(dc.Settings.cpu_smoke(profile_buckets=(2, 1)), str(tmp_path), deadline=past)
    assert p["batch_sizes"] == [2] and p["truncated"]["dropped_batch_sizes"] == [1]
    assert re.fullmatch(r"2 programs, 8 threads \(2 left: time budget\); the first alone [\d.]+ s, "
                        r"the other 1 in [\d.]+ s", p["precompiled"]), p["precompiled"]
    assert Profile.load(p["profile_path"]).batch_sizes == [2]
    report = dc.format_report({"kernels": k, "timings": t, "e2e": e, "profile": p})
    assert "0/0 passed, 3 skipped (time budget)" in report and "attention  tiny-llama [2, 3, 40]: skipped" in report
    assert "synthetic: skipped (time budget)" in report and "cut by the time budget" in report
    with pytest.raises(ValueError, match="distinct positive"):
        dc.bucket_order((2, 2))


def test_verify_only_step_and_time_steps(tiny_pair):
    """The floors' verify-only step is the engine's step without its drafter: the target's
    matmuls only (those of a K = 0 step), none of the draft's; `time_steps` times programs
    interleaved on the engine's state and gives the state back usable."""
    from conftest import greedy_reference, make_engine
    from dsd_jax import SamplingParams
    from dsd_jax.device_check.floor import ZeroDrafts, draft_share_point
    from dsd_jax.profiler import time_steps
    target, draft = tiny_pair
    eng = make_engine(target, draft, max_batch_size=2, batch_buckets=(2,), num_speculative_tokens=2)
    verify = eng.programs.step_with_drafter(ZeroDrafts(inner=eng.drafter), 2, 2)
    dots = lambda exe: len(re.findall(r" dot\(", exe.as_text()))
    assert dots(verify) == dots(eng.programs.step(0, 2)) < dots(eng.programs.step(2, 2))
    with pytest.raises(ValueError, match="not a compiled step"):
        eng.programs.step_with_drafter(ZeroDrafts(inner=eng.drafter), 3, 2)
    ms = time_steps(eng, {"step": eng.programs.step(2, 2), "verify_only": verify}, 2, 20, repeats=3,
                    warmup_reps=1)
    assert [len(v) for v in ms.values()] == [3, 3] and min(ms["step"] + ms["verify_only"]) > 0
    share = draft_share_point(eng, 2, 20, 2)
    assert share["K"] == 2 and share["per_draft_token_ms"] == pytest.approx(share["share_ms"] / 2)
    prompt = [5, 9, 2, 7]
    out = eng.generate([prompt], SamplingParams(temperature=0.0, max_tokens=6))[0]
    assert out.token_ids == greedy_reference(target, prompt, 6)


def test_kernel_launches():
    """Kernels one run of an optimized HLO module launches, counted from its entry: a loop's
    body and condition once, a conditional's largest branch, instructions but plumbing; what a
    fusion or a reduction calls runs inside one kernel; a bare forward launches the same
    number per layer."""
    hlo = """HloModule m
%fused (p: f32[2]) -> f32[2] {
  %p = f32[2]{0} parameter(0)
  ROOT %n = f32[2]{0} negate(%p)
}
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
%body (t: (s32[], f32[2])) -> (s32[], f32[2]) {
  %t = (s32[], f32[2]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[2]{0} get-tuple-element(%t), index=1
  %f = f32[2]{0} fusion(%x), kind=kLoop, calls=%fused
  %r = f32[] reduce(%f, %c), dimensions={0}, to_apply=%add
  %d = f32[2]{0} custom-call(%f), custom_call_target="__cublas$gemm"
  ROOT %o = (s32[], f32[2]{0}) tuple(%i, %d)
}
%cond (t: (s32[], f32[2])) -> pred[] {
  %t = (s32[], f32[2]{0}) parameter(0)
  ROOT %lt = pred[] compare(%t, %t), direction=LT
}
%yes (x: f32[2]) -> f32[2] {
  %x = f32[2]{0} parameter(0)
  ROOT %e = f32[2]{0} exponential(%x)
}
ENTRY %main (x: f32[2]) -> f32[2] {
  %x = f32[2]{0} parameter(0)
  %w = (s32[], f32[2]{0}) while(%x), condition=%cond, body=%body
  %k = f32[2]{0} conditional(%p, %x, %x), branch_computations={%yes, %yes}
  ROOT %y = f32[2]{0} copy(%x)
}
"""
    # the body: fusion, reduce, gemm; the condition's compare, the branch's exp, the entry's copy
    assert dc.kernel_launches(hlo) == 3 + 1 + 1 + 1
    import jax.numpy as jnp
    from conftest import tiny_config
    from dsd_jax.models import init_model
    counts = []
    for layers in (1, 2, 3):
        loop, params = dc.bare_loop(init_model(tiny_config(num_layers=layers), seed=0))
        counts.append(dc.kernel_launches(loop.lower(params, jnp.zeros((2,), jnp.int32)).compile().as_text()))
    assert counts[2] - counts[1] == counts[1] - counts[0] > 0, counts


def _no_run(*args, **kw):
    raise AssertionError("a section ran")


@pytest.mark.parametrize("argv, message", [
    (["--profile-buckets", "2,2"], "--profile-buckets: profile buckets must be distinct positive"),
    (["--profile-buckets", "0"], "--profile-buckets: profile buckets must be distinct positive"),
    (["--profile-buckets", "1,x"], "--profile-buckets: need comma-separated integers"),
    (["--profile-contexts", "0"], "--profile-contexts: context lengths must be positive"),
    (["--profile-pair", "llama-3.1-8b,nope"], "--profile-pair: unknown synthetic model 'nope'"),
    (["--e2e-pair", "llama-3.1-8b"], "--e2e-pair: needs TARGET,DRAFT"),
    (["--e2e-pair", "llama-3.1-8b,"], "--e2e-pair: needs TARGET,DRAFT"),
    (["--sections", ","], "--sections: no section"),
    (["--sections", "kernel"], "--sections: unknown 'kernel'"),
    (["--sections", "kernels,kernels"], "--sections: a section twice"),
    (["--cpu"], "unrecognized arguments: --cpu"),  # no abbreviation of --cpu-smoke (the script's CPU switch)
    (["--cpu-s"], "unrecognized arguments: --cpu-s"),
])
def test_flags_are_checked_before_anything_runs(tmp_path, monkeypatch, capsys, argv, message):
    """A bad flag is a usage error (exit 2, naming it) before any section starts: they had
    failed inside their section (after minutes of device time) or as tracebacks, and an empty
    --sections wrote nothing and exited 0."""
    from dsd_jax.device_check import command
    monkeypatch.setattr(command, "run", _no_run)
    with pytest.raises(SystemExit) as e:
        dc.main(["--cpu-smoke", "--out", str(tmp_path / "dc"), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "dc").exists()


def test_smoke_profile_fits_its_contexts():
    """--cpu-smoke --profile-contexts 64 had kept max_seq_len 22 and failed in the profile."""
    assert dc.Settings.cpu_smoke().profile_max_seq_len == 22  # the e2e engine's: one compile for both
    assert dc.Settings.cpu_smoke(profile_contexts=(16, 64)).profile_max_seq_len >= 64
    assert dc.Settings.cpu_smoke(profile_max_seq_len=30).profile_max_seq_len == 30


def test_earlier_results_are_kept_unless_overwrite(tmp_path, monkeypatch, capsys):
    """An --out folder with an earlier run's outputs is refused up front (the first section
    had rewritten its device_check.json), unless --overwrite; an --out that is a file is a
    usage error, not a traceback."""
    from dsd_jax.device_check import command
    monkeypatch.setattr(command, "run", _no_run)
    for name in ("device_check.json", "profile.json"):
        out = tmp_path / name.split(".")[0]
        out.mkdir()
        (out / name).write_text('{"earlier": true}')
        with pytest.raises(SystemExit) as e:
            dc.main(["--cpu-smoke", "--out", str(out), "--sections", "kernels"])
        assert e.value.code == 2 and f"{name}' exists; pass --overwrite" in capsys.readouterr().err
        assert (out / name).read_text() == '{"earlier": true}'
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as e:
        dc.main(["--cpu-smoke", "--out", str(tmp_path / "file"), "--sections", "kernels"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--out: " in err and "exists and is not a directory" in err
    monkeypatch.setattr(command, "run", lambda *a, **kw: {"kernels": {"passed": 0, "total": 0}})
    assert dc.main(["--cpu-smoke", "--out", str(tmp_path / "device_check"), "--sections", "kernels",
                    "--overwrite"]) == 0


def test_exit_status_says_whether_anything_failed(tmp_path, monkeypatch, capsys):
    """Exit 1 when a correctness check failed or a section (or an item in one) raised, after
    the results and the report are written; a section or item cut by the time budget is no
    failure."""
    from dsd_jax.device_check import command
    bad = {"backend": "interpret", "attention": [{"case": "c0", "rel_err": float("nan"), "tol": 1e-5,
                                                  "nan_match": False, "ok": False}],
           "rejection": [], "passed": 0, "total": 1, "skipped": 0}
    monkeypatch.setattr(command, "check_kernels", lambda s, deadline=None: bad)
    out = tmp_path / "dc"
    assert dc.main(["--cpu-smoke", "--out", str(out), "--sections", "kernels"]) == 1
    assert json.loads((out / "device_check.json").read_text())["kernels"]["attention"][0]["ok"] is False
    captured = capsys.readouterr()
    assert "-> FAIL" in captured.out and "FAILED kernels: c0" in captured.err
    assert dc.failures({"kernels": {"attention": [{"case": "c", "ok": True}, {"skipped": dc.SKIPPED}]},
                        "timings": {"error": "skipped: 9 s of the 1 s budget used", "skipped": dc.SKIPPED},
                        "e2e": {"synthetic": {"skipped": dc.SKIPPED}, "tokens_identical": False}}) == []
    assert dc.failures({"timings": {"error": "RuntimeError: boom"}}) == ["timings: RuntimeError: boom"]
    assert dc.failures({"timings": {"attention": [{"xla": {"error": "OOM"}}]}}) == ["timings.attention[0].xla: OOM"]
    assert dc.failures({"e2e": {"synthetic": {"tokens_identical": False}}}) == [
        "e2e.synthetic: tokens differ across backends"]


def test_results_are_strict_json_written_whole(tmp_path):
    """A kernel's NaN error is null in device_check.json (a bare NaN is not JSON) and "nan" in
    the report; a write that fails leaves the earlier file whole (it had been truncated)."""
    res = {"mode": "cpu-smoke", "kernels": {"backend": "interpret", "passed": 0, "total": 1, "skipped": 0,
                                            "attention": [{"case": "c0", "rel_err": float("nan"), "tol": 1e-5,
                                                           "nan_match": False, "ok": False}],
                                            "rejection": []},
           "inf": [np.float32("inf"), 1.5]}
    dc.write_results(res, str(tmp_path))

    def strict(c):
        raise ValueError(c)
    saved = json.loads((tmp_path / "device_check.json").read_text(), parse_constant=strict)
    assert saved["kernels"]["attention"][0]["rel_err"] is None and saved["inf"] == [None, 1.5]
    assert "rel err nan (tol 1e-05)" in (tmp_path / "device_check.txt").read_text()
    assert "rel err - (tol" in dc.format_report(saved)  # the report also reads back from the JSON

    class Unprintable:
        def __str__(self):
            raise RuntimeError("killed mid-write")
    before = (tmp_path / "device_check.json").read_text()
    with pytest.raises(RuntimeError):
        dc.write_results({**res, "late": Unprintable()}, str(tmp_path))
    assert (tmp_path / "device_check.json").read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["device_check.json", "device_check.txt"]


def test_hardware_peaks_by_exact_device_kind():
    """Peaks of a device kind known exactly; others unknown (no floors), not a substring's:
    "NVIDIA H100 NVL" had an H100 SXM's 3.35 TB/s, a GH200 the H200's 4.8, an A100 40GB 2.0."""
    assert dc.hardware_peaks("NVIDIA H200") == (4.8e12, 990e12)
    assert dc.hardware_peaks("NVIDIA H100 80GB HBM3") == (3.35e12, 990e12)
    assert dc.hardware_peaks("NVIDIA A100-SXM4-40GB")[0] == 1.555e12
    assert dc.hardware_peaks("NVIDIA A100-SXM4-80GB")[0] == 2.039e12
    for kind in ("NVIDIA H100 NVL", "NVIDIA GH200 480GB", "NVIDIA H200 NVL", "TPU v5 lite", "cpu"):
        assert dc.hardware_peaks(kind) is None, kind
    info = {"device_kind": "NVIDIA H100 NVL", "platform": "gpu", "hbm_bytes_per_s": None}
    assert "peak HBM bandwidth UNKNOWN for this device kind" in dc.format_report({"device": info})
    info = {**info, "device_kind": "NVIDIA H200", "hbm_bytes_per_s": 4.8e12}
    assert "peak HBM 4.80 TB/s" in dc.format_report({"device": info})
