"""SpecConfig / DynamicConfig: vLLM-style dicts, validation, round trips."""

import dataclasses
import json
import math
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsd_jax import drafters
from dsd_jax.config import DynamicConfig, SpecConfig

SCHED = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]


def test_defaults_and_modes():
    s = SpecConfig()
    assert s.method == "draft_model" and s.max_k == 4 and s.controller_mode == "static"
    assert SpecConfig(method="none").controller_mode == "none"
    assert SpecConfig(method="none").max_k == 0  # forced to 0 for plain decoding
    assert SpecConfig(num_speculative_tokens_per_batch_size=SCHED).controller_mode == "schedule"
    assert SpecConfig(dynamic=DynamicConfig(profile="p.json")).controller_mode == "goodput"
    assert SpecConfig(dynamic={}).controller_mode == "goodput"
    assert SpecConfig(disable_by_batch_size=8).controller_mode == "static"
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.method = "ngram"


def test_vllm_dict_shapes():
    s = SpecConfig.from_dict(
        {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    )
    assert (s.method, s.max_k, s.prompt_lookup_min, s.prompt_lookup_max) == ("ngram", 5, 2, 4)
    s = SpecConfig.from_dict({"model": "/ckpt/draft", "num_speculative_tokens": 3,
                              "speculative_disable_by_batch_size": 30})
    assert s.method == "draft_model" and s.model == "/ckpt/draft" and s.disable_by_batch_size == 30
    assert SpecConfig.from_dict({"method": None, "num_speculative_tokens": 2}).method == "draft_model"
    s = SpecConfig.from_dict({"num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": SCHED})
    assert s.num_speculative_tokens_per_batch_size == ((1, 64, 3), (65, 128, 1), (129, 512, 0))
    s = SpecConfig.from_dict({"dynamic": {"profile": "x.json", "margin": 0.1, "per_request": True}})
    assert s.dynamic == DynamicConfig(profile="x.json", margin=0.1, per_request=True)
    assert DynamicConfig().objective == "makespan"
    t = SpecConfig.from_dict({"dynamic": {"objective": "throughput"}})
    assert t.dynamic.objective == "throughput" and SpecConfig.from_dict(t.to_dict()) == t


def test_schedule_lookup_uncovered_is_zero():
    s = SpecConfig(num_speculative_tokens=3, num_speculative_tokens_per_batch_size=[[2, 4, 3], [9, 9, 1]])
    assert [s.schedule_k(b) for b in (1, 2, 4, 5, 8, 9, 10)] == [0, 3, 3, 0, 0, 1, 0]
    s = SpecConfig(num_speculative_tokens=3, num_speculative_tokens_per_batch_size=SCHED,
                   disable_by_batch_size=32)
    assert (s.schedule_k(31), s.schedule_k(32)) == (3, 0)  # vLLM V0: K = 0 from the threshold on


def test_round_trip(tmp_path):
    s = SpecConfig(method="ngram", num_speculative_tokens=6, disable_by_batch_size=16,
                   acceptance="drafter_invariant", draft_sampling="sample", prompt_lookup_min=2,
                   prompt_lookup_max=5, dynamic=DynamicConfig(warmup_steps=3, forgetting=0.2))
    d = s.to_dict()
    assert SpecConfig.from_dict(json.loads(json.dumps(d))) == s
    s2 = SpecConfig(num_speculative_tokens=3, num_speculative_tokens_per_batch_size=SCHED)
    assert SpecConfig.from_json(s2.to_json()) == s2
    p = tmp_path / "spec.json"
    p.write_text(s.to_json())
    assert SpecConfig.from_json(p) == s and SpecConfig.from_json(str(p)) == s


def test_argmax_draft_sampling_ignored_under_drafter_invariant_warns():
    with pytest.warns(UserWarning, match="draft_sampling='argmax' is ignored"):
        s = SpecConfig(acceptance="drafter_invariant", draft_sampling="argmax")
    assert s.draft_sampling == "argmax"  # kept as written, so the config round-trips


@pytest.mark.parametrize(
    "d, field",
    [
        ({"num_speculative_tokens": 4, "foo": 1, "bar": 2}, "'foo', 'bar'"),
        ({"num_speculative_tokens": True}, "num_speculative_tokens"),
        ({"num_speculative_tokens": "4"}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 4.0}, "num_speculative_tokens"),
        ({"num_speculative_tokens": -1}, "num_speculative_tokens"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "eagle"}, "method"),
        ({"method": 3}, "method"),
        ({"model": 3}, "model"),
        ({"disable_by_batch_size": 0}, "disable_by_batch_size"),
        ({"disable_by_batch_size": False}, "disable_by_batch_size"),
        ({"acceptance": "typical"}, "acceptance"),
        ({"draft_sampling": None}, "draft_sampling"),
        ({"prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"prompt_lookup_min": 0}, "prompt_lookup_min"),
        ({"dynamic": True}, "dynamic"),
        ({"dynamic": [1]}, "dynamic"),
        ({"dynamic": {"forgetting": float("nan")}}, "dynamic.forgetting"),
        ({"dynamic": {"forgetting": 0.0}}, "dynamic.forgetting"),
        ({"dynamic": {"forgetting": 1.5}}, "dynamic.forgetting"),
        ({"dynamic": {"probe_interval": -1}}, "dynamic.probe_interval"),
        ({"dynamic": {"probe_interval": 2.5}}, "dynamic.probe_interval"),
        ({"dynamic": {"latency_forgetting": -0.1}}, "dynamic.latency_forgetting"),
        ({"dynamic": {"latency_forgetting": 1.5}}, "dynamic.latency_forgetting"),
        ({"dynamic": {"latency_forgetting": "fast"}}, "dynamic.latency_forgetting"),
        ({"dynamic": {"explore_gap": -0.5}}, "dynamic.explore_gap"),
        ({"dynamic": {"explore_gap": float("nan")}}, "dynamic.explore_gap"),
        ({"dynamic": {"objective": "latency"}}, "dynamic.objective"),
        ({"dynamic": {"objective": None}}, "dynamic.objective"),
        ({"dynamic": {"margin": float("inf")}}, "dynamic.margin"),
        ({"dynamic": {"margin": -0.1}}, "dynamic.margin"),
        ({"dynamic": {"warmup_steps": -1}}, "dynamic.warmup_steps"),
        ({"dynamic": {"warmup_steps": True}}, "dynamic.warmup_steps"),
        ({"dynamic": {"per_request": 1}}, "dynamic.per_request"),
        ({"dynamic": {"profile": 7}}, "dynamic.profile"),
        ({"dynamic": {"prof": "x"}}, "'prof'"),
        ({"num_speculative_tokens_per_batch_size": "1,2,3"}, "num_speculative_tokens_per_batch_size"),
        ({"num_speculative_tokens_per_batch_size": []}, "num_speculative_tokens_per_batch_size"),
        ({"num_speculative_tokens_per_batch_size": [[1, 2]]}, "num_speculative_tokens_per_batch_size[0]"),
        ({"num_speculative_tokens_per_batch_size": [[0, 2, 1]]}, "start_bs"),
        ({"num_speculative_tokens_per_batch_size": [[5, 2, 1]]}, "start_bs 5 > end_bs 2"),
        ({"num_speculative_tokens_per_batch_size": [[1, 2, 9]]}, "K 9 exceeds"),
        ({"num_speculative_tokens_per_batch_size": [[1, 2, True]]}, "(K)"),
        ({"num_speculative_tokens_per_batch_size": [[1, 8, 1], [5, 9, 2]]}, "[1, 8, 1] (entry 0) and [5, 9, 2]"),
        ({"num_speculative_tokens_per_batch_size": [[9, 12, 1], [1, 8, 2]]}, "sorted"),
        ({"num_speculative_tokens_per_batch_size": [[1, 2, 1]], "dynamic": {}}, "mutually exclusive"),
        ({"speculative_disable_by_batch_size": 3, "disable_by_batch_size": 4}, "aliases"),
        ({"method": "none", "num_speculative_tokens_per_batch_size": [[1, 2, 1]]}, "exceeds"),
        ({"method": "none", "dynamic": {}}, "no K to choose"),
        ({"num_speculative_tokens": 65}, "num_speculative_tokens must be <= 64"),
        ({"num_speculative_tokens": 2 ** 40}, "num_speculative_tokens must be <= 64"),
        ({"method": "suffix", "suffix_bank_len": 10 ** 12}, "suffix_bank_len must be <="),
    ],
)
def test_malformed_names_field(d, field):
    with pytest.raises(ValueError) as e:
        SpecConfig.from_dict(d)
    assert field in str(e.value)


def test_not_a_dict_and_bad_json(tmp_path):
    for bad in ([], "x", 3, None):
        with pytest.raises(ValueError):
            SpecConfig.from_dict(bad)
    with pytest.raises(ValueError, match="JSON"):
        SpecConfig.from_json("{not json")
    p = tmp_path / "bad.json"
    p.write_text("[1, 2")
    with pytest.raises(ValueError, match="bad.json"):
        SpecConfig.from_json(p)
    with pytest.raises(ValueError, match="missing.json"):
        SpecConfig.from_json(tmp_path / "missing.json")
    with pytest.raises(ValueError):
        SpecConfig.from_json('{"num_speculative_tokens": NaN}')
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpecConfig.from_json('{"num_speculative_tokens": 1' + "0" * 400 + ".5}")


def test_direct_construction_validates():
    with pytest.raises(ValueError, match="dynamic.margin"):
        SpecConfig(dynamic=DynamicConfig(margin=float("nan")))
    with pytest.raises(ValueError, match="num_speculative_tokens_per_batch_size"):
        SpecConfig(num_speculative_tokens_per_batch_size=[[1, 2, 3]], num_speculative_tokens=2)


@pytest.mark.parametrize("given, sizes", [
    ({"method": "ngram"}, (1, 3)),  # neither: ours, as SpecConfig(method="ngram") (vLLM's: 5 and 5)
    ({"method": "ngram", "prompt_lookup_min": 5}, (5, 5)),
    ({"method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": None}, (4, 4)),
    ({"method": "ngram", "prompt_lookup_max": None, "prompt_lookup_min": 2}, (2, 2)),
    ({"speculative_model": "[ngram]", "ngram_prompt_lookup_max": 4}, (1, 4)),  # V0: the minimum 1
    ({"method": "suffix"}, (1, 3)),  # not vLLM's method: our defaults
    ({"method": "[ngram]", "prompt_lookup_max": 3}, (3, 3)),  # vLLM's other spelling of the method
])
def test_from_dict_fills_ngram_sizes_as_vllm(given, sizes):
    """vLLM fills a missing (or null) bound from the other: {"prompt_lookup_min": 5} was
    refused (min 5 > our default max 3) and null was an error."""
    spec = SpecConfig.from_dict(given)
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == sizes


def test_prompt_lookup_max_has_a_ceiling():
    assert SpecConfig(method="ngram", prompt_lookup_max=64).prompt_lookup_max == 64
    for make in (lambda: SpecConfig(method="ngram", prompt_lookup_max=65),
                 lambda: SpecConfig.from_dict({"method": "suffix", "prompt_lookup_max": 10 ** 6})):
        with pytest.raises(ValueError, match=r"prompt_lookup_max must be <= 64, got \d+: .*compile time"):
            make()


def test_alias_clash_names_both_keys_and_ignores_list_vs_tuple():
    new, old = "num_speculative_tokens_per_batch_size", "num_speculative_tokens_per_bs"
    for first, second in ((new, old), (old, new)):
        with pytest.raises(ValueError, match=f"'{first}' and '{second}' are aliases"):
            SpecConfig.from_dict({first: [[1, 2, 1]], second: [[1, 2, 2]]})
        s = SpecConfig.from_dict({first: [[1, 2, 1]], second: ((1, 2, 1),)})  # equal values
        assert s.num_speculative_tokens_per_batch_size == ((1, 2, 1),)
    with pytest.raises(ValueError, match="'speculative_model' and 'model' are aliases"):
        SpecConfig.from_dict({"speculative_model": "a", "model": "b"})


def test_from_dict_takes_any_mapping():
    s = SpecConfig.from_dict(types.MappingProxyType({"method": "ngram", "dynamic": types.MappingProxyType({})}))
    assert s.method == "ngram" and s.dynamic == DynamicConfig()


# ---------------------------------------------------------------- property tests

json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=10,
)
VALID = {
    "method": "draft_model",
    "num_speculative_tokens": 4,
    "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 32, 2]],
    "disable_by_batch_size": 64,
    "acceptance": "rejection",
    "draft_sampling": "sample",
    "prompt_lookup_min": 1,
    "prompt_lookup_max": 3,
}
# Values that are wrong for each key whatever else the dict holds.
BAD_VALUES = {
    # every registered method name is valid ("eagle3" and "suffix" fit in 6 characters)
    "method": st.one_of(st.text(max_size=6).filter(lambda s: s not in drafters.names()),
                        st.integers(), st.booleans(), st.lists(st.integers(), max_size=2)),
    "num_speculative_tokens": st.one_of(st.booleans(), st.floats(), st.text(max_size=3), st.integers(max_value=-1)),
    "disable_by_batch_size": st.one_of(st.booleans(), st.floats(), st.integers(max_value=0), st.text(max_size=2)),
    "acceptance": st.one_of(st.none(), st.integers(), st.text(max_size=4)),
    "draft_sampling": st.one_of(st.none(), st.integers(), st.text(max_size=4)),
    "prompt_lookup_min": st.one_of(st.booleans(), st.floats(), st.integers(max_value=0)),
    "num_speculative_tokens_per_batch_size": st.one_of(
        st.text(max_size=3), st.integers(), st.just([]),
        st.lists(st.tuples(st.integers(-3, 3), st.integers(-3, 3)).map(list), min_size=1, max_size=3),
        st.just([[1, 8, 1], [8, 9, 1]]), st.just([[1, 8, 5]]), st.just([[1, 2, float("nan")]]),
    ),
    "dynamic": st.one_of(st.booleans(), st.integers(), st.text(max_size=3), st.lists(json_value, max_size=2),
                         st.fixed_dictionaries({"forgetting": st.sampled_from([0.0, -1.0, 2.0, float("nan"),
                                                                                float("inf"), True, "x"])}),
                         st.fixed_dictionaries({"margin": st.sampled_from([-1.0, float("nan"), None, [0.1]])}),
                         st.fixed_dictionaries({"warmup_steps": st.sampled_from([-1, 1.5, True, None])}),
                         st.dictionaries(st.text(min_size=1, max_size=5).filter(
                             lambda k: k not in DynamicConfig._FIELDS), json_leaf, min_size=1, max_size=2)),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(BAD_VALUES)), data=st.data())
def test_malformed_dict_always_value_error(key, data):
    d = dict(VALID)
    d[key] = data.draw(BAD_VALUES[key])
    with pytest.raises(ValueError):
        SpecConfig.from_dict(d)


@settings(max_examples=150, deadline=None)
@given(key=st.one_of(st.sampled_from(sorted(VALID) + ["dynamic", "model", "extra"]), st.text(max_size=4)),
       value=json_value)
def test_any_mutation_is_valid_or_value_error(key, value):
    d = dict(VALID)
    d[key] = value
    try:
        s = SpecConfig.from_dict(d)
    except ValueError:
        return
    # Accepted: it must be a consistent, serialisable config.
    assert SpecConfig.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.controller_mode in ("none", "static", "schedule", "goodput")
    if s.dynamic is not None:
        assert math.isfinite(s.dynamic.margin) and 0 < s.dynamic.forgetting <= 1


def test_vllm_v0_ngram_spelling():
    """vLLM V0 asked for prompt lookup with speculative_model "[ngram]" and
    ngram_prompt_lookup_max/min; it became a draft model named "[ngram]"."""
    spec = SpecConfig.from_dict({"speculative_model": "[ngram]", "num_speculative_tokens": 3,
                                 "ngram_prompt_lookup_max": 4, "ngram_prompt_lookup_min": 2})
    assert (spec.method, spec.model, spec.prompt_lookup_max, spec.prompt_lookup_min) == ("ngram", None, 4, 2)
    with pytest.raises(ValueError, match="means method 'ngram'"):
        SpecConfig.from_dict({"speculative_model": "[ngram]", "method": "eagle3"})
