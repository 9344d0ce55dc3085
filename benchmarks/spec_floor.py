"""The floor of greedy speculative decoding on the built-in pair: a minimal jitted loop
doing the engine's work per round (the draft re-reads a two-token window and proposes K
tokens one by one; the target verifies the pending token and the K drafts in one forward;
the longest agreeing prefix and the target's next token are kept) as ONE XLA program with
no host in the loop, against the engine at static K, B=1, paired and interleaved. Both
must give plain greedy decoding's tokens.

    python benchmarks/spec_floor.py [--k 4] [--repeats 6] [--prompts 6] [--max-tokens 128]

Prints medians and the engine's speed over the floor's with a 95% interval over the
prompts (`dsd_jax.stats.paired_ratio`, a prompt's repeats one unit: they are correlated).
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models
from dsd_jax.bench.runner import rotated
from dsd_jax.bench.side_by_side import builtin_prompts
from dsd_jax.stats import paired_ratio

WINDOW = 2  # tokens the draft re-reads a round, as `dsd_jax.drafters.draft_model`


def make_spec_floor(target, draft, K: int, pad_to: int, max_tokens: int):
    """``run(prompt) -> tokens``: greedy speculative decoding of one prompt as one program."""
    tg, tp = nnx.split(target)
    dg, dp = nnx.split(draft)
    cap = pad_to + max_tokens + K + 1

    @jax.jit
    def decode(tp, dp, tokens, length):
        P = tokens.shape[0]
        seq = jnp.zeros((cap,), jnp.int32).at[:P].set(tokens)
        cols = jnp.arange(P, dtype=jnp.int32)
        pos = jnp.where(cols < length - 1, cols, -1)[None]  # all but the pending last token
        _, tkv = models.forward(tg, tp, tokens[None], pos, models.init_kv_cache(target.config, 1, cap))
        _, dkv = models.forward(dg, dp, tokens[None], pos, models.init_kv_cache(draft.config, 1, cap))

        def round_(carry):
            seq, n, tkv, dkv = carry  # n: committed tokens; seq[n - 1] is pending
            wpos = n - WINDOW + jnp.arange(WINDOW)
            logits, dkv = models.forward(dg, dp, seq[jnp.maximum(wpos, 0)][None],
                                         jnp.where(wpos >= 0, wpos, -1)[None], dkv)
            d = jnp.argmax(logits[0, -1]).astype(jnp.int32)

            def propose(c, i):
                dkv, prev = c
                logits, dkv = models.forward(dg, dp, prev[None, None], (n - 1 + i)[None, None], dkv)
                nxt = jnp.argmax(logits[0, 0]).astype(jnp.int32)
                return (dkv, nxt), nxt

            (dkv, _), rest = jax.lax.scan(propose, (dkv, d), jnp.arange(1, K))
            drafts = jnp.concatenate([d[None], rest])
            vtoks = jnp.concatenate([seq[n - 1][None], drafts])
            vpos = n - 1 + jnp.arange(K + 1)
            logits, tkv = models.forward(tg, tp, vtoks[None], vpos[None], tkv)
            t = jnp.argmax(logits[0], axis=-1).astype(jnp.int32)  # the target's token after each
            accepted = jnp.cumprod(drafts == t[:K]).sum()
            new = jnp.where(jnp.arange(K + 1) < accepted, jnp.concatenate([drafts, t[-1:]]), t[accepted])
            seq = jax.lax.dynamic_update_slice(seq, new, (n,))  # entries past n + accepted are overwritten later
            return seq, n + accepted + 1, tkv, dkv

        def more(carry):
            return carry[1] < length + max_tokens

        seq, _, _, _ = jax.lax.while_loop(more, round_, (seq, length, tkv, dkv))
        return seq

    def run(prompt: list[int]) -> list[int]:
        tokens = np.zeros((pad_to,), np.int32)
        tokens[:len(prompt)] = prompt
        seq = np.asarray(jax.block_until_ready(decode(tp, dp, tokens, np.int32(len(prompt)))))
        return seq[len(prompt):len(prompt) + max_tokens].tolist()

    return run


def interleave(fns: dict, inputs: list, reps: int) -> dict:
    """{name: [seconds per (repeat, input)]}, one untimed pass first; each input's order
    moves by one each repeat and consecutive (input, repeat) turns rotate on, so every
    configuration runs first equally often to within one; every output must agree."""
    for x in inputs:
        for f in fns.values():
            f(x)
    names, t = list(fns), {k: [] for k in fns}
    for rep in range(reps):
        for i, x in enumerate(inputs):
            outs = []
            for k in rotated(names, i * reps + rep):
                t0 = time.perf_counter()
                outs.append(fns[k](x))
                t[k].append(time.perf_counter() - t0)
            assert all(o == outs[0] for o in outs), "configurations disagree on an output"
    return t


def speed_ratio(base, other, prompts: int) -> tuple[float, list[float]]:
    """other's speed over base's, its 95% interval over prompts (a prompt's repeats are one
    unit: they are correlated), `dsd_jax.stats.paired_ratio`."""
    r = paired_ratio(base, other, clusters=[i % prompts for i in range(len(base))])
    return round(r["ratio"], 4), [round(r["lo"], 4), round(r["hi"], 4)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    target, draft, tok = models.builtin()
    prompts = [p[:64] for p in builtin_prompts(args.prompts, 0, tok)[0]]
    floor = make_spec_floor(target, draft, args.k, 64, args.max_tokens)
    engine = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=args.k),
                        max_batch_size=1, max_seq_len=256, tokenizer=tok, batch_buckets=[1])
    engine.warmup()
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)  # fixed lengths
    plain = SpecEngine(target, None, SpecConfig(method="none"), max_batch_size=1, max_seq_len=256,
                       tokenizer=tok, batch_buckets=[1])
    plain.warmup()
    t = interleave({"floor": floor, "engine": lambda p: engine.generate([p], sp)[0].token_ids,
                    "plain": lambda p: plain.generate([p], sp)[0].token_ids}, prompts, args.repeats)
    med = {k: round(statistics.median(v) * 1e3, 1) for k, v in t.items()}
    print(f"B=1, K={args.k}, {args.max_tokens} tokens, {len(prompts)} prompts x {args.repeats} repeats; "
          f"median ms per call {med}; jax {jax.__version__}, {jax.devices()[0].device_kind}")
    print("engine (static K) speed / spec floor", speed_ratio(t["floor"], t["engine"], len(prompts)))
    print("spec floor speed / engine plain decoding", speed_ratio(t["plain"], t["floor"], len(prompts)))
    print("engine (static K) speed / engine plain decoding", speed_ratio(t["plain"], t["engine"], len(prompts)))


if __name__ == "__main__":
    main()
