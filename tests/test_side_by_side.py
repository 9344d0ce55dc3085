"""The side-by-side workload (`dsd_jax.bench.side_by_side`, run by `benchmarks/side_by_side.py`)
end to end on tiny random models: every configuration is measured, every ratio carries a
paired interval over the prompt groups (none where there is one group), the engine
configurations are lossless, and results.json / results.png are written. No timing assertions (2 shared CPU cores)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import scaled
from dsd_jax import models
from dsd_jax.bench import side_by_side as sbs

pytest.importorskip("transformers")
pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "side_by_side.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("side_by_side", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


script = _load_script()  # the flags; the workload is sbs
# K <= 1 keeps the compile (most of this test's time) short; the workload is the same for any K
CONFIGS = ["floor", "vanilla", "static-1", "dynamic", "hf-assisted"]


@pytest.fixture(scope="module")
def doc(tiny_pair, tmp_path_factory):
    target, draft = (scaled(m, 3.0) for m in tiny_pair)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 64, size=int(rng.integers(6, 12))).tolist() for _ in range(6)]
    settings = dict(sbs.QUICK, max_seq_lens=(32,), max_tokens=8, prompt_len=12, max_k=1, torch_threads=1)
    doc = sbs.run(target, draft, prompts[:4], prompts[4:], settings, log=lambda s: None)
    out = tmp_path_factory.mktemp("side_by_side")
    sbs.write_results(doc, out)
    return doc, out


def test_every_configuration_with_intervals(doc):
    doc, _ = doc
    assert [(p["max_seq_len"], p["batch_size"]) for p in doc["points"]] == [(32, 1), (32, 2)]
    for p in doc["points"]:
        expected = CONFIGS if p["batch_size"] == 1 else CONFIGS[:-1]  # hf-assisted only at B=1 by default
        assert list(p["configs"]) == expected
        if p["batch_size"] > 1:
            assert "hf-assisted" in p["skipped"]
        n_pairs = 2 * p["groups"]  # repeats x prompt groups
        assert p["groups"] == (2 if p["batch_size"] == 1 else 1)
        for c, e in p["configs"].items():
            assert e["tokens_per_s"] > 0 and len(e["tokens_per_s_pairs"]) == n_pairs
            for base in ("vs_vanilla", "vs_floor"):
                ci = e[base]  # the intervals rest on the prompt groups: none on one
                assert ci["n"] == p["groups"] and ci["pairs"] == n_pairs, (c, base, ci)
                if p["groups"] > 1:
                    assert ci["method"] == "t" and ci["lo"] <= ci["ratio"] <= ci["hi"], (c, base, ci)
                else:
                    assert ci["lo"] is None, (c, base, ci)
            assert e["all_max_tokens"] and e["tokens"] == 8 * p["batch_size"] * p["groups"]
            if sbs.is_engine(c):
                assert e["lossless"] is True and e["mismatched_requests_vs_vanilla"] == 0
            else:
                assert "lossless" not in e and e["mismatched_requests_vs_vanilla"] >= 0
        assert p["configs"]["vanilla"]["vs_vanilla"]["ratio"] == pytest.approx(1.0)
        assert p["configs"]["floor"]["vs_floor"]["ratio"] == pytest.approx(1.0)
        assert set(p["configs"]["static-1"]["k_hist"]) == {"1"}
        assert set(p["configs"]["dynamic"]["k_hist"]) <= {"0", "1"}


def test_prediction_from_measured_steps(doc):
    doc, _ = doc
    for p in doc["points"]:
        assert p["itl_ms"]["0"] > 0 and p["itl_ms"]["1"] > 0
        assert len(p["acceptance"]) == 1 and 0.0 <= p["acceptance"][0] <= 1.0
        assert p["al"]["0"] == 1.0 and p["al"]["1"] == pytest.approx(1.0 + p["acceptance"][0])
        for c in ("static-1", "dynamic"):
            e = p["configs"][c]
            assert e["predicted_speedup"] > 0 and e["measured_over_predicted"] > 0
        expect = p["al"]["1"] * p["itl_ms"]["0"] / p["itl_ms"]["1"]
        assert p["configs"]["static-1"]["predicted_speedup"] == pytest.approx(expect)
        measured = p["configs"]["static-1"]["vs_vanilla"]["ratio"]
        assert p["configs"]["static-1"]["measured_over_predicted"] == pytest.approx(measured / expect)


def test_summary_files_and_table(doc):
    doc, out = doc
    s = doc["summary"]
    assert s["lossless"] is True and s["hf_mismatched_requests"] >= 0
    bases = {(d["batch_size"], d["config"], d["baseline"]) for d in s["differences"]}
    assert (1, "hf-assisted", "vanilla") in bases and (2, "dynamic", "floor") in bases
    assert all(d["verdict"] in ("higher", "lower", "unresolved") for d in s["differences"])
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["schema"] == "dsd_jax.side_by_side/1" and on_disk["points"] == json.loads(json.dumps(doc["points"]))
    assert on_disk["environment"]["platform"] == "cpu" and on_disk["hf"]["transformers_version"]
    png = (out / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    table = sbs.format_table(doc)
    for c in CONFIGS:
        assert f"  {c} " in table
    assert "lossless" in table and "real differences from vanilla" in table and "[" in table
    assert "max_seq_len 32, B=2 (1 prompt group(s) of 2 per repeat): cannot resolve 5%" in table
    assert "[n=1: no interval]" in table


def test_floor_matches_plain_decoding(tiny_pair):
    """The floor is plain greedy decoding: its tokens equal the conftest oracle's."""
    from conftest import greedy_reference
    target = scaled(tiny_pair[0], 3.0)
    prompts = [[5, 9, 2, 7], [3, 1, 4, 1, 5, 9, 2]]
    got = sbs.make_floor(target, 8)(prompts, 6)
    assert got == [greedy_reference(target, p, 6) for p in prompts]


def test_settings_and_arguments(tmp_path):
    quick = script.settings_from(script.parse_args(["--out", str(tmp_path), "--quick"]))
    assert quick["batch_sizes"] == [1, 2] and quick["max_seq_lens"] == [256] and quick["repeats"] == 2
    full = script.settings_from(script.parse_args(["--out", "x", "--batch-sizes", "8,1", "--max-seq-lens",
                                                   "4096,256", "--max-tokens", "128", "--repeats", "9",
                                                   "--hf-batch-sizes", "none"]))
    assert full["batch_sizes"] == [1, 8] and full["max_seq_lens"] == [256, 4096]
    assert full["repeats"] == 9 and full["hf_batch_sizes"] == [] and full["max_k"] == 4
    with pytest.raises(SystemExit):
        script.settings_from(script.parse_args(["--out", "x", "--max-seq-lens", "64", "--max-tokens", "128"]))
    with pytest.raises(SystemExit):
        script.settings_from(script.parse_args(["--out", "x", "--repeats", "0"]))
    assert sbs.config_names(3) == ["floor", "vanilla", "static-1", "static-2", "static-3", "dynamic", "hf-assisted"]
    assert models.save_hf  # the exporter hf-assisted uses


def _cell(outputs_per_repeat, info=None):
    from dsd_jax.bench.runner import Cell
    cell = Cell()
    for rep, outs in enumerate(outputs_per_repeat):
        cell.add(rep, 0.1 + 0.01 * rep, outs, info)
    return cell


def test_lossless_is_judged_on_every_repeat():
    """A configuration whose later repeats differ from vanilla's (or fall short of max_tokens)
    is not lossless, though its first repeat matched."""
    from dsd_jax.bench.side_by_side_report import analyse_point, summarize

    def info(k):
        return {"row_steps": 8, "steps": 8, "k_hist": {k: 8}, "decode_tokens": 8, "decode_s": 0.1,
                "step_ms": [(k, 1, 10.0, 20)] * 8, "accepted": [0], "proposed": [0], "controller_s": 0.0}

    good, bad, short = [[1, 2, 3, 4, 5, 6, 7, 8]], [[1, 2, 3, 9, 9, 9, 9, 9]], [[1, 2, 3]]
    cells = {"floor": _cell([good] * 3), "vanilla": _cell([good] * 3, info(0)),
             "static-1": _cell([good, good, short], info(1)), "dynamic": _cell([good, bad, bad], info(1)),
             "hf-assisted": _cell([good, bad, good])}
    p = analyse_point(cells, 1, 8, 1)
    configs = p["configs"]
    assert configs["vanilla"]["lossless"] and configs["vanilla"]["all_max_tokens"]
    dyn = configs["dynamic"]
    assert not dyn["lossless"] and dyn["mismatched_requests_vs_vanilla"] == 1 and not dyn["matches_floor"]
    assert not configs["static-1"]["lossless"] and not configs["static-1"]["all_max_tokens"]
    assert configs["hf-assisted"]["mismatched_requests_vs_vanilla"] == 1
    summ = summarize([{"max_seq_len": 32, "batch_size": 1, **p}])
    assert summ["lossless"] is False and summ["hf_mismatched_requests"] == 1


def test_prompt_groups_are_distinct_at_any_settings(monkeypatch):
    """ceil(rows / B) groups of B may take more prompts than rows_per_point (B = 3, 4 rows:
    two groups, six prompts): run_builtin fetches them all, and run refuses groups that would
    repeat a prompt (the intervals resample them as independent draws), before any compile."""
    s = sbs.make_settings(False, batch_sizes="1,3", rows_per_point=4)
    fetched = []

    class Fetched(Exception):
        pass

    def builtin_prompts(n, n_profile, tokenizer):
        fetched.append(n)
        raise Fetched

    monkeypatch.setattr(sbs.models, "builtin", lambda: (None, None, None))
    monkeypatch.setattr(sbs, "builtin_prompts", builtin_prompts)
    with pytest.raises(Fetched):
        sbs.run_builtin(s, "unused")
    assert fetched == [6]
    with pytest.raises(ValueError, match="batch size 3 takes 2 prompt groups of 3, 6 distinct prompts, but 4"):
        sbs.run(None, None, [[i + 1] for i in range(4)], [], s, log=lambda m: None)


def test_existing_results_are_refused_before_the_run_unless_overwrite(tmp_path, monkeypatch):
    """--out DIR holding an earlier results.json or results.png is refused before the run
    (an hour at the defaults) unless --overwrite; results are written whole or not at all,
    as strict JSON (a non-finite number as null)."""
    class Ran(Exception):
        pass

    def run_builtin(*a, **kw):
        raise Ran

    monkeypatch.setattr(sbs, "run_builtin", run_builtin)
    for name in ("results.json", "results.png"):
        out = tmp_path / name.replace(".", "_")
        out.mkdir()
        (out / name).write_text("an earlier run")
        with pytest.raises(SystemExit, match=f"--out: '.*{name}' exists; pass --overwrite to replace it"):
            script.main(["--out", str(out), "--quick"])
        with pytest.raises(Ran):
            script.main(["--out", str(out), "--quick", "--overwrite"])
    with pytest.raises(Ran):  # nothing there yet
        script.main(["--out", str(tmp_path / "new"), "--quick"])
    out = tmp_path / "results"
    out.mkdir()
    (out / "results.json").write_text("an earlier run")
    with pytest.raises(TypeError):  # a write failing half way
        sbs.write_results({"settings": {"bad": object()}, "points": []}, out)
    assert (out / "results.json").read_text() == "an earlier run" and sorted(p.name for p in out.iterdir()) == [
        "results.json"]
    doc = {"settings": {"nan": float("nan")}, "summary": {},
           "points": [{"max_seq_len": 64, "batch_size": 1, "groups": 1, "profile_acceptance": [float("inf"), 0.5],
                       "configs": {"vanilla": {"tokens_per_s": 10.0, "vs_vanilla": None}}}]}
    sbs.write_results(doc, out)

    def refuse(name):
        raise AssertionError(f"{name} in results.json")
    on_disk = json.loads((out / "results.json").read_text(), parse_constant=refuse)
    assert on_disk["settings"]["nan"] is None and on_disk["points"][0]["profile_acceptance"] == [None, 0.5]
    assert (out / "results.png").read_bytes()[:4] == b"\x89PNG"
