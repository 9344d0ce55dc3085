"""`dsd-jax` CLI, in process: profile -> goodput engine, generate JSONL, clear errors."""

from __future__ import annotations

import io
import json
import os
import sys
import types
import warnings

import jax
import numpy as np
import pytest

from dsd_jax import DynamicConfig, RequestOutput, SamplingParams, SpecConfig, SpecEngine, cli, loading, models, records
from dsd_jax.cli import common, generate_command, profile_command
from dsd_jax.profile import Profile, ProfileMismatchWarning
from dsd_jax.profiler import device_kind, model_fingerprint
from conftest import scaled

PROMPT_IDS = [[1, 2, 3], [5, 6, 7, 8, 9], [3, 3, 3, 9]]
ENGINE_FLAGS = ["--max-batch-size", "2", "--max-seq-len", "48", "--prefill-chunk", "16", "--no-progress"]


@pytest.fixture(scope="module")
def files(tiny_pair, tmp_path_factory):
    """Saved tiny checkpoints, a word-level tokenizer and prompt files."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    root = tmp_path_factory.mktemp("cli")
    target, draft = tiny_pair
    target = scaled(target, 3.0)
    models.save(target, root / "target")
    models.save(draft, root / "draft")
    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.save(str(root / "tokenizer.json"))
    (root / "prompts.txt").write_text("".join(" ".join(f"w{t}" for t in p) + "\n\n" for p in PROMPT_IDS))
    (root / "prompts.jsonl").write_text("\n".join(json.dumps({"prompt_token_ids": p}) for p in PROMPT_IDS))
    return types.SimpleNamespace(root=root, target=str(root / "target"), draft=str(root / "draft"),
                                 tokenizer=str(root / "tokenizer.json"), txt=str(root / "prompts.txt"),
                                 jsonl=str(root / "prompts.jsonl"), models=(target, draft))


@pytest.fixture(scope="module")
def profile_path(files, compilation_cache):
    out = files.root / "profile.json"
    rc = cli.main(["profile", "--target", files.target, "--draft", files.draft,
                   "--speculative-config", '{"num_speculative_tokens": 1}', *ENGINE_FLAGS,
                   "--context-lengths", "24,8", "--repeats", "2", "--warmup-reps", "1",
                   "--prompts", files.jsonl, "--acceptance-max-tokens", "8", "--temperatures", "0.5,0",
                   "--compilation-cache-dir", compilation_cache, "--out", str(out)])
    assert rc == 0
    return out


def test_profile_round_trips(profile_path, files):
    target, draft = files.models
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prof = Profile.load(profile_path, expect_fingerprints={"target": model_fingerprint(target),
                                                              "draft": model_fingerprint(draft)},
                            expect_device_kind=device_kind())
    assert prof.batch_sizes == [1, 2] and prof.ks == [0, 1] and prof.context_lengths == [8, 24]
    table = np.asarray(prof.latency_ms)
    assert table.shape == (2, 2, 2) and np.all(np.isfinite(table)) and np.all(table > 0)
    assert len(prof.acceptance) == 1 and 0.0 <= prof.acceptance[0] <= 1.0
    assert prof.meta["num_prompts"] == len(PROMPT_IDS) and prof.meta["repeats"] == 2
    # the first temperature is the profile's: its acceptance, and steps timed sampling at it
    assert prof.meta["latency_temperature"] == 0.5 and set(prof.acceptance_by_temperature) == {"0.5", "0.0"}
    assert prof.acceptance == prof.acceptance_by_temperature["0.5"]
    with pytest.warns(ProfileMismatchWarning):
        Profile.load(profile_path, expect_fingerprints={"target": model_fingerprint(draft)})


def test_goodput_engine_with_profile_is_lossless(profile_path, files, compilation_cache, tmp_path, capsys):
    """An engine configured with the profile (acceptance made optimistic so the goodput
    controller speculates, then learns the real, low acceptance and switches K) gives
    the same greedy tokens as `dsd-jax generate` with method "none"."""
    prof = Profile.load(profile_path)
    d = prof.to_dict()
    d["acceptance"] = [0.95]
    d["acceptance_by_temperature"] = None  # else each run's prior is the measured one (`use_temperature`)
    d["latency_ms"] = [[[1.0, 1.2] for _ in prof.batch_sizes] for _ in prof.context_lengths]
    optimistic = tmp_path / "optimistic.json"
    Profile.from_dict(d).save(optimistic)
    target, draft = models.restore(files.target), models.restore(files.draft)
    spec = SpecConfig(num_speculative_tokens=1, dynamic=DynamicConfig(profile=str(optimistic), warmup_steps=2))
    engine = SpecEngine(target, draft, spec, max_batch_size=2, max_seq_len=48, prefill_chunk=16,
                        compilation_cache_dir=compilation_cache)
    outs = engine.generate(PROMPT_IDS, SamplingParams(temperature=0.0, max_tokens=12))
    k_hist = engine.stats.k_hist
    assert k_hist[1] > 0 and k_hist[0] > 0, k_hist  # speculated, then backed off

    out = tmp_path / "plain.jsonl"
    stats, trace = tmp_path / "stats.json", tmp_path / "trace.json"
    rc = cli.main(["generate", "--target", files.target, "--speculative-config", '{"method": "none"}',
                   *ENGINE_FLAGS, "--prompts", files.jsonl, "--temperature", "0", "--max-tokens", "12",
                   "--logprobs", "--out", str(out), "--stats", str(stats), "--trace", str(trace)])
    assert rc == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["token_ids"] for r in recs] == [o.token_ids for o in outs]
    for r, p in zip(recs, PROMPT_IDS):
        assert r["prompt_token_ids"] == p and r["prompt"] is None and r["text"] is None
        assert r["finish_reason"] == "length" and len(r["logprobs"]) == 12
    assert json.loads(stats.read_text())["tokens"] == 36
    assert isinstance(json.loads(trace.read_text()), list)


def test_generate_text_prompts_with_profile(profile_path, files, tmp_path, capsys):
    """Text prompt file + tokenizer + --profile (goodput); JSONL to stdout."""
    rc = cli.main(["generate", "--target", files.target, "--draft", files.draft, "--tokenizer", files.tokenizer,
                   "--speculative-config", '{"num_speculative_tokens": 1}', *ENGINE_FLAGS,
                   "--prompts", files.txt, "--temperature", "0", "--max-tokens", "5",
                   "--profile", str(profile_path)])
    assert rc == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in recs] == [" ".join(f"w{t}" for t in p) for p in PROMPT_IDS]
    assert [r["prompt_token_ids"] for r in recs] == PROMPT_IDS
    for r in recs:
        # read after the prompt, as vLLM's text: a word-level tokenizer joins it with a space
        assert len(r["token_ids"]) == 5 and r["text"] == "".join(f" w{t}" for t in r["token_ids"])
        assert "logprobs" not in r


def test_generate_top_logprobs(files, capsys):
    """--top-logprobs N: per token, its N likeliest [id, raw logprob] pairs, likeliest first,
    then its own pair if it is not among them (--prompt-logprobs: per prompt token, null for
    the first); a negative N fails before any model loads."""
    gen = ["generate", "--target", files.target, "--draft", files.draft,
           "--speculative-config", '{"num_speculative_tokens": 1}', *ENGINE_FLAGS,
           "--prompts", files.jsonl, "--temperature", "1", "--seed", "3", "--max-tokens", "6"]
    assert cli.main(gen + ["--top-logprobs", "3", "--logprobs", "--prompt-logprobs", "2"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(recs) == len(PROMPT_IDS)
    for r, prompt in zip(recs, PROMPT_IDS):
        assert r["prompt_logprobs"][0] is None and len(r["prompt_logprobs"]) == len(prompt)
        assert all(token in dict(pairs) and len(pairs) in (2, 3)
                   for token, pairs in zip(prompt[1:], r["prompt_logprobs"][1:]))
        assert len(r["top_logprobs"]) == len(r["token_ids"]) == 6
        for token, raw, pairs in zip(r["token_ids"], r["raw_logprobs"], r["top_logprobs"]):
            values = [lp for _, lp in pairs[:3]]
            assert values == sorted(values, reverse=True) and len(pairs) in (3, 4)
            assert dict(pairs)[token] == pytest.approx(raw, abs=1e-6)
    with pytest.raises(SystemExit, match=r"invalid sampling flags: logprobs .* must be >= 0, got -1"):
        cli.main(gen + ["--top-logprobs", "-1", "--target", "/nonexistent"])


def test_generate_with_stop_strings(files, tmp_path, capsys):
    """--stop (repeatable): a record ends with the token completing the string, its text
    before it, and its stop_reason names it; without a tokenizer, an error naming --stop."""
    gen = ["generate", "--target", files.target, "--draft", files.draft, "--tokenizer", files.tokenizer,
           "--speculative-config", '{"num_speculative_tokens": 1}', *ENGINE_FLAGS,
           "--prompts", files.jsonl, "--temperature", "0", "--max-tokens", "8"]
    assert cli.main(gen) == 0
    free = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    word = free[0]["text"].split()[3]  # the 4th token of the first completion: " w17" -> "w17"
    assert cli.main(gen + ["--stop", word, "--stop", "never"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    from tokenizers import Tokenizer
    decode = Tokenizer.from_file(files.tokenizer).decode
    for r, f in zip(recs, free):
        ids = f["token_ids"]
        if word in f["text"]:  # cut at the fewest tokens whose text holds it
            n = next(n for n in range(1, len(ids) + 1) if word in decode(ids[:n]))
            assert r["token_ids"] == ids[:n] and r["text"] == f["text"][:f["text"].index(word)]
            assert (r["finish_reason"], r["stop_reason"]) == ("stop", word)
        else:
            assert r["token_ids"] == ids and r["stop_reason"] is None
    assert recs[0]["finish_reason"] == "stop"
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.jsonl,
              "--stop", "w1"])
    assert "--stop" in m and "tokenizer" in m
    # --bad-word: the word never appears (here one token, with or without its space)
    assert cli.main(gen + ["--bad-word", word]) == 0
    banned = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert all(word not in r["text"].split(" ") for r in banned)
    assert banned[0]["token_ids"] != free[0]["token_ids"]
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.jsonl,
              "--bad-word", "w1"])
    assert m.startswith("dsd-jax generate: error: --bad-word: bad words are tokenized: they need a tokenizer"), m
    # --min-tokens 4: the string in the 4th token no longer ends the first completion there
    assert cli.main(gen + ["--stop", word, "--min-tokens", "4"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert len(first["token_ids"]) > 4 and free[0]["token_ids"][:len(first["token_ids"])] == first["token_ids"]
    m = _err(gen + ["--min-tokens", "9"])
    assert "min_tokens (9) must be at most max_tokens (8)" in m


def test_generate_with_an_eagle3_head(files, tmp_path, capsys):
    """--speculative-config naming an EAGLE-3 head directory: the engine drafts with the head
    and greedy output equals plain greedy decoding."""
    from conftest import greedy_reference
    from test_eagle3 import head_config, head_tensors, write_head
    cfg = head_config(64, 48, aux=(0, 1))
    head_dir = write_head(tmp_path / "head", cfg, head_tensors(cfg, seed=1))
    spec = json.dumps({"method": "eagle3", "model": str(head_dir), "num_speculative_tokens": 2})
    rc = cli.main(["generate", "--target", files.target, "--speculative-config", spec,
                   *ENGINE_FLAGS, "--prompts", files.jsonl, "--temperature", "0", "--max-tokens", "6",
                   "--stats", str(tmp_path / "stats.json")])
    assert rc == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["token_ids"] for r in recs] == [greedy_reference(files.models[0], p, 6) for p in PROMPT_IDS]
    assert json.loads((tmp_path / "stats.json").read_text())["steps"] > 0
    m = _err(["profile", "--target", files.target, "--method", "eagle3", *ENGINE_FLAGS,
              "--out", str(tmp_path / "p.json")])
    assert "--speculative-config" in m and "built-in EAGLE-3 head was trained for the built-in target" in m
    m = _err(["generate", "--target", files.target, "--prompts", files.jsonl, "--method", "ngram",
              "--speculative-config", spec])
    assert "--method" in m and "disagrees" in m


def test_builtin_head_for_a_custom_target_is_refused_before_any_model_loads(monkeypatch, capsys):
    """The refusal depends on the flags alone; it came after building the target (an 8B
    synthetic target: minutes and gigabytes)."""
    from dsd_jax import loading

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(loading, "load_models", no_loading)
    monkeypatch.setattr(profile_command, "_synthetic_models", no_loading)
    m = _err(["profile", "--synthetic", "llama-3.2-1b", "--method", "eagle3", "--acceptance", "0.5",
              "--out", "unused.json"], capsys)
    assert "built-in EAGLE-3 head was trained for the built-in target" in m, m


def _err(argv, capsys=None) -> str:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    code = e.value.code
    if isinstance(code, str):
        return code
    return capsys.readouterr().err if capsys else ""


def test_bad_paths_are_clear_errors(files, tmp_path, capsys):
    missing = str(tmp_path / "nope")
    m = _err(["profile", "--target", missing, "--draft", files.draft, "--out", str(tmp_path / "p.json")])
    assert "--target" in m and "no such directory" in m
    m = _err(["profile", "--target", files.txt, "--draft", files.draft, "--out", str(tmp_path / "p.json")])
    assert "--target" in m and "not a directory" in m
    m = _err(["profile", "--target", files.target, "--out", str(tmp_path / "no" / "p.json")])
    assert "--out" in m and "does not exist" in m
    m = _err(["profile", "--target", files.target, "--draft", files.draft, "--out", str(tmp_path)])
    assert "--out" in m and "is a directory" in m
    m = _err(["profile", "--target", str(files.root), "--draft", files.draft, "--out", str(tmp_path / "p.json")])
    assert "--target" in m and "cannot load" in m
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", missing])
    assert "--prompts" in m and "no such file" in m
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.txt,
              "--profile", missing])
    assert "--profile" in m
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.txt,
              "--speculative-config", missing])
    assert "--speculative-config" in m and "no such file" in m
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.txt,
              "--speculative-config", '{"num_speculative_tokens": -1}'])
    assert "--speculative-config" in m and "num_speculative_tokens" in m
    m = _err(["generate", "--target", files.target, "--prompts", files.jsonl])
    assert "--draft" in m  # default method draft_model needs a draft
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.txt])
    assert "--prompts" in m and "tokenizer" in m  # text prompts without a tokenizer
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_token_ids": [1, 2]}\n{"text": "x"}\n')
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", str(bad)])
    assert "--prompts" in m and "line 2" in m
    m = _err(["generate", "--target", files.target, "--hf-target", files.target, "--prompts", files.jsonl,
              "--method", "none"])
    assert "--target" in m and "not both" in m
    m = _err(["profile", "--context-lengths", "8,x"], capsys)
    assert "--context-lengths" in m
    for mesh in ("4", "\u00b2x2"):  # a superscript two is a digit to str.isdigit, not to int()
        m = _err(["generate", "--mesh", mesh], capsys)
        assert "--mesh" in m and "DATAxMODEL" in m, mesh
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.jsonl,
              "--mesh", "1x64"])
    assert "--mesh" in m and "needs 64 devices" in m


def test_corrupted_profile_is_a_clear_cli_error(profile_path, files, tmp_path):
    d = json.loads(profile_path.read_text())
    d["latency_ms"][0][0][1] = 0.0
    bad = tmp_path / "zero.json"
    bad.write_text(json.dumps(d))
    m = _err(["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.jsonl,
              "--speculative-config", '{"num_speculative_tokens": 1}', *ENGINE_FLAGS, "--profile", str(bad)])
    assert "--profile" in m and "positive finite latency" in m and "zero.json" in m


def test_bench_and_demo_dispatch(monkeypatch, tmp_path, capsys):
    seen = {}
    fake = types.ModuleType("dsd_jax.bench")
    fake.main = lambda args: seen.setdefault("bench", args) and 0
    fake.demo = lambda args: seen.setdefault("demo", args) and 0
    monkeypatch.setitem(sys.modules, "dsd_jax.bench", fake)
    import dsd_jax
    monkeypatch.setattr(dsd_jax, "bench", fake, raising=False)
    assert cli.main(["bench", "--quick", "--json", str(tmp_path / "b.json"), "--batch-sizes", "1,2,4",
                     "--configs", "vanilla,static-1,dynamic", "--repeats", "2", "--max-tokens", "16",
                     "--rows-per-point", "16", "--min-units", "0"]) == 0
    a = seen["bench"]
    assert a.quick and a.batch_sizes == [1, 2, 4] and a.configs == ["vanilla", "static-1", "dynamic"]
    assert a.repeats == 2 and a.max_tokens == 16 and a.plot is None and a.profile is None
    assert a.rows_per_point == 16 and a.min_units == 0
    assert cli.main(["demo", "--full", "--out-dir", str(tmp_path / "demo")]) == 0
    assert seen["demo"].quick is False and seen["demo"].full is True
    assert seen["demo"].out_dir == str(tmp_path / "demo")
    m = _err(["bench", "--plot", str(tmp_path / "missing" / "x.png")])
    assert "--plot" in m
    m = _err(["bench", "--profile", str(tmp_path / "missing.json")])
    assert "--profile" in m
    m = _err(["bench", "--eagle3-profile", str(tmp_path / "missing.json")])
    assert "--eagle3-profile" in m
    m = _err(["bench", "--eagle3", str(tmp_path / "no_head")])
    assert "--eagle3" in m and "no such directory" in m
    seen.pop("bench")
    assert cli.main(["bench", "--method", "both", "--eagle3-max-batch", "16"]) == 0
    assert seen["bench"].method == "both" and seen["bench"].eagle3_max_batch == 16 and seen["bench"].eagle3 is None
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--quick", "--json", "--plot", "--profile", "--batch-sizes", "--configs", "--repeats",
                 "--max-tokens", "--rows-per-point"):
        assert flag in help_text


def test_outputs_never_replace_an_input_or_each_other(files, tmp_path):
    """Every output is checked against every other output and every input before any model
    is loaded (--target names no directory here: its error would come first otherwise)."""
    missing = str(tmp_path / "no_model")
    gen = ["generate", "--target", missing, "--prompts", files.jsonl]
    same = str(tmp_path / "same.json")
    m = _err(gen + ["--out", same, "--stats", same])
    assert "--stats" in m and "also the output file of --out" in m
    m = _err(gen + ["--out", str(tmp_path / "o.jsonl"), "--trace", same, "--stats", same])
    assert "--stats" in m and "--trace" in m
    m = _err(gen + ["--out", files.jsonl])
    assert "--out" in m and "input file of --prompts" in m
    m = _err(gen + ["--out", files.tokenizer, "--tokenizer", files.tokenizer])
    assert "--out" in m and "input file of --tokenizer" in m
    link = tmp_path / "link.json"
    link.symlink_to(files.jsonl)  # another name of the same file
    m = _err(gen + ["--stats", str(link)])
    assert "--stats" in m and "input file of --prompts" in m
    cfg = tmp_path / "spec.json"
    cfg.write_text(json.dumps({"method": "ngram", "dynamic": {"profile": same}}))
    m = _err(gen + ["--speculative-config", str(cfg), "--stats", str(cfg)])
    assert "--stats" in m and "input file of --speculative-config" in m
    m = _err(gen + ["--speculative-config", str(cfg), "--trace", same])
    assert "--trace" in m and "dynamic.profile" in m
    m = _err(gen + ["--profile", same, "--out", same])
    assert "--out" in m and "input file of --profile" in m
    m = _err(["profile", "--target", missing, "--prompts", files.jsonl, "--out", files.jsonl])
    assert "--out" in m and "input file of --prompts" in m
    (tmp_path / "p.png").write_text("{}")
    for argv in (["--json", same, "--plot", str(tmp_path / "p.png"), "--profile", str(tmp_path / "p.png")],
                 ["--json", str(tmp_path / "b.png"), "--plot", str(tmp_path / "b.png")]):
        m = _err(["bench", "--target", missing] + argv)
        assert "--plot" in m, m
    # the profile bench measures is saved beside --json: not over the EAGLE-3 profile it reads
    beside = tmp_path / "b.profile.json"
    beside.write_text("{}")
    m = _err(["bench", "--target", missing, "--configs", "vanilla,dynamic,eagle3-dynamic",
              "--json", str(tmp_path / "b.json"), "--eagle3-profile", str(beside)])
    assert "--json" in m and "saved beside --json" in m and "input file of --eagle3-profile" in m


def test_existing_outputs_need_overwrite(files, compilation_cache, tmp_path, capsys):
    prof = tmp_path / "profile.json"
    prof.write_text("an earlier profile")
    m = _err(["profile", "--target", files.target, "--speculative-config", '{"method": "ngram"}', *ENGINE_FLAGS,
              "--acceptance", "0.5,0.4,0.3,0.2", "--out", str(prof)])
    assert "--out" in m and str(prof) in m and "--overwrite" in m
    assert prof.read_text() == "an earlier profile"
    stats = tmp_path / "stats.json"
    stats.write_text("earlier stats")
    argv = ["generate", "--target", files.target, "--speculative-config", '{"method": "none"}', *ENGINE_FLAGS,
            "--prompts", files.jsonl, "--temperature", "0", "--max-tokens", "12", "--stats", str(stats)]
    m = _err(argv)
    assert "--stats" in m and str(stats) in m and "--overwrite" in m
    assert stats.read_text() == "earlier stats"
    assert cli.main(argv + ["--overwrite", "--compilation-cache-dir", compilation_cache]) == 0
    assert json.loads(stats.read_text())["tokens"] == 36
    capsys.readouterr()
    # bench: checked with the other flags, before the run (its profile beside --json too)
    (tmp_path / "b.profile.json").write_text("an earlier profile")
    m = _err(["bench", "--target", files.target, "--draft", files.draft, "--tokenizer", files.tokenizer,
              "--configs", "vanilla,dynamic", "--json", str(tmp_path / "b.json")])
    assert "--json" in m and "b.profile.json" in m and "--overwrite" in m
    for cmd in ("profile", "generate", "bench"):
        with pytest.raises(SystemExit):
            cli.main([cmd, "--help"])
        assert "--overwrite" in capsys.readouterr().out


def test_output_paths_must_name_a_file(files, tmp_path):
    for cmd, flag in (("generate", "--out"), ("generate", "--stats"), ("profile", "--out"), ("bench", "--json"),
                      ("bench", "--plot")):
        for path in (str(tmp_path / "newdir") + "/", ""):
            argv = [cmd, flag, path] + (["--prompts", files.jsonl] if cmd == "generate" else [])
            m = _err(argv)
            assert flag in m and "give a file name" in m, (argv, m)


def test_unreadable_hf_tokenizer_is_an_error(files, tmp_path):
    from dsd_jax import loading
    from tokenizers import Tokenizer
    hf = tmp_path / "hf"
    models.save_hf(files.models[0], hf, tokenizer=Tokenizer.from_file(files.tokenizer))
    tok = hf / "tokenizer.json"
    tok.write_text(tok.read_text()[:40])  # truncated
    m = _err(["generate", "--hf-target", str(hf), "--speculative-config", '{"method": "none"}',
              "--prompts", files.jsonl])
    assert "--hf-target" in m and "tokenizer.json" in m and "cannot read" in m
    # --tokenizer replaces it; a missing one is no error (token-id prompts need none)
    opts = types.SimpleNamespace(hf_target=str(hf), tokenizer=files.tokenizer)
    assert loading.load_models(opts)[2] is not None
    tok.unlink()
    assert loading.load_models(types.SimpleNamespace(hf_target=str(hf)))[2] is None


def test_a_checkpoint_passed_to_the_wrong_flag_names_the_right_one(files, tmp_path):
    """Each loader's own error (unknown config fields, a missing tensor) would mislead."""
    hf = models.save_hf(files.models[0], tmp_path / "hf")
    m = _err(["generate", "--target", hf, "--draft", files.draft, "--prompts", files.jsonl])
    assert "--target" in m and "a Hugging Face checkpoint" in m and "--hf-target/--hf-draft" in m
    m = _err(["generate", "--hf-target", files.target, "--speculative-config", '{"method": "none"}',
              "--prompts", files.jsonl])
    assert "--hf-target" in m and "a models.save checkpoint" in m and "--target/--draft" in m


def test_prompt_file_with_a_byte_order_mark(tmp_path):
    from dsd_jax import loading
    p = tmp_path / "prompts.txt"
    p.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "Write a haiku"}\n{"prompt_token_ids": [1, 2]}\n')
    assert loading.read_prompts("--prompts", str(p)) == [{"prompt": "Write a haiku"}, {"prompt_token_ids": [1, 2]}]
    p.write_bytes(b"\xef\xbb\xbfWrite a haiku\n")
    assert loading.read_prompts("--prompts", str(p)) == [{"prompt": "Write a haiku"}]


def test_prompt_lines_end_only_at_line_breaks(tmp_path):
    """str.splitlines also split at a form feed, U+2028 and other characters a prompt may
    hold: a 2-line text file gave 3 prompts, and a JSONL line with a raw U+2028 (valid JSON,
    as generate writes with ensure_ascii=False) was refused as invalid JSON."""
    from dsd_jax import loading
    odd = ["a form feed \x0c, \x0b, \x1c and \x85 inside", "U+2028 \u2028 and U+2029 \u2029 inside"]
    p = tmp_path / "odd.txt"
    p.write_text(odd[0] + "\r\n\n" + odd[1] + "\rlast\n", encoding="utf-8")
    assert loading.read_prompts("--prompts", str(p)) == [{"prompt": t} for t in odd + ["last"]]
    j = tmp_path / "odd.jsonl"
    lines = [json.dumps({"prompt": t}, ensure_ascii=False) for t in odd]
    assert "\u2028" in lines[1]  # raw, not escaped
    j.write_text(lines[0] + "\n\n" + lines[1] + "\n", encoding="utf-8")
    assert loading.read_prompts("--prompts", str(j)) == [{"prompt": t} for t in odd]
    # line numbers count only line breaks
    j.write_text(lines[1] + "\n\n" + lines[0] + "\n{bad\n", encoding="utf-8")
    with pytest.raises(loading.ArgumentError, match=r"line 4: invalid JSON"):
        loading.read_prompts("--prompts", str(j), "jsonl")


def test_jsonl_prompt_lines_refuse_other_keys(tmp_path):
    """A per-line "max_tokens" (or any key but the prompt's) was silently ignored: the run
    used the flag's value. It is refused, naming the keys."""
    from dsd_jax import loading
    p = tmp_path / "prompts.jsonl"
    p.write_text('{"prompt": "w1"}\n{"prompt": "def fib", "temperature": 0, "max_tokens": 2}\n')
    with pytest.raises(loading.ArgumentError, match=r'line 2: unknown keys "max_tokens", "temperature": '
                       r'a line holds only "prompt" or "prompt_token_ids"; sampling settings come from '
                       r'the command-line flags .* for every prompt'):
        loading.read_prompts("--prompts", str(p), "jsonl")
    p.write_text('{"prompt_token_ids": [1], "n": 2}\n')
    with pytest.raises(loading.ArgumentError, match=r'line 1: unknown key "n":'):
        loading.read_prompts("--prompts", str(p))


def test_stop_token_ids_count_the_added_end_of_text_ids(files, tmp_path):
    """The tokenizer's end-of-text ids were added to --stop-token-ids without a word, and the
    engine's limit then failed as "request 0: at most 8 stop_token_ids": the CLI says where
    the ids came from, and that --ignore-eos leaves the added ones out."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from dsd_jax import loading
    from dsd_jax.state import MAX_STOP_IDS
    vocab = {f"w{i}": i for i in range(62)} | {"<|endoftext|>": 62, "</s>": 63}
    tok = Tokenizer(WordLevel(vocab, unk_token="w0"))
    path = tmp_path / "eos_tokenizer.json"
    tok.save(str(path))
    assert loading.eos_token_ids(tok) == [62, 63]
    given = ",".join(str(i) for i in range(1, MAX_STOP_IDS))  # 7 ids, 2 end-of-text ids added
    m = _err(["generate", "--target", files.target, "--tokenizer", str(path), "--prompts", files.jsonl,
              "--speculative-config", '{"method": "none"}', "--stop-token-ids", given])
    assert m == ("dsd-jax generate: error: --stop-token-ids: 9 stop ids: 7 given and 2 end-of-text ids "
                 "of the tokenizer added (--ignore-eos leaves those out); at most 8 are supported"), m
    # a repeat, and an end-of-text id given, count once
    args = types.SimpleNamespace(stop_token_ids=[1, 2, 3, 4, 5, 6, 1, 62], ignore_eos=False,
                                 temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, max_tokens=4,
                                 min_tokens=0, seed=None, repetition_penalty=1.0,
                                 presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None,
                                 hf_target=None, stop=None, bad_words=None, allowed_token_ids=None,
                                 top_logprobs=None, prompt_logprobs=None)
    assert generate_command._sampling("generate", args, tok, 1, 64)[0].stop_token_ids == (1, 2, 3, 4, 5, 6, 62, 63)
    args.stop_token_ids = list(range(1, MAX_STOP_IDS + 1)) * 2
    with pytest.raises(SystemExit, match=r"10 stop ids: 8 distinct given and 2 end-of-text ids"):
        generate_command._sampling("generate", args, tok, 1, 64)
    args.ignore_eos = True
    assert generate_command._sampling("generate", args, tok, 2, 64)[1].stop_token_ids == tuple(range(1, MAX_STOP_IDS + 1))
    args.stop_token_ids = list(range(1, MAX_STOP_IDS + 2))
    with pytest.raises(SystemExit, match=r"--stop-token-ids: 9 stop ids: 9 given; at most 8"):
        generate_command._sampling("generate", args, tok, 1, 64)


def test_penalty_bias_bad_word_and_allowed_flags_reach_every_request_and_are_checked(files, capsys):
    from tokenizers import Tokenizer
    args = cli.build_parser().parse_args(["generate", "--repetition-penalty", "1.3", "--frequency-penalty",
                                          "-0.5", "--logit-bias", "7=-100, 3=2.5", "--ignore-eos",
                                          "--bad-word", "w5", "--bad-word", " w6",
                                          "--allowed-token-ids", "3,5,3"])
    sps = generate_command._sampling("generate", args, Tokenizer.from_file(files.tokenizer), 2, 64)
    assert [(sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) for sp in sps] == [
        (1.3, 0.0, -0.5)] * 2
    assert [sp.logit_bias for sp in sps] == [{3: 2.5, 7: -100.0}] * 2
    assert [sp.bad_words for sp in sps] == [("w5", " w6")] * 2
    assert [sp.allowed_token_ids for sp in sps] == [(3, 5)] * 2
    args.bad_words = ["w5", "  "]
    with pytest.raises(SystemExit, match=r"invalid sampling flags: bad_words\[1\] is blank"):
        generate_command._check_sampling_flags("generate", args)
    args.bad_words = None
    for bad, why in (("7", "expected ID=BIAS"), ("x=1", "expected ID=BIAS"), ("7=1,7=2", "given twice")):
        assert why in _err(["generate", "--logit-bias", bad], capsys)
    args.presence_penalty = 3.0
    with pytest.raises(SystemExit, match=r"invalid sampling flags: presence_penalty must be in \[-2, 2\]"):
        generate_command._check_sampling_flags("generate", args)
    args.presence_penalty, args.logit_bias = 0.0, {7: 101.0}
    with pytest.raises(SystemExit, match=r"invalid sampling flags: logit_bias\[7\] must be in \[-100, 100\]"):
        generate_command._check_sampling_flags("generate", args)


def test_plot_format_is_checked_before_the_run(tmp_path):
    for name, why in (("r.txt", "cannot write 'txt'"), ("r", "no file extension")):
        m = _err(["bench", "--target", str(tmp_path / "no_model"), "--plot", str(tmp_path / name)])
        assert "--plot" in m and why in m and ".png" in m


def test_seed_range(files, tmp_path, capsys):
    for seed in ("-1", str(2 ** 32)):
        m = _err(["generate", "--seed", seed], capsys)
        assert "--seed" in m and "2**32 - 1" in m
    # request i is seeded seed + i: the last of the 3 prompts' seed is checked before loading models
    m = _err(["generate", "--target", str(tmp_path / "no_model"), "--prompts", files.jsonl,
              "--seed", str(2 ** 32 - 2)])
    assert "--seed" in m and "3 prompts" in m


def test_method_fills_in_a_speculative_config_without_one(files, tmp_path):
    cfg = tmp_path / "spec.json"
    cfg.write_text(json.dumps({"num_speculative_tokens": 3}))
    for src in ('{"num_speculative_tokens": 3}', '{"method": null, "num_speculative_tokens": 3}', str(cfg)):
        args = types.SimpleNamespace(method="ngram", speculative_config=src, target="t", hf_target=None)
        spec = common.load_spec("generate", args)
        assert spec.method == "ngram" and spec.num_speculative_tokens == 3
    m = _err(["generate", "--target", files.target, "--prompts", files.jsonl, "--method", "ngram",
              "--speculative-config", '{"method": "draft_model"}'])
    assert "--method" in m and "disagrees" in m
    m = _err(["generate", "--target", files.target, "--prompts", files.jsonl, "--method", "nope",
              "--speculative-config", '{"num_speculative_tokens": 3}'])
    assert "--method" in m and "nope" in m


def test_no_subcommand_prints_help(capsys):
    assert cli.main([]) == 2
    assert "profile" in capsys.readouterr().err


def test_prompt_format_forces_text_or_jsonl(files, tmp_path, capsys):
    """A text prompt whose first line starts with '{' reads as text under --prompt-format
    text; auto's JSONL error says so; jsonl refuses a text line."""
    from dsd_jax import loading
    p = tmp_path / "code.txt"
    p.write_text("{w1 w2\nw3 w4\n")
    assert loading.read_prompts("--prompts", str(p), "text") == [{"prompt": "{w1 w2"}, {"prompt": "w3 w4"}]
    with pytest.raises(loading.ArgumentError, match="invalid JSON.*--prompt-format text"):
        loading.read_prompts("--prompts", str(p))
    with pytest.raises(loading.ArgumentError, match=r"line 1: invalid JSON \(") as e:
        loading.read_prompts("--prompts", files.txt, "jsonl")
    assert "--prompt-format" not in str(e.value)
    with pytest.raises(ValueError, match="prompt format must be one of"):
        loading.read_prompts("--prompts", str(p), "csv")
    rc = cli.main(["generate", "--target", files.target, "--tokenizer", files.tokenizer,
                   "--speculative-config", '{"method": "none"}', *ENGINE_FLAGS, "--prompts", str(p),
                   "--prompt-format", "text", "--temperature", "0", "--max-tokens", "3"])
    assert rc == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt"] for r in recs] == ["{w1 w2", "w3 w4"] and recs[1]["prompt_token_ids"] == [3, 4]
    m = _err(["generate", "--target", files.target, "--tokenizer", files.tokenizer, *ENGINE_FLAGS,
              "--prompts", str(p), "--max-tokens", "3"])
    assert "--prompts" in m and "--prompt-format text" in m


def test_outputs_never_go_into_a_checkpoint_or_the_compilation_cache(files, tmp_path):
    """An output inside a model directory (--target, --hf-target, --draft, an EAGLE-3 head)
    or in --compilation-cache-dir is refused before any model is loaded: --out
    hf/model.safetensors --overwrite replaced a checkpoint's weights, and --out cc
    --compilation-cache-dir cc failed only after the whole run."""
    hf, head, cache = tmp_path / "hf", tmp_path / "head", str(tmp_path / "cc")
    hf.mkdir()
    head.mkdir()
    (hf / "model.safetensors").write_text("weights")
    gen = ["generate", "--prompts", files.jsonl, "--overwrite"]
    for argv, flag, why in (
            (["--target", files.target, "--out", f"{files.target}/config.json"], "--out", "of --target"),
            (["--hf-target", str(hf), "--stats", str(hf / "model.safetensors")], "--stats", "of --hf-target"),
            (["--target", files.target, "--draft", files.draft, "--trace", f"{files.draft}/new.json"],
             "--trace", "of --draft"),
            (["--speculative-config", json.dumps({"method": "eagle3", "model": str(head)}),
              "--out", str(head / "o.jsonl")], "--out", "of --speculative-config's model"),
            (["--out", cache, "--compilation-cache-dir", cache], "--out", "of --compilation-cache-dir"),
            (["--target", files.target, "--compilation-cache-dir", f"{files.target}/xla"],
             "--compilation-cache-dir", "of --target")):
        m = _err(gen + argv)
        assert m.startswith(f"dsd-jax generate: error: {flag}: ") and f"is in the directory {why}" in m, m
    assert (hf / "model.safetensors").read_text() == "weights"
    m = _err(["profile", "--target", files.target, "--out", f"{files.target}/config.json", "--overwrite"])
    assert "--out" in m and "in the directory of --target" in m
    m = _err(["bench", "--target", files.target, "--json", f"{files.target}/b.json"])
    assert "--json" in m and "in the directory of --target" in m
    m = _err(["bench", "--json", str(tmp_path / "cc" / "b.json"), "--compilation-cache-dir", cache])
    assert "--json" in m  # cc does not exist yet: its directory is refused
    (tmp_path / "cc").mkdir()
    m = _err(["bench", "--json", str(tmp_path / "cc" / "b.json"), "--compilation-cache-dir", cache])
    assert "--json" in m and "in the directory of --compilation-cache-dir" in m


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc (a directory no file can be made in)")
def test_unwritable_output_directories_are_refused_up_front(files):
    for argv, flag in ((["generate", "--prompts", files.jsonl, "--out", "/proc/out.jsonl"], "--out"),
                       (["generate", "--prompts", files.jsonl, "--stats", "/proc/stats.json"], "--stats"),
                       (["profile", "--out", "/proc/prof.json"], "--out"),
                       (["bench", "--json", "/proc/b.json"], "--json")):
        m = _err(argv + ["--target", "no_such_model"])
        assert f"{flag}: cannot write a file in the directory of" in m, m


def test_a_failed_write_leaves_the_earlier_file(tmp_path):
    """Outputs are written to a temporary file and renamed over the earlier one: a full disk
    left a half-written --stats and destroyed the earlier result."""
    from dsd_jax import loading
    out = tmp_path / "stats.json"
    out.write_text("earlier")

    def fail(f):
        f.write("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(loading.ArgumentError, match=r"--stats: cannot write .*stats.json.*No space left"):
        with loading.writing("--stats", out):
            loading.atomic_write(out, fail)
    assert out.read_text() == "earlier" and sorted(p.name for p in tmp_path.iterdir()) == ["stats.json"]
    loading.atomic_write(out, lambda f: f.write("new"))
    assert out.read_text() == "new"


def test_prompts_that_are_not_text_are_refused_by_line(tmp_path):
    """A JSON escape of half a surrogate pair ("\\ud800") crashed the tokenizer with a
    TypeError; it is refused, naming the file and line."""
    from dsd_jax import loading
    p = tmp_path / "s.jsonl"
    p.write_text('{"prompt": "fine"}\n\n{"prompt": "a\\ud800"}\n')
    with pytest.raises(loading.ArgumentError, match=r"--prompts: '.*s.jsonl' line 3: not valid UTF-8 text "
                       r"\(a lone surrogate '\\ud800' at character 1\)$"):
        loading.read_prompts("--prompts", str(p))


def test_prompt_errors_name_the_file_and_line(files, tmp_path):
    """An over-long prompt was "prompt 1 has 40 tokens" (its index among the non-blank
    lines): the file and line are named, with --max-seq-len, before the engine is built."""
    p = tmp_path / "long.jsonl"
    p.write_text('{"prompt_token_ids": [1]}\n\n' + json.dumps({"prompt_token_ids": [1] * 40}) + "\n")
    m = _err(["generate", "--target", files.target, "--speculative-config", '{"method": "none"}',
              "--max-seq-len", "32", "--prompts", str(p)])
    assert m == (f"dsd-jax generate: error: --prompts: {str(p)!r} line 3 has 40 tokens; --max-seq-len 32 "
                 "leaves no room to generate (raise --max-seq-len or shorten the prompt)"), m
    p.write_text('{"prompt_token_ids": [1]}\n\n{"prompt_token_ids": [1, 99]}\n')
    m = _err(["generate", "--target", files.target, "--speculative-config", '{"method": "none"}',
              "--prompts", str(p)])
    assert f"--prompts: {str(p)!r} line 3 has token ids outside [0, 64)" in m, m


def test_profile_refuses_flags_no_run_uses(files, compilation_cache, tmp_path, capsys):
    """With --acceptance no acceptance run happens: --prompts, --num-prompts,
    --acceptance-max-tokens and a second temperature were silently ignored, and values past
    K silently dropped (a published curve may run past K: they are noted); the steps were
    timed greedy whatever --temperatures said."""
    out = str(tmp_path / "p.json")
    base = ["profile", "--target", files.target, "--speculative-config", '{"method": "ngram", '
            '"num_speculative_tokens": 2}', *ENGINE_FLAGS, "--context-lengths", "8", "--repeats", "1",
            "--warmup-reps", "0", "--passes", "1", "--compilation-cache-dir", compilation_cache, "--out", out]
    for extra, flag in ((["--prompts", files.jsonl], "--prompts"), (["--num-prompts", "4"], "--num-prompts"),
                        (["--acceptance-max-tokens", "8"], "--acceptance-max-tokens"),
                        (["--temperatures", "0.5,0"], "--temperatures")):
        m = _err(base + ["--acceptance", "0.5,0.3"] + extra)
        assert m.startswith(f"dsd-jax profile: error: {flag}: --acceptance gives the acceptance"), m
    m = _err(base + ["--num-prompts", "4"])  # custom models: random prompts, not the held-out ones
    assert "--num-prompts: counts the built-in held-out prompts" in m
    m = _err(base + ["--prompts", files.jsonl, "--num-prompts", "4"])
    assert "--num-prompts" in m and "every prompt of the file is used" in m
    m = _err(base[:4] + ['{"method": "none"}'] + base[5:] + ["--acceptance-max-tokens", "8"])
    assert "--acceptance-max-tokens: the speculative config speculates no tokens (K = 0)" in m, m
    capsys.readouterr()
    assert cli.main(base + ["--acceptance", "0.5,0.3,0.1", "--temperatures", "0.7"]) == 0
    prof = Profile.load(out)
    assert prof.meta["latency_temperature"] == 0.7 and list(prof.acceptance) == [0.5, 0.3]
    assert prof.meta["acceptance_given"] == [0.5, 0.3, 0.1]  # the curve as given, nothing lost
    assert "recording a_1..a_2 = [0.5, 0.3]; the other 1 value(s) are past K" in capsys.readouterr().err


def test_profile_and_generate_flags_are_read_or_refused_before_the_work(files, tmp_path, monkeypatch):
    """(CLI audit) profile --synthetic dropped --tokenizer, then asked for one; --prompts ids
    outside the vocabulary failed after the latency table was timed, unnamed; --prompt-format
    without --prompts was ignored; --prompts - (stdin) was "no such file"; --top-logprobs
    past the vocabulary failed as the engine's max_logprobs; an output name too long for the
    file system failed once the run was done."""
    def engine_reached(*a, **k):
        raise SystemExit("engine")
    monkeypatch.setattr(profile_command, "make_engine", engine_reached)
    out = str(tmp_path / "p.json")
    synth = ["profile", "--synthetic", "tiny-llama", "--draft-synthetic", "tiny-llama-draft", "--max-seq-len", "64",
             "--max-batch-size", "2", "--no-progress", "--out", out]
    assert _err(synth + ["--tokenizer", files.tokenizer, "--prompts", files.txt]) == "engine"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_token_ids": [1, 2]}\n{"prompt_token_ids": [3, 99999999]}\n')
    m = _err(synth + ["--prompts", str(bad)])
    assert m.startswith("dsd-jax profile: error: --prompts: ") and "line 2" in m and "outside [0," in m, m
    m = _err(synth + ["--acceptance", "0.5", "--prompt-format", "jsonl"])
    assert "--prompt-format: says how to read --prompts, and no --prompts is given" in m
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(open(files.jsonl, "rb").read()), encoding="utf-8"))
    assert _err(synth + ["--prompts", "-"]) == "engine"
    monkeypatch.undo()
    gen = ["generate", "--target", files.target, "--prompts", files.jsonl, "--speculative-config",
           '{"method": "none"}', *ENGINE_FLAGS]
    m = _err(gen + ["--top-logprobs", "1000"])
    assert m.startswith("dsd-jax generate: error: --top-logprobs: at most the vocabulary's 64 ids"), m
    m = _err(gen + ["--stats", str(tmp_path / ("x" * 252 + ".json"))])  # 257 bytes
    assert m.startswith("dsd-jax generate: error: --stats: ") and "file name is longer than" in m, m
    longest = tmp_path / ("x" * 250 + ".json")  # 255: its temporary file's name was longer
    loading.atomic_write(longest, lambda f: f.write("ok"))
    assert longest.read_text() == "ok" and sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", longest.name]


def test_backend_and_temperature_errors_name_cli_flags(files, capsys):
    m = _err(["profile", "--temperatures", "0.5,-1"], capsys)
    assert "--temperatures" in m and "numbers >= 0" in m
    if jax.default_backend() == "cpu":  # the kernel's error advised platform='gpu' / interpret=True
        m = _err(["generate", "--target", files.target, "--prompts", files.jsonl, "--backend", "pallas"])
        assert "--backend: " in m and "--backend interpret" in m and "--backend xla" in m


def test_settings_that_would_be_ignored_are_refused(files, profile_path, tmp_path):
    """A draft model for a method that drafts without one was loaded and dropped; --profile
    silently replaced a different dynamic.profile; bench's EAGLE-3 and draft flags were
    ignored where no such configuration ran. Each is refused before any model is loaded."""
    gen = ["generate", "--target", files.target, "--prompts", files.jsonl]
    for spec, why in (('{"method": "none"}', "'none' drafts without a draft model"),
                      ('{"method": "ngram"}', "'ngram' drafts without a draft model"),
                      ('{"method": "eagle3"}', "its EAGLE-3 head is the speculative config's \"model\"")):
        m = _err(gen + ["--draft", str(tmp_path / "no_draft"), "--speculative-config", spec])
        assert m.startswith("dsd-jax generate: error: --draft: ") and why in m and "leave --draft out" in m, m
    m = _err(["profile", "--target", files.target, "--hf-draft", files.draft, "--method", "ngram"])
    assert "--hf-draft: speculative method 'ngram' drafts without a draft model" in m
    m = _err(["profile", "--synthetic", "tiny-llama", "--draft-synthetic", "tiny-llama", "--method", "ngram"])
    assert "--draft-synthetic: speculative method 'ngram'" in m
    other = tmp_path / "other.json"
    other.write_text("{}")
    spec = json.dumps({"num_speculative_tokens": 1, "dynamic": {"profile": str(other)}})
    m = _err(gen + ["--draft", files.draft, "--speculative-config", spec, "--profile", str(profile_path)])
    assert "--profile" in m and "is not the speculative config's dynamic.profile" in m
    for argv, flag in ((["--eagle3-profile", str(other)], "--eagle3-profile"), (["--eagle3-max-batch", "4"],
                       "--eagle3-max-batch"), (["--eagle3", str(tmp_path)], "--eagle3"),
                       (["--profile", str(other)], "--profile"), (["--draft", files.draft], "--draft")):
        configs = "vanilla,static-1" if flag == "--profile" else "vanilla,eagle3-static-1" if "draft" in flag \
            else "vanilla,dynamic"
        m = _err(["bench", "--target", str(tmp_path / "no_model"), "--configs", configs] + argv)
        assert m.startswith(f"dsd-jax bench: error: {flag}: is for the ") and "none runs" in m, (argv, m)
    m = _err(["bench", "--target", str(tmp_path / "no_model"), "--configs", "vanilla,static-1",
              "--method", "eagle3"])
    assert m.startswith("dsd-jax bench: error: --method: picks the default configurations; --configs "
                        "names them"), m


def _stub_demo(monkeypatch, shipped):
    """bench.commands.demo with its models, prompts, benchmark and report stubbed: returns
    {name: call count}; the file handling is the real demo's."""
    import dsd_jax.bench.commands as C
    calls = {"load": 0}

    def load(*a, **k):
        calls["load"] += 1
        return None, None, None
    monkeypatch.setattr(models, "builtin", load)
    monkeypatch.setattr(models, "load_eagle3", load)
    monkeypatch.setattr(C, "shipped_profile", lambda quick: shipped)
    monkeypatch.setattr(C, "_builtin_prompts", lambda n: [f"p{i}" for i in range(n)])
    monkeypatch.setattr(C, "run_bench", lambda *a, **k: [])
    monkeypatch.setattr(C, "write_json", lambda rows, path: open(path, "w").write("new bench\n"))
    monkeypatch.setattr(C, "write_plot", lambda rows, path, title=None: open(path, "w").write("new plot\n"))
    monkeypatch.setattr(C, "format_table", lambda rows: "(table)")
    monkeypatch.setattr(C, "summarize", lambda rows: {"lossless": True})
    return calls


def test_demo_builds_its_engines_at_float32_precision(monkeypatch, tmp_path):
    """The demo's lossless check on its float32 pair compares algorithms, not two roundings:
    its engines (which keep the precision they are built under) are built at "highest", so a
    GPU runs their dots in float32, not TF32."""
    import jax

    import dsd_jax.bench.commands as C
    _stub_demo(monkeypatch, shipped="shipped.json")
    seen = []
    monkeypatch.setattr(C, "run_bench", lambda *a, **k: seen.append(jax.config.jax_default_matmul_precision) or [])
    assert cli.main(["demo", "--out-dir", str(tmp_path / "demo")]) == 0
    assert seen == ["highest"] and jax.config.jax_default_matmul_precision != "highest"


def test_demo_refuses_to_replace_its_outputs(monkeypatch, tmp_path, capsys):
    """`dsd-jax demo --out-dir DIR` replaced an earlier DIR/bench.json (as `dsd-jax bench
    --json bench.json` leaves), bench.png and the profiles without --overwrite or a word. The
    files it would write are refused before any model loads; --overwrite replaces them."""
    calls = _stub_demo(monkeypatch, shipped="shipped.json")  # quick: the shipped profile, no profile.json
    out = tmp_path / "demo"
    out.mkdir()
    (out / "bench.json").write_text("earlier bench\n")
    (out / "eagle3_profile.json").write_text("earlier profile\n")
    (out / "profile.json").write_text("not written by a run with the shipped profile\n")
    m = _err(["demo", "--out-dir", str(out)])
    assert m.startswith("dsd-jax demo: error: --out-dir: ") and "--overwrite" in m, m
    assert str(out / "bench.json") in m and str(out / "eagle3_profile.json") in m and "profile.json'" not in \
        m.replace("eagle3_profile.json'", ""), m
    assert calls["load"] == 0 and (out / "bench.json").read_text() == "earlier bench\n"
    assert cli.main(["demo", "--out-dir", str(out), "--overwrite"]) == 0
    assert calls["load"] == 2 and (out / "bench.json").read_text() == "new bench\n"
    # --full measures its own profile: an earlier profile.json is named too
    calls = _stub_demo(monkeypatch, shipped=None)
    (out / "bench.json").unlink()
    (out / "bench.png").unlink()
    m = _err(["demo", "--full", "--out-dir", str(out)])
    assert str(out / "profile.json") in m and "bench.json" not in m and calls["load"] == 0, m
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    assert "--overwrite" in capsys.readouterr().out


def _pipe(text: str) -> str:
    """A path naming a pipe that holds `text` (as a shell's <(...) gives), read end only."""
    r, w = os.pipe()
    os.write(w, text.encode())
    os.close(w)
    return f"/dev/fd/{r}"


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_prompts_and_speculative_config_may_be_pipes(files, compilation_cache, tmp_path, capsys):
    """--prompts <(...), /dev/stdin or a FIFO, and --speculative-config <(...), were refused
    as "not a file" (os.path.isfile); they are read, once (a pipe gives its text once)."""
    prompts = _pipe("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p in PROMPT_IDS))
    spec = _pipe('{"method": "none"}')
    try:
        rc = cli.main(["generate", "--target", files.target, "--speculative-config", spec, *ENGINE_FLAGS,
                       "--prompts", prompts, "--temperature", "0", "--max-tokens", "2",
                       "--compilation-cache-dir", compilation_cache])
    finally:
        for p in (prompts, spec):
            os.close(int(p.rsplit("/", 1)[1]))
    assert rc == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["prompt_token_ids"] for r in recs] == PROMPT_IDS
    m = _err(["generate", "--target", files.target, "--prompts", str(tmp_path)])
    assert "--prompts" in m and "is a directory" in m, m
    m = _err(["generate", "--target", files.target, "--prompts", files.jsonl, "--speculative-config",
              str(tmp_path)])
    assert "--speculative-config" in m and "is a directory" in m, m


def test_stdin_and_stdout_are_utf8_whatever_the_locale(monkeypatch):
    """Prompts on stdin were decoded, and records written to stdout encoded, with the locale's
    encoding: bytes that are not UTF-8 read as another text (or a UnicodeDecodeError
    traceback), and a completion outside a latin-1 locale failed the write after the run."""
    from dsd_jax import loading

    def stdin(data: bytes):  # a latin-1 locale's stdin
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="latin-1"))
    stdin(b"\xef\xbb\xbfx = \xe2\x86\x92\n")
    assert loading.read_prompts("--prompts", "-") == [{"prompt": "x = \u2192"}]
    stdin(b"caf\xe9 au lait\n")
    with pytest.raises(loading.ArgumentError, match=r"cannot read stdin: 'utf-8' codec can't decode"):
        loading.read_prompts("--prompts", "-")
    monkeypatch.setattr(sys, "stdin", io.StringIO("w1\n"))  # a stdin without .buffer
    assert loading.read_prompts("--prompts", "-") == [{"prompt": "w1"}]

    out = RequestOutput(0, [1, 2], [1], "length", text="\u2192 done")
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="latin-1"))
    records.InOrder(False, [{"prompt": "x = \u2192"}], [[1, 2]], generate_command._stdout_lines())(0, out)
    rec = json.loads(raw.getvalue().decode("utf-8"))
    assert rec["prompt"] == "x = \u2192" and rec["text"] == "\u2192 done"
    text = io.StringIO()  # a stdout without .buffer (a test's capture) takes text
    monkeypatch.setattr(sys, "stdout", text)
    records.InOrder(False, [{"prompt": "x"}], [[1, 2]], generate_command._stdout_lines())(0, out)
    assert json.loads(text.getvalue())["text"] == "\u2192 done"


def test_one_cache_folder_has_one_name_however_it_is_given(compilation_cache, tmp_path, monkeypatch):
    """JAX's cache key includes the cache's path: a relative path, or a link to the folder
    another process caches in, must name it as that process does to share its entries."""
    from dsd_jax.compilation import enable_persistent_cache
    real = tmp_path / "cache"
    real.mkdir()
    (tmp_path / "link").symlink_to(real, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    try:
        for name in ("cache", "cache/", "link", str(tmp_path / "link"), real):
            enable_persistent_cache(name)
            assert jax.config.jax_compilation_cache_dir == str(real.resolve()), name
    finally:
        enable_persistent_cache(compilation_cache)  # the run's


def test_directories_that_cannot_be_made_are_refused_before_models_load(monkeypatch, files, tmp_path):
    """--compilation-cache-dir (and demo --out-dir) under a file, or where no directory can be
    made (/proc), ended in a raw traceback, for generate after the models loaded."""
    from dsd_jax import loading
    from dsd_jax.compilation import enable_persistent_cache

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(loading, "load_models", no_loading)
    monkeypatch.setattr(models, "builtin", no_loading)
    under_file = f"{files.txt}/cache"
    gen = ["generate", "--prompts", files.jsonl, "--speculative-config", '{"method": "none"}']
    places = [under_file] + (["/proc/dsd_xla_cache"] if os.path.isdir("/proc") else [])
    for place in places:
        for argv, flag in ((gen + ["--compilation-cache-dir", place], "--compilation-cache-dir"),
                           (["profile", "--compilation-cache-dir", place], "--compilation-cache-dir"),
                           (["bench", "--compilation-cache-dir", place], "--compilation-cache-dir"),
                           (["demo", "--out-dir", f"{place}/demo"], "--out-dir")):
            m = _err(argv)
            assert m.startswith(f"dsd-jax {argv[0]}: error: {flag}: cannot make the directory "), m
            assert ("is not a directory" in m) if place == under_file else ("no file can be made in" in m), m
    m = _err(["demo", "--out-dir", files.txt])
    assert "--out-dir" in m and "exists and is not a directory" in m
    assert loading.output_dir("--out-dir", str(tmp_path / "a" / "b")) == str(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists()  # checked, not made
    with pytest.raises(ValueError, match="cannot make the compilation cache directory"):
        enable_persistent_cache(under_file)


def test_a_closed_stdout_pipe_ends_quietly(monkeypatch):
    """`dsd-jax generate ... | head -1` ended in a BrokenPipeError traceback: main returns 141
    (128 + SIGPIPE) and points stdout at devnull, so the flush at exit does not fail again."""
    r, w = os.pipe()
    os.close(r)  # the reader left
    broken = open(w, "w", encoding="utf-8")
    monkeypatch.setattr(sys, "stdout", broken)
    out = RequestOutput(0, [1, 2], [1], "length", text="t")

    def generate(args):
        write = records.InOrder(False, [{"prompt": "p"}] * 3, [[1]] * 3, generate_command._stdout_lines())
        for i in range(3):
            write(i, out)
        return 0
    monkeypatch.setattr(generate_command, "cmd_generate", generate)
    try:
        assert cli.main(["generate"]) == cli.BROKEN_PIPE_STATUS == 141
        broken.write("more\n")
        broken.flush()  # devnull now: no second BrokenPipeError
    finally:
        broken.close()


def test_generate_writes_records_in_order_as_they_finish_and_keeps_them_if_killed(tmp_path):
    """`generate --out` held every completion and wrote the file after the last prompt: a run
    killed after hours kept nothing. Records now go out in prompt order as they finish (an
    early finisher waits for those before it), to FILE.partial, renamed to FILE at the end;
    a run that stops leaves FILE as it was and the finished prefix in FILE.partial."""
    out = tmp_path / "out.jsonl"
    out.write_text("earlier\n")
    done = lambda i: RequestOutput(i, [1, 2], [i], "length", text=f"t{i}")  # noqa: E731

    class Engine:  # finishes requests 2, 0, 1 (then, if `dies`, fails before 3)
        dies = False

        def generate(self, prompts, sampling, return_logprobs, progress, on_output):
            for i in (2, 0, 1):
                on_output(i, done(i))
                # 2 waits for 0 and 1; 0 goes out at once; 1 takes 2 with it
                assert (tmp_path / "out.jsonl.partial").read_text().count("\n") == {2: 0, 0: 1, 1: 3}[i]
            if self.dies:
                raise KeyboardInterrupt
            on_output(3, done(3))
            return [done(i) for i in range(4)]
    args = types.SimpleNamespace(out=str(out), logprobs=False, warmup=False, no_progress=True)
    raw, ids = [{"prompt": f"p{i}"} for i in range(4)], [[i] for i in range(4)]
    Engine.dies = True
    with pytest.raises(KeyboardInterrupt):
        generate_command._generate_records(args, Engine(), raw, ids, None)
    assert out.read_text() == "earlier\n"
    assert [json.loads(x)["text"] for x in (tmp_path / "out.jsonl.partial").read_text().splitlines()] == [
        "t0", "t1", "t2"]
    Engine.dies = False
    generate_command._generate_records(args, Engine(), raw, ids, None)
    assert [json.loads(x)["text"] for x in out.read_text().splitlines()] == ["t0", "t1", "t2", "t3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]

    class Stopped:  # stopped before any request finished (Ctrl-C while compiling)
        def generate(self, *a, **k):
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        generate_command._generate_records(args, Stopped(), raw, ids, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no empty partial to refuse next time
    # a symlinked --out: the partial file checked up front is the one written, beside the target
    (tmp_path / "link.jsonl").symlink_to(out)
    assert records.partial_path(str(tmp_path / "link.jsonl")) == os.path.realpath(out) + ".partial"
    assert records.partial_path("/dev/stdout") is None and records.partial_path(None) is None


def test_generate_with_warmup_refuses_a_request_before_compiling():
    """`generate --warmup` compiled every program (minutes) before `generate` refused a bad
    request; it now asks `SpecEngine.check` first."""
    class Engine:
        warmed = False

        def check(self, prompts, sampling):
            raise ValueError("request 0: allowed_token_ids [3, 5] leaves no token to draw first")

        def warmup(self, progress):
            self.warmed = True

    engine = Engine()
    args = types.SimpleNamespace(logprobs=False, warmup=True, no_progress=True)
    with pytest.raises(SystemExit, match="dsd-jax generate: error: request 0: allowed_token_ids"):
        generate_command._run_generate(args, engine, [[1]], None, None)
    assert not engine.warmed


def test_generate_resume_continues_an_interrupted_run(files, tmp_path, monkeypatch):
    """`generate --out F --resume` after a run stopped midway (and a record torn by the
    kill): keeps the finished records, generates the rest, and F is what one uninterrupted
    run writes, sampled records included (drafter-invariant, request i seeded --seed + i);
    what cannot be resumed is a clear error (other flags before any model loads)."""
    spec = json.dumps({"num_speculative_tokens": 2, "acceptance": "drafter_invariant"})
    argv = lambda out, *more: ["generate", "--target", files.target, "--draft", files.draft,  # noqa: E731
                               "--speculative-config", spec, *ENGINE_FLAGS, "--prompts", files.jsonl,
                               "--temperature", "0.9", "--seed", "5", "--max-tokens", "8", "--out", str(out),
                               *more]
    whole = tmp_path / "whole.jsonl"
    assert cli.main(argv(whole)) == 0
    out = tmp_path / "out.jsonl"
    partial, settings = tmp_path / "out.jsonl.partial", tmp_path / "out.jsonl.partial.settings.json"

    real_call = records.InOrder.__call__

    def stop_after_one(self, i, o):  # the run is killed once its first record is out
        real_call(self, i, o)
        if self.next >= 1:
            raise KeyboardInterrupt
    with monkeypatch.context() as m:
        m.setattr(records.InOrder, "__call__", stop_after_one)
        with pytest.raises(KeyboardInterrupt):
            cli.main(argv(out))
    assert not out.exists() and partial.read_text().count("\n") == 1 and settings.exists()
    with partial.open("a") as f:
        f.write('{"prompt": null, "prompt_tok')  # the second record, cut short by the kill

    m = _err(argv(out))  # not resumed: the unfinished run is not replaced silently
    assert "--out" in m and "exists" in m and "--resume continues it" in m
    from dsd_jax import loading

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")
    with monkeypatch.context() as m:  # other flags are refused before minutes of loading
        m.setattr(loading, "load_models", no_loading)
        msg = _err(argv(out, "--resume", "--temperature", "0.5"))
        assert "--resume" in msg and "temperature 0.9 (now 0.5)" in msg
        # a settings file from before the penalty flags stands for them off
        saved = json.loads(settings.read_text())
        for flag in ("repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "min_p",
                     "min_tokens", "bad_words", "allowed_token_ids", "share_prefixes"):
            del saved[flag]
        settings.write_text(json.dumps(saved))
        msg = _err(argv(out, "--resume", "--repetition-penalty", "1.2"))
        assert msg.count("(now") == 1 and "repetition_penalty 1.0 (now 1.2)" in msg, msg
        # and, from before --no-share-prefixes, for prompts sharing their beginnings
        msg = _err(argv(out, "--resume", "--no-share-prefixes"))
        assert msg.count("(now") == 1 and "share_prefixes True (now False)" in msg, msg
    assert "give its --out" in _err([a for a in argv(out) if a not in ("--out", str(out))] + ["--resume"])

    # an existing --stats: refused, and with --overwrite replaced (it was refused either way:
    # "--overwrite starts the run over"); the resumed records are kept whatever --overwrite says
    stats = tmp_path / "stats.json"
    stats.write_text("earlier")
    assert "pass --overwrite to replace it" in _err(argv(out, "--resume", "--stats", str(stats)))
    assert cli.main(argv(out, "--resume", "--overwrite", "--stats", str(stats))) == 0
    assert out.read_text() == whole.read_text()
    assert json.loads(stats.read_text())["tokens"] == 2 * 8  # the two prompts after the kept record
    stats.unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "whole.jsonl"]
    m = _err(argv(out, "--resume"))  # finished: nothing to resume
    assert "nothing to resume" in m and "--overwrite without --resume" in m

    # records of the same ids from other texts (here the JSONL file's ids, "prompt" null) are
    # another run's: the resumed file would mix both
    text_out = tmp_path / "text.jsonl"
    text_argv = lambda *more: [a if a != files.jsonl else files.txt for a in argv(text_out, *more)]  # noqa: E731
    with monkeypatch.context() as m:
        m.setattr(records.InOrder, "__call__", stop_after_one)
        with pytest.raises(KeyboardInterrupt):
            cli.main(text_argv("--tokenizer", files.tokenizer))
    msg = _err([a if a != files.txt else files.jsonl for a in text_argv("--resume", "--tokenizer", files.tokenizer)])
    assert "record 1" in msg and "its prompt field differs" in msg, msg
    for name in ("text.jsonl.partial", "text.jsonl.partial.settings.json"):
        (tmp_path / name).unlink()

    # a partial file of other prompts is refused, not appended to
    other = tmp_path / "other.jsonl"
    (tmp_path / "other.jsonl.partial").write_text(json.dumps({"prompt_token_ids": [9, 9]}) + "\n")
    (tmp_path / "other.jsonl.partial.settings.json").write_text(json.dumps(_settings_of(argv(other))))
    m = _err(argv(other, "--resume"))
    assert "record 1" in m and "not for prompt 1" in m, m
    assert (tmp_path / "other.jsonl.partial").read_text().count("\n") == 1
    # a partial file that cannot be written is named as --out's, with no advice to resume it
    (tmp_path / "dir.jsonl.partial").mkdir()
    m = _err(argv(tmp_path / "dir.jsonl"))
    assert m.startswith("dsd-jax generate: error: --out: ") and "is a directory" in m, m
    # --resume with nothing begun runs from the start
    fresh = tmp_path / "fresh.jsonl"
    assert cli.main(argv(fresh, "--resume")) == 0 and fresh.read_text() == whole.read_text()


def test_no_share_prefixes_prefills_every_prompt_whole(files, tmp_path):
    """Two prompts beginning with the same 40 tokens: by default the second copies 40
    positions from the first's slot (--stats' shared_prefix_tokens); --no-share-prefixes
    prefills both whole; the records are the same."""
    prompts = tmp_path / "alike.jsonl"
    begin = [(7 * i) % 50 + 3 for i in range(40)]
    prompts.write_text("".join(json.dumps({"prompt_token_ids": begin + [t]}) + "\n" for t in (1, 2)))
    got = {}
    for more in ([], ["--no-share-prefixes"]):
        out, stats = tmp_path / f"out{len(more)}.jsonl", tmp_path / f"stats{len(more)}.json"
        argv = ["generate", "--target", files.target, "--draft", files.draft, *ENGINE_FLAGS,
                "--max-seq-len", "64", "--prompts", str(prompts), "--temperature", "0", "--max-tokens", "4",
                "--out", str(out), "--stats", str(stats), *more]
        assert cli.main(argv) == 0
        got[bool(more)] = out.read_text(), json.loads(stats.read_text())["shared_prefix_tokens"]
    assert got[False][1] == 40 and got[True][1] == 0 and got[False][0] == got[True][0]


def _settings_of(argv) -> dict:
    """The settings a generate run with `argv` records (no model loaded)."""
    args = cli.build_parser().parse_args(argv)
    sampling = [SamplingParams(stop_token_ids=[])]
    return generate_command._run_settings(args, sampling)


def test_dtype_auto_is_each_checkpoints_own(files, tmp_path):
    """--dtype defaults to "auto": an HF checkpoint in the dtype its config.json names
    (bfloat16; float16 and none widen to float32), a saved checkpoint as saved, the
    built-in pair float32; an explicit --dtype casts them all."""
    from dsd_jax import loading
    bf16 = models.save_hf(models.restore(files.target, dtype="bfloat16"), tmp_path / "bf16")
    load = lambda **kw: loading.load_models(types.SimpleNamespace(**kw))[0].config.dtype  # noqa: E731
    assert cli.build_parser().parse_args(["generate"]).dtype == "auto"
    assert load(hf_target=bf16, dtype="auto") == "bfloat16"
    assert load(hf_target=bf16, dtype="float32") == "float32"
    cfg_path = os.path.join(bf16, "config.json")
    for name, want in (("float16", "float32"), (None, "float32")):
        cfg = json.loads(open(cfg_path).read())
        cfg.pop("torch_dtype", None)
        cfg.pop("dtype", None)
        if name:
            cfg["torch_dtype"] = name
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        assert load(hf_target=bf16, dtype="auto") == want, name
    saved = tmp_path / "saved"
    models.save(models.restore(files.target, dtype="bfloat16"), saved)
    assert load(target=str(saved), dtype="auto") == "bfloat16"
    assert load(target=files.target, dtype="auto") == "float32"
    assert load(dtype="auto") == "float32"  # the built-in pair


def test_generate_refuses_bad_sampling_flags_and_profiles_before_loading(files, tmp_path, monkeypatch):
    """An invalid --top-p or --temperature, or a profile that cannot be read, was refused only
    after both checkpoints loaded (minutes for an 8B)."""
    from dsd_jax import loading

    def no_loading(*a, **k):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(loading, "load_models", no_loading)
    gen = ["generate", "--target", files.target, "--draft", files.draft, "--prompts", files.jsonl]
    assert "invalid sampling flags" in _err(gen + ["--top-p", "1.5"])
    assert "invalid sampling flags" in _err(gen + ["--temperature", "-1"])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    m = _err(gen + ["--profile", str(bad)])
    assert m.startswith("dsd-jax generate: error: --profile: "), m


def test_a_templated_prompt_gets_no_second_bos():
    """A tokenizer that adds a BOS (Llama-3's post-processor) doubled it on a chat-templated
    prompt that already starts with one; a plain prompt still gets it."""
    from tokenizers import Tokenizer, processors
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from dsd_jax import loading
    from dsd_jax.inputs import encode_text
    tok = Tokenizer(WordLevel({"<bos>": 0, "w1": 1, "w2": 2, "<unk>": 3}, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    tok.add_special_tokens(["<bos>"])
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    assert tok.encode("<bos> w1").ids == [0, 0, 1]  # what the tokenizer alone does
    assert encode_text(tok, "<bos> w1 w2") == [0, 1, 2] and encode_text(tok, "w1 w2") == [0, 1, 2]
    assert loading.encode_prompts([{"prompt": "<bos> w2"}], tok, 4, "--prompts") == [[0, 2]]
