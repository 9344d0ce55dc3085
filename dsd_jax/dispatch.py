"""The engine's dispatch policy: what its next dispatch runs (host-side decisions).

Before each dispatch `SpecEngine` asks this policy for K (its controller's choice; the
same on every process under `jax.distributed`), for how many rounds of K the dispatch
runs, and whether to dispatch at all (not when every live row finishes in the dispatch in
flight); at admission, whether to prefill the drafter with the prompts. The engine owns
the requests, slots and device state; this module only decides.
"""

from __future__ import annotations

import collections
from typing import Any, Callable

import numpy as np

from dsd_jax.request import Request
from dsd_jax.step import MAX_ROUNDS

__all__ = ["ADAPTIVE_ROUNDS", "DispatchPolicy", "HELD_ROUNDS", "STABLE_DECISIONS"]

STABLE_DECISIONS = 3  # equal K choices in a row before a dispatch may run several rounds
# Rounds a dispatch may run while the controller may change its mind (goodput: acceptance,
# probes): it gets a say every ADAPTIVE_ROUNDS rounds. A choice the controller is `settled` on
# may run MAX_ROUNDS (32): for plain decoding at B=1 that was 0.9% [0.2, 1.5] faster than 8.
ADAPTIVE_ROUNDS = 8
# Rounds a dispatch of several live rows may run at the K a goodput controller holds
# (`DispatchPolicy._holds`): with no wait for equal choices and 16 rounds, dynamic ran 1.5%
# [0.4, 2.7] faster at B=2, 1.9% [0.2, 3.7] at B=4 (the same in a second run) and 2.7%
# [0.3, 5.0] at B=8 on XLA:CPU, where a dispatch costs ~1 ms beside its rounds
# (`benchmarks/results/controller_host/`, s30).
HELD_ROUNDS = 16


class DispatchPolicy:
    """K, rounds and the draft prefill for one engine's dispatches.

    Args:
      controller: the engine's controller (`SpecEngine.controller` reads and sets it here).
      max_k: the engine's largest K (0: plain decoding, no controller asked).
      agreement: `multihost.agreement(...)`, None on one process.
      budget: the most tokens a request may produce (its max_tokens within its slot).
    """

    stable_decisions = STABLE_DECISIONS  # a class attribute: the replay's variants change it

    def __init__(self, controller, max_k: int, agreement, budget: Callable[[Request], int]):
        self.controller = controller
        self._max_k = max_k
        self.agreement = agreement
        self._budget = budget
        self._history: collections.deque = collections.deque(maxlen=self.stable_decisions)

    def begin_run(self) -> None:
        """A run starts: the K choices of the last one do not make this one's stable."""
        self._history.clear()

    def remaining(self, r: Request) -> int:
        """Tokens request `r` may still produce."""
        return self._budget(r) - len(r.tokens)

    # ---- admission ------------------------------------------------------------------
    def draft_at_admission(self, batch: int, live: list[Request], refilled: bool) -> bool:
        """Whether admission prefills a drafter that could leave the prompts to its first
        round with K > 0 (`Drafter.catches_up_prompts`): when the controller would speculate
        at `batch` live rows (the K a goodput controller holds there, for the `live`
        requests as its next choice will see them; the static or scheduled K; unknown
        controllers: yes). Several processes always prefill: their controllers need not
        agree, and every process must run the same program on the same inputs."""
        if self.agreement is not None:
            return True
        ctl = self.controller
        mode = getattr(ctl, "mode", None)
        if mode == "goodput":  # priced as `choose_k` will price it: the same context and rows
            context = max(len(r.prompt) + len(r.tokens) for r in live)
            return ctl.held_k(batch, context_len=context, **self._controller_args(live, refilled)) > 0
        if mode in ("none", "static", "schedule"):
            return ctl.spec.schedule_k(batch) > 0
        return True

    # ---- the next dispatch ----------------------------------------------------------
    def finishes_in_flight(self, live: list[Request], inflight: Any) -> bool:
        """Whether every live row is in the dispatch in flight and reaches its length limit
        within it (each of its rounds emits at least one token a live row): a dispatch
        behind it would run no round."""
        if inflight is None:
            return False
        ran = {id(r) for r in inflight.snapshot if r is not None}
        return all(id(r) in ran and self.remaining(r) <= inflight.rounds for r in live)

    def choose_k(self, live: list[Request], batch: int, context: int, refilled: bool) -> int:
        """K for the next dispatch; `batch` is the fullest data shard's live count (the
        whole batch without data parallelism), whose rows set the step's time."""
        if self._max_k == 0:
            return 0
        if self.agreement is not None:  # every process must dispatch the same program
            return self.agreement.k(lambda: self._controller_k(live, batch, context, refilled))
        return self._controller_k(live, batch, context, refilled)

    def rounds(self, live: list[Request], k: int, queued: bool, inflight: Any, batch: int,
               context: int, after_prefill: bool) -> int:
        """Rounds of K the next dispatch runs. One right after a prefill (the dispatch's
        wall time includes the prefill, so none of its rounds times a step for the
        controller or the bench: let that be one round). Otherwise one, unless nothing can
        change before the rounds are done: no request is queued (a finishing row would
        free a slot for it), the controller's choice is stable, and no live row can reach
        its length limit before the last round (counting what the dispatch still in flight
        may emit). Rows stopping on a stop token end early on device all the same. The
        controller still observes every round. A stop string, found on the host, is not seen
        early: with one in any live row a dispatch runs ADAPTIVE_ROUNDS at most.

        Stable: a controller `settled` on K (every mode's K but goodput's follows the batch
        size alone; goodput holding K = 0 where it runs no probe) may run MAX_ROUNDS, and a
        lone row may run past its limit (the dispatch ends with it). The K a goodput
        controller holds (`_holds`, K = 0 too) is stable at once: a lone row runs
        ADAPTIVE_ROUNDS, past its limit too, several rows HELD_ROUNDS with the length rule.
        Any other choice is stable once the last STABLE_DECISIONS were this K, and gets a
        say every ADAPTIVE_ROUNDS, with the length rule: the goodput controller counts its probe
        interval in choices, so fewer, longer dispatches would probe less often (with lone
        rows running on, dynamic held K=0 in 25% of its B=1 steps, not 16%; `fixed_k_rounds/`;
        counted in steps instead, probes cost B=16-64 6-7%: `probe_steps/`).
        """
        self._history.append(k)
        fixed = self._settled(batch, k, context)
        if queued or after_prefill:
            return 1
        # a stop string ends a row on the host, after the dispatch: the device runs the
        # dispatch out, so rows that have stop strings get ADAPTIVE_ROUNDS at most
        strings = any(r.params.stop for r in live)
        held = not strings and self._holds(k)
        if len(live) == 1 and (fixed and not strings or held):
            # the dispatch ends when its one row does, so its length limit does not count
            return MAX_ROUNDS if fixed else ADAPTIVE_ROUNDS
        stable = fixed or held or (len(self._history) == self.stable_decisions and all(x == k for x in self._history))
        if not stable:
            return 1
        most = MAX_ROUNDS if fixed and not strings else HELD_ROUNDS if held else ADAPTIVE_ROUNDS
        return int(np.clip(-(-self._room(live, inflight) // (k + 1)), 1, most))

    def _room(self, live: list[Request], inflight: Any) -> int:
        """Tokens every live row may still produce once the dispatch in flight is done, at
        the fewest: their remaining budgets less what that dispatch may emit (K + 1 a round).
        (The replay prices other rules: `benchmarks/results/replay/dispatch_variants.py`.)"""
        pending = 0 if inflight is None else inflight.rounds * (inflight.k + 1)
        return min(self.remaining(r) for r in live) - pending

    def _holds(self, k: int) -> bool:
        """Whether K is what a goodput controller holds (`Controller.current_k`), not a
        probe off it: the choice is then stable at once (a lone row runs ADAPTIVE_ROUNDS,
        several rows HELD_ROUNDS). Short dispatches cost rounds on XLA:CPU (dynamic's K=4
        rounds at B=1 took 10.3 ms in dispatches of 1-8 rounds, static-4's 9.8 in 32; 1.8%
        [0.8, 2.7] faster at B=1 with the lone-row rule, s29; 1.5-2.0% at B=2-4 with
        several rows', s30: `benchmarks/results/controller_host/`). A held K = 0 too (s32):
        under the makespan objective it is never `settled` (its row moves as the budgets
        shrink), so it waited for three equal choices and ran 8 rounds a dispatch where
        plain decoding runs 32 (B=16: 11.8 dispatches a unit -> 5.3; speed +0.3% to +0.8%
        in three A/Bs, +2.9% [1.6, 4.4] in a fourth). Probes keep their one-round
        dispatches and their spacing in choices. Not under several processes: their
        controllers keep their own state."""
        if self.agreement is not None:
            return False
        ctl = self.controller
        return getattr(ctl, "mode", None) == "goodput" and getattr(ctl, "current_k", None) == k

    def _settled(self, batch: int, k: int, context: int) -> bool:
        """Whether the controller is sure to choose K again until the batch changes
        (`Controller.settled`). Under several processes only a K that follows the batch
        size alone counts: their controllers keep their own state, and every process must
        ask for the same rounds."""
        if self._max_k == 0:
            return True
        if self.agreement is not None:
            return getattr(self.controller, "mode", None) in ("none", "static", "schedule")
        settled = getattr(self.controller, "settled", None)
        return settled is not None and bool(settled(batch, k, context))

    def _makespan_args(self, live: list[Request], refilled: bool) -> dict:
        """The live requests' ids and remaining budgets for a makespan-objective controller
        when nothing will take a finished row's slot (it aims at the last row); else none."""
        if refilled or getattr(self.controller, "objective", None) != "makespan":
            return {}
        return {"request_ids": [r.request_id for r in live], "remaining": [self.remaining(r) for r in live]}

    def _controller_args(self, live: list[Request], refilled: bool) -> dict:
        """What `choose_k` and `held_k` read of the live requests: their ids, and their
        remaining budgets where the makespan objective aims at the last row."""
        return self._makespan_args(live, refilled) or {"request_ids": [r.request_id for r in live]}

    def _controller_k(self, live: list[Request], batch: int, context: int, refilled: bool) -> int:
        k = int(self.controller.choose_k(batch, context_len=context, **self._controller_args(live, refilled)))
        if not 0 <= k <= self._max_k:
            raise ValueError(f"controller chose K={k}, outside 0..{self._max_k}")
        return k
