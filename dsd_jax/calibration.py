"""How well the controller's predictions matched the steps it observed (numpy only).

For each observed step `Controller.observe` hands over the AL and the ITL it had
predicted for it (taken before the step updates any estimate) with what was
measured. `Calibration` keeps the recent records (`Controller.calibration_log()`)
and the running mean absolute percentage errors (`Controller.stats()`'s
``al_mape`` and ``itl_mape``). It only reports: nothing here steers the choice of K.
"""

from __future__ import annotations

import collections
import math
import numbers

import numpy as np

__all__ = ["Calibration", "step_ms"]


def step_ms(step_time_s) -> float | None:
    """A measured step time in seconds, checked, in milliseconds (None stays None)."""
    if step_time_s is None:
        return None
    if isinstance(step_time_s, bool) or not isinstance(step_time_s, numbers.Real) or not (
        math.isfinite(float(step_time_s)) and step_time_s > 0
    ):
        raise ValueError(f"step_time_s must be a positive finite number, got {step_time_s!r}")
    return float(step_time_s) * 1e3


def _mape(err_sum: float, n: int) -> float | None:
    return 100.0 * err_sum / n if n else None


class Calibration:
    """Predicted vs measured AL and ITL per step: the last `history` records and the
    mean absolute percentage errors over all of them."""

    def __init__(self, history: int):
        self._log: collections.deque = collections.deque(maxlen=max(1, history))
        self._al_err_sum = 0.0
        self._al_n = 0
        self._itl_err_sum = 0.0
        self._itl_n = 0

    def record(
        self,
        step: int,
        k: int,
        num_accepted: np.ndarray,
        pred_al: float | None = None,
        meas_itl_ms: float | None = None,
        itl_ms: tuple[float, float] | None = None,
    ) -> None:
        """One observed step that ran `k` drafts with `num_accepted` (checked, one per
        row). pred_al: the AL predicted for it (None for k = 0; NaN, not scored, when
        nothing was known). meas_itl_ms: its measured time; itl_ms: the (profile,
        predicted) ITL for it in ms (None without a profile)."""
        b = num_accepted.size
        rec = {"step": step, "k": k, "batch_size": int(b)}
        if pred_al is not None:
            meas_al = 1.0 + float(num_accepted.sum()) / b
            rec["pred_al"] = pred_al
            rec["meas_al"] = meas_al
            if pred_al == pred_al:  # not NaN (no prior and no live data yet)
                self._al_err_sum += abs(pred_al - meas_al) / meas_al
                self._al_n += 1
        if meas_itl_ms is not None:
            rec["meas_itl_ms"] = meas_itl_ms
            if itl_ms is not None:
                profile_ms, pred_ms = itl_ms
                rec["profile_itl_ms"] = profile_ms
                rec["pred_itl_ms"] = pred_ms
                self._itl_err_sum += abs(pred_ms - meas_itl_ms) / meas_itl_ms
                self._itl_n += 1
        self._log.append(rec)

    def log(self) -> list[dict]:
        """The recent records, oldest first."""
        return list(self._log)

    def mape(self) -> dict:
        """{"itl_mape", "al_mape"}: percent, None before any scored step."""
        return {"itl_mape": _mape(self._itl_err_sum, self._itl_n), "al_mape": _mape(self._al_err_sum, self._al_n)}
