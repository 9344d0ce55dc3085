"""`models.train_eagle3`: checkpoints that a kill cannot truncate, the directories
--overwrite may replace, and the flags --eval refuses (tiny target, `test_train_cli`'s
fixture)."""

import json
import re

import pytest

from dsd_jax import models
from dsd_jax.models import eagle3 as e3
from dsd_jax.models import train_eagle3 as te
from test_eagle3 import die_mid_weights
from test_train_cli import E3, TINY, _digest, _usage_error, tiny_e3  # noqa: F401  (a fixture)

FILES = ("model.safetensors", "config.json", "train_log.json")


def test_checkpoints_replace_files_whole(tmp_path, tiny_e3, monkeypatch):  # noqa: F811
    """A checkpoint killed while it writes the weights leaves the last one whole, and
    --resume continues from it; a finished one never wrote into the old files."""
    out = tmp_path / "h"
    te.main(["--out", str(out), "--steps", "1"] + E3)
    old = {n: (out / n).read_bytes() for n in FILES}
    for n in FILES:  # a second name for each file: an in-place write would change it too
        (tmp_path / n).hardlink_to(out / n)
    resume = ["--out", str(out), "--resume", "--steps", "2", "--minutes", "0", "--batch", "1",
              "--seq-len", "8", "--ttt-steps", "2", "--log-every", "1"]
    real = die_mid_weights(monkeypatch)  # the job is killed while it writes the weights
    with pytest.raises(KeyboardInterrupt):
        te.main(resume)
    assert {n: (out / n).read_bytes() for n in FILES} == old
    monkeypatch.setattr(e3, "atomic_write", real)
    te.main(resume)
    assert {n: (tmp_path / n).read_bytes() for n in FILES} == old
    assert (out / FILES[0]).read_bytes() != old[FILES[0]]
    assert json.loads((out / "train_log.json").read_text())["steps_done"] == 2


@pytest.mark.parametrize("case, match", [
    ("hf_target", r"config\.json names architectures \['LlamaForCausalLM'\], not an EAGLE-3 head"),
    ("orbax", r"a models\.save checkpoint \(params"),
    ("no_config", "holds model.safetensors with no config.json"),
    ("lone_log", "a train_log.json with no EAGLE-3 head beside it"),
    ("bad_config", r"a config\.json that is not a readable JSON object"),
])
def test_overwrite_replaces_only_a_head(tmp_path, capsys, tiny_e3, case, match):  # noqa: F811
    """--overwrite (or --resume, or nothing) never trains into another model's checkpoint;
    the error says what is there and does not suggest --overwrite."""
    out = tmp_path / "d"
    model = models.init_model(models.ModelConfig(**TINY), seed=0)
    if case == "orbax":
        models.save(model, out)
    elif case == "lone_log":
        out.mkdir()
        (out / "train_log.json").write_text("{}")
    elif case == "bad_config":
        out.mkdir()
        (out / "config.json").write_text("{")
    else:
        models.save_hf(model, out)
        if case == "no_config":
            (out / "config.json").unlink()
    before = _digest(out)
    for flags in (["--overwrite"], ["--resume"], []):
        err = _usage_error(capsys, te.main, ["--out", str(out), "--steps", "1"] + E3 + flags)
        assert re.search(match, err) and "not an EAGLE-3 head" in err, err
        assert "--overwrite to" not in err
    assert _digest(out) == before and tiny_e3["steps"] == []


@pytest.mark.parametrize("flags", [["--resume"], ["--overwrite"], ["--new-schedule"], ["--steps", "3"],
                                   ["--seq-len", "8"]])
def test_eval_refuses_training_flags(tmp_path, capsys, flags):
    err = _usage_error(capsys, te.main, ["--out", str(tmp_path), "--eval"] + flags)
    assert f"training flags ({flags[0]}) do not apply" in err
    assert not (tmp_path / "EVAL.json").exists()


def test_eval_needs_a_head(tmp_path, capsys):
    err = _usage_error(capsys, te.main, ["--out", str(tmp_path / "missing"), "--eval"])
    assert "--eval: --out" in err and "holds no EAGLE-3 head" in err and "does not exist" in err
