"""models.save / models.restore: bit-identical round trips and clear errors."""

import json

import jax
import numpy as np
import pytest
from flax import nnx

from dsd_jax.models import ModelConfig, init_model
from dsd_jax.models.checkpoint import restore, save

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, tie_word_embeddings=True)


def _params(model):
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def _assert_identical(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("cfg", [CFG, CFG.replace(tie_word_embeddings=False, model_type="qwen3",
                                                  qk_norm=True),
                                 CFG.replace(model_type="qwen2", qkv_bias=True)])
def test_round_trip_bit_identical(tmp_path, dtype, cfg):
    model = init_model(cfg.replace(dtype=dtype), seed=3)
    save(model, tmp_path / "ckpt")
    back = restore(tmp_path / "ckpt")
    assert back.config == model.config
    _assert_identical(_params(model), _params(back))


def test_restores_on_a_machine_without_the_saving_device(tmp_path):
    # Orbax records each array's device ("cpu:0" for the shipped pair); on a GPU machine,
    # restoring without our own placement failed with "Topology mismatch" (issue 19's run).
    model = init_model(CFG, seed=2)
    save(model, tmp_path / "ckpt")
    sharding_file = tmp_path / "ckpt" / "params" / "_sharding"
    recorded = json.loads(sharding_file.read_text())
    assert all("cpu:0" in v for v in recorded.values())
    sharding_file.write_text(json.dumps({k: v.replace("cpu:0", "cuda:0") for k, v in recorded.items()}))
    back = restore(tmp_path / "ckpt")
    _assert_identical(_params(model), _params(back))
    assert back.embed[...].sharding.device_set == {jax.local_devices()[0]}


RESTORE_ON_DEVICE_1 = """
import sys, jax
from dsd_jax.models import ModelConfig, init_model
from dsd_jax.models.checkpoint import restore, save
cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                  num_kv_heads=2, head_dim=8)
save(init_model(cfg, seed=2), sys.argv[1])
with jax.default_device(jax.local_devices()[1]):
    back = restore(sys.argv[1])
print(sorted(d.id for d in back.embed[...].sharding.device_set))
"""


def test_restore_honours_the_default_device(tmp_path):
    """As `jnp` arrays and `load_hf` do: a user restoring elsewhere (say, onto the host to
    spare an accelerator's memory) gets the arrays there. Two CPU devices need a process
    of their own."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "2", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", RESTORE_ON_DEVICE_1, str(tmp_path / "ckpt")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[1]"


def test_save_cast_and_restore_cast(tmp_path):
    model = init_model(CFG, seed=1)
    save(model, tmp_path / "c", dtype="bfloat16")
    assert json.loads((tmp_path / "c" / "config.json").read_text())["dtype"] == "bfloat16"
    back = restore(tmp_path / "c")
    assert back.config.dtype == "bfloat16" and back.embed[...].dtype == np.dtype("bfloat16")
    up = restore(tmp_path / "c", dtype="float32")
    assert up.config.dtype == "float32" and up.embed[...].dtype == np.float32
    np.testing.assert_array_equal(np.asarray(up.embed[...]),
                                  np.asarray(model.embed[...].astype("bfloat16").astype("float32")))


def test_refuses_to_overwrite(tmp_path):
    model = init_model(CFG)
    save(model, tmp_path / "c")
    with pytest.raises(FileExistsError, match="not empty"):
        save(model, tmp_path / "c")
    save(model, tmp_path / "c", overwrite=True)
    restore(tmp_path / "c")


def _files(path):
    return {f.relative_to(path): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def _head():
    from dsd_jax.models.eagle3 import Eagle3Config, init_eagle3
    return init_eagle3(Eagle3Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=1,
                                    num_heads=4, num_kv_heads=2, head_dim=8, draft_vocab_size=32))


def test_savers_replace_only_their_own_kind(tmp_path):
    """All three write config.json: with overwrite=True any of them would make another
    kind's checkpoint unloadable (a target's replaced by a head, a head by a target), so
    each refuses the others, naming what is there and never suggesting overwrite."""
    from dsd_jax.models import load_eagle3, load_hf, save_eagle3, save_hf
    from dsd_jax.models.layout import checkpoint_kind
    model, head = init_model(CFG), _head()
    savers = {"dsd": (lambda d, **kw: save(model, d, **kw), FileExistsError),
              "hf": (lambda d, **kw: save_hf(model, d, **kw), ValueError),
              "eagle3": (lambda d, **kw: save_eagle3(head, d, **kw), ValueError)}
    dirs = {kind: tmp_path / kind for kind in savers}
    for kind, (saver, _) in savers.items():
        saver(dirs[kind])
        assert checkpoint_kind(dirs[kind]).kind == kind
    what = {"dsd": r"a models\.save checkpoint \(params/, checksums\.json, config\.json\)",
            "hf": r"a Hugging Face checkpoint \(model\.safetensors\) whose config\.json names "
                  r"architectures \['LlamaForCausalLM'\]",
            "eagle3": r"an EAGLE-3 head \(config\.json, model\.safetensors\)"}
    before = {kind: _files(d) for kind, d in dirs.items()}
    for kind, (saver, error) in savers.items():
        for other, d in dirs.items():
            if other == kind:
                continue
            for overwrite in (False, True):
                with pytest.raises(error, match=rf"holds {what[other]}, not ") as e:
                    saver(d, overwrite=overwrite)
                assert "overwrite" not in str(e.value)
    assert {kind: _files(d) for kind, d in dirs.items()} == before
    restore(dirs["dsd"]), load_hf(dirs["hf"]), load_eagle3(dirs["eagle3"])
    for kind, (saver, _) in savers.items():  # each still replaces its own
        saver(dirs[kind], overwrite=True)
        assert checkpoint_kind(dirs[kind]).kind == kind


def test_checkpoint_kind_table(tmp_path):
    """Directory contents -> kind: the one rule every saver and trainer asks."""
    from dsd_jax.models.hf import hf_config
    from dsd_jax.models.layout import KINDS, checkpoint_kind
    dsd_cfg = json.dumps(CFG.to_dict())
    hf_cfg = json.dumps(hf_config(CFG))
    e3_cfg = json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"})
    cases = [  # (entries: name -> text, or None for a directory; kind; part of the description)
        ({}, "empty", "empty directory"),
        ({"notes.txt": "x"}, "other", "notes.txt"),
        ({"tokenizer.json": "{}"}, "other", "tokenizer.json"),  # no model reads a tokenizer alone
        ({"train_log.json": "{}", "train_state": None}, "other", "train_log.json"),
        ({"config.json": dsd_cfg, "params": None, "checksums.json": "{}"}, "dsd",
         "a models.save checkpoint (params/, checksums.json, config.json)"),
        ({"config.json": dsd_cfg, "params": None, "tokenizer.json": "{}"}, "dsd", "models.save"),
        ({"params": None, "checksums.json": "{}"}, "dsd-partial", "params/, checksums.json with no"),
        ({"config.json": dsd_cfg}, "dsd-partial", "no params/ directory"),
        ({"config.json": hf_cfg, "model.safetensors": ""}, "hf",
         "a Hugging Face checkpoint (model.safetensors) whose config.json names architectures"),
        ({"config.json": hf_cfg, "model.safetensors.index.json": "{}"}, "hf", "index"),
        ({"config.json": hf_cfg, "model.safetensors": "", "tokenizer.json": "{}"}, "hf", "tokenizer.json"),
        ({"config.json": json.dumps({"model_type": "llama"})}, "hf", "names model_type 'llama'"),
        ({"config.json": e3_cfg, "model.safetensors": ""}, "eagle3", "an EAGLE-3 head"),
        ({"config.json": e3_cfg, "model.safetensors": "", "train_state": None, "train_log.json": "{}",
          "EVAL.json": "{}"}, "eagle3", "an EAGLE-3 head"),
        ({"model.safetensors": ""}, "unknown", "model.safetensors with no config.json"),
        ({"config.json": "{not json"}, "unknown", "not a readable JSON object"),
        ({"config.json": "[1]"}, "unknown", "not a readable JSON object (a JSON list)"),
        ({"config.json": "{}"}, "unknown", "no known checkpoint format"),
        ({"config.json": dsd_cfg, "params": None, "model.safetensors": ""}, "unknown", "two checkpoint formats"),
        ({"config.json": hf_cfg, "model.safetensors": "", "checksums.json": "{}"}, "unknown",
         "two checkpoint formats"),
        ({"params": None, "model.safetensors": ""}, "unknown", "two checkpoint formats"),
    ]
    for i, (entries, kind, part) in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        for name, text in entries.items():
            (d / name).mkdir() if text is None else (d / name).write_text(text)
        found = checkpoint_kind(d)
        assert (found.kind, part in found.what) == (kind, True), (entries, found)
        assert found.kind in KINDS
    assert checkpoint_kind(tmp_path / "missing").kind == "empty"
    (tmp_path / "file").write_text("x")
    assert checkpoint_kind(tmp_path / "file").kind == "file"
    link = tmp_path / "link"  # a dangling link is still something a save would replace
    link.mkdir()
    (link / "params").symlink_to(tmp_path / "nowhere")
    assert checkpoint_kind(link).kind == "dsd-partial"


def test_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        restore(tmp_path / "nope")


def test_missing_config(tmp_path):
    save(init_model(CFG), tmp_path / "c")
    (tmp_path / "c" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json is missing"):
        restore(tmp_path / "c")


def test_corrupt_config(tmp_path):
    save(init_model(CFG), tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt checkpoint config"):
        restore(tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text(json.dumps({"vocab_size": 64, "bogus": 1}))
    with pytest.raises(ValueError, match="invalid checkpoint config"):
        restore(tmp_path / "c")


def test_missing_params(tmp_path):
    save(init_model(CFG), tmp_path / "c")
    import shutil
    shutil.rmtree(tmp_path / "c" / "params")
    with pytest.raises(FileNotFoundError, match="params/ is missing"):
        restore(tmp_path / "c")


def _swap_config(tmp_path, **changes):
    save(init_model(CFG), tmp_path / "c")
    cfg_file = tmp_path / "c" / "config.json"
    d = json.loads(cfg_file.read_text())
    d.update(changes)
    cfg_file.write_text(json.dumps(d))
    return tmp_path / "c"


def test_shape_mismatch_named(tmp_path):
    path = _swap_config(tmp_path, intermediate_size=64)
    with pytest.raises(ValueError, match=r"does not match its config.*layers/0/w_(gate|up|down).*has shape"):
        restore(path)


def test_tree_mismatch_named(tmp_path):
    path = _swap_config(tmp_path, num_layers=3)
    with pytest.raises(ValueError, match=r"does not match its config.*missing.*layers/2"):
        restore(path)
    path2 = _swap_config(tmp_path / "x", tie_word_embeddings=False)
    with pytest.raises(ValueError, match=r"missing.*lm_head"):
        restore(path2)


def test_dtype_mismatch_named(tmp_path):
    path = _swap_config(tmp_path, dtype="bfloat16")
    with pytest.raises(ValueError, match=r"dtype float32, config says bfloat16"):
        restore(path)


def test_save_rejects_non_model(tmp_path):
    with pytest.raises(TypeError):
        save({"a": 1}, tmp_path / "c")


@pytest.mark.parametrize("missing", ["_METADATA", "manifest.ocdbt", "d"])
def test_incomplete_params_named(tmp_path, missing):
    """Orbax returns no tree without these: the error names the directory and the file."""
    import shutil
    save(init_model(CFG), tmp_path / "c")
    entry = tmp_path / "c" / "params" / missing
    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    with pytest.raises(ValueError, match=rf"{tmp_path / 'c' / 'params'}: {missing}/? missing"):
        restore(tmp_path / "c")


@pytest.mark.parametrize("changes, match", [
    ({"vocab_size": None}, "vocab_size must be a positive integer, got null"),
    ({"num_heads": "4"}, r"num_heads must be a positive integer, got '4' \(str\)"),
    ({"rms_norm_eps": None}, "rms_norm_eps must be a non-negative finite number, got null"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings must be True or False"),
    ({"rope_scaling": [1, 2]}, r"rope_scaling must be null or a dict.*\[1, 2\]"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}}, "unsupported rope_scaling type 'yarn'"),
])
def test_config_field_types_named(tmp_path, changes, match):
    with pytest.raises(ValueError, match=f"invalid checkpoint config .*config.json: {match}"):
        restore(_swap_config(tmp_path, **changes))


def test_from_dict_needs_a_dict():
    with pytest.raises(ValueError, match="must be a JSON object, got list"):
        ModelConfig.from_dict([1, 2])


LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("scaling, match", [
    ({"rope_type": "yarn", "factor": 4.0}, "unsupported rope_scaling type 'yarn'"),
    ({"rope_type": "linear", "factor": 4.0}, "unsupported rope_scaling type 'linear'"),
    ({"type": "dynamic", "factor": 4.0}, "unsupported rope_scaling type 'dynamic'"),
    ([("rope_type", "llama3"), ("factor", 8.0)], "rope_scaling must be null or a dict"),
    ({k: v for k, v in LLAMA3.items() if k != "factor"}, "needs a 'factor'"),
    ({**LLAMA3, "factor": 0.0}, "factor must be a positive finite number, got 0.0"),
    ({**LLAMA3, "factor": float("inf")}, "factor must be a positive finite number, got inf"),
    ({**LLAMA3, "factor": "8"}, "factor must be a positive finite number, got '8'"),
    ({**LLAMA3, "low_freq_factor": 4.0}, "high_freq_factor .* must exceed low_freq_factor"),
    ({**LLAMA3, "original_max_position_embeddings": None}, "original_max_position_embeddings must be"),
    ({**LLAMA3, "beta_fast": 32}, r"unknown llama3 key\(s\) \['beta_fast'\]"),
    ({**LLAMA3, "type": "yarn"}, "rope_type 'llama3' and type 'yarn'"),
])
def test_rope_scaling_validated_at_construction(scaling, match):
    """Refused when the config is built, not at the first forward (and never computed as
    unscaled RoPE, as other types used to be)."""
    with pytest.raises(ValueError, match=match):
        CFG.replace(rope_scaling=scaling)


def test_rope_scaling_canonical_form(tmp_path):
    from dsd_jax.models.synthetic import SYNTHETIC_CONFIGS, synthetic_config
    from dsd_jax.models.transformer import rope_inv_freq
    cfg = CFG.replace(rope_scaling=LLAMA3)
    assert cfg.rope_scaling == tuple(sorted(LLAMA3.items())) and hash(cfg)
    legacy = {("type" if k == "rope_type" else k): v for k, v in LLAMA3.items()}
    assert CFG.replace(rope_scaling=legacy) == cfg  # the legacy key is the same scaling
    assert CFG.replace(rope_scaling=tuple(reversed(cfg.rope_scaling))) == cfg
    assert not np.array_equal(rope_inv_freq(cfg), rope_inv_freq(CFG))
    assert CFG.replace(rope_scaling={"rope_type": "default"}).rope_scaling is None
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    save(init_model(cfg), tmp_path / "c")
    assert restore(tmp_path / "c").config == cfg
    for name in SYNTHETIC_CONFIGS:  # the real Llama 3.1 / 3.2 scalings load
        synthetic_config(name)


def _flip_a_weight_bit(path):
    """Flips one bit in the middle of the largest Orbax data file (raw weight bytes)."""
    data = [f for f in (path / "params").rglob("*") if f.is_file() and f.parent.name == "d"]
    f = max(data, key=lambda f: f.stat().st_size)
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0x10
    f.write_bytes(bytes(b))


def test_flipped_bit_in_the_weights_is_named(tmp_path):
    model = init_model(CFG, seed=1)
    save(model, tmp_path / "c")
    assert (tmp_path / "c" / "checksums.json").is_file()
    _flip_a_weight_bit(tmp_path / "c")
    unchecked = restore(tmp_path / "c", verify=False)  # Orbax itself reads it back without complaint
    changed = [x for x, y in zip(jax.tree.leaves(_params(model)), jax.tree.leaves(_params(unchecked)))
               if not np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))]
    assert len(changed) == 1
    with pytest.raises(ValueError, match=r"is corrupt: parameter\(s\) \['[^']+'\] read from params/ "
                                         r"do not match the checksums recorded at save"):
        restore(tmp_path / "c")


def test_checksum_file_problems_named(tmp_path):
    save(init_model(CFG), tmp_path / "c")
    file = tmp_path / "c" / "checksums.json"
    record = json.loads(file.read_text())
    file.write_text("{trunc")
    with pytest.raises(ValueError, match="corrupt checksum file .*checksums.json"):
        restore(tmp_path / "c")
    file.write_text(json.dumps({**record, "algorithm": "md5"}))
    with pytest.raises(ValueError, match="corrupt checksum file .*expected"):
        restore(tmp_path / "c")
    digests = dict(record["parameters"])
    digests["layers/9/w_up"] = digests.pop("embed")
    file.write_text(json.dumps({**record, "parameters": digests}))
    with pytest.raises(ValueError, match=r"does not list this checkpoint's parameters.*'embed'"):
        restore(tmp_path / "c")
    restore(tmp_path / "c", verify=False)
    file.unlink()  # a checkpoint saved before checksums were recorded restores unchecked
    restore(tmp_path / "c")


def test_builtin_pair_ships_checksums():
    from dsd_jax.models.builtin import BUILTIN_DIR
    for name in ("target", "draft"):
        assert (BUILTIN_DIR / name / "checksums.json").is_file()


def test_atomic_write_writes_through_links_and_devices(tmp_path):
    """`atomic_write` renames a temporary file over its path: given a symlink it replaced the
    link (its target never got the output), and given a device or FIFO (`--out /dev/null`
    with --overwrite, as root) it replaced the device with a plain file. Both are written
    through now; a regular file is still replaced whole."""
    import os
    import stat
    import threading

    from dsd_jax.models.layout import atomic_write
    target, link = tmp_path / "target.jsonl", tmp_path / "link.jsonl"
    target.write_text("old")
    link.symlink_to(target)
    atomic_write(link, lambda f: f.write("new"))
    assert link.is_symlink() and target.read_text() == "new"
    fifo, got = tmp_path / "fifo", []
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    atomic_write(fifo, lambda f: f.write("through"))
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and got == ["through"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "link.jsonl", "target.jsonl"]
    # /dev/stdout of a process run as `>> log`: appended to; the file behind it is not replaced
    import subprocess
    import sys
    log = tmp_path / "log.txt"
    log.write_text("earlier\n")
    code = "from dsd_jax.models.layout import atomic_write; atomic_write('/dev/stdout', lambda f: f.write('new\\n'))"
    with open(log, "a") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, check=True, timeout=120)
    assert log.read_text() == "earlier\nnew\n"
    piped = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, check=True, timeout=120)
    assert piped.stdout == b"new\n"  # `| cat`: realpath gives /proc/PID/fd/pipe:[...], not a file


def test_save_under_a_glob_character_path(tmp_path):
    """Orbax globs the full path when merging its OCDBT files: under a `[` it skipped writing
    manifest.ocdbt and d/ (a logged warning only), so save returned an unloadable checkpoint,
    and with overwrite=True it had already destroyed the good one there."""
    model = init_model(CFG, seed=1)
    for name in ("run[1]", "lr=[3e-4]", "a*b?"):
        path = tmp_path / name / "ckpt"
        save(model, path)
        _assert_identical(_params(model), _params(restore(path)))
        other = init_model(CFG, seed=5)
        save(other, path, overwrite=True)
        _assert_identical(_params(other), _params(restore(path)))
        assert sorted(p.name for p in path.iterdir()) == ["checksums.json", "config.json", "params"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a*b?", "lr=[3e-4]", "run[1]"]  # no staging left


def test_incomplete_orbax_save_replaces_nothing(tmp_path, monkeypatch):
    """A save that Orbax leaves incomplete (as it did under a `[`, warning only) raises
    before the checkpoint already there is touched."""
    import shutil

    from dsd_jax.models import checkpoint
    model = init_model(CFG, seed=1)
    save(model, tmp_path / "c")
    before = _files(tmp_path / "c")
    real = checkpoint._checkpointer

    class Dropping:
        def __init__(self):
            self.inner = real()

        def save(self, directory, *args, **kw):
            self.inner.save(directory, *args, **kw)
            self.inner.wait_until_finished()
            shutil.rmtree(directory / "d")

        def wait_until_finished(self):
            self.inner.wait_until_finished()

        def close(self):
            self.inner.close()

    monkeypatch.setattr(checkpoint, "_checkpointer", Dropping)
    with pytest.raises(RuntimeError, match=rf"saving to {tmp_path / 'c'} failed: .*incomplete .*d/ missing"):
        save(init_model(CFG, seed=5), tmp_path / "c", overwrite=True)
    assert _files(tmp_path / "c") == before
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["checksums.json", "config.json", "params"]
    monkeypatch.undo()
    _assert_identical(_params(model), _params(restore(tmp_path / "c")))


def test_flipped_bit_in_the_config_is_named(tmp_path):
    """checksums.json covered only the weights: rms_norm_eps 1e-05 -> 1e-04 (one bit) restored
    silently as another model."""
    save(init_model(CFG.replace(rms_norm_eps=1e-5), seed=1), tmp_path / "c")
    file = tmp_path / "c" / "config.json"
    raw = bytearray(file.read_bytes())
    i = raw.index(b'"rms_norm_eps": 1e-05') + len(b'"rms_norm_eps": 1e-0')
    raw[i] ^= 0x01
    file.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"is corrupt: config\.json does not match the checksum "
                                         r"recorded at save \(checksums\.json\)"):
        restore(tmp_path / "c")
    assert restore(tmp_path / "c", verify=False).config.rms_norm_eps == 1e-4
    # saved before configs were checksummed: restores, its weights still checked
    checksums = tmp_path / "c" / "checksums.json"
    record = json.loads(checksums.read_text())
    del record["config"]
    checksums.write_text(json.dumps(record))
    restore(tmp_path / "c")
    _flip_a_weight_bit(tmp_path / "c")
    with pytest.raises(ValueError, match=r"is corrupt: parameter\(s\)"):
        restore(tmp_path / "c")


def test_builtin_pair_restores_without_a_config_checksum():
    """The shipped pair predates config checksums: they are recorded as absent, not an error."""
    from dsd_jax import models
    from dsd_jax.models.builtin import BUILTIN_DIR
    for name in ("target", "draft"):
        assert "config" not in json.loads((BUILTIN_DIR / name / "checksums.json").read_text())
    target, draft, _ = models.builtin()
    assert target.config.num_layers > 0 and draft.config.num_layers > 0


def test_a_crashed_saves_staging_folder_is_not_a_checkpoint(tmp_path):
    """A save killed mid-write leaves its staging folder in the directory: the next save
    still takes it as empty (it had needed overwrite=True), and the checkpoint loads."""
    from dsd_jax.models.layout import checkpoint_kind
    path = tmp_path / "c"
    (path / ".saving-killed" / "params").mkdir(parents=True)
    assert checkpoint_kind(path).kind == "empty"
    model = init_model(CFG, seed=1)
    save(model, path)
    _assert_identical(_params(model), _params(restore(path)))
    assert checkpoint_kind(path).kind == "dsd"
    (tmp_path / "d" / ".saving-notes.txt").parent.mkdir()
    (tmp_path / "d" / ".saving-notes.txt").write_text("x")  # a file of that name is the user's
    assert checkpoint_kind(tmp_path / "d").kind == "other"
