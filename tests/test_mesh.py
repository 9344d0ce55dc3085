"""The engine on a `jax.sharding` mesh: tensor parallel on "model", data parallel on "data"
(4 fake CPU devices).

The mesh cases run in a subprocess (`mesh_cases.py`), started at collection so it overlaps
the rest of the suite: the number of CPU devices is fixed when a process starts its
backend, and this suite runs on one.
"""

import jax
from jax.sharding import PartitionSpec as P
import pytest

from dsd_jax import SpecConfig, models
from dsd_jax.sharding import memory_report, param_spec

import background


@pytest.fixture(scope="module")
def results():
    (out,) = background.results("test_mesh.py")  # started at collection (`background.py`)
    return out


@pytest.mark.parametrize("mesh, case", [("1x4", "greedy_draft"), ("1x4", "greedy_ngram"),
                                        ("1x4", "coupled"), ("1x2", "greedy_draft"),
                                        ("1x2", "coupled"), ("2x2", "greedy_draft"),
                                        ("2x2", "coupled"), ("2x2", "group"),
                                        ("4x1", "greedy_draft"), ("4x1", "coupled"),
                                        ("4x1", "group"), ("1x2_explicit", "greedy_draft")])
def test_outputs_identical_to_one_device(results, mesh, case):
    """Greedy, and drafter-invariant sampling with the same seeds, token for token."""
    assert results[mesh][case] == results["single"][case]


def test_shared_prefixes_on_each_data_shard(results):
    """Four prompts behind one 34-token preamble on 2x2: each data shard prefills one whole
    and its other one copies 34 positions (the shares stop before the 35-token prompt's
    pending last token: 34); tokens equal one device's."""
    assert results["2x2"]["shared_prefixes"] == {"same": True, "shared_tokens": 2 * 34}


def test_a_next_turn_takes_what_each_data_shard_kept(results):
    """A second call whose prompts are the first's, their completions and two more tokens,
    in another order: each is placed on the shard its first turn finished on (two would go
    to the other by load alone), and all but the last three positions of every prompt come
    from the free slot that kept them; tokens equal one device's."""
    turn = results["2x2"]["next_turn"]
    assert turn["same"] and turn["shared_tokens"] == turn["want"]


def test_third_turns_one_at_a_time_keep_each_others_records_on_a_data_shard(results):
    """Third turns one call at a time (as from a thread per episode), each filling slot 0
    of its shard: the first, kept in slot 1, swaps slots with slot 0's record, which the
    second then still takes whole; tokens equal one device's."""
    turn = results["2x2"]["one_at_a_time"]
    assert turn["same"] == [True, True] and turn["shared_tokens"] == turn["want"]


@pytest.mark.parametrize("which", ["top_logprobs", "prompt_logprobs"])
def test_top_logprobs_on_a_mesh(results, which):
    """SamplingParams.logprobs and prompt_logprobs on 2x2 (logits split by vocabulary on
    "model", a data shard each): every entry's top 3 ids, in order, and its own, as a full
    forward on one device gives them, its values to 2e-5."""
    checked = results["2x2"]["logprobs_vs_full_forward"][which]
    assert len(checked) == {"top_logprobs": 6 * 6, "prompt_logprobs": 23}[which]
    assert all(same for same, _ in checked)
    assert max(diff for _, diff in checked) < 2e-5


@pytest.mark.parametrize("mesh", ["pallas_1x2", "pallas_1x4", "pallas_2x2"])
def test_pallas_kernels_per_device_match_one_device(results, mesh):
    """backend="interpret" (the Pallas kernels) under shard_map: heads local on 1x2, every
    head on every device on 1x4 (2 KV heads); tokens equal one device's (XLA). Sampled
    (drafter-invariant) tokens on 1x2 (the same attention program)."""
    assert results[mesh]["greedy"] == results["single"]["greedy_draft"]
    if mesh == "pallas_1x2":
        assert results[mesh]["coupled"] == results["single"]["coupled"]


def test_pallas_attention_runs_under_shard_map(results):
    assert results["pallas_hlo_per_device"]


def test_large_weights_are_split_four_ways(results):
    """Every weight of 1k+ elements holds a quarter per device on 1x4, except the K/V
    projections: 2 KV heads cannot be split 4 ways, so they are replicated by design."""
    for name, (fraction, size) in results["1x4"]["params"].items():
        if size < 1024:
            continue
        expected = 1.0 if any(w in name for w in ("'wk'", "'wv'")) else 0.25
        assert fraction == expected, name


def test_kv_cache_split_by_heads_when_they_divide(results):
    assert results["1x2"]["kv_spec"] == [None, "model", None, None]
    assert results["1x4"]["kv_spec"] == [None, None, None, None]  # 2 KV heads < 4: replicated



def test_memory_report_per_device(results):
    one, four = results["single"]["memory"], results["1x4"]["memory"]
    assert four["mesh"] == {"data": 1, "model": 4}
    # a quarter of every large weight; the norms and the 2-head K/V projections are whole
    assert 0.25 * one["params"]["target"] < four["params"]["target"] < 0.35 * one["params"]["target"]
    assert four["kv_cache"] == one["kv_cache"]  # 2 KV heads do not split 4 ways: replicated
    assert results["1x2"]["memory"]["kv_cache"]["target"] == one["kv_cache"]["target"] // 2


@pytest.mark.parametrize("mesh", ["1x4", "2x2"])
def test_rejection_sampled_law_on_a_mesh(results, mesh):
    """2000 rejection-sampled 2-token completions on 1x4 and 2x2 are distributed as the
    target's law (total variation under the exact sampler's 99.9% quantile), and the test
    has power: the draft's own law is far outside the threshold."""
    law = results[f"law_{mesh}"]
    assert law["tv"] < law["threshold"], law
    assert law["draft_tv"] > 2 * law["threshold"], law


def test_no_compilation_after_warmup(results):
    assert results["compilations_after_warmup"] == 0


def test_weights_from_another_device_and_a_callers_mesh(results):
    single = results["single"]
    assert single["param_devices_after_move"] == [0]
    # built from weights on another device, or on two: served from the default one
    ngram = single["greedy_ngram"]
    assert single["params_elsewhere"] == {"device_1": ngram, "replicated_2": ngram}
    # a caller's jax.set_mesh around a mesh=None engine (Pallas kernels) changes nothing
    assert single["ambient_mesh"] == [single["greedy_draft"]] * 2
    assert single["greedy_after_move"] == single["greedy_draft"]


def test_no_compilation_after_warmup_data_parallel(results):
    """2x2: batch sizes 1 -> 4 -> 1, a group, new params under a transfer guard."""
    assert results["dp_compilations_after_warmup"] == 0


def test_group_completions_are_single_requests_with_seeds_seed_plus_g(results):
    assert results["single"]["group"] == results["single"]["group_seeds"]


def test_data_parallel_balances_requests_over_shards(results):
    """4x1 holds one slot per shard: had admission filled the first global slots, four
    live requests would have needed the 4-row bucket; balanced, every step ran 1 row per
    shard. 2x2's largest bucket is 2 rows per shard."""
    assert results["4x1"]["buckets_run"] == [1]
    assert max(results["2x2"]["buckets_run"]) == 2


def test_data_parallel_uneven_lengths(results):
    """Six requests of 4..20 tokens through 2x2's four slots: tokens equal one device's;
    the first step holds two rows on each shard, no step more than a shard's slots."""
    assert results["2x2"]["uneven"]
    rows = results["2x2"]["shard_rows"]
    assert rows[0] == [2, 2]
    assert all(len(r) == 2 and max(r) <= 2 for r in rows)


def test_data_parallel_moves_finished_slots_two_a_call(results):
    """2x2 with 16 slots a shard, 24 requests of 1..7 tokens: each shard's swaps of
    finished slots go two to a call (the rows over "data", its own shard's on each), and
    the tokens are one device's."""
    r = results["2x2"]["batched_moves"]
    assert r["same"] and r["move_rows"] == [1, 2] and r["two_a_call"], r


def test_programs_wait_for_each_call_on_a_cpu_mesh_only(results):
    """Unwaited collective programs one after another hang XLA:CPU's fake devices
    (docs/design.md section 11): on a CPU mesh each call waits, on one device none does."""
    assert results["waits_each_call"] == {"2x2": True, "single": False, "move_waits": "_Waited"}


def test_data_parallel_stop_strings(results):
    """2x2, six requests through four slots, stop strings taken from each one's own text:
    the tokens are one device's, and no slot stays active on the device after the call."""
    r = results["2x2"]["stop_strings"]
    assert r["same"] and r["stopped"] >= 4 and r["shorter"] >= 4 and not r["active_after"], r


def test_data_parallel_with_a_goodput_controller(results):
    """2x2 under dynamic K (the makespan objective): the controller is asked with the
    fullest shard's rows as the batch and every live request's id (it had refused the
    mismatch); tokens equal one device's, and it speculated."""
    assert results["2x2"]["dynamic_uneven"]
    assert max(results["2x2"]["dynamic_ks"]) > 0


def test_data_parallel_layout_and_memory(results):
    """Slots split on "data", KV heads on "model" (2 heads over 2): a quarter per device."""
    assert results["2x2"]["kv_spec"] == ["data", "model", None, None]
    assert results["4x1"]["kv_spec"] == ["data", None, None, None]
    one = results["single"]["memory"]["kv_cache"]["target"]
    assert results["2x2"]["memory"]["kv_cache"]["target"] == one // 4
    assert results["4x1"]["memory"]["kv_cache"]["target"] == one // 4


LLAMA_8B = models.ModelConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                              num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
                              rope_theta=500000.0, dtype="bfloat16")
LLAMA_1B = models.ModelConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                              num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
                              rope_theta=500000.0, dtype="bfloat16", tie_word_embeddings=True)


def test_memory_report_from_abstract_shapes():
    """Llama-3.1-8B + Llama-3.2-1B, bf16, 64 slots x 4096: sized without allocating."""
    spec = SpecConfig(num_speculative_tokens=4)
    one = memory_report(LLAMA_8B, LLAMA_1B, spec, {"model": 1}, 64, 4096)
    tp8 = memory_report(LLAMA_8B, LLAMA_1B, spec, {"model": 8}, 64, 4096)
    assert one["params"]["target"] == 8_030_261_248 * 2  # Llama-3.1-8B's parameter count
    kv = 2 * 32 * 64 * 8 * (4096 + 4 + 1) * 128 * 2  # K and V, layers, slots, heads, positions, dim
    assert one["kv_cache"]["target"] == kv
    assert tp8["kv_cache"]["target"] == kv // 8  # 8 KV heads over 8 devices
    assert tp8["params"]["target"] == pytest.approx(one["params"]["target"] / 8, rel=0.001)
    assert tp8["total"] < one["total"] / 7.5


def test_meshes_are_taken_in_auto_mode_and_other_values_refused():
    from dsd_jax.sharding import Placement, make_mesh
    auto = make_mesh(1, 1)
    assert Placement(auto, (4, 2), None).mesh is auto
    explicit = jax.make_mesh((1, 1), ("data", "model"))
    assert set(Placement(explicit, (4, 2), None).mesh.axis_types) == {jax.sharding.AxisType.Auto}
    with pytest.raises(TypeError, match=r"mesh must be a jax.sharding.Mesh .*got tuple"):
        Placement((1, 4), (4, 2), None)


def test_kv_heads_that_do_not_divide_the_axis_are_replicated():
    # Qwen2.5-7B: 28 query heads, 4 KV heads under tensor parallel 8 (KV) and 4 (both)
    qwen = (28, 4)
    assert param_spec("wk", (3584, 512), qwen, {"model": 8}) == P()
    assert param_spec("wk", (3584, 512), qwen, {"model": 4}).count("model") == 1
    assert param_spec("wq", (3584, 3584), qwen, {"model": 4})[1] == "model"
    assert param_spec("wo", (3584, 3584), qwen, {"model": 4})[0] == "model"
    assert param_spec("w_up", (3584, 18944), qwen, {"model": 8})[1] == "model"


def test_query_heads_are_never_split_inside_a_head():
    """28 query heads of 128 over 8: 3584 columns divide by 8, but 3.5 heads a device would
    split a head, so q and o are replicated (the MLP and the vocabulary are still split)."""
    qwen = (28, 4)
    for name, shape in (("wq", (3584, 3584)), ("bq", (3584,)), ("wo", (3584, 3584))):
        assert param_spec(name, shape, qwen, {"model": 8}) == P(), name
    assert param_spec("w_down", (18944, 3584), qwen, {"model": 8})[0] == "model"
    assert param_spec("lm_head", (3584, 152064), qwen, {"model": 8})[1] == "model"
