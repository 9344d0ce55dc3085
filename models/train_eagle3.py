"""Trains an EAGLE-3 head for the built-in target on its own training corpus.

    python -m dsd_jax.models.train_eagle3 --out DIR --minutes 20 --seed 0

The recipe of EAGLE-3 (Li et al. 2025): the frozen target reads each batch once and hands
over its aux hidden states (residual inputs to layers 2, L//2, L-3) and its logits; the
head is trained with the *training-time test*, unrolled over `--ttt-steps` steps. Step 0
reads fc(features) at every index p with the embedding of x_{p+1}; step k reads the
head's own output of step k-1 at the same index with the embedding of x_{p+1+k}, at RoPE
position p+k, attending to step-0 keys at indices <= p and to the keys of steps 1..k at
index p: exactly what the k-th chained draft step sees at serving time. The loss is
sum_k 0.8^k * soft cross-entropy against the target's distribution of x_{p+2+k}
restricted to the draft vocabulary (no feature loss, as in EAGLE-3).

The draft vocabulary is the `--draft-vocab` most frequent training tokens (`d2t`).
Checkpoints (bf16, the published key layout, `models.save_eagle3`) go to DIR every
`--ckpt-minutes` and at the end, with `train_log.json`; `--eval` then measures
per-position acceptance through the engine beside the built-in draft model's
(`DIR/EVAL.json`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from . import corpus
from .builtin import builtin
from .eagle3 import Eagle3Config, Eagle3Head, default_aux_layers, load_eagle3, save_eagle3
from .train import encode_corpus
from .transformer import rope_cos_sin

DECAY = 0.8  # EAGLE-3's per-step loss weight


def head_config(target_cfg, draft_vocab: int, intermediate: int) -> Eagle3Config:
    t = target_cfg
    return Eagle3Config(vocab_size=t.vocab_size, hidden_size=t.hidden_size,
                        intermediate_size=intermediate, num_layers=1, num_heads=t.num_heads,
                        num_kv_heads=t.num_kv_heads, head_dim=t.head_dim, rope_theta=t.rope_theta,
                        rms_norm_eps=t.rms_norm_eps, max_position_embeddings=t.max_position_embeddings,
                        draft_vocab_size=draft_vocab)


def draft_vocabulary(stream: np.ndarray, vocab: int, size: int) -> np.ndarray:
    """d2t of the `size` most frequent token ids (ties by id), sorted by id."""
    counts = np.bincount(stream.astype(np.int64), minlength=vocab)
    top = np.sort(np.argsort(-counts, kind="stable")[:size])
    return (top - np.arange(size)).astype(np.int32)


def target_features(target, tokens, aux_layers):
    """The target over full sequences [B, T]: (aux features [B, T, 3d], logits [B, T, V]),
    with plain causal attention (as `train.model_logits`)."""
    cfg = target.config
    cos, sin = rope_cos_sin(cfg, jnp.arange(tokens.shape[1])[None])
    x = jnp.take(target.embed[...], tokens, axis=0)
    aux = {}
    for i, layer in enumerate(target.layers):
        if i in aux_layers:
            aux[i] = x
        q, k, v = layer.qkv(cfg, x, cos, sin)
        x = layer.finish(cfg, x, jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                              implementation="xla"))
    return jnp.concatenate([aux[i] for i in aux_layers], -1), target.logits(x)


def _repeat_kv(x, groups):
    return jnp.repeat(x, groups, axis=2) if groups > 1 else x


def ttt_logits(head: Eagle3Head, features, tokens, embed, steps: int):
    """Training-time test: head logits [steps, B, T, Vd] where step k at index p predicts
    x_{p+2+k}. features [B, T, 3d] at indices 0..T-1; tokens [B, T + steps]."""
    cfg = head.config
    B, T, _ = features.shape
    groups = cfg.num_heads // cfg.num_kv_heads
    scale = 1.0 / math.sqrt(cfg.head_dim)
    idx = jnp.arange(T)
    causal = idx[:, None] >= idx[None, :]
    h = head.project(features)
    keys, values, out = [], [], []
    for k in range(steps):
        pos = (idx + k)[None].repeat(B, 0)
        q, kk, vv = head.qkv(h, tokens[:, 1 + k:1 + k + T], pos, embed)
        kk, vv = _repeat_kv(kk, groups), _repeat_kv(vv, groups)
        if k == 0:
            k0, v0 = kk, vv
        else:
            keys.append(kk)
            values.append(vv)
        s0 = jnp.einsum("bqhd,bkhd->bhqk", q, k0) * scale
        s0 = jnp.where(causal, s0, -jnp.inf)
        diag = [jnp.einsum("bqhd,bqhd->bhq", q, kj)[..., None] * scale for kj in keys]
        probs = jax.nn.softmax(jnp.concatenate([s0] + diag, -1).astype(jnp.float32), -1)
        attn = jnp.einsum("bhqk,bkhd->bqhd", probs[..., :T].astype(v0.dtype), v0)
        for j, vj in enumerate(values):
            attn = attn + probs[..., T + j].transpose(0, 2, 1)[..., None].astype(vj.dtype) * vj
        h = head.finish(h, attn)  # attn [B, T, Hq, D]
        out.append(head.logits(h))
    return jnp.stack(out)


def make_train_step(t_graph, h_graph, h_rest, opt, aux_layers, steps: int, d2t):
    ids = jnp.arange(d2t.shape[0]) + d2t  # target ids of the draft vocabulary

    def loss_fn(h_params, t_params, batch):
        target = nnx.merge(t_graph, t_params)
        head = nnx.merge(h_graph, h_params, h_rest)
        T = batch.shape[1] - steps
        feats, t_logits = target_features(target, batch, aux_layers)
        feats, t_logits = jax.lax.stop_gradient((feats, t_logits))
        logits = ttt_logits(head, feats[:, :T], batch, target.embed[...], steps)
        losses, accs = [], []
        for k in range(steps):
            tl = t_logits[:, 1 + k:1 + k + T][..., ids]  # target's x_{p+2+k} over the draft vocab
            p = jax.nn.softmax(tl, -1)
            logq = jax.nn.log_softmax(logits[k], -1)
            losses.append(-jnp.mean(jnp.sum(p * logq, -1)))
            accs.append(jnp.mean(jnp.argmax(logits[k], -1) == jnp.argmax(tl, -1)))
        weights = DECAY ** jnp.arange(steps)
        return jnp.sum(weights * jnp.stack(losses)), (jnp.stack(losses), jnp.stack(accs))

    @jax.jit
    def train_step(h_params, t_params, opt_state, batch, lr):
        (loss, (losses, accs)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            h_params, t_params, batch)
        upd, opt_state = opt.update(grads, opt_state, h_params)
        upd = jax.tree.map(lambda u: lr * u, upd)  # the schedule is an argument: no recompile
        return optax.apply_updates(h_params, upd), opt_state, loss, losses, accs

    return train_step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=20.0,
                    help="wall-clock budget; the step plan is set from the measured rate "
                         "(0: no limit, needs --steps)")
    ap.add_argument("--steps", type=int, default=None, help="planned steps (the LR schedule)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--ttt-steps", type=int, default=4)
    ap.add_argument("--draft-vocab", type=int, default=3072)
    ap.add_argument("--intermediate", type=int, default=704)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rate-steps", type=int, default=3, help="steps timed to plan the budget")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--ckpt-minutes", type=float, default=4.0)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--resume", action="store_true", help="start from DIR's checkpoint")
    ap.add_argument("--eval", action="store_true", help="only measure acceptance of DIR's head")
    args = ap.parse_args(argv)
    if args.minutes <= 0 and args.steps is None and not args.eval:
        ap.error("--minutes 0 needs --steps")
    out = Path(args.out)
    if args.eval:
        res = evaluate(out)
        (out / "EVAL.json").write_text(json.dumps(res, indent=1) + "\n")
        return
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    lines = []

    def log(msg):
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        lines.append(line)

    target, _, tok = builtin("float32")
    texts = corpus.read_texts(corpus.train_files())
    stream = encode_corpus(tok, texts)
    log(f"train stream: {len(stream) / 1e6:.2f} M tokens")
    cfg = head_config(target.config, args.draft_vocab, args.intermediate)
    d2t = draft_vocabulary(stream, cfg.vocab_size, cfg.draft_vocab_size)
    covered = np.isin(stream, np.arange(cfg.draft_vocab_size) + d2t).mean()
    log(f"draft vocabulary: {cfg.draft_vocab_size} of {cfg.vocab_size} ids cover {covered:.4f} "
        "of training tokens")
    if args.resume:
        head = load_eagle3(out, dtype="float32")
        log(f"resumed from {out.name}")
    else:
        head = Eagle3Head(cfg, rngs=nnx.Rngs(args.seed))
        head.d2t.set_value(jnp.asarray(d2t))
        # warm start in the target's output space: its final norm and (tied) embedding rows
        head.norm.set_value(target.final_norm[...])
        head.lm_head.set_value(target.embed[...][np.arange(cfg.draft_vocab_size) + d2t].T)
    aux_layers = default_aux_layers(target.config.num_layers)
    t_graph, t_params = nnx.split(target, nnx.Param)
    h_graph, h_params, h_rest = nnx.split(head, nnx.Param, ...)  # d2t is not trained
    # AdamW at unit rate; train_step scales the update by the scheduled rate
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(1.0, b1=0.9, b2=0.95, weight_decay=args.weight_decay,
                                  mask=decay_mask))
    opt_state = opt.init(h_params)
    train_step = make_train_step(t_graph, h_graph, h_rest, opt, aux_layers, args.ttt_steps,
                                 jnp.asarray(d2t))
    rng = np.random.default_rng(args.seed + (1 if args.resume else 0))
    L = args.seq_len + args.ttt_steps + 1

    def next_batch():
        offs = rng.integers(0, len(stream) - L, size=args.batch)
        return jnp.asarray(np.stack([stream[o:o + L] for o in offs]).astype(np.int32))

    record = {"args": {**vars(args), "out": out.name}, "config": cfg.to_dict(),
              "aux_layers": list(aux_layers), "draft_vocab_coverage": float(covered)}
    last_ckpt = time.time()

    def checkpoint(tag):
        nonlocal last_ckpt
        save_eagle3(nnx.merge(h_graph, h_params, h_rest), out, dtype="bfloat16", overwrite=True)
        record["log"] = lines[-300:]
        (out / "train_log.json").write_text(json.dumps(record, indent=1) + "\n")
        last_ckpt = time.time()
        log(f"checkpoint ({tag}) -> {out.name}")

    deadline = t_start + args.minutes * 60 if args.minutes > 0 else math.inf
    planned = args.steps

    def lr_at(i):  # linear warm-up, cosine to 5% over the planned steps
        warm = min(1.0, (i + 1) / max(1, args.warmup))
        frac = min(1.0, i / max(1, (planned or 10_000) - 1))
        return args.lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    acc_sum, n_sum, s0 = None, 0, time.time()
    done, i = 0, 0
    while planned is None or i < planned:
        if time.time() > deadline:
            log(f"wall-clock budget reached after {i} of {planned} steps")
            break
        if planned is None and i == 2 + args.rate_steps:  # steps 0-1 compiled; plan from the rate
            rate = args.rate_steps / (time.time() - t_rate)
            planned = max(i + 1, int(i + rate * (deadline - time.time()) * 0.95))
            log(f"measured {rate:.3f} steps/s; plan: --steps {planned}")
            record["planned_steps"] = planned
        if i == 2:
            t_rate = time.time()
        h_params, opt_state, loss, losses, accs = train_step(h_params, t_params, opt_state,
                                                             next_batch(), jnp.float32(lr_at(i)))
        loss.block_until_ready()  # steps take seconds: keeps the rate and the deadline honest
        i += 1
        m = jnp.concatenate([losses, accs])
        acc_sum = m if acc_sum is None else acc_sum + m
        n_sum += 1
        done = i
        if done % args.log_every == 0 or done == planned:
            mm = np.asarray(acc_sum) / n_sum
            S = args.ttt_steps
            log(f"step {done}/{planned} lr {lr_at(done - 1):.2e} ce " + " ".join(f"{x:.3f}" for x in mm[:S]) +
                " | top1 " + " ".join(f"{x:.3f}" for x in mm[S:]) +
                f" ({n_sum / (time.time() - s0):.3f} steps/s)")
            record.setdefault("history", []).append(
                {"step": done, "ce": mm[:S].tolist(), "top1": mm[S:].tolist()})
            acc_sum, n_sum, s0 = None, 0, time.time()
        if time.time() - last_ckpt > args.ckpt_minutes * 60:
            checkpoint(f"step {done}")
    record["steps_done"] = done
    record["wall_seconds"] = time.time() - t_start
    checkpoint("final")


# ---- evaluation through the engine ---------------------------------------------------------

def evaluate(head_dir, prompts: int = 32, tokens: int = 48, k: int = 4, seed: int = 0) -> dict:
    """Per-position acceptance (the engine's counters, static K) of the head in `head_dir`
    and of the built-in draft model, on held-out prompts, at temperature 0 and 1."""
    from dsd_jax import SamplingParams, SpecConfig, SpecEngine

    target, draft, tok = builtin("float32")
    head = load_eagle3(head_dir, dtype="float32")
    texts = corpus.heldout_prompts(prompts, num_lines=8, seed=seed)
    ids = [tok.encode(t).ids[-128:] for t in texts]
    res = {"prompts": len(ids), "max_tokens": tokens, "k": k, "note":
           "acceptance_per_position: P(drafts 1..i all accepted), engine counters, "
           "static K, held-out stdlib prompts; mean_accepted_length = tokens per round"}
    for name, method, model in (("draft_model", "draft_model", draft), ("eagle3", "eagle3", head)):
        eng = SpecEngine(target, model, SpecConfig(method=method, num_speculative_tokens=k),
                         max_batch_size=16, max_seq_len=256, prefill_chunk=128)
        for temp in (0.0, 1.0):
            eng.stats.reset()
            eng.generate(ids, [SamplingParams(temperature=temp, max_tokens=tokens, seed=seed + i)
                               for i in range(len(ids))])
            m = eng.metrics()
            acc = [float(x) for x in m["acceptance_per_position"]]
            res.setdefault(name, {})[f"temperature_{temp:g}"] = {
                "acceptance_per_position": acc,
                "mean_accepted_length": float(1 + np.sum(acc))}
            print(name, temp, json.dumps(res[name][f"temperature_{temp:g}"]), flush=True)
    return res


if __name__ == "__main__":
    sys.exit(main())
