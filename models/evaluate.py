"""Evaluates a target/draft pair (default: the built-in one) on held-out stdlib modules.

    python -m dsd_jax.models.evaluate [--models DIR] [--out FILE]

Reports
- held-out loss of both models in bits per byte (the UTF-8 bytes of the predicted tokens);
- draft-vs-target acceptance at K drafts per round, measured directly with teacher
  forcing (no engine): the target continues each held-out prompt (greedily for
  temperature 0, by sampling for temperature 1), then both models score the whole
  sequence once. From every start position s of the continuation, draft position i
  of a round is accepted when positions s+1..s+i all are:
    temperature 0: the draft's argmax equals the target's token (= the target's argmax);
    temperature 1: with probability beta = sum_x min(p(x), q(x)) (the acceptance
      probability of a token sampled from q under rejection sampling), so
      P(first i accepted) is the mean over starts of the product of the betas.
  `accept_at[i-1]` = P(first i accepted), `accept_cond[i-1]` = P(i accepted | i-1
  accepted), and the mean accepted length AL(K) = 1 + sum_{i<=K} P(first i accepted).
- FLOP/token of both models and the measured decode-step time ratio.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from . import corpus
from .builtin import BUILTIN_DIR, builtin
from .train import flops_per_token, model_logits
from .transformer import forward, init_kv_cache, num_params


def token_byte_lengths(tok) -> np.ndarray:
    """UTF-8 byte length of every token id of a byte-level BPE tokenizer (0 for specials)."""
    from tokenizers import pre_tokenizers
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    specials = {t.content for t in tok.get_added_tokens_decoder().values()}
    lens = np.zeros(tok.get_vocab_size(), np.int64)
    for i in range(tok.get_vocab_size()):
        piece = tok.id_to_token(i)
        if piece is None or piece in specials:
            continue
        assert all(c in alphabet for c in piece), piece
        lens[i] = len(piece)  # one alphabet character per byte
    return lens


def heldout_bits_per_byte(models: dict, tok, seq_len: int = 256, batch: int = 8,
                          max_tokens: int | None = None) -> dict:
    texts = corpus.read_texts(corpus.heldout_files())
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(0)
    stream = np.asarray(ids, np.int32)
    n_win = (len(stream) - 1) // seq_len
    if max_tokens:
        n_win = min(n_win, max(1, max_tokens // seq_len))
    windows = np.stack([stream[i * seq_len:i * seq_len + seq_len + 1] for i in range(n_win)])
    byte_len = token_byte_lengths(tok)
    total_bytes = int(byte_len[windows[:, 1:]].sum())
    out = {"heldout_files": len(texts), "tokens": int(n_win * seq_len), "bytes": total_bytes}
    for name, model in models.items():
        graph, params = nnx.split(model)

        @jax.jit
        def nll(params, w):
            logits = model_logits(nnx.merge(graph, params), w[:, :-1])
            logp = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.sum(jnp.take_along_axis(logp, w[:, 1:, None], axis=-1), axis=(1, 2))

        tot = 0.0
        for i in range(0, n_win, batch):
            w = windows[i:i + batch]
            n = len(w)
            if n < batch:  # pad to the compiled batch; padded rows are not counted
                w = np.concatenate([w, np.repeat(w[-1:], batch - n, axis=0)])
            tot += float(np.asarray(nll(params, jnp.asarray(w)))[:n].sum())
        out[name] = {"nats_per_token": tot / (n_win * seq_len),
                     "bits_per_byte": tot / math.log(2) / total_bytes}
    return out


def _left_pad(seqs: list[list[int]]):
    P = max(len(s) for s in seqs)
    tokens = np.zeros((len(seqs), P), np.int32)
    positions = np.full((len(seqs), P), -1, np.int32)
    for i, s in enumerate(seqs):
        tokens[i, P - len(s):] = s
        positions[i, P - len(s):] = np.arange(len(s))
    return tokens, positions


def generate(model, prompts: list[list[int]], num_tokens: int, temperature: float, seed: int = 0):
    """Target continuations of left-padded prompts with the model's KV-cache forward."""
    graph, params = nnx.split(model)
    tokens, positions = _left_pad(prompts)
    B, P = tokens.shape
    lens = np.array([len(p) for p in prompts], np.int32)
    kv = init_kv_cache(model.config, B, P + num_tokens)
    fwd = jax.jit(lambda p, t, pos, kv: forward(graph, p, t, pos, kv, attn_backend="xla"))

    def pick(logits, key):
        if temperature == 0:
            return jnp.argmax(logits, axis=-1)
        return jax.random.categorical(key, logits / temperature, axis=-1)

    key = jax.random.key(seed)
    logits, kv = fwd(params, jnp.asarray(tokens), jnp.asarray(positions), kv)
    out = []
    for t in range(num_tokens):
        key, sub = jax.random.split(key)
        nxt = pick(logits[:, -1], sub).astype(jnp.int32)
        out.append(np.asarray(nxt))
        if t + 1 < num_tokens:
            logits, kv = fwd(params, nxt[:, None], jnp.asarray(lens + t)[:, None], kv)
    return np.stack(out, axis=1)  # [B, num_tokens]


def score(model, seqs: list[list[int]], G: int):
    """Logits predicting the G continuation tokens of each (prompt + continuation)."""
    graph, params = nnx.split(model)
    tokens, positions = _left_pad(seqs)
    B, S = tokens.shape
    kv = init_kv_cache(model.config, B, S)
    logits, _ = jax.jit(lambda p, t, pos, kv: forward(graph, p, t, pos, kv, attn_backend="xla"))(
        params, jnp.asarray(tokens), jnp.asarray(positions), kv)
    # continuation token j (0-based) sits at column S-G+j; it is predicted at column S-G+j-1
    return np.asarray(logits[:, S - G - 1:S - 1], np.float32)


def acceptance(target, draft, prompts: list[list[int]], G: int, K: int, temperature: float,
               seed: int = 0, batch: int = 16) -> dict:
    firsts = []  # per (prompt, start): [K] P(first i accepted)
    for b0 in range(0, len(prompts), batch):
        pr = prompts[b0:b0 + batch]
        cont = generate(target, pr, G, temperature, seed + b0)
        seqs = [list(p) + list(c) for p, c in zip(pr, cont)]
        lq = score(draft, seqs, G)
        if temperature == 0:
            ok = (np.argmax(lq, -1) == cont).astype(np.float64)  # [B, G]; cont = target argmax
        else:
            lp = score(target, seqs, G)
            p = jax.nn.softmax(jnp.asarray(lp) / temperature, -1)
            q = jax.nn.softmax(jnp.asarray(lq) / temperature, -1)
            ok = np.asarray(jnp.sum(jnp.minimum(p, q), -1), np.float64)
        for s in range(G - K + 1):
            firsts.append(np.cumprod(ok[:, s:s + K], axis=1))
    f = np.concatenate(firsts, axis=0).mean(axis=0)
    cond = [float(f[0])] + [float(f[i] / f[i - 1]) if f[i - 1] > 0 else 0.0 for i in range(1, K)]
    return {"accept_at": [float(x) for x in f], "accept_cond": cond,
            "first_position": float(f[0]), "mean_accepted_length": float(1 + f.sum()),
            "rounds": int(sum(len(x) for x in firsts))}


def decode_time(model, batch: int = 1, context: int = 128, reps: int = 50) -> tuple[float, float]:
    """(median, min) seconds of one jitted decode step; the min is the robust figure on a
    shared CPU."""
    graph, params = nnx.split(model)
    kv = init_kv_cache(model.config, batch, 512)
    f = jax.jit(lambda p, t, pos, kv: forward(graph, p, t, pos, kv, attn_backend="xla"))
    t = jnp.zeros((batch, 1), jnp.int32)
    pos = jnp.full((batch, 1), context, jnp.int32)
    jax.block_until_ready(f(params, t, pos, kv))
    times = []
    for _ in range(reps):
        s = time.perf_counter()
        jax.block_until_ready(f(params, t, pos, kv))
        times.append(time.perf_counter() - s)
    return float(np.median(times)), float(np.min(times))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=str(BUILTIN_DIR), help="dir with target/, draft/, tokenizer.json")
    ap.add_argument("--out", default=None, help="JSON output (default: MODELS/EVAL.json)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-lines", type=int, default=8)
    ap.add_argument("--continuation", type=int, default=32)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-bpb-tokens", type=int, default=None)
    args = ap.parse_args(argv)

    target, draft, tok = builtin("float32", path=args.models)
    res = {"models": Path(args.models).name, "dtype": "float32",  # no machine paths in the record
           "target": {"config": target.config.to_dict(), "params": int(num_params(target))},
           "draft": {"config": draft.config.to_dict(), "params": int(num_params(draft))}}
    for name, cfg in (("target", target.config), ("draft", draft.config)):
        res[name]["flops_per_token_ctx0"] = flops_per_token(cfg, 0)
        res[name]["flops_per_token_ctx256"] = flops_per_token(cfg, 256)
    res["flops_ratio_ctx0"] = res["draft"]["flops_per_token_ctx0"] / res["target"]["flops_per_token_ctx0"]
    res["flops_ratio_ctx256"] = res["draft"]["flops_per_token_ctx256"] / res["target"]["flops_per_token_ctx256"]
    (t_med, t_min), (d_med, d_min) = decode_time(target), decode_time(draft)
    res["decode_step_seconds"] = {
        "target_median": t_med, "draft_median": d_med, "ratio_median": d_med / t_med,
        "target_min": t_min, "draft_min": d_min, "ratio_min": d_min / t_min,
        "note": "batch 1, one token at position 128, 512-entry cache, XLA:CPU, 50 timed calls"}
    print(json.dumps({k: res[k] for k in ("flops_ratio_ctx0", "decode_step_seconds")}), flush=True)

    res["heldout"] = heldout_bits_per_byte({"target": target, "draft": draft}, tok,
                                           max_tokens=args.max_bpb_tokens)
    print(json.dumps(res["heldout"]), flush=True)

    texts = corpus.heldout_prompts(args.prompts, num_lines=args.prompt_lines, seed=args.seed)
    prompts = [tok.encode(t).ids[-128:] for t in texts]
    res["acceptance"] = {"prompts": len(prompts), "prompt_lines": args.prompt_lines,
                         "continuation_tokens": args.continuation, "k": args.k}
    for temp in (0.0, 1.0):
        r = acceptance(target, draft, prompts, args.continuation, args.k, temp, seed=args.seed)
        res["acceptance"][f"temperature_{temp:g}"] = r
        print(f"temperature {temp:g}: " + json.dumps(r), flush=True)
    out = Path(args.out) if args.out else Path(args.models) / "EVAL.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
