"""Slots: where new requests go, their prefill, and keeping each shard's live requests packed.

`SpecEngine` holds the requests and the loop; this mixin holds what admission and
removal do to its slots. Live requests stay packed in each data shard's slots 0..n-1, so
the (K, bucket) program follows the live batch: a new request takes the slot after its
shard's last live one (`_place`), is prefilled there in chunks, sharing a group's or a
shared beginning's prefill by copying slots (`_admit`, `dsd_jax.prefix_sharing`), and a
finished request's slot receives its shard's last live one (`_remove`). Every device
write is a program of `dsd_jax.programs`, called with [data, rows] host arguments
(`_per_shard`).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from dsd_jax import bad_words, prefix_sharing
from dsd_jax.buckets import bucket_for, prefill_cost, prefill_pieces
from dsd_jax.drafters.base import AdmissionRequest
from dsd_jax.request import Request, top_entries
from dsd_jax.sampling import MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS, allowed_array, bias_arrays
from dsd_jax.state import MAX_STOP_IDS
from dsd_jax.step import SlotInit, swap_batches, unpack_prompt_logprobs


class SlotAdmission:
    """`SpecEngine`'s slot management. A mixin: it works on the engine's own attributes
    (`state`, `programs`, `data`, `slots_per_shard`, `_retained`, `share_prefixes`, `drafter`,
    `_policy`, `stats`), which `SpecEngine.__init__` sets."""

    def _place(self, new: list[Request], shards: list[list[Request]]) -> None:
        """Each new request goes to a data shard, at the end of its packed slots: as many to
        each shard as placing each on the least loaded one gives (the step's time follows
        the fullest), and with `share_prefixes` each to the shard whose running requests or
        kept slots hold the longest start of its prompt while that shard still takes one
        (`prefix_sharing.place`); the others to the least loaded that does."""
        loads = [len(shard) for shard in shards]
        quota = [0] * self.data
        for _ in new:
            s = min(range(self.data), key=lambda s: loads[s] + quota[s])
            quota[s] += 1
        chosen: list[int | None] = [None] * len(new)
        if self.share_prefixes and self.data > 1:
            donors = [[r.prompt for r in shards[s]] + [kept.sequence for kept in self._retained[s].values()]
                      for s in range(self.data)]
            chosen = prefix_sharing.place([r.prompt for r in new], donors, quota)
            for s in chosen:
                if s is not None:
                    quota[s] -= 1
        for r, s in zip(new, chosen):
            if s is None:
                s = min((s for s in range(self.data) if quota[s] > 0), key=lambda s: len(shards[s]))
                quota[s] -= 1
            r.shard, r.slot = s, len(shards[s])
            shards[s].append(r)

    def _per_shard(self, items_of, n: int, fill, dtype=np.int32, width=None) -> np.ndarray:
        """A [data, n(, width)] host argument: shard s's rows from `items_of(s)`, padded with
        `fill` (a padding slot index is out of range: the programs skip it)."""
        shape = (self.data, n) if width is None else (self.data, n, width)
        out = np.full(shape, fill, dtype)
        for s in range(self.data):
            items = items_of(s)
            if items:
                out[s, :len(items)] = items
        return out

    def _admit(self, new: list[Request], shards: list[list[Request]], refilled: bool) -> None:
        """Prefills target (and draft, when the dispatch policy says so) for new requests in
        chunks, then marks them live; `shards` holds every live request in slot order (the
        new ones placed at the ends), `refilled` says whether requests are queued.

        A group's completions (`SamplingParams.n`) on one shard share one prefill: the
        first is prefilled and its slot copied into its siblings' slots. With
        `share_prefixes`, so do the prompts' shared beginnings (`dsd_jax.prefix_sharing`):
        the prompts prefilled whole go first, then the others copy their donor's slot (or
        sit in it, a free slot that kept a finished request) and prefill the rest."""
        admitted = {id(r) for r in new}
        leader_of = [{} for _ in range(self.data)]  # per shard: group -> its first new request
        for r in new:
            leader_of[r.shard].setdefault(r.group, r)
        leaders = [list(groups.values()) for groups in leader_of]
        live = [r for shard in shards for r in shard]
        # a drafter that cannot leave the prompts to its catch-up is always prefilled
        t0 = time.perf_counter()
        draft_now = not self.drafter.catches_up_prompts or self._policy.draft_at_admission(
            max(map(len, shards)), live, refilled)
        self.stats.add_controller_time(t0)
        for r in new:  # what the donors among them will hold (a taker may still leave it, below)
            r.prompt_drafted = draft_now
        whole, rest, donor_of, skip = self._plan_sharing(
            leaders, [[r for r in shard if id(r) not in admitted] for shard in shards], draft_now)
        drafter_lengths = {(r.shard, r.group): h for shard in rest for r in shard
                           if (h := self._drafter_held(r, donor_of[r.request_id], skip, draft_now)) is not None}
        for r in new:  # siblings get their shard's leader's drafter state
            r.prompt_drafted = draft_now and (r.shard, r.group) not in drafter_lengths
        self._seat(new, shards, donor_of)
        self._preserve_kept(new, shards, donor_of)
        self._prefill(whole, {}, new)
        if skip:
            pairs = [[(self._slot_of(donor_of[r.request_id]), r.slot) for r in shard] for shard in rest]
            self._copy_slots([[(a, b) for a, b in shard if a != b] for shard in pairs])  # seated: in place
            self._prefill(rest, skip, new)
            self.stats.shared_prefix_tokens += sum(skip.values())
        copies = [[(leader_of[s][r.group].slot, r.slot) for r in shard
                   if id(r) in admitted and leader_of[s][r.group] is not r] for s, shard in enumerate(shards)]
        if any(copies):
            self._copy_slots(copies)
        for s, shard in enumerate(shards):  # slots now taken keep nothing
            self._retained[s] = {slot: kept for slot, kept in self._retained[s].items() if slot >= len(shard)}
        by_shard = [[r for r in new if r.shard == s] for s in range(self.data)]
        n = self._rows_bucket(by_shard)

        def field(value, fill=0, dtype=np.int32):
            return self._per_shard(lambda s: [value(r) for r in by_shard[s]], n, fill, dtype)

        stop = np.full((self.data, n, MAX_STOP_IDS), -1, np.int32)
        bias_ids = np.full((self.data, n, MAX_LOGIT_BIAS), -1, np.int32)
        bias_values = np.zeros((self.data, n, MAX_LOGIT_BIAS), np.float32)
        bad = np.full((self.data, n, bad_words.MAX_BAD_WORDS, bad_words.MAX_BAD_WORD_TOKENS), -1, np.int32)
        allowed = np.full((self.data, n, MAX_ALLOWED_TOKEN_IDS), -1, np.int32)
        for s in range(self.data):
            for i, r in enumerate(by_shard[s]):
                stop[s, i, :len(r.params.stop_token_ids)] = r.params.stop_token_ids
                bias_ids[s, i], bias_values[s, i] = bias_arrays(r.params.logit_bias)
                if r.params.bad_words:
                    bad[s, i] = self._bad_word_rows(r.params.bad_words, id(self.tokenizer))
                allowed[s, i] = allowed_array(r.params.allowed_token_ids)
        extra = {}
        for name, (shape, dtype, fill) in self.drafter.admission_fields().items():
            arr = extra[name] = np.full((self.data, n) + tuple(shape), fill, dtype)
            for s in range(self.data):
                for i, r in enumerate(by_shard[s]):
                    arr[s, i] = self.drafter.admission_value(
                        name, AdmissionRequest(r.group, r.prompt, r.references))
        real = lambda name, fill=0.0: field(lambda r: getattr(r.params, name), fill, np.float32)
        init = SlotInit(rows=field(lambda r: r.slot, self.slots_per_shard), length=field(lambda r: len(r.prompt)),
                        limit=field(lambda r: len(r.prompt) + self._budget(r)),
                        min_length=field(lambda r: len(r.prompt) + min(r.params.min_tokens, self._budget(r))),
                        prompt_length=field(lambda r: len(r.prompt)),
                        temperature=real("temperature"), top_k=field(lambda r: r.params.top_k),
                        top_p=real("top_p", 1.0), min_p=real("min_p"),
                        repetition_penalty=real("repetition_penalty", 1.0),
                        presence_penalty=real("presence_penalty"),
                        frequency_penalty=real("frequency_penalty"),
                        bias_ids=bias_ids, bias_values=bias_values, bad_words=bad, allowed_ids=allowed,
                        seed=field(lambda r: r.seed, dtype=np.uint32), stop_ids=stop,
                        drafter_length=field(lambda r: len(r.prompt) if r.prompt_drafted
                                             else drafter_lengths.get((r.shard, r.group), 1)),
                        drafter=extra)
        self.state = self.programs.admit(n)(self.state, init)

    def _plan_sharing(self, leaders: list[list[Request]], running: list[list[Request]], draft_now: bool):
        """Which leaders (per shard) are prefilled whole and which take a shared prefix
        (`prefix_sharing.plan`) from one of those, from a running request's slot or from a
        free slot that kept a finished request (`_retained`): (whole, rest, {request id:
        its donor, a Request or a retained slot}, {request id: positions shared}).

        A running request's slot holds its prompt's target KV; its drafter state only if
        its prompt was drafted (`Request.prompt_drafted`), which matters when this
        admission drafts (draft_now): a taker's drafter state below the share is its
        donor's, so a taker of more than the donor's drafted prompt leaves the rest to the
        drafter's catch-up (`_drafter_held`). Sharing takes a second prefill and a
        copy, so it is done only when the two prefills cost less than one over every prompt
        whole (`buckets.prefill_cost`): a 32-token preamble before 480 tokens of each
        prompt's own had cost 1.25x (`benchmarks/results/prefix_sharing/`)."""
        empty = lambda: [[] for _ in leaders]
        if not self.share_prefixes:
            return leaders, empty(), {}, {}
        whole, rest, donor_of, skip = empty(), empty(), {}, {}
        for s, shard in enumerate(leaders):
            fixed = [(r, r.prompt) for r in running[s]]
            fixed += [(slot, kept.sequence) for slot, kept in sorted(self._retained[s].items())]
            candidates = fixed + [(r, r.prompt) for r in shard]
            may_share = [False] * len(fixed) + [r.params.prompt_logprobs is None for r in shard]
            plan = prefix_sharing.plan([tokens for _, tokens in candidates], may_share)
            for r, share in zip(shard, plan[len(fixed):]):
                if share is None:
                    whole[s].append(r)
                else:
                    rest[s].append(r)
                    donor_of[r.request_id], skip[r.request_id] = candidates[share[0]][0], share[1]

        def cost(rows, skip):  # of one prefill of these rows (every shard runs the fullest's)
            if not any(rows):
                return 0
            longest = max(len(r.prompt) - skip.get(r.request_id, 0) for shard in rows for r in shard)
            return self._rows_bucket(rows) * prefill_cost(longest, self.programs.prefill_chunks)

        if skip and cost(whole, {}) + cost(rest, skip) >= cost(leaders, {}):
            return leaders, empty(), {}, {}
        return whole, rest, donor_of, skip

    def _drafter_held(self, r: Request, donor, skip: dict[int, int], draft_now: bool) -> int | None:
        """None, or the `drafter_length` taker r is admitted with although the admission
        drafts: its share runs past what its donor's drafter state is known to hold (a kept
        completion, a prompt left to the catch-up; `Retained.drafter_held`), so its prompt's
        draft prefill is skipped and its first round with K > 0 catches the rest up."""
        if not (draft_now and self.drafter.keeps_positions):
            return None
        if isinstance(donor, int):  # a free slot's kept request
            return self._retained[r.shard][donor].drafter_held(skip[r.request_id])
        return prefix_sharing.drafter_held(len(donor.prompt), donor.prompt_drafted, skip[r.request_id])

    @staticmethod
    def _slot_of(donor) -> int:
        return donor if isinstance(donor, int) else donor.slot

    def _seat(self, new: list[Request], shards: list[list[Request]], donor_of: dict) -> None:
        """Orders each shard's new requests (its last slots) so that a request taking a
        retained slot's prefix sits in that slot when it is one of theirs
        (`prefix_sharing.seat`): its share is then in place."""
        donor_slot = {id(r): donor_of[r.request_id] for r in new
                      if isinstance(donor_of.get(r.request_id), int)}
        if not donor_slot:
            return
        for s, shard in enumerate(shards):
            base = len(shard) - sum(r.shard == s for r in new)
            shard[base:] = prefix_sharing.seat(shard[base:], base, donor_slot)
            for slot in range(base, len(shard)):
                shard[slot].slot = slot

    def _preserve_kept(self, new: list[Request], shards: list[list[Request]], donor_of: dict) -> None:
        """Moves the kept records in the slots the new requests take out of their way
        (`prefix_sharing.preserve`) before anything writes those slots, and points the
        takers of a moved donor and `_retained` at where the contents went."""
        if not self.share_prefixes:
            return
        plans = []
        for s, shard in enumerate(shards):
            base = len(shard) - sum(r.shard == s for r in new)
            takes = {r.slot: donor_of[r.request_id] for r in shard[base:]
                     if isinstance(donor_of.get(r.request_id), int)}
            ages = {slot: kept.finished for slot, kept in self._retained[s].items()}
            plans.append(prefix_sharing.preserve(base, len(shard), self.slots_per_shard, ages, takes))
        self._move_slots([plan.swaps for plan in plans])
        if any(plan.copies for plan in plans):
            self._copy_slots([plan.copies for plan in plans])
        for s, plan in enumerate(plans):
            self._retained[s] = plan.moved(self._retained[s])
        for r in new:
            if isinstance(donor := donor_of.get(r.request_id), int):
                donor_of[r.request_id] = plans[r.shard].where.get(donor, donor)

    def _rows_bucket(self, per_shard: list[list], buckets=None) -> int:
        """The smallest of `buckets` (the prefill rows) that holds the fullest shard's list."""
        return bucket_for(max(len(x) for x in per_shard), buckets or self.programs.prefill_rows)

    def _prefill(self, leaders: list[list[Request]], skip: dict[int, int], new: list[Request]) -> None:
        """Prefills the prompts of `leaders` (per shard) in chunks, each from position
        skip.get(request id, 0) (the positions before it are in its slot already), the
        drafter's state too for the requests whose `prompt_drafted` is set. When one
        of them asks for prompt logprobs the chunks run the scored prefill programs and the
        new requests' `prompt_logprobs` are set from them."""
        if not any(leaders):
            return
        n = self._rows_bucket(leaders)
        rows = self._per_shard(lambda s: [r.slot for r in leaders[s]], n, 0)  # padding writes nothing
        lengths = self._per_shard(lambda s: [len(r.prompt) for r in leaders[s]], n, 0)
        starts = self._per_shard(lambda s: [skip.get(r.request_id, 0) for r in leaders[s]], n, 0)
        model_end = np.maximum(lengths - 1, 0).astype(np.int32)
        draft_end = np.where(self._per_shard(lambda s: [r.prompt_drafted for r in leaders[s]], n, False, bool),
                             model_end, 0).astype(np.int32)
        todo = lengths - starts  # prompt tokens each row still writes
        longest = int(todo.max())
        prompts = np.zeros((self.data, n, longest), np.int32)
        for s in range(self.data):
            for i, r in enumerate(leaders[s]):
                prompts[s, i, :todo[s, i]] = r.prompt[starts[s, i]:]
        # a request asking for prompt logprobs sends the chunks through the prefill programs
        # that also score the prompt (`Programs.prefill_scored`)
        scored = any(r.params.prompt_logprobs is not None for shard in leaders for r in shard)
        if scored:  # each position's next prompt token (-1: none)
            following = np.where(np.arange(longest) + 1 < todo[..., None],
                                 np.pad(prompts[..., 1:], ((0, 0), (0, 0), (0, 1))), -1).astype(np.int32)
        chunks = []  # (start, the scored prefill's packed prompt logprobs) per piece
        for start, c in prefill_pieces(longest, self.programs.prefill_chunks):
            piece = np.zeros((self.data, n, c), np.int32)
            width = min(c, longest - start)
            piece[..., :width] = prompts[..., start:start + width]
            count = np.clip(todo - start, 0, c).astype(np.int32)
            args = (self._target_params, self._draft_params, self.state, rows, piece,
                    (starts + start).astype(np.int32), count, model_end, draft_end)
            if scored:
                after = np.full((self.data, n, c), -1, np.int32)
                after[..., :width] = following[..., start:start + width]
                self.state, packed = self.programs.prefill_scored(n, c)(*args, after)
                chunks.append((start, packed))
            else:
                self.state = self.programs.prefill(n, c)(*args)
        self.stats.prefill_tokens += int(todo.sum())
        if scored:  # scored prompts are prefilled whole: their chunks start at position 0
            self._read_prompt_logprobs(new, leaders, n, chunks)

    def _copy_slots(self, pairs: list[list[tuple[int, int]]]) -> None:
        """Copies slots into slots, (source, destination) pairs per shard."""
        m = self._rows_bucket(pairs)
        self.state = self.programs.copy(m)(
            self.state, self._per_shard(lambda s: [a for a, _ in pairs[s]], m, 0),
            self._per_shard(lambda s: [b for _, b in pairs[s]], m, self.slots_per_shard))

    def _read_prompt_logprobs(self, new: list[Request], leaders: list[list[Request]], n: int,
                              chunks: list[tuple[int, Any]]) -> None:
        """Sets `prompt_logprobs` of the new requests asking for them from the scored
        prefill's chunks ((start, packed [data * n, c, ...]) each); a group's completions
        share its leader's (the same prompt, prefilled once per shard)."""
        got = jax.device_get([packed for _, packed in chunks])
        by_group = {}
        for s, shard in enumerate(leaders):
            for i, r in enumerate(shard):
                if r.params.prompt_logprobs is None:
                    continue
                entries: list = [None]  # nothing predicts the first token
                for (start, _), packed in zip(chunks, got):
                    own, ids, values = unpack_prompt_logprobs(packed[s * n + i], self.max_logprobs)
                    take = min(len(r.prompt) - 1 - start, len(own))  # positions start .. len - 2
                    if take > 0:
                        entries += top_entries(np.asarray(r.prompt[start + 1:start + 1 + take]), own[:take],
                                               ids[:take], values[:take], r.params.prompt_logprobs)
                r.prompt_logprobs = by_group[r.group] = entries
        for r in new:
            if r.params.prompt_logprobs is not None:
                r.prompt_logprobs = by_group[r.group]

    def _remove(self, shards: list[list[Request]], finished: list[Request]) -> None:
        """Keeps each shard's live requests packed: its last live slot swaps with each freed
        slot, highest first (`_move_slots`), and the free slot it leaves keeps what the
        finished request wrote, which later prompts beginning with it take (`_retained`,
        `dsd_jax.prefix_sharing`)."""
        swaps: list[list[tuple[int, int]]] = [[] for _ in range(self.data)]
        for r in sorted(finished, key=lambda r: r.slot, reverse=True):
            s, live = r.shard, shards[r.shard]
            i, last = r.slot, len(live) - 1
            if i != last:
                swaps[s].append((last, i))
                live[i] = live[last]
                live[i].slot = i
            elif r.stopped_on_host:  # still active on the device: a move with no
                swaps[s].append((i, self.slots_per_shard))  # destination frees it
            live.pop()
            r.slot = -1
            if self.share_prefixes:
                self._finished += 1
                self._retained[s][last] = prefix_sharing.retained(r.prompt, r.tokens, r.prompt_drafted,
                                                                  self._finished)
        self._move_slots(swaps)

    def _move_slots(self, swaps: list[list[tuple[int, int]]]) -> None:
        """Does each shard's (src, dst) swaps in order (`step.move_slots`), as many per
        program call as `step.swap_batches` allows: two programs a call, not two a swap. Every
        size compiles at the first call, swaps or none: a later rollout whose first swap
        needs another size must compile nothing."""
        programs = {m: (self.programs.slot_rows(m), self.programs.move(m)) for m in self.programs.move_rows}
        runs = [swap_batches(pairs, self.programs.move_rows[-1], self.slots_per_shard)
                for pairs in swaps]
        for i in range(max(map(len, runs))):
            run = [shard[i] if i < len(shard) else [] for shard in runs]
            m = self._rows_bucket(run, self.programs.move_rows)
            src = self._per_shard(lambda s: [a for a, _ in run[s]], m, self.slots_per_shard)  # padding
            dst = self._per_shard(lambda s: [b for _, b in run[s]], m, self.slots_per_shard)
            rows, move = programs[m]
            self.state = move(self.state, src, dst, rows(self.state, dst))
