"""Stop strings (`SamplingParams.stop`): matched in the decoded text on the host, the
completion cut at the token that completes the first match, the slot freed on the device."""

import copy

import numpy as np
import pytest

from dsd_jax import SamplingParams
from dsd_jax.stop_strings import CONTEXT_TOKENS, Match, Text, scan
from conftest import FixedK, greedy_reference, make_engine, scaled


class Pieces:
    """A tokenizer whose token i decodes to two letters (all 64 distinct): a string can
    start inside one token and end inside another."""

    letters = "abcdefgh"

    def piece(self, i: int) -> str:
        return self.letters[i % 8] + self.letters[(i // 8) % 8]

    def decode(self, ids) -> str:
        return "".join(self.piece(int(i)) for i in ids)

    def encode(self, text):  # prompts are token ids in these tests
        raise AssertionError("not used")


# ---- the matcher -----------------------------------------------------------------------

def _scan(decode, tokens, stops, include=False, at_least=0, text=None):
    return scan(decode, tokens, at_least, stops, text or Text(), include)


def test_scan_cuts_at_the_token_that_completes_the_first_match():
    tok = Pieces()
    tokens = [0, 9, 18, 27, 36]  # "aa" "bb" "cc" "dd" "ee"
    # "bc" starts inside token 1 and ends inside token 2: 3 tokens kept, text "aab"
    assert _scan(tok.decode, tokens, ["bc"]) == Match(3, 3, "bc")
    assert _scan(tok.decode, tokens, ["bc"], include=True) == Match(3, 5, "bc")
    # of two strings, the one completed first wins, whatever the order they are listed in
    assert _scan(tok.decode, tokens, ["dde", "bb"]) == Match(2, 2, "bb")
    text = Text()
    assert _scan(tok.decode, tokens, ["zz"], text=text) is None
    assert (text.text, text.read) == ("aabbccddee", 5)


def test_scan_reads_only_new_tokens_and_finds_strings_straddling_them():
    tok = Pieces()
    decoded = []
    decode = lambda ids: decoded.append(len(ids)) or tok.decode(ids)  # noqa: E731
    text = Text()
    tokens = list(range(0, 64, 9)) * 40  # 320 tokens: "aabbccddeeffgghh" again and again
    assert _scan(decode, tokens[:300], ["zz"], text=text) is None
    decoded.clear()
    assert _scan(decode, tokens[:310], ["zz"], at_least=300, text=text) is None
    assert max(decoded) <= 10 + CONTEXT_TOKENS  # the new tokens and a few before them
    first = [0, 9]  # "aabb": no "bc"
    text = Text()
    assert _scan(tok.decode, first, ["bc"], text=text) is None
    # the match began in the tokens already given out: they stay, and the cut is after "cc"
    assert _scan(tok.decode, first + [18, 27], ["bc"], at_least=2, text=text) == Match(3, 3, "bc")


def test_a_match_must_end_past_the_text_read_before():
    """The text `Text` read before is not searched again: under min_tokens it is the first
    tokens' text, where a match does not count (vLLM); a match straddling its end does."""
    tok = Pieces()
    tokens = [0, 9, 18, 27, 9]  # "aa" "bb" "cc" "dd" "bb"
    text = Text()
    text.extend(tok.decode, tokens[:2])  # "aabb": min_tokens=2, not searched
    assert _scan(tok.decode, tokens, ["bb"], at_least=3, text=copy.copy(text)) == Match(5, 8, "bb")
    assert _scan(tok.decode, tokens, ["bc"], at_least=3, text=copy.copy(text)) == Match(3, 3, "bc")
    assert _scan(tok.decode, tokens[:4], ["ab"], at_least=3, text=copy.copy(text)) is None


def test_scan_waits_for_an_incomplete_character():
    """A byte-level tokenizer decodes half a character to U+FFFD: the text stops before it,
    so a string that needs the whole character is found once the next token completes it."""
    from tokenizers import Tokenizer
    from dsd_jax.models.builtin import BUILTIN_DIR
    tok = Tokenizer.from_file(str(BUILTIN_DIR / "tokenizer.json"))
    ids = tok.encode("x \u6f22 y").ids  # a CJK character: three byte tokens in this vocabulary
    halves = [i for i in ids if tok.decode([i]) == "\ufffd"]
    assert len(halves) == 3
    cut = ids.index(halves[0]) + 1  # the character's first byte read, two to come
    text = Text()
    assert _scan(tok.decode, ids[:cut], ["\u6f22"], text=text) is None
    assert text.read < cut and not text.text.endswith("\ufffd")
    hit = _scan(tok.decode, ids, ["\u6f22"], at_least=cut, text=text)
    assert hit == Match(cut + 2, 2, "\u6f22") and tok.decode(ids[:hit.keep]).endswith("\u6f22")


def test_a_match_before_an_incomplete_character_is_found_at_once():
    """A dispatch whose tokens complete "STOP" and end one byte into a CJK character: the
    text before that character is searched now. It was left for the next dispatch, whose
    tokens could no longer be cut back: the completion kept 7 tokens where vLLM keeps 5."""
    from tokenizers import Tokenizer
    from dsd_jax.models.builtin import BUILTIN_DIR
    tok = Tokenizer.from_file(str(BUILTIN_DIR / "tokenizer.json"))
    ids = tok.encode("x = 1 STOP \u6f22 y").ids
    need = next(n for n in range(1, len(ids) + 1) if "STOP" in tok.decode(ids[:n]))
    cut = next(j for j, i in enumerate(ids) if tok.decode([i]) == "\ufffd") + 1
    assert cut > need
    text = Text()
    assert _scan(tok.decode, ids[:cut], ["STOP"], text=text) == Match(need, 6, "STOP")
    # under min_tokens the first tokens' text, up to the incomplete character, is not searched
    text = Text()
    text.extend(tok.decode, ids[:cut])
    assert text.read < cut and text.searched == len("x = 1 STOP ")
    assert _scan(tok.decode, ids, ["STOP"], at_least=cut + 1, text=text) is None


def test_scan_with_the_builtin_tokenizer():
    from tokenizers import Tokenizer
    from dsd_jax.models.builtin import BUILTIN_DIR
    tok = Tokenizer.from_file(str(BUILTIN_DIR / "tokenizer.json"))
    ids = tok.encode("def f(x):\n    return x\n\n\nprint(f(2))").ids
    text = Text()
    for n in range(1, len(ids) + 1):  # a token at a time, as the engine's rounds come
        hit = _scan(tok.decode, ids[:n], ["\n\n"], at_least=n - 1, text=text)
        if hit:
            break
    assert hit.keep == n and "\n\n" not in tok.decode(ids[:n - 1]) and "\n\n" in tok.decode(ids[:n])
    assert tok.decode(ids[:n])[:hit.text_end] == "def f(x):\n    return x"
    assert text.text == tok.decode(ids[:n])


def test_stop_strings_are_checked():
    assert SamplingParams(stop="\n").stop == ("\n",)
    assert SamplingParams(stop=["a", "b", "a"]).stop == ("a", "b")
    assert SamplingParams(stop=None).stop == ()
    for bad, match in (([""], "empty"), ([1], "must be a string"), (b"x", "string"), (3, "string")):
        with pytest.raises(ValueError, match=match):
            SamplingParams(stop=bad)
    with pytest.raises(ValueError, match="include_stop_str_in_output"):
        SamplingParams(stop="x", include_stop_str_in_output="yes")


# ---- the engine ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tiny_pair):
    return scaled(tiny_pair[0], 3.0), tiny_pair[1]


@pytest.fixture(scope="module")
def engine(pair):
    engine = make_engine(*pair, method="draft_model", max_seq_len=48)
    engine.tokenizer = Pieces()
    return engine


PROMPTS = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11]]


def _expected(tok, reference: list[int], stop: str):
    """What a completion stopped by `stop` holds: the fewest tokens whose text contains it."""
    n = next(n for n in range(1, len(reference) + 1) if stop in tok.decode(reference[:n]))
    text = tok.decode(reference[:n])
    return reference[:n], text[:text.index(stop)]


def _stop_inside(tok, reference: list[int]) -> str:
    """A string of the reference's text that ends inside its 6th token and starts inside an
    earlier one (the shortest such string that first occurs there)."""
    text = tok.decode(reference)
    for start in range(7, 2, -1):
        s = text[start:11]
        if text.index(s) == start:
            return s
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("k", [0, 2])
def test_greedy_completions_end_at_their_stop_strings(engine, pair, k):
    """More prompts than slots: rows stopped on the host free their slots for queued
    prompts, whose completions are still exact; the device holds no active row after."""
    tok = engine.tokenizer
    engine.controller = FixedK([k])
    refs = [greedy_reference(pair[0], p, 20) for p in PROMPTS]
    stops = [_stop_inside(tok, r) for r in refs]
    sampling = [SamplingParams(temperature=0.0, max_tokens=20, stop=[s, "zzzz"]) for s in stops]
    sampling[3] = SamplingParams(temperature=0.0, max_tokens=20)  # no stop string: runs its 20
    engine.max_batch_size, old = 2, engine.max_batch_size
    engine.reset_metrics()
    try:
        outs = engine.generate(PROMPTS, sampling, return_logprobs=True)
    finally:
        engine.max_batch_size = old
    # the rounds the device ran past a stop string count for nothing
    assert engine.metrics()["tokens"] == sum(len(o.token_ids) for o in outs)
    for o, ref, stop in zip(outs[:3], refs, stops):
        tokens, text = _expected(tok, ref, stop)
        assert (o.token_ids, o.text, o.finish_reason, o.stop_reason) == (tokens, text, "stop", stop)
        assert len(o.logprobs) == len(o.token_ids)
    assert outs[3].token_ids == refs[3] and outs[3].finish_reason == "length"
    assert outs[3].stop_reason is None
    assert not np.asarray(engine.state.active).any()
    # the text kept with include_stop_str_in_output ends after the string; a lone row
    # stopped long before its length limit is freed on the device too
    out = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=40, stop=stops[0],
                                                       include_stop_str_in_output=True))[0]
    tokens, text = _expected(tok, refs[0], stops[0])
    assert out.token_ids == tokens and out.text == text + stops[0]
    assert not np.asarray(engine.state.active).any()


def test_stream_and_groups_with_stop_strings(engine, pair):
    """A stream's tokens join to generate's; a group's completions each stop on their own."""
    tok = engine.tokenizer
    engine.controller = FixedK([2])
    ref = greedy_reference(pair[0], PROMPTS[2], 20)
    stop = _stop_inside(tok, ref)
    sp = SamplingParams(temperature=0.0, max_tokens=20, stop=stop, n=2)
    outs = engine.generate([PROMPTS[2]], sp)
    joined = {0: [], 1: []}
    for i, new in engine.stream([PROMPTS[2]], sp):
        joined[i] += new
    tokens, _ = _expected(tok, ref, stop)
    assert [o.token_ids for o in outs] == [tokens, tokens] == [joined[0], joined[1]]
    # sampled (at a static K, so the drafts are the same): each completion is cut where its
    # own text first holds the string
    sampled = SamplingParams(temperature=1.0, max_tokens=20, seed=3, n=4)
    free = engine.generate([PROMPTS[0]], sampled)
    stop = tok.decode(free[0].token_ids)[5:8]
    cut = engine.generate([PROMPTS[0]], SamplingParams(temperature=1.0, max_tokens=20, seed=3, n=4,
                                                       stop=stop))
    for f, c in zip(free, cut):
        if stop in tok.decode(f.token_ids):
            assert (c.token_ids, c.stop_reason) == (_expected(tok, f.token_ids, stop)[0], stop)
        else:
            assert c.token_ids == f.token_ids and c.stop_reason is None


def test_stop_strings_need_a_tokenizer_and_stop_ids_report_theirs(engine, pair):
    engine.controller = FixedK([1])
    old, engine.tokenizer = engine.tokenizer, None
    try:
        with pytest.raises(ValueError, match="request 1: stop strings.*tokenizer"):
            engine.generate([[1], [2]], [SamplingParams(), SamplingParams(stop="ab")])
        # a stop token id names itself as the stop reason (end-of-text ids would give None)
        ref = greedy_reference(pair[0], PROMPTS[0], 12)
        out = engine.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=12,
                                                           stop_token_ids=[ref[4]]))[0]
        assert out.stop_reason == ref[4] and out.token_ids == ref[:ref.index(ref[4]) + 1]
    finally:
        engine.tokenizer = old


def test_no_stop_string_ends_in_the_first_min_tokens(engine, pair):
    """As vLLM: a match that ends in the text of the first min_tokens tokens does not count;
    the first one that ends after it does, even when it starts before."""
    tok = engine.tokenizer
    engine.controller = FixedK([2])
    ref = greedy_reference(pair[0], PROMPTS[1], 20)
    text = tok.decode(ref)  # two letters a token
    letter = next(c for c in text[:6] if c in text[6:])  # in the first 3 tokens' text, and after
    straddling = text[7:9]  # starts in token 4's text, ends in token 5's
    sampling = [SamplingParams(temperature=0.0, max_tokens=20, min_tokens=3, stop=letter),
                SamplingParams(temperature=0.0, max_tokens=20, min_tokens=4, stop=straddling)]
    outs = engine.generate([PROMPTS[1]] * 2, sampling)
    end = text.index(letter, 6) + 1
    expected = (ref[:(end + 1) // 2], text[:end - 1], letter)  # two letters a token
    assert (outs[0].token_ids, outs[0].text, outs[0].stop_reason) == expected
    assert (outs[1].token_ids, outs[1].text, outs[1].stop_reason) == (ref[:5], text[:7], straddling)
    free = engine.generate([PROMPTS[1]], SamplingParams(temperature=0.0, max_tokens=20, stop=letter))[0]
    assert len(free.token_ids) <= 3  # without min_tokens the letter ends it in the first tokens


def _words(vocab_size: int, special: int):
    """A SentencePiece-style (Metaspace) tokenizer: id i reads " w{i}", id `special` is a
    special token "<sp>"; as a `tokenizers.Tokenizer` and wrapped by transformers."""
    from tokenizers import Tokenizer, decoders, models as wordlevel, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"\u2581w{i}": i for i in range(vocab_size) if i != special} | {"<sp>": special}
    words = Tokenizer(wordlevel.WordLevel(vocab, unk_token="<sp>"))
    words.pre_tokenizer, words.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    words.add_special_tokens(["<sp>"])
    return words, PreTrainedTokenizerFast(tokenizer_object=words)


def test_text_reads_as_after_the_prompt_as_vllm_gives_it(engine, pair):
    """A SentencePiece tokenizer drops a sequence's leading space: decoded alone, the
    completion lost its first token's space and a stop string starting with it never
    matched. A transformers tokenizer's special tokens stayed in the text, and a stop id's
    own text too (vLLM leaves it out unless include_stop_str_in_output)."""
    engine.controller = FixedK([2])
    ref = greedy_reference(pair[0], PROMPTS[2], 10)
    special = next(t for t in ref[1:] if t != ref[0])
    stop_id = next(t for t in ref[1:] if t not in (ref[0], special))
    read = lambda ids: "".join(f" w{t}" for t in ids if t != special)  # noqa: E731
    old = engine.tokenizer
    try:
        for engine.tokenizer in _words(pair[0].config.vocab_size, special):
            out = engine.generate([PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=10))[0]
            assert out.token_ids == ref and out.text == read(ref)
            first = f" w{ref[0]}"
            out = engine.generate([PROMPTS[2]], SamplingParams(temperature=0.0, max_tokens=10, stop=first))[0]
            assert (out.token_ids, out.text, out.stop_reason) == (ref[:1], "", first)
            kept = ref[:ref.index(stop_id) + 1]
            for include in (False, True):
                out = engine.generate([PROMPTS[2]], SamplingParams(
                    temperature=0.0, max_tokens=10, stop_token_ids=[stop_id], include_stop_str_in_output=include))[0]
                assert out.token_ids == kept and out.text == read(kept if include else kept[:-1])
    finally:
        engine.tokenizer = old
