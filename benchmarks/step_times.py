"""Step time per (batch bucket, K) from the library's profiler, and the goodput of each K.

    python benchmarks/step_times.py --max-seq-len 2048 --out step_times.json
    python benchmarks/step_times.py --random-models [--identical-draft] --batch-buckets 1,32 \\
        --max-seq-len 192 --context 128 --repeats 15

Runs `dsd_jax.profiler.profile_engine` (interleaved Ks, medians) on an engine with
`max_seq_len` slots and prints `format_profile`'s table. With --out it also writes the
ITL table, the measured acceptance and, per batch bucket, the goodput AL(K) / ITL(B, K)
relative to K = 0 (AL(K) = 1 + a_1 + ... + a_K, the controller's model) with the K that
maximises it: where that K is 0, speculation stops paying. Run it on two checkouts to
compare step times before and after a change at the same settings.

Models: the built-in pair, or with --random-models a random 4-layer d=128 target and a
1-layer draft; --identical-draft drafts with the target itself, so every draft is
accepted and tokens per step is K + 1, the upper bound.
"""

from __future__ import annotations

import argparse
import json

import jax
import numpy as np

from dsd_jax import SpecConfig, SpecEngine, models
from dsd_jax.acceptance import al_curve
from dsd_jax.profiler import format_profile, profile_engine


def random_pair(identical_draft: bool):
    cfg = models.ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=4,
                             num_heads=4, num_kv_heads=2, head_dim=32)
    target = models.init_model(cfg, 0)
    draft = target if identical_draft else models.init_model(
        cfg.replace(num_layers=1, hidden_size=64, intermediate_size=192, num_heads=2, num_kv_heads=1), 1)
    return target, draft


def goodput_vs_k0(prof, buckets, max_k: int) -> dict:
    """Per bucket: AL(K) / ITL(B, K) over K = 0's, and the best K."""
    al = al_curve(np.asarray(prof.acceptance, float), max_k)
    out = {}
    for b in buckets:
        g = al / np.array([prof.itl_ms(b, k) for k in range(max_k + 1)])
        out[f"B={b}"] = {**{f"K={k}": round(float(g[k] / g[0]), 3) for k in range(max_k + 1)},
                         "best_k": int(np.argmax(g))}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--batch-buckets", default="1,8,64")
    ap.add_argument("--max-k", type=int, default=4)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--acceptance-max-tokens", type=int, default=8)
    ap.add_argument("--random-models", action="store_true", help="a random pair instead of the built-in one")
    ap.add_argument("--identical-draft", action="store_true", help="with --random-models: draft = target")
    ap.add_argument("--out", help="write the table as JSON")
    args = ap.parse_args()
    buckets = tuple(int(b) for b in args.batch_buckets.split(","))
    target, draft = random_pair(args.identical_draft) if args.random_models else models.builtin()[:2]
    engine = SpecEngine(target, draft, SpecConfig(num_speculative_tokens=args.max_k),
                        max_batch_size=buckets[-1], max_seq_len=args.max_seq_len, batch_buckets=buckets)
    prof = profile_engine(engine, context_lengths=(args.context,), repeats=args.repeats,
                          warmup_reps=1, acceptance_max_tokens=args.acceptance_max_tokens)
    print(format_profile(prof))
    if args.out:
        table = {f"B={b}": {f"K={k}": round(prof.itl_ms(b, k), 2) for k in range(args.max_k + 1)} for b in buckets}
        result = dict(max_seq_len=args.max_seq_len, context=args.context, jax=jax.__version__, itl_ms=table,
                      acceptance=[round(a, 3) for a in prof.acceptance],
                      goodput_vs_k0=goodput_vs_k0(prof, buckets, args.max_k))
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
