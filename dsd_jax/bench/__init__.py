"""`dsd-jax bench` and `dsd-jax demo`: vanilla vs static-K vs dynamic speculative decoding.

One process. Every configuration runs on the same prompts, greedy (temperature 0),
with the same output lengths, so all of them do the same useful work and their
outputs must be token-identical to vanilla's (checked: ``"lossless"`` on every row;
a fast wrong answer is worthless). Each request that differs is listed in its row's
``"divergences"`` with the target's top-2 logit gap where it parts: a near-tie that the
programs' float rounding can swap, or a wrong token (`run.diagnose`).

Configurations (`settings`): ``vanilla`` (target only), ``static-K`` (the library's
static controller), ``dynamic`` (the goodput controller with a profile, `profiles`)
and, not run by default, ``dynamic-throughput`` (the same with
``DynamicConfig(objective="throughput")``, vLLM's batch-mean goodput, beside the
default makespan objective). The summaries compare ``dynamic`` with the best of
vanilla and the static Ks only.

Method: every engine is warmed up (`engine.warmup()` compiles every program), then
each configuration does one untimed run whose live batch shrinks through every
bucket. Timed runs are interleaved (`runner`): each repeat, each point of the
workloads (`workloads`: the sweep over batch sizes and the rollout) and each of its
prompt groups, the configurations run back to back in an order rotated by one from the
same group's previous repeat, every configuration running first equally often over a
point's groups and repeats (to within one, `runner.turns`). Reported numbers are
medians over repeats; each pair unit (prompt group, repeat) gives paired ratios, whose
95% intervals resample prompt groups with their repeats (`pairs`, `dsd_jax.stats`: a
t interval for 2-4 groups, none for one); a difference is called real only when its
interval excludes 1 (``summarize()["differences"]``), and the table marks each point
that cannot resolve 5%. tokens/s =
generated tokens / wall time of `generate` (prefill included);
``decode_tokens_per_s`` leaves out the prefill and the first step; the rollout's
makespan is the wall time of its single `generate`. ``controller_ms_per_step``: host
time in the K controller a round (`EngineStats.controller_s`).

Modules: `settings` (modes, names), `workloads`, `runner` (engines, interleaving,
per-point rows), `pairs` (paired statistics), `profiles`, `run` (`run_bench`),
`report` (summary, table, JSON, plot), `environment`, `commands` (the CLI's bench and
demo), and `side_by_side` (the floor of plain decoding, the engine and transformers'
assisted generation side by side; `benchmarks/side_by_side.py` runs it).
"""

from dsd_jax.bench.commands import demo, main
from dsd_jax.bench.environment import environment
from dsd_jax.bench.pairs import add_intervals
from dsd_jax.bench.profiles import profile_fit_problems
from dsd_jax.bench.report import format_table, summarize, write_json, write_plot
from dsd_jax.bench.run import run_bench
from dsd_jax.bench.settings import DYNAMIC_OBJECTIVES, FULL, QUICK, parse_config
from dsd_jax.bench.workloads import rollout_lengths

__all__ = ["run_bench", "main", "demo", "summarize", "format_table", "write_json", "write_plot",
           "parse_config", "environment", "rollout_lengths", "profile_fit_problems", "add_intervals",
           "QUICK", "FULL", "DYNAMIC_OBJECTIVES"]
