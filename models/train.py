"""Trains the built-in target/draft pair on the CPython standard library.

    python -m dsd_jax.models.train --out DIR --minutes 60 --seed 0

Steps (all deterministic for a given seed and step counts):
1. a byte-level BPE tokenizer (vocab 4096, `<|endoftext|>` = id 0) on the train split
   (`DIR/tokenizer.json`; reused when present);
2. the train split tokenized into one stream, files separated by `<|endoftext|>`;
3. phase 1 (joint): each step trains the target on next-token cross-entropy and the
   draft on `alpha * CE + (1 - alpha) * KL(target || draft)` against the target's
   logits of the same batch (stop-gradient);
4. phase 2 (distil): the target is frozen and the draft keeps distilling from it.

Batches are windows of `seq_len + 1` tokens at offsets drawn from
`numpy.random.default_rng(seed)`, so the data order depends only on the seed.
Each phase uses AdamW with linear warm-up and cosine decay over its planned steps.
With `--minutes`, the planned step counts are set from the measured step rate after a
few steps (printed and written to `DIR/train_log.json`); pass them back as
`--joint-steps/--distill-steps` (and `--minutes 0`, plus `--joint-stop` when phase 1
ended at its time limit) to reproduce a run step for step.
Checkpoints (bf16, `models.save`) go to `DIR/target` and `DIR/draft` every
`--ckpt-minutes` and at the end, so the job can be stopped at any time. A DIR that
already holds `target` or `draft` is refused unless `--overwrite` is passed, and even
then only model checkpoints (`config.json` + `params/`) are ever removed there. A reused
`DIR/tokenizer.json` must fit the models (at most 4096 ids, `<|endoftext|>` = id 0), and
non-finite losses or parameters stop the run before they are checkpointed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from . import corpus
from .argtypes import float_in, nonneg_float, nonneg_int, positive_float, positive_int
from .checkpoint import save
from .layout import CHECKSUMS_FILE, CONFIG_FILE, PARAMS_DIR, checkpoint_kind
from .config import ModelConfig
from .transformer import init_kv_cache, init_model, rope_cos_sin

EOT = "<|endoftext|>"
VOCAB_SIZE = 4096

TARGET_CONFIG = ModelConfig(
    vocab_size=VOCAB_SIZE, hidden_size=512, intermediate_size=1408, num_layers=8, num_heads=8,
    num_kv_heads=2, head_dim=64, model_type="llama", rope_theta=10000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, max_position_embeddings=4096)
DRAFT_CONFIG = ModelConfig(
    vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=704, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=64, model_type="llama", rope_theta=10000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True, max_position_embeddings=4096)


def flops_per_token(cfg: ModelConfig, context: int = 0) -> int:
    """Forward FLOPs per token (2 per multiply-add): the matmuls, the LM head, and
    attention over `context` previous tokens."""
    d, hd = cfg.hidden_size, cfg.head_dim
    per_layer = 2 * (d * cfg.num_heads * hd + 2 * d * cfg.num_kv_heads * hd + cfg.num_heads * hd * d
                     + 3 * d * cfg.intermediate_size)
    attn = 2 * 2 * cfg.num_heads * hd * context
    return cfg.num_layers * (per_layer + attn) + 2 * d * cfg.vocab_size


# ----------------------------------------------------------------------------- tokenizer

def train_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    assert tok.token_to_id(EOT) == 0
    return tok


def check_tokenizer(tok, vocab_size: int = VOCAB_SIZE, source: str = "tokenizer") -> None:
    """Raises ValueError unless every id of `tok` is below `vocab_size` (the models'
    embedding rows) and `<|endoftext|>` is id 0 (the separator `encode_corpus` writes)."""
    vocab = tok.get_vocab(with_added_tokens=True)
    top = max(vocab.values(), default=-1)
    if top >= vocab_size:
        raise ValueError(f"{source}: its ids go up to {top} ({tok.get_vocab_size()} tokens) but the "
                         f"models have {vocab_size} embedding rows; use a tokenizer of at most "
                         f"{vocab_size} tokens (or remove it to train a fresh one)")
    eot = tok.token_to_id(EOT)
    if eot != 0:
        raise ValueError(f"{source}: {EOT!r} is id {eot}, not 0 (the document separator the training "
                         "stream uses); remove it to train a fresh tokenizer")


def encode_corpus(tok, texts: list[str]) -> np.ndarray:
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(0)
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and arr.max() > np.iinfo(np.uint16).max:
        raise ValueError(f"token id {int(arr.max())} does not fit the uint16 training stream "
                         "(the tokenizer is larger than 65536 tokens)")
    return arr.astype(np.uint16)


# ----------------------------------------------------------------------------- model math

def model_logits(model, tokens):
    """Training forward over full sequences (positions 0..T-1): the same math as
    `Transformer.__call__` (its helpers, its parameters) with plain causal attention
    instead of the KV-cache scatter, which makes the backward pass cheaper. Parity with
    the model's own forward is checked by `check_parity` and tests/test_builtin.py."""
    cfg = model.config
    B, T = tokens.shape
    cos, sin = rope_cos_sin(cfg, jnp.arange(T)[None])
    x = jnp.take(model.embed[...], tokens, axis=0)
    for layer in model.layers:
        q, k, v = layer.qkv(cfg, x, cos, sin)
        attn = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
        x = layer.finish(cfg, x, attn)
    return model.logits(x)


def cached_logits(model, tokens):
    """The model's own forward with a fresh KV cache of capacity T."""
    B, T = tokens.shape
    kv = init_kv_cache(model.config, B, T)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    logits, _ = model(tokens, positions, kv, attn_backend="xla")
    return logits


def check_parity(model, seed: int = 0, atol: float = 1e-4) -> float:
    x = jax.random.randint(jax.random.key(seed), (2, 32), 0, model.config.vocab_size)
    graph, params = nnx.split(model)

    @jax.jit
    def max_diff(params, x):
        m = nnx.merge(graph, params)
        return jnp.max(jnp.abs(model_logits(m, x) - cached_logits(m, x)))

    diff = float(max_diff(params, x))
    if not diff <= atol:
        raise AssertionError(f"training forward differs from the model forward by {diff}")
    return diff


def cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[..., None], axis=-1))


def kl_target_draft(t_logits, d_logits):
    t_logp = jax.nn.log_softmax(jax.lax.stop_gradient(t_logits), axis=-1)
    d_logp = jax.nn.log_softmax(d_logits, axis=-1)
    return jnp.mean(jnp.sum(jnp.exp(t_logp) * (t_logp - d_logp), axis=-1))


def make_optimizer(lr: float, steps: int, warmup: int, weight_decay: float):
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, max(1, min(warmup, steps // 2)),
                                               max(steps, 2), end_value=lr * 0.05)
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=weight_decay,
                                   mask=decay_mask))


def make_steps(t_graph, d_graph, t_opt, d_opt, alpha: float):
    def draft_loss(d_params, t_logits, x, y):
        d_logits = model_logits(nnx.merge(d_graph, d_params), x)
        ce = cross_entropy(d_logits, y)
        kl = kl_target_draft(t_logits, d_logits)
        return alpha * ce + (1 - alpha) * kl, (ce, kl)

    def target_loss(t_params, x, y):
        logits = model_logits(nnx.merge(t_graph, t_params), x)
        return cross_entropy(logits, y), logits

    @jax.jit
    def joint_step(t_params, d_params, t_state, d_state, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        (t_ce, t_logits), t_grads = jax.value_and_grad(target_loss, has_aux=True)(t_params, x, y)
        (_, (d_ce, kl)), d_grads = jax.value_and_grad(draft_loss, has_aux=True)(
            d_params, t_logits, x, y)
        t_upd, t_state = t_opt.update(t_grads, t_state, t_params)
        d_upd, d_state = d_opt.update(d_grads, d_state, d_params)
        return (optax.apply_updates(t_params, t_upd), optax.apply_updates(d_params, d_upd),
                t_state, d_state, {"t_ce": t_ce, "d_ce": d_ce, "kl": kl})

    @jax.jit
    def distill_step(t_params, d_params, d_state, batch):
        x, y = batch[:, :-1], batch[:, 1:]
        t_logits = model_logits(nnx.merge(t_graph, t_params), x)
        (_, (d_ce, kl)), d_grads = jax.value_and_grad(draft_loss, has_aux=True)(
            d_params, t_logits, x, y)
        d_upd, d_state = d_opt.update(d_grads, d_state, d_params)
        return optax.apply_updates(d_params, d_upd), d_state, {
            "t_ce": cross_entropy(t_logits, y), "d_ce": d_ce, "kl": kl}

    return joint_step, distill_step


# ----------------------------------------------------------------------------- driver

_CKPT_ENTRIES = {CONFIG_FILE, PARAMS_DIR, CHECKSUMS_FILE}  # what `models.save` writes


def _is_checkpoint(path: Path) -> bool:
    """A `models.save` directory (`layout.checkpoint_kind` "dsd": its config.json and params/),
    not a link (what it points to is not ours to remove)."""
    return not path.is_symlink() and checkpoint_kind(path).kind == "dsd"


def _is_partial_save(path: Path) -> bool:
    """What an interrupted `models.save` leaves: a directory holding only its entries."""
    return (path.is_dir() and not path.is_symlink() and (path / PARAMS_DIR).is_dir()
            and {p.name for p in path.iterdir()} <= _CKPT_ENTRIES)


def _removable(path: Path, tmp: bool = False) -> bool:
    return _is_checkpoint(path) or (tmp and _is_partial_save(path))


def _refuse_removal(path: Path) -> str:
    return (f"{path} exists and is not a model checkpoint (config.json + params/): "
            "refusing to remove it; move it away or choose another --out")


def _save_atomic(graph, params, path: Path):
    """Writes a checkpoint to `path` through `path.tmp`; only ever removes a model
    checkpoint (or an interrupted save's leftovers) that is there."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists() or tmp.is_symlink():
        if not _removable(tmp, tmp=True):
            raise FileExistsError(_refuse_removal(tmp))
        shutil.rmtree(tmp)
    save(nnx.merge(graph, params), tmp, dtype="bfloat16")
    if path.exists() or path.is_symlink():
        if not _removable(path):
            raise FileExistsError(_refuse_removal(path))
        shutil.rmtree(path)
    os.replace(tmp, path)


def check_out(out: Path, overwrite: bool) -> str | None:
    """Why training into `out` must not start (None: it may): `out` is a file, or holds
    `target`/`draft` entries (without `overwrite`, or that are not model checkpoints)."""
    if out.exists() and not out.is_dir():
        return f"--out {out} is an existing file, not a directory"
    for name in ("target", "draft"):
        for path, tmp in ((out / name, False), (out / (name + ".tmp"), True)):
            if not (path.exists() or path.is_symlink()):
                continue
            if not overwrite:
                return (f"--out {out} already holds {path}; pass --overwrite to replace the "
                        "checkpoints there (or choose another --out)")
            if not _removable(path, tmp):
                return _refuse_removal(path)
    return None


class NonFiniteError(FloatingPointError):
    """Training produced NaN/inf losses or parameters; nothing was checkpointed."""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the checkpoints already in DIR/target and DIR/draft")
    ap.add_argument("--minutes", type=nonneg_float, default=60.0,
                    help="wall-clock budget for both phases (0: no limit, needs --joint-steps)")
    ap.add_argument("--distill-fraction", type=float_in(0.0, 1.0, high_open=True), default=0.2,
                    help="share of the budget for phase 2 (draft-only distillation), in [0, 1)")
    ap.add_argument("--joint-steps", type=positive_int, default=None, help="planned phase-1 steps")
    ap.add_argument("--distill-steps", type=nonneg_int, default=None, help="planned phase-2 steps")
    ap.add_argument("--joint-stop", type=nonneg_int, default=None,
                    help="end phase 1 after this many steps (reproduces a run whose phase 1 hit "
                         "its wall-clock limit; the schedule still spans --joint-steps)")
    ap.add_argument("--seed", type=nonneg_int, default=0)
    ap.add_argument("--batch", type=positive_int, default=8)
    ap.add_argument("--seq-len", type=positive_int, default=256)
    ap.add_argument("--lr", type=positive_float, default=2e-3)
    ap.add_argument("--draft-lr", type=positive_float, default=3e-3)
    ap.add_argument("--warmup", type=nonneg_int, default=60)
    ap.add_argument("--weight-decay", type=nonneg_float, default=0.1)
    ap.add_argument("--alpha", type=float_in(0.0, 1.0), default=0.2,
                    help="draft loss: alpha*CE + (1-alpha)*KL, in [0, 1]")
    ap.add_argument("--ckpt-minutes", type=nonneg_float, default=5.0)
    ap.add_argument("--log-every", type=positive_int, default=20)
    ap.add_argument("--rate-steps", type=positive_int, default=8, help="steps timed to plan the budget")
    args = ap.parse_args(argv)
    if args.minutes <= 0 and args.joint_steps is None:
        ap.error("--minutes 0 needs --joint-steps (and --distill-steps)")
    max_len = min(TARGET_CONFIG.max_position_embeddings, DRAFT_CONFIG.max_position_embeddings)
    if args.seq_len > max_len:
        ap.error(f"--seq-len {args.seq_len} exceeds the models' max_position_embeddings {max_len}")
    out = Path(args.out)
    problem = check_out(out, args.overwrite)
    if problem:
        ap.error(problem)

    t_start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    log_lines = []

    def log(msg):
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        log_lines.append(line)

    # Tokenizer and data.
    from tokenizers import Tokenizer
    train_rel = corpus.train_files()
    texts = corpus.read_texts(train_rel)
    tok_path = out / "tokenizer.json"
    if tok_path.exists():
        tok = Tokenizer.from_file(str(tok_path))
        try:
            check_tokenizer(tok, min(TARGET_CONFIG.vocab_size, DRAFT_CONFIG.vocab_size), str(tok_path))
        except ValueError as e:
            ap.error(str(e))
        log(f"tokenizer: reusing {tok_path}")
    else:
        tok = train_tokenizer(texts)
        tok.save(str(tok_path))
        log(f"tokenizer: trained on {len(texts)} files, vocab {tok.get_vocab_size()}")
    stream = encode_corpus(tok, texts)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    log(f"train split: {len(train_rel)} files, {n_bytes / 1e6:.2f} MB, {len(stream) / 1e6:.2f} M tokens "
        f"({n_bytes / len(stream):.2f} bytes/token)")

    rng = np.random.default_rng(args.seed)
    L = args.seq_len + 1
    if len(stream) <= L:
        ap.error(f"--seq-len {args.seq_len} needs a training stream longer than {L} tokens; "
                 f"it has {len(stream)}")

    def next_batch():
        offs = rng.integers(0, len(stream) - L, size=args.batch)
        return jnp.asarray(np.stack([stream[o:o + L] for o in offs]).astype(np.int32))

    # Models.
    target = init_model(TARGET_CONFIG, args.seed)
    draft = init_model(DRAFT_CONFIG, args.seed + 1)
    check_parity(target)
    check_parity(draft)
    t_graph, t_params = nnx.split(target, nnx.Param)
    d_graph, d_params = nnx.split(draft, nnx.Param)
    del target, draft
    ft, fd = flops_per_token(TARGET_CONFIG, args.seq_len // 2), flops_per_token(DRAFT_CONFIG, args.seq_len // 2)
    log(f"target {sum(x.size for x in jax.tree.leaves(t_params)) / 1e6:.2f} M params, "
        f"draft {sum(x.size for x in jax.tree.leaves(d_params)) / 1e6:.2f} M params; "
        f"forward FLOP/token at context {args.seq_len // 2}: {ft / 1e6:.1f} M vs {fd / 1e6:.1f} M "
        f"(ratio {fd / ft:.3f})")

    budget = args.minutes * 60.0 if args.minutes > 0 else math.inf
    deadline = t_start + budget
    joint_deadline = t_start + budget * (1 - args.distill_fraction)

    def build(joint_steps, distill_steps):
        t_opt = make_optimizer(args.lr, joint_steps, args.warmup, args.weight_decay)
        d_opt = make_optimizer(args.draft_lr, joint_steps + distill_steps, args.warmup, args.weight_decay)
        return t_opt, d_opt

    record = {"args": {**vars(args), "out": out.name},  # no machine paths in the record
              "target_config": TARGET_CONFIG.to_dict(),
              "draft_config": DRAFT_CONFIG.to_dict(), "train_files": len(train_rel),
              "train_tokens": int(len(stream)), "train_bytes": n_bytes}
    last_ckpt = time.time()

    # First step of each phase whose loss was not finite (-1: none), kept on the device so
    # that watching for it costs no host sync per step.
    bad_step = {"joint": jnp.int32(-1), "distill": jnp.int32(-1)}

    def check_finite(where, params_too=True):
        """Raises NonFiniteError, before anything is written, on a NaN/inf loss since the
        start of the run or (params_too) on NaN/inf parameters."""
        keep = f"stopping without checkpointing (the previous checkpoint in {out} is left as it was)"
        for phase, step in bad_step.items():
            if int(step) >= 0:
                raise NonFiniteError(f"non-finite loss at {phase} step {int(step)} (found at {where}); {keep}")
        for name, params in (("target", t_params), ("draft", d_params)) if params_too else ():
            if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params)):
                raise NonFiniteError(f"non-finite {name} parameters at {where}; {keep}")

    def checkpoint(tag):
        nonlocal last_ckpt
        check_finite(tag)
        _save_atomic(t_graph, t_params, out / "target")
        _save_atomic(d_graph, d_params, out / "draft")
        record["log"] = log_lines[-400:]
        (out / "train_log.json").write_text(json.dumps(record, indent=1))
        last_ckpt = time.time()
        log(f"checkpoint ({tag}) -> {out.name}/target, {out.name}/draft")

    # Plan: the draft's optimizer runs over both phases (one schedule), the target's
    # over phase 1. With a time budget, time a few steps with a provisional plan, then
    # fix the plan (the provisional steps count towards it and use the same schedule
    # values only approximately, which is why the plan is logged for reproduction).
    joint_steps, distill_steps = args.joint_steps, args.distill_steps
    if joint_steps is None:
        t_opt, d_opt = build(10_000, 0)
        joint_step, distill_step = make_steps(t_graph, d_graph, t_opt, d_opt, args.alpha)
        b = next_batch()
        s0 = time.time()
        tp, dp, ts, ds, m = joint_step(t_params, d_params, t_opt.init(t_params), d_opt.init(d_params), b)
        jax.block_until_ready(m)
        log(f"joint step compiled in {time.time() - s0:.1f}s")
        s0 = time.time()
        for _ in range(args.rate_steps):
            tp, dp, ts, ds, m = joint_step(tp, dp, ts, ds, b)
        jax.block_until_ready(m)
        joint_rate = args.rate_steps / (time.time() - s0)
        s0 = time.time()
        _, _, m = distill_step(t_params, d_params, d_opt.init(d_params), b)
        jax.block_until_ready(m)
        s0 = time.time()
        ds2 = d_opt.init(d_params)
        dp2 = d_params
        for _ in range(args.rate_steps):
            dp2, ds2, m = distill_step(t_params, dp2, ds2, b)
        jax.block_until_ready(m)
        distill_rate = args.rate_steps / (time.time() - s0)
        del tp, dp, ts, ds, dp2, ds2
        now = time.time()
        joint_steps = max(10, int(joint_rate * (joint_deadline - now) * 0.93))
        distill_steps = max(0, int(distill_rate * (deadline - joint_deadline) * 0.93))
        log(f"measured {joint_rate:.3f} joint steps/s, {distill_rate:.3f} distill steps/s "
            f"({args.batch}x{args.seq_len} tokens/step)")
    distill_steps = distill_steps or 0
    log(f"plan: --joint-steps {joint_steps} --distill-steps {distill_steps}")
    record.update(joint_steps=joint_steps, distill_steps=distill_steps)

    # Fresh start with the fixed plan and the seed's data order.
    rng = np.random.default_rng(args.seed)
    t_opt, d_opt = build(joint_steps, distill_steps)
    joint_step, distill_step = make_steps(t_graph, d_graph, t_opt, d_opt, args.alpha)
    t_state, d_state = t_opt.init(t_params), d_opt.init(d_params)

    def run_phase(name, steps, step_fn, phase_deadline):
        nonlocal t_params, d_params, t_state, d_state
        acc, n_acc, s0, done = None, 0, time.time(), 0
        stop = steps if name != "joint" or args.joint_stop is None else min(steps, args.joint_stop)
        for i in range(stop):
            if time.time() > phase_deadline:
                log(f"{name}: wall-clock budget reached after {i} of {steps} steps")
                break
            batch = next_batch()
            if name == "joint":
                t_params, d_params, t_state, d_state, m = step_fn(t_params, d_params, t_state, d_state, batch)
            else:
                d_params, d_state, m = step_fn(t_params, d_params, d_state, batch)
            acc = m if acc is None else jax.tree.map(jnp.add, acc, m)
            n_acc += 1
            done = i + 1
            finite = jnp.all(jnp.stack([jnp.isfinite(v) for v in m.values()]))
            bad_step[name] = jnp.where((bad_step[name] < 0) & ~finite, done, bad_step[name])
            if done % args.log_every == 0 or done == steps:
                check_finite(f"{name} step {done}", params_too=False)
                mm = {k: float(v) / n_acc for k, v in acc.items()}
                log(f"{name} {done}/{steps} t_ce {mm['t_ce']:.4f} d_ce {mm['d_ce']:.4f} "
                    f"kl {mm['kl']:.4f} ({n_acc / (time.time() - s0):.3f} steps/s)")
                record.setdefault("history", []).append({"phase": name, "step": done, **mm})
                acc, n_acc, s0 = None, 0, time.time()
            if time.time() - last_ckpt > args.ckpt_minutes * 60:
                checkpoint(f"{name} step {done}")
        record[f"{name}_steps_done"] = done
        return done

    run_phase("joint", joint_steps, joint_step, joint_deadline if args.minutes > 0 else math.inf)
    if record["joint_steps_done"] == 0 and args.joint_stop != 0:
        # compiling and timing the plan used the whole phase-1 budget: untrained models
        # must not be checkpointed as a result
        raise RuntimeError(f"the --minutes {args.minutes:g} budget ended before the first joint "
                           "step (compiling and timing the steps took it); nothing was "
                           "checkpointed: give more --minutes, or --minutes 0 with --joint-steps")
    run_phase("distill", distill_steps, distill_step, deadline if args.minutes > 0 else math.inf)
    record["wall_seconds"] = time.time() - t_start
    record["tokens_seen"] = {
        "target": record["joint_steps_done"] * args.batch * args.seq_len,
        "draft": (record["joint_steps_done"] + record["distill_steps_done"]) * args.batch * args.seq_len}
    checkpoint("final")
    log(f"done in {record['wall_seconds'] / 60:.1f} min")


if __name__ == "__main__":
    sys.exit(main())
