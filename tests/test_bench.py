"""The benchmark harness on tiny random models: row schema, losslessness, JSON and plot.

No timing assertions (2 shared CPU cores); the built-in pair's numbers are in the
issue notes."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest

from conftest import scaled
from dsd_jax import bench, stats


def _prompts(n, vocab=64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=int(rng.integers(6, 14))).tolist() for _ in range(n)]


TINY = dict(batch_sizes=[1, 4], configs="vanilla,static-2,dynamic", repeats=3, max_tokens=8, quick=True,
            prompt_len=12, rows_per_point=2, rollout_requests=4, rollout_prompt_len=8,
            rollout_median_tokens=4, rollout_max_tokens=12, rollout_units=2, max_seq_len=32, max_k=2,
            batch_buckets=[4], log=None)


SWEEP_CALLS: list[tuple[str, tuple]] = []  # (config, prompts) of every timed sweep run, in order


def _record_sweep_runs(runner):
    run = runner.run

    def recording(config, prompts, sampling):
        if not isinstance(sampling, list):  # the sweep's one greedy SamplingParams
            SWEEP_CALLS.append((config, tuple(map(tuple, prompts))))
        return run(config, prompts, sampling)

    runner.run = recording


@pytest.fixture(scope="module")
def bench_rows(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    # A draft that agrees with the target on some tokens, so acceptance is not ~0.
    rows = bench.run_bench(scaled(target, 3.0), scaled(draft, 3.0), None, _prompts(14), profile=None,
                           profile_out=tmp_path_factory.mktemp("prof") / "profile.json",
                           runner_hook=_record_sweep_runs, **TINY)
    return rows


def test_a_divergence_from_vanilla_is_located_and_its_top2_gap_judged(tiny_pair, capsys):
    """A wrong token (one static-2 output altered after the run) is reported where it is,
    with the target's top-2 gap there: not a near-tie, so the report says a wrong token."""
    target, draft = tiny_pair

    def corrupt(runner):
        run = runner.run

        def once(config, prompts, sampling):
            wall, outs, info = run(config, prompts, sampling)
            if config == "static-2" and not isinstance(sampling, list) and not corrupt.done:  # timed
                corrupt.done = outs[1][3]
                outs[1][3] = (outs[1][3] + 1) % target.config.vocab_size
            return wall, outs, info
        runner.run = once

    corrupt.done = None
    rows = bench.run_bench(target, draft, None, _prompts(8), profile=None, runner_hook=corrupt,
                           **{**TINY, "batch_sizes": [2], "configs": "vanilla,static-2", "repeats": 1,
                              "batch_buckets": [2], "workloads": ("sweep",), "log": print})
    bad = [r for r in rows if r["workload"] == "sweep" and r["config"] == "static-2"][0]
    assert not bad["lossless"] and not rows[-1]["lossless"]
    [d] = bad["divergences"]
    assert (d["repeat"], d["request"], d["position"]) == (0, 1, 3)
    assert d["top2_gap"] > 0 and d["near_tie"] is False and d["dtype"] == target.config.dtype
    assert "NOT a near-tie: a wrong token" in capsys.readouterr().out
    assert "1 request(s) diverged; 1 of the 1 diagnosed at a top-2 gap no rounding explains" in bench.format_table(rows)
    # a near-tie reads as rounding
    near = {**bad, "divergences": [{**d, "near_tie": True, "gap_in_ulps": 1.0}]}
    text = bench.format_table([near if r is bad else r for r in rows])
    assert "all 1 diagnosed at near-ties the programs' rounding can swap (top-2 gaps of at most 1.0 ulps)" in text


def test_configurations_take_turns_per_prompt_group(bench_rows):
    """B=1 runs two one-prompt groups: every configuration runs group 0, then every one group 1."""
    first = SWEEP_CALLS[:6]
    groups = [p for _, p in first]
    assert groups[0] != groups[3] and len(set(groups[:3])) == 1 and len(set(groups[3:])) == 1
    assert sorted(c for c, _ in first[:3]) == sorted(c for c, _ in first[3:]) == ["dynamic", "static-2", "vanilla"]
    assert [c for c, _ in first[:3]] != [c for c, _ in first[3:]]  # the order rotates


@pytest.mark.parametrize("configs,units", [(2, [1, 1]), (3, [2, 1]), (2, [4, 2, 1, 1]), (7, [8, 4, 2, 1, 1, 1, 1, 1])])
def test_every_configuration_runs_every_unit_first_equally_often(configs, units):
    """Over as many repeats as configurations, each pair unit runs in every rotation once,
    whatever the number of units per repeat (two configurations and two one-unit points
    once ran in the same order every repeat)."""
    from dsd_jax.bench.runner import run_interleaved
    from dsd_jax.bench.workloads import Point

    names = [f"c{i}" for i in range(configs)]
    points = [Point("sweep", b, [[[b, u]] for u in range(n)], names) for b, n in enumerate(units)]
    orders: dict[tuple, list[str]] = {}

    def run(config, point, u):
        orders.setdefault((point.batch_size, point.units[u][0][1]), []).append(config)
        return 1.0, [[1]], None

    run_interleaved(points, run, repeats=configs)
    for unit, ran in orders.items():
        rounds = [tuple(ran[i:i + configs]) for i in range(0, len(ran), configs)]
        assert sorted(r[0] for r in rounds) == names, f"unit {unit}: first in each repeat {rounds}"
        assert len(set(rounds)) == configs


@pytest.mark.parametrize("configs,repeats,units", [(7, 3, [8, 4, 2, 1, 1, 1, 1, 1]), (7, 6, [8, 4, 2, 1, 1, 1, 1, 1]),
                                                   (6, 2, [4, 1, 1, 1, 1]), (4, 2, [4, 1, 1, 1, 1])])
def test_every_configuration_leads_a_point_equally_often(configs, repeats, units):
    """Over a point's repeats x units every configuration runs first, and at every position,
    as often as any other to within one, whatever the repeats (rep + unit index, the earlier
    turn, led 3, 3, 2, 2, 1, 1, 0 times with 7 configurations, 3 repeats and 4 groups: the
    full bench's B=2 under its old defaults), and a unit's order still moves each repeat."""
    from collections import Counter

    from dsd_jax.bench.runner import run_interleaved
    from dsd_jax.bench.workloads import Point

    names = [f"c{i}" for i in range(configs)]
    points = [Point("sweep", b, [[[b, u]] for u in range(n)], names) for b, n in enumerate(units)]
    runs: dict[tuple, list[str]] = {}

    def run(config, point, u):
        runs.setdefault((point.batch_size, point.units[u][0][1]), []).append(config)
        return 1.0, [[1]], None

    run_interleaved(points, run, repeats=repeats)
    missing = set()
    for b, n in enumerate(units):
        orders = [tuple(ran[i:i + configs]) for u in range(n) for ran in [runs[(b, u)]]
                  for i in range(0, len(ran), configs)]
        for pos in range(configs):
            at = Counter(o[pos] for o in orders)
            counts = [at.get(c, 0) for c in names]
            assert max(counts) - min(counts) <= 1, (b, pos, counts)
        if n * repeats < configs:
            missing.add(frozenset(set(names) - {o[0] for o in orders}))
        for u in range(n):  # a unit's order changes from repeat to repeat
            ran = runs[(b, u)]
            assert all(ran[i:i + configs] != ran[i + configs:i + 2 * configs] for i in range(0, len(ran) - configs, configs))
    assert len(missing) != 1  # points too small for everyone to lead leave out different ones


def test_rows_schema_and_lossless(bench_rows):
    rows = bench_rows
    meta = [r for r in rows if r["workload"] == "meta"]
    assert len(meta) == 1 and meta[0]["lossless"] is True
    assert meta[0]["configs"] == ["vanilla", "static-2", "dynamic"]
    assert meta[0]["profile"]["source"].startswith("profiled now")
    sweep = [r for r in rows if r["workload"] == "sweep"]
    assert {(r["batch_size"], r["config"]) for r in sweep} == {
        (b, c) for b in (1, 4) for c in ("vanilla", "static-2", "dynamic")}
    for r in sweep:
        assert r["tokens_per_s"] > 0 and np.isfinite(r["tokens_per_s"])
        assert r["lossless"] is True and r["mismatched_requests"] == 0 and r["divergences"] == []
        assert r["tokens"] == r["prompts"] * 8  # fixed max_tokens, no stop ids: same work everywhere
        cal = r["step_calibration"]  # measured step time next to the profile's ITL
        assert cal and all(e["measured_ms"] > 0 and e["profile_ms"] > 0 for e in cal)
        assert {e["k"] for e in cal} <= {int(k) for k in r["k_hist"]}
        assert r["controller_ms_per_step"] >= 0  # host time in the K controller a round
        hist = {int(k): v for k, v in r["k_hist"].items()}
        assert sum(hist.values()) >= r["steps"] > 0  # the histogram counts every repeat's steps
        if r["config"] == "vanilla":
            assert hist == {0: r["steps"] * r["repeats"]} and r["mean_accepted_len"] == 1.0
        elif r["config"] == "static-2":
            assert set(hist) == {2} and 1.0 <= r["mean_accepted_len"] <= 3.0
        else:
            assert set(hist) <= {0, 1, 2} and "itl_mape" in r["controller"]
    roll = [r for r in rows if r["workload"] == "rollout"]
    assert [r["config"] for r in roll] == ["vanilla", "static-2", "dynamic"]
    # one paired sample per (repeat, prompt group): B=1 runs 2 groups a repeat, each repeat
    # groups of its own (the 6 prompts beyond the profile's 8 hold them), B=4 one group
    # every repeat (12 would not fit), the rollout 2 rollouts; the intervals rest on the
    # groups: an interval on 6 (bootstrap) or 2 (t), none on 1
    units = {1: [0, 1, 2, 3, 4, 5], 4: [0, 0, 0], None: [0, 1, 0, 1, 0, 1]}
    for r in sweep + roll:
        pair_units = units[r.get("batch_size")]
        groups = len(set(pair_units))
        assert r["pair_units"] == pair_units
        assert len(r["tokens_per_s_pairs"]) == len(pair_units) and all(x > 0 for x in r["tokens_per_s_pairs"])
        for key in ("vs_vanilla", "vs_best_static"):
            ci = r[key]
            assert ci["n"] == groups and ci["pairs"] == len(pair_units), (key, ci)
            if groups == 1:
                assert ci["lo"] is None and ci["method"] is None, (key, ci)
            else:
                method = "t" if groups <= stats.SMALL_N else "bootstrap"
                assert ci["method"] == method and ci["lo"] <= ci["ratio"] <= ci["hi"], (key, ci)
        assert r["best_static"] == "static-2"
        if r["config"] == "vanilla" and groups > 1:
            assert r["vs_vanilla"]["lo"] == pytest.approx(1.0) == r["vs_vanilla"]["hi"]
        if r["config"] == "static-2":
            assert r["vs_best_static"]["ratio"] == pytest.approx(1.0)
    lengths = meta[0]["rollout"]["lengths"]  # per rollout, each its own draw
    assert [len(x) for x in lengths] == [4, 4] and lengths[0] != lengths[1]
    assert all(1 <= n <= 12 for x in lengths for n in x) and meta[0]["rollout"]["units"] == 2
    for r in roll:
        assert r["makespan_s"] > 0 and r["tokens_per_s"] > 0 and r["lossless"] is True
        assert r["tokens"] == sum(map(sum, lengths)) and r["num_requests"] == 4 and r["rollouts"] == 2
    json.dumps(rows)  # JSON-ready


def test_json_plot_and_table(bench_rows, tmp_path):
    bench.write_json(bench_rows, tmp_path / "b.json")
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["rows"] == json.loads(json.dumps(bench_rows))
    env = doc["environment"]
    assert env["platform"] == "cpu" and env["jax_version"] and "device_kind" in env
    s = doc["summary"]
    assert s["lossless"] is True and [e["batch_size"] for e in s["sweep"]] == [1, 4]
    assert "dynamic_vs_best_other" in s["sweep"][0] and "dynamic_vs_best_other" in s["rollout"]
    ci = s["sweep"][0]["dynamic_vs_best_other_ci"]
    assert ci["n"] == 6 and ci["pairs"] == 6 and ci["lo"] <= ci["ratio"] <= ci["hi"]  # 2 groups a repeat, each its own
    ci = s["rollout"]["dynamic_vs_best_other_ci"]  # two rollouts: a t interval
    assert ci["n"] == 2 and ci["method"] == "t" and ci["lo"] <= ci["ratio"] <= ci["hi"]
    assert s["sweep"][1]["resolves_5pct"] is False
    # every configuration against vanilla and the best static K, with a verdict
    diffs = {(d["workload"], d["batch_size"], d["config"], d["baseline"]) for d in s["differences"]}
    assert diffs == {(w, b, c, base) for w, b in (("sweep", 1), ("sweep", 4), ("rollout", None))
                     for c, base in (("static-2", "vanilla"), ("dynamic", "vanilla"), ("dynamic", "static-2"))}
    assert all(d["verdict"] in ("higher", "lower", "unresolved") and d["real"] == (d["verdict"] != "unresolved")
               for d in s["differences"])
    bench.write_plot(bench_rows, tmp_path / "b.png")
    png = (tmp_path / "b.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    table = bench.format_table(bench_rows)
    assert "static-2" in table and "lossless" in table and "K histogram" in table
    assert "best static K" in table and "differences the data resolve" in table
    vanilla_1 = next(r for r in bench_rows if r.get("batch_size") == 1 and r["config"] == "vanilla")
    assert f"{vanilla_1['tokens_per_s']:.1f} (baseline)" in table
    b4 = next(line for line in table.splitlines() if line.startswith("    4 |"))
    assert "[n=1: no interval]" in b4 and "no interval (1 prompt group): cannot resolve 5%" in b4
    assert "its points cannot resolve 5%" in table  # the quick run says it is a smoke run


def _row(b, c, tps, workload="sweep"):
    r = {"workload": workload, "config": c, "tokens_per_s": tps, "lossless": True, "k_hist": {"0": 1},
         "speedup_vs_vanilla": 1.0}
    if workload == "sweep":
        r["batch_size"] = b
    else:
        r["makespan_s"] = 100.0 / tps
    return r


def test_plot_draws_the_paired_estimate_inside_its_bar():
    """The speedup plot's point is the paired ratio its interval bar is about (the ratio of
    medians, 104/60 here, lies below the bar)."""
    from matplotlib.figure import Figure

    from dsd_jax.bench.report import _plot_speedup, config_colors
    rows = []
    for c, xs in {"vanilla": [60] * 7, "dynamic": [104] * 4 + [124] * 3}.items():
        r = _row(4, c, float(statistics.median(xs)))
        r["tokens_per_s_pairs"], r["speedup_vs_vanilla"] = xs, float(statistics.median(xs)) / 60
        rows.append(r)
    bench.add_intervals(rows)
    ci = rows[1]["vs_vanilla"]
    assert not ci["lo"] <= rows[1]["speedup_vs_vanilla"] <= ci["hi"]  # what the plot used to draw
    ax = Figure().subplots()
    _plot_speedup(ax, rows, ["vanilla", "dynamic"], config_colors(["vanilla", "dynamic"]))
    drawn = ax.lines[1].get_ydata()[0]
    (_, lo), (_, hi) = ax.collections[0].get_segments()[0]
    assert drawn == pytest.approx(ci["ratio"]) and lo <= drawn <= hi


def test_summary_on_hand_made_rows():
    rows = []
    for b, (v, s2, s4, dyn) in {1: (10, 20, 25, 26), 4: (30, 40, 35, 40), 16: (80, 70, 50, 80),
                                 64: (200, 150, 100, 199)}.items():
        rows += [_row(b, "vanilla", v), _row(b, "static-2", s2), _row(b, "static-4", s4), _row(b, "dynamic", dyn)]
    rows += [_row(None, "vanilla", 10, "rollout"), _row(None, "static-2", 12, "rollout"),
             _row(None, "dynamic", 15, "rollout")]
    s = bench.summarize(rows)
    by_b = {e["batch_size"]: e for e in s["sweep"]}
    assert by_b[1]["best_other"] == "static-4" and by_b[1]["dynamic_vs_best_other"] == pytest.approx(26 / 25)
    assert by_b[64]["best_other"] == "vanilla" and by_b[64]["dynamic_vs_best_other"] == pytest.approx(0.995)
    assert by_b[1]["best_speedup_vs_vanilla"] == pytest.approx(2.6)
    # no paired samples, no intervals: where speculation stops paying is unresolved
    assert s["speculation_stops_paying_at"] is None
    assert s["speculation_pays"]["draft_model (best static K)"] == [[b, "unresolved"] for b in (1, 4, 16, 64)]
    assert s["rollout"]["best_other"] == "static-2"
    assert s["rollout"]["dynamic_vs_best_other"] == pytest.approx(12 / 15)
    assert s["lossless"] is True
    assert by_b[1]["repeat_spread"] is None  # no repeats recorded
    for r, reps in zip(rows[:4], ([9, 10, 11], [18, 20, 22], [25, 25, 25], [26, 26, 26])):
        r["tokens_per_s_repeats"] = reps
    spread = bench.summarize(rows)["sweep"][0]["repeat_spread"]
    assert spread == pytest.approx(statistics.median([0.2, 0.2, 0.0, 0.0]))
    assert s["differences"] == []  # no paired samples, no verdicts
    rows[0]["lossless"] = False
    assert bench.summarize(rows)["lossless"] is False
    # dynamic-throughput is a dynamic variant, never the "best other" dynamic is held to
    rows += [_row(1, "dynamic-throughput", 30), _row(None, "dynamic-throughput", 50, "rollout")]
    s = bench.summarize(rows)
    assert s["sweep"][0]["best_other"] == "static-4" and s["rollout"]["best_other"] == "static-2"


def test_best_speedup_is_the_best_configs_own():
    """best_config is ranked by the paired scores; its speedup is its own on them, not the
    highest median's (static-2's 160 over one slow pair, ranked below static-1)."""
    def row(c, tps, pairs):
        return {**_row(1, c, tps), "tokens_per_s_pairs": pairs, "tokens_per_s_repeats": pairs,
                "pair_units": [0, 1, 2, 3]}

    rows = [row("vanilla", 100.0, [100.0] * 4), row("static-1", 150.0, [150.0] * 4),
            row("static-2", 160.0, [60.0, 160.0, 160.0, 160.0])]
    e = bench.summarize(rows)["sweep"][0]
    assert e["best_config"] == "static-1" and e["best_speedup_vs_vanilla"] == pytest.approx(1.5)


def test_paired_intervals_on_hand_made_rows():
    """Interleaved pairs share the machine's drift: a 10% gain under 30% drift is resolved, a
    config equal to vanilla is not."""
    rng = np.random.default_rng(0)
    drift = rng.lognormal(0.0, 0.3, 12)
    noise = lambda: rng.lognormal(0.0, 0.02, 12)  # noqa: E731
    jitter = noise()
    vanilla = 100 * drift * noise()
    pairs = {"vanilla": vanilla, "static-2": 110 * drift * noise(),
             "static-4": vanilla * jitter / np.exp(np.mean(np.log(jitter))),  # geometric mean ratio 1
             "dynamic": 112 * drift * noise()}
    rows = []
    for c, p in pairs.items():
        r = _row(1, c, float(np.median(p)))
        r["tokens_per_s_pairs"] = p.tolist()
        rows.append(r)
    bench.add_intervals(rows)
    by_c = {r["config"]: r for r in rows}
    assert by_c["static-2"]["vs_vanilla"]["lo"] > 1.0 and by_c["static-2"]["vs_vanilla"]["n"] == 12
    assert by_c["static-4"]["vs_vanilla"]["lo"] < 1.0 < by_c["static-4"]["vs_vanilla"]["hi"]
    assert all(r["best_static"] == "static-2" for r in rows)
    s = bench.summarize(rows)
    verdicts = {(d["config"], d["baseline"]): d["verdict"] for d in s["differences"]}
    assert verdicts[("static-2", "vanilla")] == verdicts[("dynamic", "vanilla")] == "higher"
    assert verdicts[("static-4", "vanilla")] == "unresolved"
    assert verdicts[("static-4", "static-2")] == "lower"
    assert s["sweep"][0]["resolution"] < 0.05
    table = bench.format_table(rows)
    assert "static-2 higher than vanilla: 1.1" in table and "not resolved" in table


def test_summary_point_estimate_is_the_paired_ratio_its_interval_is_around():
    """The ratio of medians (104 / 100 = 1.04 here) can sit at the edge of the paired
    interval printed beside it; the summary now gives the paired ratio and picks the best
    other configuration by the paired ranking, in the sweep and the rollout alike."""
    per = {"vanilla": [60] * 7, "static-2": [100] * 4 + [130] * 3, "dynamic": [104] * 4 + [124] * 3}
    rows = []
    for workload, b in (("sweep", 4), ("rollout", None)):
        for c, xs in per.items():
            r = _row(b, c, float(statistics.median(xs)), workload)
            r["tokens_per_s_pairs"] = xs
            rows.append(r)
    bench.add_intervals(rows)
    s = bench.summarize(rows)
    sweep, roll = s["sweep"][0], s["rollout"]
    ci = sweep["dynamic_vs_best_other_ci"]
    assert sweep["best_other"] == roll["best_other"] == "static-2"
    assert sweep["dynamic_vs_best_other"] == pytest.approx(ci["ratio"]) and ci["lo"] <= ci["ratio"] <= ci["hi"]
    assert abs(sweep["dynamic_vs_best_other"] - 1.04) > 0.02
    assert roll["dynamic_vs_best_other"] == pytest.approx(roll["dynamic_vs_best_other_ci"]["ratio"])
    assert roll["dynamic_vs_best_other"] == pytest.approx(1 / sweep["dynamic_vs_best_other"])


def _paired(rows, noise, groups=6, repeats=2, seed=0):
    """Gives hand-made rows the bench's paired samples: `groups` prompt groups x `repeats`,
    laid out pairs[rep * G + g], each group's speed shared by every configuration at the point
    (it cancels in the ratios) and each run's own noise (log sd `noise`)."""
    rng = np.random.default_rng(seed)
    for key in dict.fromkeys((r["workload"], r.get("batch_size")) for r in rows):
        group = np.tile(rng.lognormal(0.0, 0.3, groups), repeats)
        for r in rows:
            if (r["workload"], r.get("batch_size")) == key:
                r["tokens_per_s_pairs"] = (r["tokens_per_s"] * group * rng.lognormal(0.0, noise, group.size)).tolist()
                r["repeats"] = repeats
    bench.add_intervals(rows)
    return rows


def _eagle3_rows(noise):
    rows = []
    for b, tps in {1: (10, 20, 22, 15, 16), 4: (30, 40, 40, 29, 31), 16: (80, 70, 80, None, None)}.items():
        rows += [_row(b, c, v) for c, v in zip(("vanilla", "static-2", "dynamic", "eagle3-static-1",
                                                "eagle3-dynamic"), tps) if v is not None]
    return _paired(rows, noise)


def test_eagle3_configurations_in_the_summary():
    """The head's configurations beside the draft model's: each dynamic one compared with the
    best other, where each method pays and from where on it is slower than vanilla, eagle3 only
    at the batch sizes it ran. A verdict needs an interval that excludes 1: dynamic equal to
    vanilla at B=16 is unresolved, not "stopped paying"."""
    s = bench.summarize(_eagle3_rows(noise=0.002))
    by_b = {e["batch_size"]: e for e in s["sweep"]}
    assert by_b[1]["best_other"] == "static-2"
    assert by_b[1]["dynamic_configs"]["eagle3-dynamic"]["vs_best_other"] == pytest.approx(0.8, rel=0.01)
    assert by_b[1]["dynamic_configs"]["eagle3-dynamic"]["verdict"] == "lower"
    assert by_b[1]["dynamic_vs_best_other"] == pytest.approx(1.1, rel=0.01)
    assert "eagle3-dynamic" not in by_b[16]["dynamic_configs"]
    assert s["stops_paying_at"] == {"draft_model (best static K)": 16, "eagle3 (best static K)": 4,
                                    "dynamic": None, "eagle3-dynamic": None}
    assert s["speculation_pays"]["dynamic"] == [[1, "pays"], [4, "pays"], [16, "unresolved"]]
    assert s["speculation_stops_paying_at"] == 16
    table = bench.format_table(_eagle3_rows(noise=0.002))
    assert "eagle3 (best static K): B=1 pays, B=4 slower -> slower than vanilla from B=4 on" in table
    assert "eagle3-dynamic: B=1 pays, B=4 pays -> still pays at the largest batch size it ran" in table
    assert "dynamic: B=1 pays, B=4 pays, B=16 ? -> where it stops paying is unresolved" in table
    assert "B=  1: eagle3-dynamic = 0.80 x best other (static-2), paired 0.80x [" in table
    # the same means under 20% run-to-run noise: the 3-13% losses are not resolved, so no verdict
    noisy = bench.summarize(_eagle3_rows(noise=0.2))
    assert noisy["stops_paying_at"] == {name: None for name in s["stops_paying_at"]}
    assert noisy["speculation_pays"]["eagle3 (best static K)"] == [[1, "pays"], [4, "unresolved"]]
    assert noisy["speculation_pays"]["draft_model (best static K)"][-1] == [16, "unresolved"]


def test_table_marks_points_that_cannot_resolve_five_percent():
    """Each comparison prints its half-width; a point is marked where one of them is over 5%
    or has no interval (one prompt group)."""
    rows = []
    for b in (1, 2, 8):
        rows += [_row(b, "vanilla", 100.0), _row(b, "static-2", 110.0)]
    _paired(rows[:2], noise=0.005)  # B=1: 6 groups, tight
    _paired(rows[2:4], noise=0.2)  # B=2: 6 groups, noisy
    _paired(rows[4:], noise=0.005, groups=1, repeats=6)  # B=8: one group of 8 prompts
    bench.add_intervals(rows)
    s = bench.summarize(rows)
    assert [e["resolves_5pct"] for e in s["sweep"]] == [True, False, False]
    lines = {}  # the sweep table's row of each batch size (the first line starting with it)
    for line in bench.format_table(rows).splitlines():
        if line[:5].strip().isdigit():
            lines.setdefault(line[:5].strip(), line)
    ci = {r["batch_size"]: r["vs_vanilla"] for r in rows if r["config"] == "static-2"}
    for b in (1, 2):
        assert f"+-{100 * stats.resolution(ci[b]):.1f}%" in lines[str(b)]
    assert "cannot resolve 5%" not in lines["1"] and lines["2"].endswith(": cannot resolve 5%")
    assert lines["8"].endswith("no interval (1 prompt group): cannot resolve 5%")
    assert "smoke" not in bench.format_table(rows)  # not a quick run: no smoke-run line


def test_config_parsing_and_lengths():
    from dsd_jax.bench.settings import config_list, method_of, resolve, with_method
    assert bench.parse_config("eagle3-static-2") == ("static", 2)
    assert bench.parse_config("eagle3-dynamic") == ("dynamic", None)
    assert [method_of(c) for c in ("vanilla", "static-1", "eagle3-static-1")] == [None, "draft_model", "eagle3"]
    assert with_method(["vanilla", "static-1", "dynamic"], "eagle3") == ["vanilla", "eagle3-static-1",
                                                                          "eagle3-dynamic"]
    assert config_list("eagle3-dynamic") == ["vanilla", "eagle3-dynamic"]
    with pytest.raises(ValueError, match="prefixed with 'eagle3-'"):
        bench.parse_config("eagle3-fast")
    s = resolve(True, dict(configs="static-1,eagle3-static-1", eagle3_max_batch=16, eagle3_max_k=2,
                           workloads=("sweep", "rollout")))
    assert s.runs_at("eagle3-static-1", 16) and not s.runs_at("eagle3-static-1", 64)
    assert s.runs_at("static-1", 64) and s.method_max_batch("eagle3") == 16
    assert s.method_max_k("eagle3") == 2 and s.method_max_k("draft_model") == 3
    with pytest.raises(ValueError, match="eagle3 configurations would never run"):
        resolve(True, dict(configs="eagle3-static-1", batch_sizes=[4], eagle3_max_batch=2, workloads=("sweep",)))
    assert bench.parse_config("static-6") == ("static", 6)
    assert bench.parse_config("vanilla") == ("vanilla", None)
    assert bench.parse_config("dynamic-throughput") == bench.parse_config("dynamic") == ("dynamic", None)
    for bad in ("static-0", "static-x", "fast", 3):
        with pytest.raises(ValueError):
            bench.parse_config(bad)
    a = bench.rollout_lengths(64, 32, 320, seed=0)
    assert a == bench.rollout_lengths(64, 32, 320, seed=0) and len(a) == 64
    assert max(a) > 4 * np.median(a) and min(a) >= 4 and max(a) <= 320  # heavy tail


def test_output_checks_come_before_the_run(tmp_path):
    """`bench.main` (the CLI's bench) checks the plot format and its outputs before any model is
    loaded: --target names no directory, so getting past the checks would fail on it."""
    import types

    from dsd_jax.bench.report import check_plot_path
    from dsd_jax.loading import ArgumentError
    for ok in ("b.png", "b.PDF", tmp_path / "b.svg"):
        check_plot_path(ok)
    for bad, why in (("b.txt", "cannot write 'txt'"), ("b", "no file extension")):
        with pytest.raises(ValueError, match=why):
            check_plot_path(bad)

    def args(**kw):
        base = dict(quick=True, target=str(tmp_path / "no_model"), configs=["vanilla", "dynamic"], json=None,
                    plot=None, profile=None, eagle3_profile=None, overwrite=False)
        return types.SimpleNamespace(**{**base, **kw})

    with pytest.raises(ArgumentError, match="--plot.*cannot write 'json'"):
        bench.main(args(plot=str(tmp_path / "b.json")))
    with pytest.raises(ArgumentError, match="--plot.*also the output file of --json"):
        bench.main(args(json=str(tmp_path / "b.png"), plot=str(tmp_path / "b.png")))
    given = tmp_path / "given.json"
    given.write_text("{}")
    with pytest.raises(ArgumentError, match="--json.*input file of --profile"):
        bench.main(args(json=str(given), profile=str(given)))
    with pytest.raises(ArgumentError, match="saved beside --json.*input file of --eagle3-profile"):
        bench.main(args(json=str(tmp_path / "r.json"), eagle3_profile=str(tmp_path / "r.profile.json"),
                        configs=["vanilla", "dynamic", "eagle3-dynamic"]))
    with pytest.raises(ArgumentError, match="--target"):  # past the checks
        bench.main(args(json=str(tmp_path / "r.json"), plot=str(tmp_path / "r.png")))


def _unloadable_args(tmp_path, **kw):
    """`bench.main`'s flags with a --target that names no directory: getting past the flag
    checks fails on it, before any model loads."""
    import types
    base = dict(quick=True, target=str(tmp_path / "no_model"), configs=["vanilla", "static-1"], json=None,
                plot=None, profile=None, eagle3_profile=None, overwrite=False)
    return types.SimpleNamespace(**{**base, **kw})


def test_min_units_below_fresh_repeats_is_refused_before_loading(tmp_path):
    """Below FRESH_MIN_REPEATS repeats no repeat takes groups of its own, so --min-units would
    be ignored: an argument error naming both flags; --quick's own min_units (0) is not one."""
    from dsd_jax.loading import ArgumentError
    with pytest.raises(ArgumentError, match=r"--min-units: .*--repeats 3 or more; this run has 2 repeats "
                                            r"\(--quick's\)"):
        bench.main(_unloadable_args(tmp_path, min_units=6))
    with pytest.raises(ArgumentError, match=r"--min-units: .*this run has 2 repeats: give --repeats 3"):
        bench.main(_unloadable_args(tmp_path, quick=False, min_units=18, repeats=2))
    for ok in (dict(), dict(min_units=0), dict(min_units=6, repeats=3), dict(quick=False, repeats=2)):
        with pytest.raises(ArgumentError, match="--target"):
            bench.main(_unloadable_args(tmp_path, **ok))


def test_eagle3_max_batch_below_every_batch_size_is_refused_before_loading(tmp_path):
    from dsd_jax.loading import ArgumentError
    e3 = dict(configs=["vanilla", "eagle3-static-1"], batch_sizes=[4, 16])
    with pytest.raises(ArgumentError, match=r"--eagle3-max-batch: 2 is below every batch size of the run "
                                            r"\(4, 16, 64\)"):  # --quick's rollout: 64 requests
        bench.main(_unloadable_args(tmp_path, eagle3_max_batch=2, **e3))
    with pytest.raises(ArgumentError, match="--target"):
        bench.main(_unloadable_args(tmp_path, eagle3_max_batch=4, **e3))


def test_controllers_are_sized_per_data_shard_and_profiles_checked_against_the_mesh(tiny_pair):
    """On a DxM mesh (D > 1) the engine's buckets count one data shard's slots: the bench built
    its controllers for every slot and each configuration failed ("largest batch bucket 32 <
    max_batch_size 64"), after compiling everything. A profile measured on another mesh is
    reported as the engine reports it (the bench used it silently)."""
    import types
    import warnings

    from conftest import make_engine
    from dsd_jax.bench import profiles
    from dsd_jax.bench.runner import Runner
    from dsd_jax.profile import Profile, ProfileMismatchWarning
    runner = Runner.__new__(Runner)  # its engines' shapes are all `controller` reads
    shard = types.SimpleNamespace(max_batch_size=4, slots_per_shard=2, batch_buckets=(1, 2), max_k=2)
    prof = Profile("cpu", [1, 2], [0, 1, 2], [[1.0, 1.1, 1.2], [1.2, 1.3, 1.4]], [0.8, 0.6],
                   method="draft_model", meta={"engine": {"mesh": {"data": 2, "model": 1}}})
    runner.by_method, runner.profiles, runner.profile_paths, runner._dynamic = (
        {"draft_model": shard}, {"draft_model": prof}, {}, {})
    assert runner.controller("static-2").max_batch_size == 2
    assert runner.controller("dynamic").max_batch_size == 2
    engine = make_engine(*tiny_pair, num_speculative_tokens=2)  # one device: {"data": 1, "model": 1}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiles._check(engine, prof, None, lambda line: None)
    assert any(issubclass(w.category, ProfileMismatchWarning) and "measured on mesh" in str(w.message)
               for w in caught)


@pytest.mark.parametrize("configs,repeats,groups", [(7, 6, 1), (7, 6, 8), (3, 2, 2), (4, 3, 1)])
def test_fresh_groups_run_once_each_and_every_configuration_leads_equally(configs, repeats, groups):
    """A point whose repeats take groups of their own (`Point.units_per_repeat`) runs each
    unit once per configuration, in its repeat, configurations leading equally often (to
    within one); its pairs are units of their own for the intervals."""
    from collections import Counter

    from dsd_jax.bench import pairs
    from dsd_jax.bench.runner import run_interleaved
    from dsd_jax.bench.workloads import Point

    names = [f"c{i}" for i in range(configs)]
    point = Point("sweep", 8, [[[u]] for u in range(repeats * groups)], names, units_per_repeat=groups)
    runs: list[tuple[int, int, str]] = []
    rep_of = {}

    def run(config, p, u):
        runs.append((len(rep_of.setdefault(u, [])), u, config))
        rep_of[u].append(config)
        return 1.0 + u, [[u]], None

    run_interleaved([point], run, repeats=repeats)
    assert sorted(rep_of) == list(range(repeats * groups))
    assert all(sorted(ran) == names for ran in rep_of.values())  # once each, every configuration
    assert [u for _, u, _ in runs[::configs]] == list(range(repeats * groups))  # repeat r: its own units
    leads = Counter(ran[0] for ran in rep_of.values())
    counts = [leads.get(c, 0) for c in names]
    assert max(counts) - min(counts) <= 1, counts
    cell = point.cells["c0"]
    assert len(cell.walls) == repeats and cell.outputs[1] == [[u] for u in point.units_of(1)]
    row = {"tokens_per_s_pairs": cell.pairs, "pair_units": point.pair_units(repeats), "repeats": repeats}
    assert pairs.pair_groups(row) == list(range(repeats * groups))
    old = {"tokens_per_s_pairs": [1.0] * 4, "repeats": 2}  # rows written before pair_units
    assert pairs.pair_groups(old) == [0, 1, 0, 1]


def test_prompt_groups_never_repeat_a_prompt_and_the_cli_fetches_enough():
    """The intervals resample prompt groups as independent draws: `--rows-per-point` past the
    prompts given is refused rather than cycled into repeated groups (a point of one group
    may cycle: it has no interval), and the CLI fetches the prompts it takes, the profile's
    apart."""
    from dsd_jax.bench.commands import _prompts_needed
    from dsd_jax.bench.workloads import check_distinct_groups
    check_distinct_groups([1, 4, 64], 16, 16)  # 16 groups of 1, 4 of 4, one of 64 (cycled)
    with pytest.raises(ValueError, match=r"rows_per_point 16 at batch size 1 takes 16 prompt groups of 1, "
                                         r"16 distinct prompts, but 12 were given"):
        check_distinct_groups([1], 16, 12)
    assert _prompts_needed(False, [1, 2], 96, 1, 1) == 96 + 16 and _prompts_needed(False, [1, 2], None, 1, 1) == 64 + 16
    assert _prompts_needed(False, [1, 16, 48], 70, 1, 1) == 2 * 48 + 16  # groups of 48 take 96, not 70
    assert _prompts_needed(False, [1, 2]) == 6 * 64 + 16  # FULL's six rollouts of 64, each its own prompts
    # FULL's 6 repeats, each with groups of its own where the 615 held-out prompts hold them
    assert _prompts_needed(False, [1, 64]) == 6 * 64 + 16
    assert _prompts_needed(False, [1, 2], 96, 1) == 6 * 96 + 16
    assert _prompts_needed(False, [128]) == 6 * 64 + 16  # 6 x 128 would not fit: one group, repeated
    assert _prompts_needed(True, [1, 4, 16, 64]) == 64 + 8  # QUICK's 2 repeats: one set (FRESH_MIN_REPEATS)
    from dsd_jax.bench.settings import resolve
    from dsd_jax.bench.workloads import profile_prompts, sweep
    s = resolve(False, dict(batch_sizes=[1, 3], rows_per_point=100, workloads=("sweep",)))
    ids = [[i] for i in range(_prompts_needed(False, [1, 3], 100))]  # 34 groups of 3 take 102
    swept = {p[0] for point in sweep(s, ids) for group in point.units for p in group}
    assert swept == set(range(102)) and not swept & {p[0] for p in profile_prompts(s, ids, 16)}
    s = resolve(False, dict(batch_sizes=[1, 8], rows_per_point=8, min_units=0, workloads=("sweep",)))
    ids = [[i] for i in range(_prompts_needed(False, [1, 8], min_units=0))]
    points = sweep(s, ids)
    assert [(len(p.units), p.units_per_repeat) for p in points] == [(48, 8), (6, 1)]
    for p in points:  # every repeat's groups distinct from every other's, and from the profile's
        swept = [q[0] for group in p.units for q in group]
        assert len(set(swept)) == len(swept) == 48


def test_a_sweep_point_gets_at_least_min_units_where_the_prompts_hold_them():
    """FULL's 18 units: B = 4-32 take 3 groups a repeat of their own (B = 8-32 had one, 6
    units); B = 64's 3 x 64 x 6 would not fit in the held-out prompts, so it keeps one."""
    from dsd_jax.bench.commands import _prompts_needed
    from dsd_jax.bench.settings import resolve
    from dsd_jax.bench.workloads import group_count, profile_prompts, sweep
    sizes = [1, 2, 4, 8, 16, 32, 64]
    n = _prompts_needed(False, sizes)
    assert n == 3 * 32 * 6 + 16  # B = 32's 18 groups of 32 need the most
    s = resolve(False, dict(batch_sizes=sizes, workloads=("sweep",)))
    assert s.min_units == 18
    ids = [[i] for i in range(n)]
    points = sweep(s, ids)
    assert [(len(p.units), p.units_per_repeat) for p in points] == [
        (48, 8), (24, 4), (18, 3), (18, 3), (18, 3), (18, 3), (6, 1)]
    profiled = {q[0] for q in profile_prompts(s, ids, 16)}
    for p in points:  # distinct prompts, none of them the profile's
        swept = [q[0] for group in p.units for q in group]
        assert len(set(swept)) == len(swept) and not set(swept) & profiled
    # as many more groups as the room holds; none where repeats share their groups
    assert group_count(8, 8, 6, 10 * 8 * 6, 60) == 10
    assert group_count(8, 8, 6, 2 * 8 * 6, 60) == 2
    assert group_count(8, 8, 2, 10_000, 60) == 1  # 2 repeats share their groups (FRESH_MIN_REPEATS)
    assert group_count(8, 8, 6, None, 60) == group_count(8, 8) == 1
    with pytest.raises(ValueError, match="min_units must be >= 0"):
        resolve(False, dict(min_units=-1, workloads=("sweep",)))
        assert not set(swept) & {q[0] for q in profile_prompts(s, ids, 16)}
