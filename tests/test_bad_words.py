"""vLLM's bad_words: a bad word's last token gets probability 0 wherever the completion's
preceding tokens (drafts included) are the rest of it, in the target's law and the
drafter's. Greedy output equals plain decoding and a full-forward reference; sampled
output is distributed exactly as the banned law (drafter-invariant output:
`test_drafter_invariant_settings.py`)."""

import numpy as np
import pytest

import jax.numpy as jnp

from dsd_jax import SamplingParams, bad_words
from conftest import FixedK, make_engine, oracle_logits, scaled
from test_penalties import PROMPTS, penalised_greedy
from test_spec_sampling import (PROMPT, VOCAB, empirical_joint, exact_joint,  # noqa: F401
                                small_vocab_pair, tv_threshold)  # small_vocab_pair: a fixture


class Words:
    """A made-up tokenizer: `table` holds the ids of each text it may be asked to encode."""

    def __init__(self, table: dict):
        self.table = table

    def encode(self, text, add_special_tokens=True):
        return list(self.table[text])

    def decode(self, ids):
        return " ".join(str(int(i)) for i in ids)


def words_for(sequences) -> tuple[Words, list[str]]:
    """A tokenizer where word "w{i}" is sequences[i], with or without a leading space."""
    names = [f"w{i}" for i in range(len(sequences))]
    table = {}
    for name, seq in zip(names, sequences):
        table[name] = table[" " + name] = list(seq)
    return Words(table), names


def vllm_bans(sequences, past) -> set[int]:
    """vLLM's `_apply_bad_words_single_batch`: the ids banned after completion tokens `past`."""
    out = set()
    for seq in sequences:
        seq = list(seq)
        if len(seq) > len(past) + 1:
            continue
        if len(seq) == 1 or list(past[len(past) - len(seq) + 1:]) == seq[:-1]:
            out.add(seq[-1])
    return out


def banned_greedy(model, prompt, max_tokens, sequences) -> list[int]:
    """Greedy decoding by full forwards, each position's bad-word bans applied."""
    out = []
    for _ in range(max_tokens):
        z = np.array(oracle_logits(model, list(prompt) + out), np.float32)
        z[list(vllm_bans(sequences, out))] = -np.inf
        out.append(int(np.argmax(z)))
    return out


def test_bad_words_tokenize_as_vllm_does_and_are_checked():
    tok = Words({"ab": [5], " ab": [6], "cd ef": [7, 8], " cd ef": [9, 8],
                 "gh": [10, 11], " gh": [12],  # a leading space gives fewer tokens: not kept
                 "ij": [13, 1], " ij": [13, 2],  # the same first token: not kept
                 "long": list(range(17)), " long": [0], "far": [64], " far": [64], "none": [], " none": []})
    assert bad_words.token_sequences(("ab", "  cd ef", "gh", "ij"), tok, 64) == [
        (5,), (6,), (7, 8), (9, 8), (10, 11), (13, 1)]
    for word, why in [("long", "bad word 'long' tokenizes to 17 tokens; at most 16"),
                      ("far", r"bad word 'far' tokenizes to id 64, outside the vocabulary \[0, 64\)"),
                      ("none", "bad word 'none' tokenizes to no tokens")]:
        with pytest.raises(ValueError, match=why):
            bad_words.token_sequences(("ab", word), tok, 64)
    many = Words({f"{s}w{i}": [i] for i in range(65) for s in ("", " ")})
    with pytest.raises(ValueError, match="65 token sequences .* at most 64"):
        bad_words.token_sequences([f"w{i}" for i in range(65)], many, 100)
    row = bad_words.rows([(5,), (7, 8)])
    assert row.shape == (bad_words.MAX_BAD_WORDS, bad_words.MAX_BAD_WORD_TOKENS)
    assert row[0, -2:].tolist() == [-1, 5] and row[1, -3:].tolist() == [-1, 7, 8] and (row[2:] == -1).all()

    assert SamplingParams(bad_words="ab").bad_words == ("ab",)
    assert SamplingParams(bad_words=["ab", " x", "ab"]).bad_words == ("ab", " x")
    for bad, why in [([""], r"bad_words\[0\] is empty"), (["x", "  "], r"bad_words\[1\] is blank"),
                     ([3], r"bad_words\[0\] must be a string"), (b"ab", "must be a string or a sequence")]:
        with pytest.raises(ValueError, match=why):
            SamplingParams(bad_words=bad)


def test_each_position_bans_what_its_completion_so_far_would_complete():
    """`bad_words.bans` against vLLM's rule on random windows: the committed completion
    and the drafts before each position count, the prompt does not; a drafter's next
    proposal (after i of its drafts) gets window position i's bans."""
    rng = np.random.default_rng(0)
    V, B, K, C = 5, 3, 3, 14
    for trial in range(20):
        sequences = [[tuple(rng.integers(0, V, size=rng.integers(1, 4)).tolist()) for _ in range(4)]
                     for _ in range(B)]
        bad = np.stack([bad_words.rows(s) for s in sequences])
        tokens = rng.integers(0, V, size=(B, C)).astype(np.int32)
        prompt_length = rng.integers(1, 5, size=B).astype(np.int32)
        length = prompt_length + rng.integers(0, 6, size=B).astype(np.int32)
        drafts = rng.integers(0, V, size=(B, K)).astype(np.int32)
        args = [jnp.asarray(x) for x in (bad, tokens, prompt_length, length, drafts)]
        window = np.asarray(bad_words.bans(*args, jnp.broadcast_to(jnp.arange(K + 1), (B, K + 1))))
        for b in range(B):
            completion = tokens[b, prompt_length[b]:length[b]].tolist()
            for j in range(K + 1):
                got = set(window[b, j].tolist()) - {-1}
                assert got == vllm_bans(sequences[b], completion + drafts[b, :j].tolist()), (trial, b, j)
        for i in range(K):
            drafted = np.where(np.arange(K) < i, drafts, -1).astype(np.int32)  # a drafter's buffer
            own = bad_words.bans(*args[:4], jnp.asarray(drafted), jnp.full((B, 1), i))
            assert [set(r) for r in np.asarray(own)[:, 0].tolist()] == [set(r) for r in window[:, i].tolist()]
    # no live row has a bad word: nothing is banned (and nothing computed)
    none = bad_words.banned_by_bad_words(jnp.asarray(bad), jnp.zeros(B, bool), *args[1:],
                                         jnp.zeros((B, 2), jnp.int32))
    assert (np.asarray(none) == -1).all()


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return scaled(tiny_pair[0], 3.0), tiny_pair[1]


def _settings(target):
    """Per PROMPTS row: bad token sequences taken from the row's unbanned greedy output, so
    each changes it (row 1 has none): a two-token word, a one-token word, a three-token
    word."""
    free = [penalised_greedy(target, p, 8) for p in PROMPTS]
    return [[free[0][1:3], free[0][5:6]], [], [free[2][0:1]], [free[3][0:3]]]


def test_greedy_with_bad_words_equals_the_full_forward_reference(pair):
    """Rows ban different words (one none) and finish at different steps, so a banning
    row moves into the free row's slot. Plain decoding and the speculative schedules give
    the reference, and a draft model identical to the target has every draft accepted
    (its proposals are banned alike, each after the drafts before it)."""
    target, draft = pair
    sequences = _settings(target)
    lengths = [16, 7, 12, 9]
    expected = [banned_greedy(target, p, m, s) for p, m, s in zip(PROMPTS, lengths, sequences)]
    free = [penalised_greedy(target, p, m) for p, m in zip(PROMPTS, lengths)]
    assert [e != f for e, f in zip(expected, free)] == [True, False, True, True]
    tokenizer, names = words_for([s for row in sequences for s in row])
    it = iter(names)
    params = [SamplingParams(temperature=0.0, max_tokens=m, bad_words=[next(it) for _ in row])
              for m, row in zip(lengths, sequences)]
    engine = make_engine(target, draft, method="draft_model", batch_buckets=(4,), tokenizer=tokenizer)
    for schedule in ([0], [4], [0, 3, 1, 4, 2]):
        engine.controller = FixedK(schedule)
        assert [o.token_ids for o in engine.generate(PROMPTS, params)] == expected, schedule
    ctl = FixedK([4])
    itself = make_engine(target, target, controller=ctl, method="draft_model", batch_buckets=(4,),
                         tokenizer=tokenizer)
    assert [o.token_ids for o in itself.generate(PROMPTS, params)] == expected
    assert all((accepted == k).all() for k, accepted in ctl.observed)


def test_bad_words_need_a_tokenizer_and_fit_the_device(pair):
    target, draft = pair
    engine = make_engine(target, draft, method="draft_model", batch_buckets=(4,))
    with pytest.raises(ValueError, match=r"request 1: bad_words \['x'\] are tokenized: they need an "
                                         "engine with a tokenizer"):
        engine.generate(PROMPTS[:2], [SamplingParams(), SamplingParams(bad_words=["x"])])
    engine.tokenizer = Words({"x": [3], " x": [4], "y": list(range(20)), " y": [1]})
    with pytest.raises(ValueError, match="request 0: bad word 'y' tokenizes to 20 tokens"):
        engine.generate(PROMPTS[:1], SamplingParams(bad_words=["x", "y"]))


def _banned_joint(model, sp: SamplingParams, sequences, prompt=PROMPT) -> np.ndarray:
    """P(t1, t2 | prompt) with the bad-word bans, then temperature, by enumeration in
    numpy float64."""
    def law(completion):
        z = np.array(oracle_logits(model, list(prompt) + completion), np.float64)
        z[list(vllm_bans(sequences, completion))] = -np.inf
        z /= sp.temperature
        p = np.exp(z - z.max())
        return p / p.sum()
    p1 = law([])
    return np.stack([p1[a] * law([a]) for a in range(VOCAB)])


def test_sampled_output_is_the_banned_law_exactly(small_vocab_pair):
    """The joint law of two tokens matches the banned one: the likeliest first token is a
    bad word, and the likeliest second token after the second likeliest first one
    completes another. With power against the plain law."""
    target, draft = small_vocab_pair
    first = np.argsort(oracle_logits(target, PROMPT))
    after = int(np.argmax(oracle_logits(target, PROMPT + [int(first[-2])])))
    sequences = [(int(first[-1]),), (int(first[-2]), after)]
    tokenizer, names = words_for(sequences)
    sp = SamplingParams(temperature=1.0, max_tokens=2, bad_words=names)
    engine = make_engine(target, draft, method="draft_model", draft_sampling="sample", max_batch_size=64,
                         batch_buckets=(64,), controller=FixedK([4]), tokenizer=tokenizer)
    n = 2000
    outs = engine.generate([PROMPT] * n, [SamplingParams(**{**sp.__dict__, "seed": 7000 + i})
                                          for i in range(n)])
    exact = _banned_joint(target, sp, sequences)
    threshold = tv_threshold(exact, n)
    assert 0.5 * np.abs(empirical_joint(outs) - exact).sum() < threshold
    plain = exact_joint(target, SamplingParams(temperature=1.0, max_tokens=2))
    assert 0.5 * np.abs(plain - exact).sum() > 2 * threshold
