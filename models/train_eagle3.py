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
`--ckpt-minutes` and at the end, with `train_log.json` and `DIR/train_state/` (the
float32 weights, the optimizer state, the step and the schedule; `models.load_eagle3`
reads only `config.json` + `model.safetensors`). A DIR that already holds a head is
refused unless `--overwrite` (start a new head there) or `--resume` is passed; a DIR
holding anything else this script would write over (another model's checkpoint: a
`config.json` not naming `LlamaForCausalLMEagle3`, `models.save`'s `params/`, a lone
`train_log.json`) is refused even so. Non-finite
losses or weights stop the run before they are checkpointed.

`--resume` continues the head in DIR: its config and draft vocabulary (an explicit
`--draft-vocab`/`--intermediate` must agree), and, from `train_state/`, its weights,
optimizer state and step, so the LR schedule (`--lr`, `--warmup`, the planned steps;
override them by passing them) and the data order (its seed saved; another `--seed` is
refused) go on where the run stopped;
`--steps` is the total planned step count, as in the first run. `train_log.json` keeps
the earlier runs' records under `previous_runs`. A head without a saved training state
(an older one) resumes with a fresh optimizer and a new schedule from step 0, with a note.
`--resume --new-schedule` keeps the weights but starts a fresh optimizer and a new
`--steps` schedule (a cool-down). The shipped head (`models/builtin/eagle3`) was trained
with `--minutes 18 --batch 4 --seq-len 128 --ttt-steps 3 --draft-vocab 2048 --lr 3e-3
--warmup 10` (683 steps planned from the measured rate, 226 done in the budget), then
cooled down with a fresh 50-step schedule, `--resume --new-schedule --minutes 3.2
--steps 50 --lr 1e-3 --warmup 5` (it predates `train_state/`: plain `--resume` did that).
`--eval` measures per-position acceptance through the engine beside the built-in draft
model's (`DIR/EVAL.json`).
"""

from __future__ import annotations

import argparse
import hashlib
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
from .builtin import builtin
from .eagle3 import (ARCHITECTURE, Eagle3Config, Eagle3Head, default_aux_layers, load_eagle3,
                     save_eagle3)
from .layout import CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, atomic_write, checkpoint_kind
from .argtypes import nonneg_float, nonneg_int, positive_float, positive_int
from .train import NonFiniteError, encode_corpus
from .transformer import rope_cos_sin

DECAY = 0.8  # EAGLE-3's per-step loss weight
STATE_DIR = "train_state"        # DIR/train_state: what --resume needs beyond the head
STATE_FILE = "state.json"        # step, planned steps, schedule, the head file's digest
ARRAYS_FILE = "arrays.npz"       # float32 weights and optimizer state
LOG_FILE = "train_log.json"
HEAD_ENTRIES = (CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, STATE_DIR, LOG_FILE)
DEFAULTS = {"draft_vocab": 3072, "intermediate": 704, "lr": 2e-3, "warmup": 20}


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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _keyed_leaves(tree) -> tuple[list[str], list]:
    pairs = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [jax.tree_util.keystr(k) for k, _ in pairs], [v for _, v in pairs]


def _is_state_dir(path: Path) -> bool:
    """A directory `save_train_state` wrote (or began to): only its two files."""
    return (path.is_dir() and not path.is_symlink()
            and {p.name for p in path.iterdir()} <= {STATE_FILE, ARRAYS_FILE})


def _remove_state_dir(path: Path) -> None:
    if path.exists() or path.is_symlink():
        if not _is_state_dir(path):
            raise FileExistsError(f"{path} is not a training state this script wrote "
                                  f"({STATE_FILE}, {ARRAYS_FILE}): refusing to remove it")
        shutil.rmtree(path)


def save_train_state(out: Path, h_params, opt_state, info: dict) -> None:
    """Writes `out/train_state` (through `train_state.tmp`): the float32 weights, the
    optimizer state and `info` (step, schedule), tied to the head file beside it by its
    digest. Call after `save_eagle3` wrote the head to `out`."""
    tmp, final = out / (STATE_DIR + ".tmp"), out / STATE_DIR
    _remove_state_dir(tmp)
    tmp.mkdir()
    p_keys, p_leaves = _keyed_leaves(h_params)
    o_keys, o_leaves = _keyed_leaves(opt_state)
    arrays = {f"p{i}": np.asarray(jax.device_get(x)) for i, x in enumerate(p_leaves)}
    arrays.update({f"o{i}": np.asarray(jax.device_get(x)) for i, x in enumerate(o_leaves)})
    np.savez(tmp / ARRAYS_FILE, **arrays)
    (tmp / STATE_FILE).write_text(json.dumps(
        {**info, "head_sha256": _sha256(out / WEIGHTS_FILE), "params": p_keys, "opt_state": o_keys},
        indent=1) + "\n")
    _remove_state_dir(final)
    os.replace(tmp, final)


def load_train_state(out: Path, h_params, opt_state):
    """(info, h_params, opt_state) from `out/train_state`, with `h_params`/`opt_state` as
    templates; or (reason, None, None) when there is none that belongs to the head in `out`."""
    d = out / STATE_DIR
    if not (d / STATE_FILE).is_file() or not (d / ARRAYS_FILE).is_file():
        return f"{out} has no saved training state ({STATE_DIR}/)", None, None
    try:
        info = json.loads((d / STATE_FILE).read_text())
    except (OSError, ValueError) as e:
        return f"{d / STATE_FILE} is unreadable ({e})", None, None
    if info.get("head_sha256") != _sha256(out / WEIGHTS_FILE):
        return (f"{d} belongs to another {WEIGHTS_FILE} (the head changed after it was "
                "written)"), None, None
    restored = []
    with np.load(d / ARRAYS_FILE) as z:
        for tree, tag, name in ((h_params, "p", "params"), (opt_state, "o", "opt_state")):
            keys, leaves = _keyed_leaves(tree)
            if info.get(name) != keys:
                return f"{d} was saved for a different head or optimizer ({name})", None, None
            arrs = [z[f"{tag}{i}"] for i in range(len(leaves))]
            if any(a.shape != np.shape(x) or a.dtype != np.asarray(x).dtype
                   for a, x in zip(arrs, leaves)):
                return f"{d} holds arrays of other shapes or dtypes than the head's ({name})", None, None
            restored.append(jax.tree.unflatten(jax.tree.structure(tree), [jnp.asarray(a) for a in arrs]))
    return info, restored[0], restored[1]


def _not_a_head(out: Path) -> str | None:
    """What in `out` this script must not replace, described (None: nothing, or an EAGLE-3
    head with its training state and log): --overwrite and checkpoints replace only those."""
    found = checkpoint_kind(out)
    if found.kind in ("empty", "file", "eagle3"):  # a file: main refuses it on its own
        return None
    if found.kind != "other":
        return found.what
    if (out / LOG_FILE).exists() and not (out / STATE_DIR).exists():
        # no checkpoint, but a log this script would write over
        return f"a {LOG_FILE} with no EAGLE-3 head beside it (another script's?)"
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=nonneg_float, default=20.0,
                    help="wall-clock budget; the step plan is set from the measured rate "
                         "(0: no limit, needs --steps)")
    ap.add_argument("--steps", type=positive_int, default=None,
                    help="planned steps (the LR schedule; with --resume, the total count)")
    ap.add_argument("--seed", type=nonneg_int, default=None,
                    help="the head's initialisation and the data order (default 0; --resume: the run's own)")
    ap.add_argument("--batch", type=positive_int, default=4)
    ap.add_argument("--seq-len", type=positive_int, default=256)
    ap.add_argument("--ttt-steps", type=positive_int, default=4)
    ap.add_argument("--draft-vocab", type=positive_int, default=None,
                    help=f"draft vocabulary size, 1..target vocab (default {DEFAULTS['draft_vocab']}; "
                         "--resume: the head's)")
    ap.add_argument("--intermediate", type=positive_int, default=None,
                    help=f"SwiGLU size (default {DEFAULTS['intermediate']}; --resume: the head's)")
    ap.add_argument("--lr", type=positive_float, default=None,
                    help=f"peak learning rate (default {DEFAULTS['lr']:g}; --resume: the saved one)")
    ap.add_argument("--warmup", type=nonneg_int, default=None,
                    help=f"warm-up steps (default {DEFAULTS['warmup']}; --resume: the saved count)")
    ap.add_argument("--rate-steps", type=positive_int, default=3, help="steps timed to plan the budget")
    ap.add_argument("--weight-decay", type=nonneg_float, default=0.0)
    ap.add_argument("--ckpt-minutes", type=nonneg_float, default=4.0)
    ap.add_argument("--log-every", type=positive_int, default=20)
    ap.add_argument("--resume", action="store_true",
                    help="continue training DIR's head (its optimizer state, step and schedule)")
    ap.add_argument("--new-schedule", action="store_true",
                    help="with --resume: a fresh optimizer and a new --steps schedule from step 0")
    ap.add_argument("--overwrite", action="store_true",
                    help="replace the EAGLE-3 head already in DIR (never another checkpoint)")
    ap.add_argument("--eval", action="store_true", help="only measure acceptance of DIR's head")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.eval:
        # only --out applies: refuse training flags rather than ignore them
        given = [k for k, v in vars(args).items() if k not in ("out", "eval") and v != ap.get_default(k)]
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            ap.error(f"--eval only measures the head in --out: training flags ({flags}) do not apply")
        try:
            head = load_eagle3(out, dtype="float32")
        except (OSError, ValueError) as e:
            ap.error(f"--eval: --out {out} holds no EAGLE-3 head to measure: {e}")
        res = evaluate(head)
        atomic_write(out / "EVAL.json", lambda f: f.write(json.dumps(res, indent=1) + "\n"))
        return
    if args.new_schedule and not args.resume:
        ap.error("--new-schedule only applies with --resume")
    if args.resume and args.overwrite:
        ap.error("--resume continues the head in --out, --overwrite replaces it: pass one of them")
    if out.exists() and not out.is_dir():
        ap.error(f"--out {out} is an existing file, not a directory")
    foreign = _not_a_head(out)
    if foreign:
        ap.error(f"--out {out} holds {foreign}, not an EAGLE-3 head ({CONFIG_FILE} naming "
                 f"{ARCHITECTURE}): refusing to train into it (choose another directory)")
    if args.resume:
        missing = [f for f in (CONFIG_FILE, WEIGHTS_FILE) if not (out / f).is_file()]
        if missing:
            ap.error(f"--resume: {out} holds no EAGLE-3 head to resume ({', '.join(missing)} missing)")
    else:
        present = [f for f in HEAD_ENTRIES if (out / f).exists() or (out / f).is_symlink()]
        if present and not args.overwrite:
            ap.error(f"--out {out} already holds a head ({', '.join(present)}); pass --resume to "
                     "continue training it or --overwrite to replace it")
        if args.minutes <= 0 and args.steps is None:
            ap.error("--minutes 0 needs --steps")
    if (out / WEIGHTS_INDEX_FILE).exists():  # save_eagle3 would refuse it after training
        ap.error(f"--out {out} holds a sharded checkpoint ({WEIGHTS_INDEX_FILE}): use another directory")
    for name in (STATE_DIR, STATE_DIR + ".tmp"):
        path = out / name
        if (path.exists() or path.is_symlink()) and not _is_state_dir(path):
            ap.error(f"{path} is not a training state this script wrote: refusing to replace it")
    for name in (CONFIG_FILE, WEIGHTS_FILE):
        if (out / name).is_dir():
            ap.error(f"{out / name} is a directory")
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    lines = []

    def log(msg):
        line = f"[{time.time() - t_start:7.1f}s] {msg}"
        print(line, flush=True)
        lines.append(line)

    target, _, tok = builtin("float32")
    tcfg = target.config
    texts = corpus.read_texts(corpus.train_files())
    stream = encode_corpus(tok, texts)
    log(f"train stream: {len(stream) / 1e6:.2f} M tokens")
    L = args.seq_len + args.ttt_steps + 1
    if len(stream) <= L:
        ap.error(f"--seq-len {args.seq_len} with --ttt-steps {args.ttt_steps} needs a training stream "
                 f"longer than {L} tokens; it has {len(stream)}")
    if L - 1 > tcfg.max_position_embeddings:
        ap.error(f"--seq-len {args.seq_len} + --ttt-steps {args.ttt_steps} exceeds the target's "
                 f"max_position_embeddings {tcfg.max_position_embeddings}")

    state_info, start, note = None, 0, None
    if args.resume:
        head = load_eagle3(out, dtype="float32")
        cfg = head.config
        try:
            aux_layers = cfg.target_aux_layers(tcfg)
        except ValueError as e:
            ap.error(f"--resume: the head in {out} does not fit the built-in target: {e}")
        for flag, given, have in (("--draft-vocab", args.draft_vocab, cfg.draft_vocab_size),
                                  ("--intermediate", args.intermediate, cfg.intermediate_size)):
            if given is not None and given != have:
                ap.error(f"{flag} {given} conflicts with the resumed head's {have} "
                         f"(leave {flag} out with --resume)")
        d2t = np.asarray(head.d2t[...])
        log(f"resumed the head in {out.name}: draft vocabulary {cfg.draft_vocab_size}")
    else:
        draft_vocab = args.draft_vocab if args.draft_vocab is not None else DEFAULTS["draft_vocab"]
        if not 1 <= draft_vocab <= tcfg.vocab_size:
            ap.error(f"--draft-vocab {draft_vocab} must be in 1..{tcfg.vocab_size} (the target's vocabulary)")
        cfg = head_config(tcfg, draft_vocab, args.intermediate or DEFAULTS["intermediate"])
        d2t = draft_vocabulary(stream, cfg.vocab_size, cfg.draft_vocab_size)
        head = Eagle3Head(cfg, rngs=nnx.Rngs(args.seed or 0))
        head.d2t.set_value(jnp.asarray(d2t))
        # warm start in the target's output space: its final norm and (tied) embedding rows
        head.norm.set_value(target.final_norm[...])
        head.lm_head.set_value(target.embed[...][np.arange(cfg.draft_vocab_size) + d2t].T)
        aux_layers = default_aux_layers(tcfg.num_layers)
    covered = np.isin(stream, np.arange(cfg.draft_vocab_size) + d2t).mean()
    log(f"draft vocabulary: {cfg.draft_vocab_size} of {cfg.vocab_size} ids cover {covered:.4f} "
        "of training tokens")
    t_graph, t_params = nnx.split(target, nnx.Param)
    h_graph, h_params, h_rest = nnx.split(head, nnx.Param, ...)  # d2t is not trained
    # AdamW at unit rate; train_step scales the update by the scheduled rate
    decay_mask = lambda params: jax.tree.map(lambda x: x.ndim >= 2, params)
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(1.0, b1=0.9, b2=0.95, weight_decay=args.weight_decay,
                                  mask=decay_mask))
    opt_state = opt.init(h_params)
    lr, warmup, planned = args.lr, args.warmup, args.steps
    if args.resume:
        reason, p, o = load_train_state(out, h_params, opt_state)
        if p is None:
            note = (f"note: {reason}; resuming its weights with a fresh optimizer state and a new "
                    "schedule from step 0 (an older head, or one trained elsewhere)")
        else:
            state_info = reason
            h_params = p  # the float32 weights (the head file holds them in bf16)
            if args.new_schedule:
                note = "--new-schedule: the saved weights with a fresh optimizer state and schedule"
            else:
                opt_state, start = o, int(state_info["step"])
                lr = lr if lr is not None else state_info.get("lr")
                warmup = warmup if warmup is not None else state_info.get("warmup")
                planned = planned if planned is not None else state_info.get("planned_steps")
                if planned is not None and planned <= start:
                    ap.error(f"--resume: the head in {out} has done {start} steps of a {planned}-step "
                             "schedule; pass a larger --steps to extend it, or --new-schedule for a "
                             "fresh one (e.g. a cool-down)")
                log(f"resuming at step {start} of {planned}: optimizer state restored from "
                    f"{out.name}/{STATE_DIR}")
        if note:
            log(note)
    lr = lr if lr is not None else DEFAULTS["lr"]
    warmup = warmup if warmup is not None else DEFAULTS["warmup"]
    if args.minutes <= 0 and planned is None:
        ap.error("--minutes 0 needs --steps")
    train_step = make_train_step(t_graph, h_graph, h_rest, opt, aux_layers, args.ttt_steps,
                                 jnp.asarray(d2t))
    # the data order: a new schedule on resumed weights draws batches of its own (seed + 1);
    # a resumed run goes on with its own order (the data seed it saved), skipping what it drew
    seed = args.seed
    if seed is None:  # a resumed run keeps its own
        seed = int(state_info.get("seed", 0)) if start else 0
    data_seed = seed + (1 if args.resume else 0)
    if start:
        if seed != int(state_info.get("seed", 0)):
            ap.error(f"--resume: the run in {out} was started with --seed {state_info.get('seed', 0)}; "
                     f"--seed {seed} would change its data order (leave --seed out, or pass --new-schedule)")
        data_seed = int(state_info.get("data_seed", seed))  # a state saved without it: its seed
    rng = np.random.default_rng(data_seed)
    for _ in range(start):
        rng.integers(0, len(stream) - L, size=args.batch)

    def next_batch():
        offs = rng.integers(0, len(stream) - L, size=args.batch)
        return jnp.asarray(np.stack([stream[o:o + L] for o in offs]).astype(np.int32))

    record = {"args": {**vars(args), "out": out.name}, "config": cfg.to_dict(),
              "aux_layers": list(aux_layers), "draft_vocab_coverage": float(covered),
              "schedule": {"lr": lr, "warmup": warmup}, "start_step": start}
    if note:
        record["note"] = note
    if args.resume and (out / LOG_FILE).is_file():
        try:
            prev = json.loads((out / LOG_FILE).read_text())
        except (OSError, ValueError) as e:
            log(f"note: the earlier {LOG_FILE} is unreadable ({e}); it is replaced")
        else:
            record["previous_runs"] = prev.pop("previous_runs", []) + [prev]
    last_ckpt = time.time()

    def checkpoint(tag):
        nonlocal last_ckpt
        if not all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(h_params)):
            raise NonFiniteError(f"non-finite head weights at {tag}; stopping without checkpointing "
                                 f"(the previous head in {out} is left as it was)")
        # --out was checked before training: what is there now is this run's own (or the
        # head it resumed, or one --overwrite asked to replace)
        save_eagle3(nnx.merge(h_graph, h_params, h_rest), out, dtype="bfloat16", overwrite=True)
        save_train_state(out, h_params, opt_state, {"step": done, "planned_steps": planned, "lr": lr,
                                                    "warmup": warmup, "seed": seed, "data_seed": data_seed})
        record["planned_steps"], record["steps_done"] = planned, done
        record["log"] = lines[-300:]
        atomic_write(out / LOG_FILE, lambda f: f.write(json.dumps(record, indent=1) + "\n"))
        last_ckpt = time.time()
        log(f"checkpoint ({tag}) -> {out.name}")

    deadline = t_start + args.minutes * 60 if args.minutes > 0 else math.inf

    def lr_at(i):  # linear warm-up, cosine to 5% over the planned steps
        warm = min(1.0, (i + 1) / max(1, warmup))
        frac = min(1.0, i / max(1, (planned or 10_000) - 1))
        return lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    acc_sum, n_sum, s0 = None, 0, time.time()
    done = i = start
    t_rate = None
    while planned is None or i < planned:
        if time.time() > deadline:
            log(f"wall-clock budget reached after {i} of {planned} steps")
            break
        if planned is None and i - start == 2 + args.rate_steps:  # 2 compiled; plan from the rate
            rate = args.rate_steps / (time.time() - t_rate)
            planned = max(i + 1, int(i + rate * (deadline - time.time()) * 0.95))
            log(f"measured {rate:.3f} steps/s; plan: --steps {planned}")
        if i - start == 2:
            t_rate = time.time()
        h_new, opt_new, loss, losses, accs = train_step(h_params, t_params, opt_state,
                                                        next_batch(), jnp.float32(lr_at(i)))
        if not np.isfinite(float(loss)):  # (waits for the step: keeps the rate and deadline honest)
            raise NonFiniteError(f"non-finite loss at step {i + 1}; stopping without checkpointing "
                                 f"(the previous head in {out} is left as it was)")
        h_params, opt_state = h_new, opt_new
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
    record["wall_seconds"] = time.time() - t_start
    checkpoint("final")


# ---- evaluation through the engine ---------------------------------------------------------

def evaluate(head, prompts: int = 32, tokens: int = 48, k: int = 4, seed: int = 0) -> dict:
    """Per-position acceptance (the engine's counters, static K) of `head` (an `Eagle3Head`
    or its directory) and of the built-in draft model, on held-out prompts, at temperature
    0 and 1."""
    from dsd_jax import SamplingParams, SpecConfig, SpecEngine

    target, draft, tok = builtin("float32")
    if not isinstance(head, Eagle3Head):
        head = load_eagle3(head, dtype="float32")
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
