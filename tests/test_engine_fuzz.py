"""A few cases of the engine's differential fuzzer (`engine_fuzz.py`): each a random engine
(a K that changes every dispatch) and request mix, drafter-invariant, so every completion
must equal plain decoding's token for token. Longer campaigns: `python tests/engine_fuzz.py
--cases N --seed S`."""

import pytest

from engine_fuzz import random_case, run_case


# ngram (its second call threaded), eagle3 (Pallas kernels interpreted), suffix (a memory; its
# first call threaded); draft_model: 96
@pytest.mark.parametrize("seed", [1, 9, 19])
def test_random_engines_and_request_mixes_decode_as_plain(seed):
    case = random_case(seed)
    assert case.acceptance == "drafter_invariant" and case.max_k > 0
    assert case.backend == ("interpret" if seed == 9 else "xla")
    assert ("threaded" in [mode for mode, _ in case.modes]) == (seed != 9)
    failures = run_case(case)
    assert not failures, f"case {seed} ({case.engine_spec()}):\n" + "\n".join(failures[:10])


def test_requests_with_few_allowed_ids_and_bad_words_over_them_decode_as_plain():
    """`--constrained`: 12 of the 15 requests carry allowed ids and bad words (where a
    completion can be left with nothing to draw, see `dead_ends`)."""
    case = random_case(8020, constrained=True)
    assert case.acceptance == "drafter_invariant" and case.max_k > 0
    requests = [sp for _, params, _ in case.calls for sp in params]
    assert sum(bool(sp.allowed_token_ids and sp.bad_words) for sp in requests) == 12 and len(requests) == 15
    failures = run_case(case)
    assert not failures and case.refused == 0, f"case 8020 ({case.engine_spec()}):\n" + "\n".join(failures[:10])


def test_the_invariants_name_each_kind_of_violation():
    """`completion_problems` is not vacuous: each rule flags a completion breaking it, and
    passes one that keeps them all."""
    import dataclasses
    from types import SimpleNamespace

    from dsd_jax import SamplingParams
    from engine_fuzz import Pieces, completion_problems
    case = dataclasses.replace(random_case(1), max_seq_len=64, eos_token_ids=())
    word = Pieces().decode([5, 6])  # the two-token bad word (5, 6)
    sp = SamplingParams(max_tokens=6, min_tokens=2, stop_token_ids=[9], allowed_token_ids=[1, 2, 5, 6, 9],
                        bad_words=[word], stop=[Pieces().decode([2])])

    def problems(tokens, finish="stop"):
        return completion_problems(SimpleNamespace(token_ids=tokens, finish_reason=finish), [1], sp, case)

    assert problems([1, 1, 9]) == []
    assert problems([1, 1, 1, 1, 1, 1], "length") == []
    assert "cap" in problems([1] * 7, "length")[0]
    assert "'length' at 3" in problems([1, 1, 1], "length")[0]
    assert "allowed" in problems([1, 3, 9])[0]
    assert "bad word (5, 6)" in problems([1, 5, 6, 9])[0]
    assert "stop id 9 at 0" in problems([9, 1, 9])[0]
    assert "stop string" in problems([1, 1, 2, 1])[0]
    assert problems([2, 1, 1]) == []  # a stop string completed within min_tokens does not stop
