"""The training scripts' command lines (`models.train`, `models.train_eagle3`) on tiny
settings: what they refuse before training, what they never delete, and `--resume`."""

import hashlib
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from dsd_jax import models
from dsd_jax.models import corpus
from dsd_jax.models import train as tr
from dsd_jax.models import train_eagle3 as te
from dsd_jax.models.builtin import _load_tokenizer

TINY = dict(vocab_size=4096, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
            num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
TRAIN = ["--minutes", "0", "--joint-steps", "2", "--distill-steps", "1", "--batch", "1",
         "--seq-len", "8", "--log-every", "100", "--ckpt-minutes", "100", "--warmup", "1"]


@pytest.fixture
def tiny_train(monkeypatch):
    """`models.train` on tiny models and three corpus files."""
    files = corpus.split_files()[0][:3]
    monkeypatch.setattr(corpus, "train_files", lambda root=None: files)
    monkeypatch.setattr(tr, "TARGET_CONFIG", models.ModelConfig(**TINY))
    monkeypatch.setattr(tr, "DRAFT_CONFIG", models.ModelConfig(**TINY))


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _usage_error(capsys, main, argv) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


# ------------------------------------------------------------------------------ models.train

@pytest.mark.parametrize("extra,flag", [
    (["--distill-fraction", "1.5"], "--distill-fraction"), (["--distill-fraction", "1"], "--distill-fraction"),
    (["--distill-fraction", "-0.1"], "--distill-fraction"), (["--seq-len", "0"], "--seq-len"),
    (["--batch", "0"], "--batch"), (["--lr", "0"], "--lr"), (["--lr", "nan"], "--lr"),
    (["--draft-lr", "inf"], "--draft-lr"), (["--joint-steps", "0"], "--joint-steps"),
    (["--distill-steps", "-1"], "--distill-steps"), (["--log-every", "0"], "--log-every"),
    (["--rate-steps", "0"], "--rate-steps"), (["--alpha", "1.5"], "--alpha"),
    (["--minutes", "-1"], "--minutes"), (["--warmup", "-1"], "--warmup"),
    (["--seq-len", "100000"], "--seq-len")])
def test_train_rejects_bad_numbers(tmp_path, capsys, extra, flag):
    err = _usage_error(capsys, tr.main, ["--out", str(tmp_path / "o")] + TRAIN + extra)
    assert flag in err
    assert not (tmp_path / "o").exists()  # refused before anything was written


def test_train_never_deletes_a_foreign_target_dir(tmp_path, capsys, tiny_train):
    app = tmp_path / "target" / "release" / "app"  # e.g. a cargo build folder
    app.parent.mkdir(parents=True)
    app.write_text("my build")
    err = _usage_error(capsys, tr.main, ["--out", str(tmp_path)] + TRAIN)
    assert "--overwrite" in err and str(tmp_path / "target") in err
    err = _usage_error(capsys, tr.main, ["--out", str(tmp_path), "--overwrite"] + TRAIN)
    assert "not a model checkpoint" in err and str(tmp_path / "target") in err
    assert app.read_text() == "my build"
    assert not (tmp_path / "draft").exists()


def test_train_rerun_needs_overwrite(tmp_path, capsys, tiny_train):
    out = tmp_path / "run"
    # --ckpt-minutes 0: a checkpoint after every step, each replacing the run's own last one
    tr.main(["--out", str(out)] + TRAIN + ["--ckpt-minutes", "0"])
    before = {n: _digest(out / n) for n in ("target", "draft")}
    assert models.restore(out / "draft").config.hidden_size == TINY["hidden_size"]
    err = _usage_error(capsys, tr.main, ["--out", str(out)] + TRAIN + ["--seed", "1"])
    assert "--overwrite" in err and str(out / "target") in err
    assert {n: _digest(out / n) for n in ("target", "draft")} == before
    tr.main(["--out", str(out), "--overwrite", "--seed", "1"] + TRAIN)
    assert _digest(out / "target") != before["target"]


def test_train_refuses_to_checkpoint_untrained_models(tmp_path, tiny_train):
    """A budget spent on compiling and timing left phase 1 with no step, and the untrained
    models were checkpointed as the result."""
    argv = ["--out", str(tmp_path / "o"), "--minutes", "0.0001", "--rate-steps", "1", "--batch", "1",
            "--seq-len", "8", "--log-every", "100", "--ckpt-minutes", "100"]
    with pytest.raises(RuntimeError, match="budget ended before the first joint step"):
        tr.main(argv)
    assert not (tmp_path / "o" / "target").exists() and not (tmp_path / "o" / "draft").exists()


def test_train_rejects_a_tokenizer_that_does_not_fit(tmp_path, capsys, tiny_train):
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers

    def word_tokenizer(vocab):
        tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return tok

    big = {f"w{i}": i for i in range(5000)}
    big.update({tr.EOT: 0, "[UNK]": 5000})
    eot_not_0 = {"[UNK]": 0, tr.EOT: 1, "a": 2}
    for vocab, why in ((big, "5000"), (eot_not_0, "id 1")):
        out = tmp_path / why.replace(" ", "")
        out.mkdir()
        word_tokenizer(vocab).save(str(out / "tokenizer.json"))
        err = _usage_error(capsys, tr.main, ["--out", str(out)] + TRAIN)
        assert "tokenizer.json" in err and why in err
        assert not (out / "target").exists() and not (out / "draft").exists()
    # ids past uint16 are an error, not an OverflowError or a silent wrap
    huge = word_tokenizer({tr.EOT: 0, "[UNK]": 70_000, "a": 70_001})
    with pytest.raises(ValueError, match="uint16"):
        tr.encode_corpus(huge, ["a a"])


def test_train_does_not_checkpoint_nan(tmp_path, tiny_train):
    out = tmp_path / "run"
    for name in ("target", "draft"):
        models.save(models.init_model(models.ModelConfig(**TINY), 0), out / name)
    before = {n: _digest(out / n) for n in ("target", "draft")}
    with pytest.raises(FloatingPointError, match=r"joint step \d+"):
        tr.main(["--out", str(out), "--overwrite", "--lr", "1e38", "--draft-lr", "1e38"] + TRAIN
                + ["--joint-steps", "4", "--warmup", "0"])
    assert {n: _digest(out / n) for n in ("target", "draft")} == before


# ------------------------------------------------------------------------- models.train_eagle3

E3 = ["--minutes", "0", "--batch", "1", "--seq-len", "8", "--ttt-steps", "2", "--draft-vocab", "64",
      "--intermediate", "32", "--log-every", "1", "--warmup", "2", "--lr", "1e-3"]
TINY_TARGET = dict(TINY, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=8)


@pytest.fixture
def tiny_e3(monkeypatch):
    """`models.train_eagle3` on a tiny target (the built-in tokenizer) and three corpus
    files; records the Adam step count and learning rate of every train step."""
    files = corpus.split_files()[0][:3]
    monkeypatch.setattr(corpus, "train_files", lambda root=None: files)
    target = models.init_model(models.ModelConfig(**TINY_TARGET), seed=0)
    tok = _load_tokenizer()
    monkeypatch.setattr(te, "builtin", lambda dtype="float32": (target, None, tok))
    calls = {"steps": [], "batches": [], "stop_after": None}
    make = te.make_train_step

    def make_recorded(*a, **k):
        step = make(*a, **k)

        def run(h, t, opt_state, batch, lr):
            if calls["stop_after"] is not None and len(calls["steps"]) >= calls["stop_after"]:
                raise KeyboardInterrupt  # as if the job were stopped here
            adam = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
                    if isinstance(s, optax.ScaleByAdamState)]
            calls["steps"].append((int(adam[0].count), float(lr)))
            calls["batches"].append(np.asarray(batch).tolist())
            return step(h, t, opt_state, batch, lr)
        return run

    monkeypatch.setattr(te, "make_train_step", make_recorded)
    return calls


def _state_arrays(out: Path) -> dict:
    with np.load(out / te.STATE_DIR / te.ARRAYS_FILE) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("extra,flag", [
    (["--rate-steps", "0", "--minutes", "1"], "--rate-steps"), (["--ttt-steps", "0"], "--ttt-steps"),
    (["--seq-len", "0"], "--seq-len"), (["--lr", "nan"], "--lr"), (["--steps", "0"], "--steps"),
    (["--draft-vocab", "5000"], "--draft-vocab"), (["--draft-vocab", "0"], "--draft-vocab"),
    (["--new-schedule"], "--new-schedule")])
def test_eagle3_rejects_bad_numbers(tmp_path, capsys, tiny_e3, extra, flag):
    err = _usage_error(capsys, te.main, ["--out", str(tmp_path / "h"), "--steps", "2"] + E3 + extra)
    assert flag in err
    assert tiny_e3["steps"] == []


def test_eagle3_refuses_an_existing_head(tmp_path, capsys, tiny_e3):
    out = tmp_path / "h"
    te.main(["--out", str(out), "--steps", "1"] + E3)
    head = (out / "model.safetensors").read_bytes()
    # the extra files beside the head do not disturb its loader
    assert models.load_eagle3(out).config.draft_vocab_size == 64
    err = _usage_error(capsys, te.main, ["--out", str(out), "--steps", "1", "--seed", "7"] + E3)
    assert "--resume" in err and "--overwrite" in err and str(out) in err
    with pytest.raises(FloatingPointError, match="step"):
        te.main(["--out", str(out), "--steps", "3", "--overwrite"] + E3 + ["--warmup", "0", "--lr", "1e38"])
    assert (out / "model.safetensors").read_bytes() == head
    assert len(tiny_e3["steps"]) > 1
    te.main(["--out", str(out), "--steps", "1", "--seed", "7", "--overwrite"] + E3)
    assert (out / "model.safetensors").read_bytes() != head


def test_eagle3_resume_continues_the_run(tmp_path, capsys, tiny_e3):
    whole, split = tmp_path / "whole", tmp_path / "split"
    te.main(["--out", str(whole), "--steps", "4"] + E3)
    uninterrupted = list(tiny_e3["steps"])
    assert [c for c, _ in uninterrupted] == [0, 1, 2, 3]
    # the same run stopped after two steps (a checkpoint after each), then resumed without
    # repeating --draft-vocab, --lr, --warmup or --steps
    tiny_e3["steps"].clear()
    tiny_e3["stop_after"] = 2
    with pytest.raises(KeyboardInterrupt):
        te.main(["--out", str(split), "--steps", "4", "--ckpt-minutes", "0"] + E3)
    tiny_e3["stop_after"] = None
    resume = ["--out", str(split), "--resume", "--minutes", "0", "--batch", "1", "--seq-len", "8",
              "--ttt-steps", "2", "--log-every", "1"]
    err = _usage_error(capsys, te.main, resume + ["--draft-vocab", "32"])
    assert "--draft-vocab" in err
    te.main(resume)
    assert tiny_e3["steps"] == uninterrupted  # Adam counts and the LR schedule go on
    a, b = _state_arrays(whole), _state_arrays(split)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7)
    log = json.loads((split / "train_log.json").read_text())
    assert [h["step"] for h in log["history"]] == [3, 4]
    assert [h["step"] for h in log["previous_runs"][0]["history"]] == [1, 2]
    assert models.load_eagle3(split).config == models.load_eagle3(whole).config
    # a head with no saved training state (an older one) resumes with a note
    shutil.rmtree(split / te.STATE_DIR)
    tiny_e3["steps"].clear()
    te.main(resume + ["--steps", "1"])
    assert "no saved training state" in capsys.readouterr().out
    assert tiny_e3["steps"][0][0] == 0
    assert len(json.loads((split / "train_log.json").read_text())["previous_runs"]) == 2


def test_eagle3_resume_continues_a_new_schedules_data_order(tmp_path, capsys, tiny_e3):
    """A --resume --new-schedule run draws batches of its own (seed + 1); interrupted and
    resumed, it went on with the first run's order (seed), not its own. Another --seed on
    a resume is refused: it would change the order."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    te.main(["--out", str(whole), "--steps", "2", "--ckpt-minutes", "0"] + E3)
    shutil.copytree(whole, split)
    cool_down = ["--resume", "--new-schedule", "--steps", "4", "--ckpt-minutes", "0"] + E3
    tiny_e3["batches"].clear()
    te.main(["--out", str(whole)] + cool_down)
    uninterrupted = list(tiny_e3["batches"])
    tiny_e3["batches"].clear()
    tiny_e3["steps"].clear()
    tiny_e3["stop_after"] = 2
    with pytest.raises(KeyboardInterrupt):
        te.main(["--out", str(split)] + cool_down)
    tiny_e3["stop_after"] = None
    err = _usage_error(capsys, te.main, ["--out", str(split), "--resume", "--seed", "3"] + E3)
    assert "--seed 3 would change its data order" in err
    te.main(["--out", str(split), "--resume"] + E3)
    assert tiny_e3["batches"] == uninterrupted and len(uninterrupted) == 4
