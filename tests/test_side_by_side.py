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
