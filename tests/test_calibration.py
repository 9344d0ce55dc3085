"""Calibration: predicted vs measured AL / ITL records and their MAPEs."""

import math

import numpy as np
import pytest

from dsd_jax.calibration import Calibration, step_ms


def test_records_and_mape():
    cal = Calibration(history=2)
    assert cal.mape() == {"itl_mape": None, "al_mape": None} and cal.log() == []
    # k = 2, rows accepted 2, 2, 1, 1: measured AL 2.5 vs predicted 2.4; ITL 11 ms vs 10 predicted
    cal.record(1, 2, np.array([2, 2, 1, 1]), pred_al=2.4, meas_itl_ms=11.0, itl_ms=(9.0, 10.0))
    assert cal.log() == [{"step": 1, "k": 2, "batch_size": 4, "pred_al": 2.4, "meas_al": 2.5,
                          "meas_itl_ms": 11.0, "profile_itl_ms": 9.0, "pred_itl_ms": 10.0}]
    m = cal.mape()
    assert m["al_mape"] == pytest.approx(100 * 0.1 / 2.5) and m["itl_mape"] == pytest.approx(100 / 11)
    cal.record(2, 0, np.zeros(3, int), meas_itl_ms=5.0)  # K = 0, no profile: measured time only
    cal.record(3, 1, np.array([1, 0]), pred_al=math.nan)  # no estimate yet: logged, not scored
    assert cal.mape() == m  # neither step was scored
    log = cal.log()
    assert [r["step"] for r in log] == [2, 3]  # history=2 keeps the last two
    assert log[0] == {"step": 2, "k": 0, "batch_size": 3, "meas_itl_ms": 5.0}
    assert math.isnan(log[1]["pred_al"]) and log[1]["meas_al"] == 1.5 and "meas_itl_ms" not in log[1]
    one = Calibration(history=0)  # history < 1 still keeps the latest record
    one.record(1, 0, np.zeros(1, int))
    one.record(2, 0, np.zeros(1, int))
    assert one.log() == [{"step": 2, "k": 0, "batch_size": 1}]


def test_step_ms():
    assert step_ms(None) is None
    assert step_ms(0.0125) == 12.5 and step_ms(np.float32(0.5)) == 500.0
    for bad in (0, -1.0, math.inf, math.nan, True, "1"):
        with pytest.raises(ValueError, match="step_time_s"):
            step_ms(bad)
