"""The `dsd-jax` commands' shared flags: argparse types, the model and engine flag groups,
and the one way a command fails on a bad flag (`error`: a `SystemExit` naming the flag)."""

from __future__ import annotations

import argparse
import math

from dsd_jax import loading
from dsd_jax.models.argtypes import int_at_least, positive_int


def error(cmd: str, flag: str | None, msg: str):
    where = f"{flag}: " if flag else ""
    raise SystemExit(f"dsd-jax {cmd}: error: {where}{msg}")


def number_list(convert, what: str, low=-math.inf):
    """An argparse type: a non-empty comma-separated list of finite `convert(item)`s >= low."""
    def parse(text: str) -> list:
        try:
            out = [convert(x) for x in text.split(",") if x.strip()]
        except ValueError:
            out = []
        if not out or any(not math.isfinite(x) or x < low for x in out):
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}")
        return out
    return parse


int_list = number_list(int, "integers")
float_list = number_list(float, "finite numbers")
nonneg_float_list = number_list(float, "finite numbers >= 0", low=0.0)


def logit_bias(text: str) -> dict[int, float]:
    """ID=BIAS,ID=BIAS: token ids and the biases added to their logits (ranges: `SamplingParams`)."""
    out = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        token, _, bias = item.partition("=")
        try:
            token, bias = int(token), float(bias)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected ID=BIAS,ID=BIAS,... (integer ids, numeric biases), "
                                             f"got {item!r}") from None
        if token in out:
            raise argparse.ArgumentTypeError(f"token id {token} is given twice")
        out[token] = bias
    if not out:
        raise argparse.ArgumentTypeError(f"expected ID=BIAS,ID=BIAS,..., got {text!r}")
    return out


def str_list(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return out


SEED_LIMIT = 2 ** 32  # seeds are taken modulo this: a larger one would repeat a smaller one's samples
seed_value = int_at_least(0, "an integer in [0, 2**32 - 1]", SEED_LIMIT - 1)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models (default: the built-in pair)")
    g.add_argument("--target", metavar="DIR", help="target checkpoint saved by dsd_jax.models.save")
    g.add_argument("--draft", metavar="DIR", help="draft checkpoint saved by dsd_jax.models.save")
    g.add_argument("--hf-target", metavar="DIR", help="target: local Hugging Face safetensors directory")
    g.add_argument("--hf-draft", metavar="DIR", help="draft: local Hugging Face safetensors directory")
    g.add_argument("--tokenizer", metavar="FILE", help="tokenizer.json (default: the HF dir's or the "
                   "built-in one)")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="parameter dtype (default auto: each checkpoint's own, bfloat16 where its config "
                        "says so; float32 for the built-in pair, bfloat16 for --synthetic; an EAGLE-3 head "
                        "takes the target's)")


def mesh_shape(text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdecimal() and int(p) >= 1 for p in parts):
        raise argparse.ArgumentTypeError(f"expected DATAxMODEL with positive integers (e.g. 1x4), got {text!r}")
    return int(parts[0]), int(parts[1])


def add_engine_flags(p: argparse.ArgumentParser, max_batch: int, max_seq: int) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--speculative-config", metavar="JSON",
                   help="vLLM-style speculative config: a JSON string or a path to a JSON file "
                        "(default: draft model, num_speculative_tokens 4)")
    g.add_argument("--method", metavar="NAME",
                   help="speculative method, e.g. eagle3 (the built-in head unless the speculative "
                        "config names \"model\"): short for --speculative-config '{\"method\": NAME}', "
                        "or the method of a --speculative-config that names none")
    g.add_argument("--max-batch-size", type=positive_int, default=max_batch,
                   help=f"live request slots (default {max_batch})")
    g.add_argument("--max-seq-len", type=positive_int, default=max_seq,
                   help=f"prompt + output tokens per request (default {max_seq})")
    g.add_argument("--prefill-chunk", type=positive_int, default=256, help="prompt chunk (default 256)")
    g.add_argument("--backend", choices=("auto", "xla", "pallas", "interpret"), default="auto",
                   help="kernel backend (default auto)")
    g.add_argument("--compilation-cache-dir", metavar="DIR",
                   help="persistent XLA compilation cache (makes the next start fast)")
    g.add_argument("--seed", type=seed_value, default=None,
                   help="sampling seed in [0, 2**32 - 1] (request i uses seed + i)")
    g.add_argument("--mesh", type=mesh_shape, metavar="DATAxMODEL",
                   help="run on a device mesh, e.g. 1x4: tensor parallel over 4 devices (default: one device)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_prompt_format_flag(p) -> None:
    p.add_argument("--prompt-format", choices=loading.PROMPT_FORMATS, default="auto",
                   help="how to read --prompts: text (a prompt per line), jsonl, or auto (default: "
                        "JSONL when the first line starts with '{' or the file is *.jsonl)")


def add_overwrite_flag(p: argparse.ArgumentParser, outputs: str) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help=f"replace an existing file named by {outputs} (default: refuse, so that an "
                        "earlier result is not lost)")
