"""`dsd-jax bench` and `dsd-jax demo`: their flags, checked here, and the run, in
`dsd_jax.bench` (loaded only when one of them runs)."""

from __future__ import annotations

from dsd_jax import loading
from dsd_jax.cli.flags import add_model_flags, add_overwrite_flag, error, int_list, mesh_shape, str_list
from dsd_jax.models.argtypes import nonneg_int, positive_int


def _lazy_bench(cmd: str):
    try:
        from dsd_jax import bench
    except ModuleNotFoundError as e:
        if e.name in ("dsd_jax.bench",):
            error(cmd, None, "dsd_jax.bench is not part of this installation")
        raise
    return bench


def cmd_bench(args) -> int:
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        if path is not None:  # "" too: it would write nothing
            loading.output_file(flag, path)
    for flag, path in (("--profile", args.profile), ("--eagle3-profile", args.eagle3_profile)):
        if path:
            loading.existing_file(flag, path)
    if args.eagle3 and args.eagle3 != "builtin":
        loading.existing_dir("--eagle3", args.eagle3)
    if args.compilation_cache_dir:
        loading.output_dir("--compilation-cache-dir", args.compilation_cache_dir)
    return _lazy_bench("bench").main(args) or 0


def cmd_demo(args) -> int:
    loading.output_dir("--out-dir", args.out_dir)
    args.full = not args.quick
    return _lazy_bench("demo").demo(args) or 0


def add_bench_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmark vanilla / static-K / dynamic decoding",
                       description="Benchmark configurations over batch sizes: the draft model's "
                                   "(static-K, dynamic) and the EAGLE-3 head's (eagle3-static-K, "
                                   "eagle3-dynamic), in one process.")
    add_model_flags(b)
    b.add_argument("--method", choices=("draft_model", "eagle3", "both"),
                   help="whose default configurations to run (not with --configs, which names "
                        "them): the draft model's (default), the EAGLE-3 head's (eagle3-...) or both")
    b.add_argument("--eagle3", metavar="DIR", help="EAGLE-3 head directory for the eagle3-... "
                   "configurations (default: the built-in head, with the built-in models)")
    b.add_argument("--eagle3-profile", metavar="FILE",
                   help="profile JSON of the EAGLE-3 engine for eagle3-dynamic (default: profile now)")
    b.add_argument("--quick", action="store_true", help="a small, fast run")
    b.add_argument("--json", metavar="FILE", help="write results as JSON")
    b.add_argument("--plot", metavar="FILE.png", help="write a plot")
    b.add_argument("--profile", metavar="FILE", help="profile JSON for the (draft-model) dynamic configuration")
    b.add_argument("--batch-sizes", type=int_list, metavar="1,2,4,...", help="batch sizes")
    b.add_argument("--configs", type=str_list, metavar="vanilla,static-1,...,dynamic,eagle3-static-2,...",
                   help="configurations to run (eagle3-...: the EAGLE-3 head)")
    b.add_argument("--eagle3-max-batch", type=positive_int, metavar="N",
                   help="run the eagle3 configurations only at batch sizes <= N")
    b.add_argument("--repeats", type=positive_int, help="repeats per point")
    b.add_argument("--rows-per-point", type=positive_int, metavar="N",
                   help="prompts per batch-size point, run as ceil(N/B) groups of B (default 8; --quick 4); "
                        "at 3 repeats or more each repeat takes groups of its own where the 615 held-out "
                        "prompts hold them (to B=64 at 6 repeats). The intervals resample the groups, so a "
                        "point of one group repeated has none; resolving 5%% at B=1 needs about 16 groups, "
                        "by the spread of the committed benches"),
    b.add_argument("--min-units", type=nonneg_int, metavar="N",
                   help="pair units a sweep point gets at least, adding prompt groups to each repeat "
                        "where the held-out prompts hold them (default 18: B=4-32 at 6 repeats; --quick 0); "
                        "needs --repeats 3 or more, where each repeat takes groups of its own")
    b.add_argument("--rollout-units", type=positive_int, metavar="N",
                   help="rollouts of 64 requests, each with its own prompts and lengths (default 6; --quick 1): "
                        "the rollout's interval resamples them, so 1 gives none")
    b.add_argument("--max-tokens", type=positive_int, help="tokens per request of the batch-size sweep (the "
                   "rollout draws its own heavy-tailed lengths)")
    b.add_argument("--compilation-cache-dir", metavar="DIR",
                   help="persistent XLA compilation cache (makes the next run start fast)")
    b.add_argument("--mesh", type=mesh_shape, metavar="DATAxMODEL",
                   help="run every engine on a device mesh, e.g. 2x2 (default: one device)")
    add_overwrite_flag(b, "--json, --plot or the profile measured now (saved beside --json as "
                       "NAME.profile.json)")
    b.set_defaults(func=cmd_bench)


def add_demo_parser(sub) -> None:
    d = sub.add_parser("demo", help="profile + benchmark the built-in pair and EAGLE-3 head and write a report",
                       description="Run the end-to-end demo: the built-in draft model and EAGLE-3 head "
                                   "side by side against plain decoding.")
    d.add_argument("--out-dir", default="./dsd_jax_demo", metavar="DIR", help="default ./dsd_jax_demo")
    add_overwrite_flag(d, "--out-dir (bench.json, bench.png, eagle3_profile.json, profile.json)")
    mode = d.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="quick", action="store_true", default=True,
                      help="small, fast run (default)")
    mode.add_argument("--full", dest="quick", action="store_false", help="the full run")
    d.set_defaults(func=cmd_demo)
