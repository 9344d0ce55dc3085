"""The side-by-side comparison on the built-in pair: the floor of plain decoding in XLA,
the engine (vanilla, static K, dynamic K) and transformers' assisted generation, with
paired confidence intervals and the goodput model's prediction.

    python benchmarks/side_by_side.py --out DIR [--batch-sizes 1,2,4,8] [--max-seq-lens 256,4096]
        [--max-tokens 128] [--repeats N] [--max-k 4] [--hf-batch-sizes 1] [--torch-threads N] [--quick]
        [--overwrite]

(``--quick``: B = 1, 2 at max_seq_len 256, 12 tokens, K <= 2, 2 repeats; about 2 minutes
on 2 CPU cores, mostly compiling.) Output: DIR/results.json, DIR/results.png (an existing
one is refused before the run unless --overwrite) and the table on stdout; exit status 1
when an engine configuration was not lossless.

The workload, its method and its report are `dsd_jax.bench.side_by_side`; this script
only reads the flags. It stays a script rather than a `dsd-jax bench` workload because
it needs transformers and torch, which the package does not depend on.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

from dsd_jax.bench import side_by_side
from dsd_jax.loading import ArgumentError, check_outputs


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory (results.json, results.png)")
    ap.add_argument("--batch-sizes", help="comma-separated batch sizes (default 1,2,4,8)")
    ap.add_argument("--max-seq-lens", help="comma-separated engine max_seq_len values (default 256,4096)")
    ap.add_argument("--max-tokens", type=int, help="tokens generated per request (default 128)")
    ap.add_argument("--repeats", type=int, help="timed repeats (default 5)")
    ap.add_argument("--max-k", type=int, help="static-K for K = 1..max_k, dynamic up to max_k (default 4)")
    ap.add_argument("--prompt-len", type=int, help="prompt tokens kept per held-out prompt (default 64)")
    ap.add_argument("--rows-per-point", type=int,
                    help="prompts per (B, max_seq_len) and repeat, run in groups of B (default 4)")
    ap.add_argument("--hf-batch-sizes", help="batch sizes at which hf-assisted runs (default 1; "
                    "'none' skips it); B > 1 runs its prompts one after another")
    ap.add_argument("--torch-threads", type=int, help="torch CPU threads for hf-assisted (default: torch's)")
    ap.add_argument("--compilation-cache-dir", help="persistent XLA compilation cache")
    ap.add_argument("--quick", action="store_true", help="tiny settings: a smoke test of the pipeline")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace an existing DIR/results.json or DIR/results.png (default: refuse, before the run)")
    return ap.parse_args(argv)


def settings_from(args) -> dict:
    numbers = ("max_tokens", "repeats", "max_k", "prompt_len", "rows_per_point", "torch_threads")
    lists = ("batch_sizes", "max_seq_lens", "hf_batch_sizes")  # an empty list keeps the default
    overrides = {**{k: getattr(args, k) for k in numbers}, **{k: getattr(args, k) or None for k in lists}}
    try:
        return side_by_side.make_settings(args.quick, **overrides)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def main(argv=None, log: Callable = print) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"--out {out} is an existing file, not a directory")
    settings = settings_from(args)
    try:  # before the run (an hour at the defaults): an earlier run's results are not lost
        check_outputs([("--out", str(out / name)) for name in ("results.json", "results.png")],
                      overwrite=args.overwrite)
    except ArgumentError as e:
        raise SystemExit(str(e)) from None
    doc = side_by_side.run_builtin(settings, out, compilation_cache_dir=args.compilation_cache_dir,
                                   log=log)
    log(side_by_side.format_table(doc))
    log(f"wrote {out / 'results.json'} and {out / 'results.png'}")
    return doc


if __name__ == "__main__":
    sys.exit(0 if main()["summary"]["lossless"] else 1)
