"""A request's data: what a caller gets back (`RequestOutput`), what the engine tracks
while it runs (`Request`), and the seeds its noise is drawn from."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from dsd_jax.sampling import SamplingParams
from dsd_jax.stop_strings import Text

__all__ = ["Request", "RequestOutput", "engine_seed", "references_seed", "remember", "top_entries"]


@dataclasses.dataclass
class RequestOutput:
    """One finished completion (vLLM/Tunix conventions: unpadded tokens, same-length logprobs).

    With `SamplingParams(n=G)` a prompt has G outputs, adjacent, `index` 0..G-1."""

    request_id: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    logprobs: list[float] | None = None  # of each token under the target's sampling distribution
    raw_logprobs: list[float] | None = None  # log_softmax of the raw target logits
    text: str | None = None
    prompt_index: int = 0  # which prompt of the `generate` call
    index: int = 0  # which of its n completions
    # the seed its noise was drawn from: the request's, mixed with its references' under
    # rejection acceptance when the drafter reads them (`references_seed`); an output given
    # back as a reference (or kept by a RolloutMemory) carries it, so the next draw's noise
    # is kept apart from the noise that drew the reference
    noise_seed: int | None = None
    # what stopped it, as vLLM: the stop string, or the stop token id (the last token, kept
    # or not: `include_stop_token`); None for the end-of-text ids and for "length"
    stop_reason: int | str | None = None
    # with SamplingParams.logprobs=N (vLLM's logprobs): per token, {token id: raw logprob}
    # of the N likeliest tokens at its position, largest first, then the token itself if it
    # is not among them (`top_entries`)
    top_logprobs: list[dict[int, float]] | None = None
    # with SamplingParams.prompt_logprobs=N (vLLM's): None for the first prompt token, then
    # per prompt token its entry as top_logprobs'
    prompt_logprobs: list[dict[int, float] | None] | None = None


@dataclasses.dataclass
class Request:
    """A request inside the engine: its inputs, where it lives, what it produced so far."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    seed: int
    prompt_index: int = 0
    index: int = 0  # completion index within its prompt's group (SamplingParams.n)
    group: int = -1  # request id of the group's first completion (siblings share the prefill)
    references: list = dataclasses.field(default_factory=list)  # earlier continuations of the prompt
    tokens: list = dataclasses.field(default_factory=list)
    logprobs: list = dataclasses.field(default_factory=list)
    raw_logprobs: list = dataclasses.field(default_factory=list)
    top_logprobs: list = dataclasses.field(default_factory=list)  # with params.logprobs
    prompt_logprobs: list | None = None  # with params.prompt_logprobs, once prefilled
    shard: int = 0  # data shard holding the request
    slot: int = -1  # slot within its shard
    # its prompt is in the drafter's state (prefilled at admission, or the drafter keeps
    # none to lag): a slot that can donate its prompt's drafter state (`prefix_sharing`)
    prompt_drafted: bool = False
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # RequestOutput's
    text_end: int | None = None  # where the text ends when a stop string ended it
    stop_text: Text | None = None  # its text so far, with stop strings (read after the prompt's end)
    first_token_time: float | None = None
    finish_time: float | None = None

    def __post_init__(self):
        if self.stop_text is None:
            self.stop_text = Text(self.prompt)

    @property
    def ended_by_stop_id(self) -> bool:
        """Its last token is the stop id (or end-of-text id) that ended it."""
        return self.finish_reason == "stop" and not self.stopped_on_host and self.params.include_stop_token

    @property
    def stopped_on_host(self) -> bool:
        """Ended by a stop string: the device, which knows only token ids, runs it on."""
        return isinstance(self.stop_reason, str)


def top_entries(tokens: np.ndarray, raw: np.ndarray, ids: np.ndarray, values: np.ndarray,
                n: int) -> list[dict[int, float]]:
    """Each token's `RequestOutput.top_logprobs` entry: tokens and raw [T] (its raw
    logprob), ids and values [T, >= n] (its position's likeliest, largest first)."""
    entries = []
    for token, own, top_ids, top_values in zip(tokens.tolist(), raw.tolist(), ids[:, :n].tolist(),
                                               values[:, :n].tolist()):
        entry = dict(zip(top_ids, top_values))
        entry.setdefault(token, own)
        entries.append(entry)
    return entries


def remember(memory, requests) -> None:
    """Stores finished requests' completions in a `RolloutMemory` (None: nothing)."""
    if memory is not None:
        for r in requests:
            memory.add(r.prompt, r.tokens, noise_seed=r.seed)


def references_seed(seed: int, references: list[tuple[list[int], int | None]], call: int) -> int:
    """A request's noise seed when its drafter copies from references under rejection
    acceptance. Rejection sampling is exact only for drafts independent of the noise that
    judges them, and a reference drawn with the same seed came from that very noise (a
    fixed seed per prompt each epoch, its last rollout as reference: P(token) fell from
    2.7% to 0.07%). So the seed is mixed with each reference's tokens and the seed its own
    noise came from (`RequestOutput.noise_seed`): the result differs from every seed the
    references, and the references they were drafted from, were drawn with (a hash never
    equals one of its inputs), whatever tokens repeat. A reference of unknown origin (bare
    tokens) mixes in the engine's call number instead: fresh for each call of this engine.
    Same seed and same references (with their noise seeds) give the same output."""
    digest = hashlib.blake2b(digest_size=8)
    for ids, noise_seed in references:
        origin = f"seed {noise_seed}" if noise_seed is not None else f"call {call}"
        digest.update(np.asarray(ids, np.int64).tobytes() + origin.encode() + b"|")
    mix = int.from_bytes(digest.digest(), "little")
    return int(np.random.SeedSequence([seed, mix]).generate_state(1)[0])


def engine_seed(base_seed: int, request_id: int) -> int:
    """The seed of a request that names none: a hash of (the engine's seed, request id), so
    it is reproducible for a given engine seed but does not fall on the small integers users
    pick (seed*C + id did: an unseeded request drew the same tokens as one with seed=1)."""
    return int(np.random.SeedSequence([base_seed, request_id]).generate_state(1)[0])
