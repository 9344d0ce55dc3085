"""Run by tests/test_mesh.py in a fresh process with 4 fake CPU devices (the device count
is fixed when the backend starts, and the rest of the suite runs on one). Prints one JSON
object of results; the assertions live in test_mesh.py."""

import json
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = "4"
sys.path.insert(0, os.path.dirname(__file__))
from xla_flags import use_fast_compile  # noqa: E402

# A collective waits up to 3 minutes for a slow device thread (XLA:CPU's default is 60 s);
# past that XLA:CPU aborts, and `background.py` runs the suite once more (a rare hang at
# one all-reduce, seen only beside the rest of the suite).
use_fast_compile("--xla_cpu_collective_call_terminate_timeout_seconds=180")

import functools  # noqa: E402
import tempfile  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from conftest import FixedK, oracle_logits, scaled, tiny_config  # noqa: E402
from dsd_jax import SamplingParams, SpecConfig, SpecEngine, kernels, models  # noqa: E402
from dsd_jax import step as step_lib  # noqa: E402
from dsd_jax.compilation import compilation_count, enable_persistent_cache  # noqa: E402
from dsd_jax.sharding import make_mesh as mesh  # noqa: E402

# Many engines here compile the same programs (one per mesh and case): cached on disk, the
# repeats load instead of compiling (290 s -> 204 s alone on 2 cores). Loads still count
# as compilations, so the zero-after-warm-up checks below are unchanged.
_cache = tempfile.TemporaryDirectory(prefix="dsd_mesh_xla_cache_")
enable_persistent_cache(_cache.name)

PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [3, 3, 3, 3, 9, 3],
           [4, 6], [9, 9, 9]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
COUPLED = SamplingParams(temperature=1.0, max_tokens=12, seed=11)

# GQA target with 2 KV heads: fewer than a model axis of 4 (replicated), as many as 2 (split)
target = scaled(models.init_model(tiny_config(), seed=0), 3.0)
draft = models.init_model(tiny_config(num_layers=1, hidden_size=16, intermediate_size=32,
                                      num_heads=2, num_kv_heads=1), seed=1)


def engine(m, method="draft_model", backend="auto", max_logprobs=0):
    """Drafter-invariant acceptance: greedy is plain greedy, and sampling is comparable
    token for token with another engine's (the suite is compile-bound: few programs).
    4 slots: 4, 2 or 1 per data shard."""
    per_shard = 4 // (1 if m is None else m.shape["data"])
    return SpecEngine(target, draft if method == "draft_model" else None,
                      SpecConfig(method=method, num_speculative_tokens=2, acceptance="drafter_invariant"),
                      max_batch_size=4, max_seq_len=64, prefill_chunk=16,
                      batch_buckets=sorted({1, per_shard}), controller=FixedK([0, 1, 2, 2]), mesh=m,
                      backend=backend, max_logprobs=max_logprobs)


def tokens(e, params):
    return [o.token_ids for o in e.generate(PROMPTS, params)]


def shard_fractions(e):
    """name -> (elements on device 0) / (elements), for every target param."""
    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(e._target_params):
        out[jax.tree_util.keystr(path)] = [x.addressable_shards[0].data.size / x.size, x.size]
    return out


def outputs(m, with_ngram=True):
    e = engine(m)
    r = {"greedy_draft": tokens(e, GREEDY), "coupled": tokens(e, COUPLED),
         "memory": e.memory_report()}
    if with_ngram:
        r["greedy_ngram"] = tokens(engine(m, "ngram"), GREEDY)
    return e, r


results = {}
_, results["single"] = outputs(None)
e, results["1x4"] = outputs(mesh(1, 4))
results["1x4"]["params"] = shard_fractions(e)
results["1x4"]["kv_spec"] = list(e.state.target_kv.k[0].sharding.spec)
e2, results["1x2"] = outputs(mesh(1, 2), with_ngram=False)
results["1x2"]["kv_spec"] = list(e2.state.target_kv.k[0].sharding.spec)
# jax.make_mesh's default Explicit axes (the model's gathers failed while tracing): the
# engine takes the mesh in Auto mode
explicit = jax.make_mesh((1, 2), ("data", "model"), devices=jax.devices()[:2])
results["1x2_explicit"] = {"greedy_draft": tokens(engine(explicit), GREEDY)}

# zero compilations after warm-up: batch sizes 1 -> 4 -> 1, K changes, and new params from
# a jitted "training step" on the same mesh (device to device, under a transfer guard)
e.warmup()
before = compilation_count()
for n in (1, 4, 1):
    e.generate(PROMPTS[:n], GREEDY)
train_step = jax.jit(lambda p: jax.tree.map(lambda x: x * 1.01, p))
new_params = train_step(e._target_params)  # same mesh, same shardings
train_compiles = compilation_count() - before
with jax.transfer_guard_host_to_device("disallow"):
    e.set_params(target=new_params)
e.generate(PROMPTS, GREEDY)
results["compilations_after_warmup"] = compilation_count() - before - train_compiles

# the Pallas kernels (interpreted) under shard_map: heads local on 1x2, replicated KV on 1x4.
# Sampled rounds run the attention program greedy ones run, and interpreted rounds are
# slow: sampling is compared on 1x2 only
for m in (2, 4):
    pallas = engine(mesh(1, m), backend="interpret")
    results[f"pallas_1x{m}"] = {"greedy": tokens(pallas, GREEDY)}
    if m == 2:
        results["pallas_1x2"]["coupled"] = tokens(pallas, COUPLED)
with jax.set_mesh(mesh(1, 2)):
    q = jax.ShapeDtypeStruct((1, 2, 4, 8), "float32")
    kv = jax.ShapeDtypeStruct((4, 2, 32, 8), "float32")
    new = jax.ShapeDtypeStruct((1, 2, 2, 8), "float32")
    pos = jax.ShapeDtypeStruct((1, 2), "int32")
    hlo = jax.jit(functools.partial(kernels.attend_and_write, backend="interpret")).lower(
        q, new, new, pos, kv, kv).as_text()
# shard_map lowers to a Shardy manual computation (or, with GSPMD, full-to-shard calls)
results["pallas_hlo_per_device"] = "manual_computation" in hlo or "SPMDFullToShardShape" in hlo

# the rejection-sampled law on 1x4 (the statistical test of test_spec_sampling.py)
from test_spec_sampling import PROMPT, VOCAB, empirical_joint, exact_joint, tv_threshold  # noqa: E402

small_target = scaled(models.init_model(tiny_config(vocab_size=VOCAB), seed=3), 6.0)
small_draft = scaled(models.init_model(tiny_config(vocab_size=VOCAB, num_layers=1), seed=4), 6.0)
n = 2000
sp = SamplingParams(temperature=1.0, max_tokens=2)
exact = exact_joint(small_target, sp)
for d, m in ((1, 4), (2, 2)):
    law = SpecEngine(small_target, small_draft, SpecConfig(num_speculative_tokens=2), max_batch_size=64,
                     max_seq_len=16, prefill_chunk=16, batch_buckets=(64 // d,), controller=FixedK([2]),
                     mesh=mesh(d, m))
    outs = law.generate([PROMPT] * n, [SamplingParams(temperature=1.0, max_tokens=2, seed=7 + i)
                                       for i in range(n)])
    results[f"law_{d}x{m}"] = {"tv": 0.5 * float(abs(empirical_joint(outs) - exact).sum()),
                               "threshold": tv_threshold(exact, n),
                               "draft_tv": 0.5 * float(abs(exact_joint(small_draft, sp) - exact).sum())}

# data parallel: 2x2 and 4x1, each data shard packing its own requests
GROUP = SamplingParams(temperature=1.0, max_tokens=8, seed=3, n=3)
ref = engine(None)
results["single"]["group"] = [o.token_ids for o in ref.generate(PROMPTS[:2], GROUP)]
results["single"]["group_seeds"] = tokens_by_seed = [  # each completion alone, seed 3 + g
    o.token_ids for p in PROMPTS[:2] for o in ref.generate(
        [p] * 3, [SamplingParams(temperature=1.0, max_tokens=8, seed=3 + g) for g in range(3)])]
# without a mesh, new params committed to another device move onto the engine's device
# (they were stored as given, and the next generate failed on the input shardings)
ref.set_params(target=jax.device_put(ref._target_params, jax.devices()[1]))
results["single"]["param_devices_after_move"] = sorted(
    {d.id for x in jax.tree.leaves(ref._target_params) for d in x.devices()})
results["single"]["greedy_after_move"] = tokens(ref, GREEDY)
# without a mesh, a model whose weights live elsewhere (device 1, or sharded over a
# trainer's mesh) is served from the default device (the first generate failed on the
# input shardings); and a caller's `jax.set_mesh` around the engine does not reach its
# programs (the Pallas kernels traced per device of that mesh, and the state kept its layout)
elsewhere = {}
for name, where in (("device_1", jax.devices()[1]),
                    ("replicated_2", jax.sharding.NamedSharding(mesh(2, 1), jax.sharding.PartitionSpec()))):
    moved = scaled(models.init_model(tiny_config(), seed=0), 3.0)
    from flax import nnx  # noqa: E402
    nnx.update(moved, jax.device_put(nnx.state(moved), where))
    e = SpecEngine(moved, None, SpecConfig(method="ngram", num_speculative_tokens=2,
                                           acceptance="drafter_invariant"),
                   max_batch_size=4, max_seq_len=64, prefill_chunk=16, batch_buckets=[1, 4])
    elsewhere[name] = tokens(e, GREEDY)
results["single"]["params_elsewhere"] = elsewhere
ambient = engine(None, backend="interpret")
with jax.set_mesh(mesh(1, 2)):
    inside = tokens(ambient, GREEDY)
results["single"]["ambient_mesh"] = [inside, tokens(ambient, GREEDY)]
data_parallel = {}  # one engine per mesh, reused below (each new one loads its programs again)
for d, m in ((2, 2), (4, 1)):
    e = data_parallel[d, m] = engine(mesh(d, m))
    r = results[f"{d}x{m}"] = {"greedy_draft": tokens(e, GREEDY), "coupled": tokens(e, COUPLED),
                               "memory": e.memory_report(),
                               "kv_spec": list(e.state.target_kv.k[0].sharding.spec),
                               "group": [o.token_ids for o in e.generate(PROMPTS[:2], GROUP)]}
    # the step programs that ran (none compiled up front): their batch buckets per shard
    r["buckets_run"] = sorted({key[2] for key in e.programs._compiled if key[0] == "step"})
# uneven lengths on 2x2: six requests through four slots, the per-shard live rows traced
uneven = [SamplingParams(temperature=0.0, max_tokens=m) for m in (4, 20, 8, 16, 12, 6)]
ref_uneven = [o.token_ids for o in ref.generate(PROMPTS, uneven)]
dp = data_parallel[2, 2]
dp.reset_metrics()  # the trace below is this call's
results["2x2"]["uneven"] = [o.token_ids for o in dp.generate(PROMPTS, uneven)] == ref_uneven
results["2x2"]["shard_rows"] = [t["shard_rows"] for t in dp.stats.trace]
# many requests finishing together on 2x2 with 16 slots a shard: each shard moves its
# finished slots two swaps a call (`buckets.move_buckets`), and the tokens are one device's
wide = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=2,
                                            acceptance="drafter_invariant"),
                  max_batch_size=32, max_seq_len=64, prefill_chunk=16, batch_buckets=[16],
                  controller=FixedK([2]), mesh=mesh(2, 2))
many = [PROMPTS[i % len(PROMPTS)] for i in range(24)]
lengths = [SamplingParams(temperature=0.0, max_tokens=1 + i % 7) for i in range(24)]
results["2x2"]["batched_moves"] = {
    "same": [o.token_ids for o in wide.generate(many, lengths)] == [o.token_ids for o in ref.generate(many, lengths)],
    "move_rows": list(wide.programs.move_rows), "two_a_call": wide.programs.is_compiled("move", 2)}
# on an XLA:CPU mesh every program call waits for its outputs (`programs._Waited`), on one
# device none does
results["waits_each_call"] = {"2x2": wide.programs.waits_each_call, "single": ref.programs.waits_each_call,
                              "move_waits": type(wide.programs.move(2)).__name__}
del wide
# prompts beginning alike on 2x2: each shard prefills its first one whole and copies it
# into the other (`share_prefixes`); tokens as one device's, which shares differently
preamble = [(5 * i + 3) % 60 + 2 for i in range(34)]
alike = [preamble + tail for tail in ([1], [2, 3], [4, 5, 6], [7])]
short = SamplingParams(temperature=0.0, max_tokens=8)
dp.reset_metrics()
first_turn = dp.generate(alike, short)
results["2x2"]["shared_prefixes"] = {
    "same": [o.token_ids for o in first_turn] == [o.token_ids for o in ref.generate(alike, short)],
    "shared_tokens": dp.metrics()["shared_prefix_tokens"]}
# a second turn on 2x2: each prompt, its completion and two more tokens, in an order that
# placing by load alone would send half of them to the other shard than their first turn's
turn2 = [alike[i] + list(first_turn[i].token_ids) + [9, 9] for i in (3, 1, 0, 2)]
dp.reset_metrics()
second_turn = dp.generate(turn2, short)
results["2x2"]["next_turn"] = {
    "same": [o.token_ids for o in second_turn] == [o.token_ids for o in ref.generate(turn2, short)],
    "shared_tokens": dp.metrics()["shared_prefix_tokens"], "want": sum(len(p) - 3 for p in turn2)}
# third turns one call at a time: first the episode kept in shard 0's slot 1, whose taker
# fills slot 0 and swaps with it (`prefix_sharing.preserve`), then the one slot 0 kept,
# whose record the swap moved to slot 1
turn3 = [p + list(o.token_ids) + [9, 9] for p, o in zip(turn2, second_turn)]
kept = {slot: r.sequence.tolist() for slot, r in dp._retained[0].items()}
episode = {slot: next(i for i, p in enumerate(turn3) if p[:len(seq)] == seq) for slot, seq in kept.items()}
tiny = SamplingParams(temperature=0.0, max_tokens=4)
results["2x2"]["one_at_a_time"] = {"same": [], "shared_tokens": [], "want": []}
for slot in (1, 0):
    dp.reset_metrics()
    got, want = (e.generate([turn3[episode[slot]]], tiny)[0].token_ids for e in (dp, ref))
    case = results["2x2"]["one_at_a_time"]
    case["same"].append(got == want)
    case["shared_tokens"].append(dp.metrics()["shared_prefix_tokens"])
    case["want"].append(len(turn3[episode[slot]]) - 3)
# stop strings on 2x2: a row stopped on the host frees its slot on its own shard (by a move
# to nowhere where it is its shard's last row), and the tokens are one device's


class Letters:  # a token decodes to a letter
    decode = staticmethod(lambda ids: "".join(chr(97 + int(i) % 26) for i in ids))


ref.tokenizer = dp.tokenizer = Letters()
texts = [Letters.decode(t) for t in ref_uneven]
stops = [SamplingParams(temperature=0.0, max_tokens=m, stop=text[2:4] if len(text) >= 4 else None)
         for m, text in zip((4, 20, 8, 16, 12, 6), texts)]
ref_stops = ref.generate(PROMPTS, stops)
dp_stops = dp.generate(PROMPTS, stops)
results["2x2"]["stop_strings"] = {
    "same": [o.token_ids for o in dp_stops] == [o.token_ids for o in ref_stops],
    "stopped": sum(o.stop_reason is not None for o in dp_stops),
    "shorter": sum(len(o.token_ids) < len(t) for o, t in zip(dp_stops, ref_uneven)),
    "active_after": bool(jax.device_get(dp.state.active).any())}
# a goodput controller (the makespan objective, the default) on 2x2: it gets the fullest
# shard's rows as the batch and every live request's id
from dsd_jax import DynamicConfig  # noqa: E402
from dsd_jax.controller import Controller  # noqa: E402
from dsd_jax.profile import Profile  # noqa: E402

dyn_spec = SpecConfig(method="draft_model", num_speculative_tokens=2, acceptance="drafter_invariant",
                      dynamic=DynamicConfig(warmup_steps=0))
prof = Profile("cpu", [1, 2], [0, 1, 2], [[1.0, 1.1, 1.2], [1.2, 1.3, 1.4]], [0.8, 0.6], method="draft_model")
dp = SpecEngine(target, draft, dyn_spec, max_batch_size=4, max_seq_len=64, prefill_chunk=16, batch_buckets=[1, 2],
                controller=Controller(dyn_spec, prof, 2, batch_buckets=[1, 2]), mesh=mesh(2, 2))
results["2x2"]["dynamic_uneven"] = [o.token_ids for o in dp.generate(PROMPTS, uneven)] == ref_uneven
results["2x2"]["dynamic_ks"] = sorted({t["k"] for t in dp.stats.trace})
dp = engine(mesh(2, 2), backend="interpret")
results["pallas_2x2"] = {"greedy": tokens(dp, GREEDY)}

# top logprobs on 2x2: the top-k over logits split by vocabulary on "model", per data shard;
# the prompts' from the scored prefill (its outputs shard after shard), its LM head applied
# one position at a time (a budget of 1 byte, read when the program compiles). Each entry
# against a full forward on one device (cheaper than a single-device engine in this serial job)
TOP = SamplingParams(temperature=1.0, max_tokens=6, seed=5, logprobs=3, prompt_logprobs=3)
checked = {"top_logprobs": [], "prompt_logprobs": []}  # per entry: (ids as the full forward's, |diff|)
budget, step_lib.PROMPT_LOGITS_BYTES = step_lib.PROMPT_LOGITS_BYTES, 1
scored = engine(mesh(2, 2), max_logprobs=3).generate(PROMPTS, TOP)
step_lib.PROMPT_LOGITS_BYTES = budget
for prompt, o in zip(PROMPTS, scored):
    for which, seq, entries in (("prompt_logprobs", prompt, o.prompt_logprobs),
                                ("top_logprobs", prompt + o.token_ids, [None] * len(prompt) + o.top_logprobs)):
        for t in range(1, len(seq)):
            if entries[t] is None:
                continue
            logits = np.asarray(oracle_logits(target, seq[:t]), np.float64)
            want = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
            ids = list(entries[t])
            checked[which].append((ids[:3] == np.argsort(-want, kind="stable")[:3].tolist()
                                   and len(ids) == 3 + (seq[t] not in ids[:3]),
                                   max(abs(entries[t][i] - want[i]) for i in ids)))
results["2x2"]["logprobs_vs_full_forward"] = checked

dp = data_parallel[2, 2]
dp.warmup()
before = compilation_count()
for n in (1, 4, 1):
    dp.generate(PROMPTS[:n], GREEDY)
dp.generate(PROMPTS[:2], GROUP)
new_params = train_step(dp._target_params)
train_compiles = compilation_count() - before
with jax.transfer_guard_host_to_device("disallow"):
    dp.set_params(target=new_params)
dp.generate(PROMPTS, GREEDY)
results["dp_compilations_after_warmup"] = compilation_count() - before - train_compiles

print("RESULTS " + json.dumps(results))
