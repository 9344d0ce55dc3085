"""Differential fuzzing of the engine: random engines and random request mixes, checked
against plain decoding and against what every completion must satisfy.

A case draws an engine under test (method: ngram, suffix, draft_model, eagle3 or none; max K, a K schedule that changes every
dispatch, slots, buckets, max_seq_len, prefill chunk, prefix sharing, acceptance, eos
ids, kernels: XLA or the Pallas ones interpreted) and one or two calls (`generate`,
`stream` with `on_output`, or threaded: parts of the call from threads of their own through
one `ThreadedEngine`, some joining a run already decoding; logprobs returned or not; for
method "suffix" references or a `RolloutMemory`) of requests mixing every
per-request feature (greedy and seeded sampling with filters, penalties, logit_bias,
allowed_token_ids, bad_words, stop ids and strings, min_tokens, ignore_eos, groups,
top and prompt logprobs, prompts sharing prefixes). Stop ids, stop strings and bad
words are drawn from what the request would generate without them (`aim`), so they
matter. Checks:

- **Plain equality.** Under "drafter_invariant" acceptance every completion, and under
  "rejection" every greedy one, is token for token what a plain engine (method "none",
  one slot, no prefix sharing) gives the same request alone, with group member g drawn
  as a single request with seed `seed + g`: the same tokens, finish and stop reasons,
  and (when asked for) logprobs within float tolerance. A stream's joined tokens are its
  outputs' tokens.
- **Invariants** of every completion of both engines: at most max_tokens and what the
  slot leaves, finish "length" exactly at that cap, only allowed ids, no bad word, no
  stop id before min_tokens nor before its last token, a stop string only at its end.

`python tests/engine_fuzz.py --cases N --seed S` runs cases S..S+N-1 and prints each
failing case's seed (rerun one with `--cases 1 --seed <it>`); `--mesh 2,1` runs the engine
under test on a 2-device data mesh (fake CPU devices); `--constrained` gives most requests
a few allowed ids and bad words over them. `test_engine_fuzz.py` runs a few in the suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import threading
import time
import traceback

import numpy as np

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models
from dsd_jax.bad_words import token_sequences
from dsd_jax.rollout_memory import RolloutMemory
from dsd_jax.sharding import make_mesh
from dsd_jax.threaded import ThreadedEngine

VOCAB = 64
LETTERS = "abcdefgh"


class Pieces:
    """A tokenizer whose token i is two letters (all 64 pairs of "abcdefgh"): a stop
    string can start inside one token and end inside another. Encoding ignores spaces,
    so a bad word's spaced form equals its plain one."""

    def decode(self, ids) -> str:
        return "".join(LETTERS[int(i) % 8] + LETTERS[int(i) // 8] for i in ids)

    def encode(self, text, add_special_tokens=False):
        text = text.replace(" ", "")
        return [LETTERS.index(text[i]) + 8 * LETTERS.index(text[i + 1]) for i in range(0, len(text) - 1, 2)]


@functools.lru_cache(maxsize=None)
def fuzz_models():
    """A 2-layer target and a 1-layer draft (the suite's tiny shapes), logits sharpened so
    greedy paths vary and drafts are accepted often enough to matter."""
    from conftest import scaled, tiny_config  # (the suite's helpers; tests/ is on the path)
    target = scaled(models.init_model(tiny_config(vocab_size=VOCAB, num_layers=2), seed=11), 4.0)
    draft = scaled(models.init_model(tiny_config(vocab_size=VOCAB, num_layers=1), seed=12), 4.0)
    return target, draft


@functools.lru_cache(maxsize=None)
def fuzz_head():
    """An EAGLE-3 head for `fuzz_models`' target, reading both its layers, with a reduced
    draft vocabulary (the first 48 ids): drafts of the other ids never come from it."""
    from dsd_jax.models.eagle3 import Eagle3Config, init_eagle3
    target, _ = fuzz_models()
    cfg = Eagle3Config(**{**target.config.__dict__, "num_layers": 1}, draft_vocab_size=48, aux_layers=(0, 1))
    return init_eagle3(cfg, seed=13)


@functools.lru_cache(maxsize=None)
def typical_text() -> tuple[tuple[int, ...], ...]:
    """Completions the target draws (plain decoding, greedy and sampled): stop ids, stop
    strings and bad words are drawn from them, so they occur often enough to matter (random
    ones of 64**2 bigrams would almost never be hit)."""
    target, _ = fuzz_models()
    plain = SpecEngine(target, None, SpecConfig(method="none"), max_batch_size=8, max_seq_len=64,
                       prefill_chunk=16, backend="xla")
    rng = np.random.default_rng(7)
    prompts = [list(map(int, rng.integers(0, VOCAB, int(rng.integers(1, 8))))) for _ in range(16)]
    params = [SamplingParams(temperature=t, seed=i, max_tokens=48) for i, t in enumerate([0.0, 1.0] * 8)]
    return tuple(tuple(o.token_ids) for o in plain.generate(prompts, params))


def _piece(rng, tokens: int) -> list[int]:
    """`tokens` consecutive tokens of a typical completion."""
    text = typical_text()
    row = text[int(rng.integers(0, len(text)))]
    at = int(rng.integers(0, len(row) - tokens + 1))
    return list(row[at:at + tokens])


class Schedule:
    """A controller playing a random K (0..max_k) at every dispatch."""

    def __init__(self, rng: np.random.Generator, max_k: int):
        self.rng, self.max_k = rng, max_k

    def choose_k(self, batch_size, context_len=None, request_ids=None, remaining=None):
        return int(self.rng.integers(0, self.max_k + 1))

    def observe(self, *args, **kwargs):
        pass


@dataclasses.dataclass
class Case:
    seed: int
    method: str
    acceptance: str
    max_k: int
    max_batch_size: int
    batch_buckets: tuple[int, ...]
    max_seq_len: int
    prefill_chunk: int
    share_prefixes: bool
    eos_token_ids: tuple[int, ...]
    max_logprobs: int
    calls: list  # [(prompts, params, references)]
    # how each call is made: "generate" or "stream" (tokens joined, outputs from on_output),
    # return_logprobs, and (method "suffix") a RolloutMemory across the calls in place of
    # references
    modes: list = dataclasses.field(default_factory=list)  # [(mode, return_logprobs)]
    memory: bool = False
    mesh: tuple[int, int] = (1, 1)  # (data, model) devices of the engine under test
    backend: str = "xla"  # the engine under test's kernels: "xla" or "interpret" (Pallas, interpreted)
    # per call made "threaded": its requests cut into parts, each part a `ThreadedEngine` call
    # from a thread of its own, started after its delay (s); None: not threaded
    threads: list = dataclasses.field(default_factory=list)  # [None | [(start, delay), ...]]
    # `--constrained`: most requests carry a few allowed ids and bad words over them (see
    # `constrain`), where the two can leave nothing to draw
    constrained: bool = False
    refused: int = 0  # calls the engine refused (set by `run_case`): nothing of theirs checked beyond that

    def engine_spec(self) -> str:
        return (f"mesh={self.mesh} backend={self.backend} method={self.method} acceptance={self.acceptance} "
                f"max_k={self.max_k} "
                f"slots={self.max_batch_size} buckets={self.batch_buckets} max_seq_len={self.max_seq_len} "
                f"chunk={self.prefill_chunk} share={self.share_prefixes} eos={self.eos_token_ids} "
                f"max_logprobs={self.max_logprobs}")


def _word(rng, tokens: int) -> str:
    return Pieces().decode(_piece(rng, tokens))


def _text_piece(rng) -> str:
    """2 to 4 letters of a typical completion's text: may start or end inside a token."""
    text = _word(rng, 3)
    at = int(rng.integers(0, 3))
    return text[at:at + int(rng.integers(2, 5))]


def random_params(rng, max_tokens_cap: int, max_logprobs: int) -> SamplingParams:
    kw: dict = {"max_tokens": int(rng.integers(1, max_tokens_cap + 1))}
    if rng.random() < 0.35:
        kw["temperature"] = 0.0
    else:
        kw["temperature"] = float(rng.choice([0.5, 1.0, 1.5]))
        kw["seed"] = int(rng.integers(0, 2**31))
        if rng.random() < 0.3:
            kw["top_k"] = int(rng.integers(1, 20))
        if rng.random() < 0.3:
            kw["top_p"] = float(rng.choice([0.5, 0.9]))
        if rng.random() < 0.2:
            kw["min_p"] = float(rng.choice([0.05, 0.2]))
    if rng.random() < 0.3:
        kw["stop_token_ids"] = sorted({t for _ in range(int(rng.integers(1, 4))) for t in _piece(rng, 1)})
        kw["include_stop_token"] = bool(rng.random() < 0.5)
    if rng.random() < 0.25:
        kw["min_tokens"] = int(rng.integers(0, kw["max_tokens"] + 1))
    if rng.random() < 0.2:
        kw["ignore_eos"] = True
    if rng.random() < 0.2:
        kw["stop"] = [_text_piece(rng) for _ in range(int(rng.integers(1, 3)))]
        kw["include_stop_str_in_output"] = bool(rng.random() < 0.5)
    if rng.random() < 0.2:
        kw["repetition_penalty"] = float(rng.choice([0.8, 1.3]))
    if rng.random() < 0.2:
        kw["presence_penalty"] = float(rng.choice([-0.5, 0.7]))
    if rng.random() < 0.2:
        kw["frequency_penalty"] = float(rng.choice([-0.3, 0.5]))
    if rng.random() < 0.2:
        ids = {t for _ in range(int(rng.integers(1, 6))) for t in _piece(rng, 1)}
        kw["logit_bias"] = {int(t): float(rng.choice([-100.0, -3.0, 2.0, 5.0])) for t in ids}
    if rng.random() < 0.15:
        kw["allowed_token_ids"] = sorted({t for _ in range(int(rng.integers(2, 24))) for t in _piece(rng, 1)})
    if rng.random() < 0.35:
        kw["bad_words"] = [_word(rng, int(rng.integers(1, 3))) for _ in range(int(rng.integers(1, 4)))]
    if rng.random() < 0.25:
        kw["n"] = int(rng.integers(2, 4))
    if max_logprobs and rng.random() < 0.4:
        kw["logprobs"] = int(rng.integers(0, max_logprobs + 1))
    return SamplingParams(**kw)


def random_case(seed: int, constrained: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    method = str(rng.choice(["ngram", "suffix", "draft_model", "ngram", "suffix", "draft_model", "none"]))
    max_seq_len = int(rng.choice([32, 48, 64, 96]))
    slots = int(rng.choice([1, 2, 4, 8]))
    buckets = tuple(sorted({slots} | ({int(rng.integers(1, slots))} if slots > 1 and rng.random() < 0.5 else set())))
    max_logprobs = int(rng.choice([0, 0, 3]))
    # stems from typical completions: the target continues along paths where the stop ids,
    # stop strings and bad words (drawn from the same text) occur
    # (some longer than prefix_sharing.MIN_SHARED_PREFIX, so prompts share them)
    stems = [_piece(rng, int(rng.integers(1, 12) if rng.random() < 0.6 else rng.integers(33, 47)))
             for _ in range(3)]
    calls = []
    for _ in range(int(rng.choice([1, 1, 2]))):
        n = int(rng.integers(1, 3 * slots + 3))
        prompts = []
        for _ in range(n):  # prompts extending shared stems (prefix sharing), or fresh ones
            stem = stems[int(rng.integers(0, 3))] if rng.random() < 0.6 else []
            tail = (_piece(rng, int(rng.integers(1, 10))) if rng.random() < 0.5 else
                    list(map(int, rng.integers(0, VOCAB, int(rng.integers(0 if stem else 1, 10))))))
            prompts.append((stem + tail)[:max_seq_len - 2])
        params = [random_params(rng, max_seq_len, max_logprobs) for _ in prompts]
        references = None
        if rng.random() < 0.5:
            references = [[_piece(rng, int(rng.integers(1, 20))) for _ in range(int(rng.integers(0, 3)))]
                           for _ in prompts]
        calls.append((prompts, params, references))
    # drawn apart, so adding these kept the earlier cases as they were
    extra = np.random.default_rng(seed + 2 * 10**6)
    modes = [(str(extra.choice(["generate", "stream"])), bool(extra.random() < 0.3)) for _ in calls]
    for _, params, _ in calls:
        for i, sp in enumerate(params):
            if extra.random() < 0.15:
                params[i] = dataclasses.replace(sp, prompt_logprobs=int(extra.integers(0, max_logprobs + 1)))
    memory = method == "suffix" and bool(extra.random() < 0.5)
    if method == "draft_model" and extra.random() < 0.4:  # (a later addition: the same rng's cases kept)
        method = "eagle3"
    later = np.random.default_rng(seed + 3 * 10**6)
    backend = "interpret" if later.random() < 0.2 else "xla"
    threads = [_thread_parts(later, len(prompts)) if later.random() < 0.3 else None for prompts, _, _ in calls]
    modes = [("threaded", rl) if parts else (mode, rl) for (mode, rl), parts in zip(modes, threads)]
    if constrained:
        constrain(calls, np.random.default_rng(seed + 4 * 10**6))
    return Case(modes=modes, memory=memory, backend=backend, threads=threads, constrained=constrained,
                seed=seed, method=method, acceptance=str(rng.choice(["drafter_invariant", "rejection"])),
                max_k=0 if method == "none" else int(rng.integers(1, 6)), max_batch_size=slots,
                batch_buckets=buckets, max_seq_len=max_seq_len, prefill_chunk=int(rng.choice([4, 7, 16])),
                share_prefixes=bool(rng.random() < 0.7),
                eos_token_ids=tuple(sorted({t for _ in range(int(rng.integers(0, 3))) for t in _piece(rng, 1)})),
                max_logprobs=max_logprobs, calls=calls)


def constrain(calls, rng) -> None:
    """Gives most requests a few allowed ids (2 to 8) and bad words (`aim` draws half of them
    over those ids). Without it, allowed ids (up to 23) come to 1 request in 7 and bad words
    to 1 in 3, so both to 1 in 20, and a bad word rarely bans the last allowed id."""
    for _, params, _ in calls:
        for i, sp in enumerate(params):
            kw = {}
            if rng.random() < 0.7:
                kw["allowed_token_ids"] = sorted({t for _ in range(int(rng.integers(2, 9))) for t in _piece(rng, 1)})
            if rng.random() < 0.85:
                kw["bad_words"] = [_word(rng, int(rng.integers(1, 4))) for _ in range(int(rng.integers(1, 5)))]
            params[i] = dataclasses.replace(sp, **kw)


def _thread_parts(rng, n: int) -> list[tuple[int, float]]:
    """A call of n requests cut into 1 to 3 consecutive parts: (first request, delay before
    its thread calls, 0 to 50 ms: some join a run already decoding)."""
    cuts = sorted({int(c) for c in rng.integers(1, n, int(rng.integers(0, 3)))}) if n > 1 else []
    return [(start, float(rng.choice([0.0, 0.0, 0.01, 0.05]))) for start in [0] + cuts]


def _engine(case: Case, plain: bool, rng=None) -> SpecEngine:
    target, draft = fuzz_models()
    draft = fuzz_head() if case.method == "eagle3" and not plain else draft
    spec = (SpecConfig(method="none") if plain else
            SpecConfig(method=case.method, num_speculative_tokens=max(case.max_k, 1) if case.method != "none" else 0,
                       acceptance=case.acceptance))
    data, model = (1, 1) if plain else case.mesh
    slots, buckets = case.max_batch_size, case.batch_buckets
    if data * model > 1:  # the slots split evenly over the data shards; buckets per shard
        slots, buckets = -(-slots // data) * data, None
    return SpecEngine(target, draft if spec.method in ("draft_model", "eagle3") else None, spec,
                      max_batch_size=1 if plain else slots, mesh=make_mesh(data, model) if data * model > 1 else None,
                      batch_buckets=None if plain else buckets, max_seq_len=case.max_seq_len,
                      prefill_chunk=16 if plain else case.prefill_chunk, tokenizer=Pieces(),
                      eos_token_ids=list(case.eos_token_ids), max_logprobs=case.max_logprobs,
                      share_prefixes=not plain and case.share_prefixes,
                      backend="xla" if plain else case.backend,
                      controller=None if plain or case.method == "none" else Schedule(rng, case.max_k))


def completion_problems(out, prompt, sp: SamplingParams, case: Case) -> list[str]:
    """What any completion of `prompt` under `sp` must satisfy, as a list of violations."""
    toks, problems = list(out.token_ids), []
    cap = min(sp.max_tokens, case.max_seq_len - len(prompt))
    if len(toks) > cap:
        problems.append(f"{len(toks)} tokens, more than the cap {cap}")
    if out.finish_reason == "length" and len(toks) != cap:
        problems.append(f"finish 'length' at {len(toks)} tokens, cap {cap}")
    if sp.allowed_token_ids is not None and not set(toks) <= set(sp.allowed_token_ids):
        problems.append(f"ids outside allowed_token_ids: {sorted(set(toks) - set(sp.allowed_token_ids))}")
    for seq in token_sequences(sp.bad_words, Pieces(), VOCAB):
        n = len(seq)
        if any(tuple(toks[i:i + n]) == seq for i in range(len(toks) - n + 1)):
            problems.append(f"bad word {seq} in the completion")
    stops = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(case.eos_token_ids))
    for i, t in enumerate(toks):
        if t in stops and (i < sp.min_tokens or i != len(toks) - 1):
            problems.append(f"stop id {t} at {i} (min_tokens {sp.min_tokens}, {len(toks)} tokens)")
    if sp.stop:  # a stop string ends the completion in the token completing it, if past min_tokens
        text = Pieces().decode(toks)
        for stop in sp.stop:
            ends = [at + len(stop) for at in range(len(text)) if text.startswith(stop, at)]
            early = [e for e in ends if sp.min_tokens <= (e - 1) // 2 < len(toks) - 1]
            if early:
                problems.append(f"stop string {stop!r} completed at token {(early[0] - 1) // 2} of {text!r}")
    return problems


def _singles(prompts, params, references):
    """Each request of a call as single requests: group member g with seed + g."""
    out = []
    for i, (prompt, sp) in enumerate(zip(prompts, params)):
        for g in range(sp.n):
            seed = None if sp.seed is None else sp.seed + g
            out.append((prompt, dataclasses.replace(sp, n=1, seed=seed), None if references is None else references[i]))
    return out


def _close(a, b) -> bool:
    """Logprob entries alike: the same ids (a dict's keys), values within float tolerance."""
    if a is None or b is None:
        return a is b
    if isinstance(a, dict):
        return a.keys() == b.keys() and np.allclose(list(a.values()), list(b.values()), atol=2e-4)
    return len(a) == len(b) and all(_close(x, y) if isinstance(x, dict) or x is None else
                                    np.isclose(x, y, atol=2e-4) for x, y in zip(a, b))


def _same(a, b) -> str | None:
    for name in ("token_ids", "finish_reason", "stop_reason"):
        if getattr(a, name) != getattr(b, name):
            return f"{name}: {getattr(a, name)} vs plain {getattr(b, name)}"
    for name in ("top_logprobs", "prompt_logprobs", "logprobs", "raw_logprobs"):
        if not _close(getattr(a, name), getattr(b, name)):
            return f"{name}: {getattr(a, name)} vs plain {getattr(b, name)}"
    return None


class PartRefused(ValueError):
    """A threaded call's part the engine refused: the plain engine must refuse that part
    (its own indices in the message) with the same message."""

    def __init__(self, err: ValueError, prompts, params):
        super().__init__(str(err))
        self.prompts, self.params = prompts, params


THREAD_TIMEOUT_S = 600  # a threaded call still running after this has hung


def _threaded_call(engine, parts, prompts, params, references, memory, return_logprobs) -> tuple[list, list[str]]:
    """The call's parts (`_thread_parts`) as `ThreadedEngine` calls from threads of their own:
    the outputs joined in the call's order. A refused part raises `PartRefused` once every
    thread is done; the others ran."""
    front = ThreadedEngine(engine)
    bounds = [start for start, _ in parts] + [len(prompts)]
    results: dict = {}

    def part(i, delay):
        a, b = bounds[i], bounds[i + 1]
        time.sleep(delay)
        try:
            results[i] = front.generate(prompts[a:b], params[a:b], return_logprobs=return_logprobs,
                                        references=None if references is None else references[a:b],
                                        memory=memory)
        except ValueError as err:
            results[i] = PartRefused(err, prompts[a:b], params[a:b])
        except BaseException as err:  # noqa: BLE001  (reported as the call's failure)
            results[i] = err

    threads = [threading.Thread(target=part, args=(i, delay), daemon=True) for i, (_, delay) in enumerate(parts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(THREAD_TIMEOUT_S)
    if any(t.is_alive() for t in threads) or not front.join(THREAD_TIMEOUT_S):
        raise RuntimeError(f"a threaded call was still running after {THREAD_TIMEOUT_S} s")
    for i in range(len(parts)):
        if isinstance(results[i], BaseException):
            raise results[i]
    return [out for i in range(len(parts)) for out in results[i]], []


def _call(engine, mode, prompts, params, references, memory, return_logprobs,
          parts=None) -> tuple[list, list[str]]:
    """One call of `engine` as `mode` says: its outputs, and what a stream got wrong (its
    joined tokens not its outputs' tokens, an output missing)."""
    if mode == "threaded":
        return _threaded_call(engine, parts, prompts, params, references, memory, return_logprobs)
    if mode == "generate":
        return engine.generate(prompts, params, references=references, memory=memory,
                               return_logprobs=return_logprobs), []
    outs, joined = {}, {}
    for i, tokens in engine.stream(prompts, params, references=references, memory=memory,
                                   return_logprobs=return_logprobs,
                                   on_output=lambda i, out: outs.__setitem__(i, out)):
        joined.setdefault(i, []).extend(tokens)
    total = sum(sp.n for sp in params)
    problems = [f"stream: no output for {sorted(set(range(total)) - outs.keys())}"] if len(outs) != total else []
    problems += [f"stream output {i}: joined tokens {joined.get(i, [])} vs its output's {o.token_ids}"
                 for i, o in outs.items() if joined.get(i, []) != o.token_ids]
    return [outs.get(i) for i in range(total)], problems


def aim(case: Case, plain: SpecEngine, rng) -> None:
    """Redraws the stop ids, stop strings and bad words of the requests that have them
    from what each would generate without them (plain decoding): drawn from typical text
    alone, 1 in 45 requests' bad words would ever have occurred. A constrained case's
    request that would be refused (nothing to draw) loses its bad words 3 times in 4."""
    for c, (prompts, params, references) in enumerate(case.calls):
        for i, (prompt, sp) in enumerate(zip(prompts, params)):
            if not (sp.stop_token_ids or sp.stop or sp.bad_words):
                continue
            free = dataclasses.replace(sp, n=1, stop_token_ids=(), stop=(), bad_words=())
            toks = plain.generate([prompt], [free])[0].token_ids

            def piece(n):
                at = int(rng.integers(0, max(len(toks) - n, 0) + 1))
                return list(toks[at:at + n]) or _piece(rng, n)

            kw = {}
            if sp.stop_token_ids:
                kw["stop_token_ids"] = sorted(set(piece(1) + list(sp.stop_token_ids)[1:]))
            if sp.stop:
                text = Pieces().decode(piece(3))  # 2 to 6 letters
                at = int(rng.integers(0, len(text) - 1))
                kw["stop"] = [text[at:at + int(rng.integers(2, 5))]] + list(sp.stop[1:])
            if sp.bad_words:
                kw["bad_words"] = [Pieces().decode(piece(int(rng.integers(1, 3)))) for _ in sp.bad_words]
                if case.constrained and sp.allowed_token_ids:  # some over the allowed ids in any order
                    kw["bad_words"] = [w if rng.random() < 0.5 else Pieces().decode(
                        rng.choice(sp.allowed_token_ids, int(rng.integers(1, 4)))) for w in kw["bad_words"]]
            params[i] = dataclasses.replace(sp, **kw)
            if case.constrained and rng.random() < 0.75:
                try:  # mostly served: a refused request takes its whole call with it
                    plain.check([prompt], [params[i]])
                except ValueError:
                    params[i] = dataclasses.replace(params[i], bad_words=())


def run_case(case: Case) -> list[str]:
    """Runs `case` (after `aim`); returns what went wrong (empty: nothing)."""
    rng = np.random.default_rng(case.seed + 10**6)
    engine, plain = _engine(case, False, rng), _engine(case, True)
    aim(case, plain, rng)
    memory = RolloutMemory() if case.memory else None
    failures = []
    threads = case.threads or [None] * len(case.calls)
    for c, ((prompts, params, references), (mode, return_logprobs), parts) in enumerate(
            zip(case.calls, case.modes, threads)):
        try:
            outs, problems = _call(engine, mode, prompts, params, None if memory else references, memory,
                                   return_logprobs, parts)
        except ValueError as refused:  # a request the engine refuses (checked before anything runs)
            case.refused += 1
            if isinstance(refused, PartRefused):  # (a threaded call: the plain engine gets that part)
                prompts, params = refused.prompts, refused.params
            try:
                plain.generate(prompts, params)
                failures.append(f"call {c}: refused ({refused}), but the plain engine ran it")
            except ValueError as also:
                if str(also) != str(refused):
                    failures.append(f"call {c}: refused ({refused}); the plain engine: {also}")
            continue  # (the engine must still serve the next call)
        failures += [f"call {c}: {p}" for p in problems]
        singles = _singles(prompts, params, references)
        expected = [plain.generate([p], [sp], return_logprobs=return_logprobs)[0] for p, sp, _ in singles]
        assert len(outs) == len(singles)
        for j, (out, want, (prompt, sp, _)) in enumerate(zip(outs, expected, singles)):
            where = f"call {c} ({mode}) output {j} (prompt {prompt}, {sp})"
            if out is None:
                continue  # (named by the stream's problems)
            failures += [f"{where}: {p}" for p in completion_problems(out, prompt, sp, case)]
            failures += [f"{where}: plain engine: {p}" for p in completion_problems(want, prompt, sp, case)]
            if case.acceptance == "drafter_invariant" or sp.temperature == 0:
                diff = _same(out, want)
                if diff:
                    failures.append(f"{where}: {diff}")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--constrained", action="store_true", help="most requests with a few allowed ids "
                    "and bad words over them (where a completion can get stuck with nothing to draw)")
    ap.add_argument("--mesh", default="1,1", help="DATA,MODEL: the engine under test on a mesh of that "
                    "many fake CPU devices (the plain one stays on one)")
    args = ap.parse_args(argv)
    mesh = tuple(int(x) for x in args.mesh.split(","))
    if mesh != (1, 1):
        import jax
        jax.config.update("jax_num_cpu_devices", mesh[0] * mesh[1])  # before the backend starts
    bad = []
    for seed in range(args.seed, args.seed + args.cases):
        case, start = dataclasses.replace(random_case(seed, args.constrained), mesh=mesh), time.perf_counter()
        try:
            failures = run_case(case)
        except Exception:  # a crash is a finding too
            failures = [traceback.format_exc()]
        status = "ok" if not failures else f"{len(failures)} FAILURES"
        print(f"case {seed}: {status} in {time.perf_counter() - start:.1f} s ({case.engine_spec()}, "
              f"{sum(len(c[0]) for c in case.calls)} prompts, calls {case.modes}, {case.refused} refused, "
              f"memory {case.memory})", flush=True)
        for f in failures[:5]:
            print("   ", f, flush=True)
        if failures:
            bad.append(seed)
    print(f"{args.cases - len(bad)} of {args.cases} cases passed; failing seeds: {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
