"""The `dsd-jax` command line: `profile`, `generate`, `bench`, `demo`.

    dsd-jax profile --target T --draft D --context-lengths 128,512 --out profile.json
    dsd-jax profile --synthetic llama-3.1-8b --draft-synthetic llama-3.2-1b --acceptance 0.68,0.39,0.2,0.1
    dsd-jax generate --prompts prompts.txt --profile profile.json --temperature 0 > out.jsonl
    dsd-jax bench --quick --json bench.json
    dsd-jax demo --out-dir ./dsd_jax_demo

Models: `--target DIR` / `--draft DIR` are checkpoints written by
`dsd_jax.models.save`; `--hf-target DIR` / `--hf-draft DIR` are local Hugging Face
safetensors directories (`dsd_jax.models.load_hf`); with neither, the built-in pair
(`dsd_jax.models.builtin()`). Everything runs in this process (no subprocess, no
shell). Every bad argument is a `SystemExit` whose message names the flag; what the
library finds wrong with an input (`dsd_jax.loading.ArgumentError`: a missing directory,
a bad prompt file) `main` turns into the same exit. No command writes an output over one of its
inputs (or into a model directory or the compilation cache) or over another output, or replaces
an existing file without `--overwrite` (`demo`: the files it writes in --out-dir); all of that, and
that each output's directory takes files, is checked before any model is loaded, and an
output is written to a temporary file renamed over it, so a failed write loses no earlier
result. The commands parse flags and call into
the library (`dsd_jax.loading`, `dsd_jax.profiler`, `dsd_jax.bench`); nothing in the library
imports this package (`tests/test_layout.py`).

Modules: `flags` (argparse types, shared flag groups), `common` (the speculative config, the
up-front output checks, the engine), and one per command: `profile_command`,
`generate_command`, `bench_commands` (bench and demo).
"""

from __future__ import annotations

import argparse
import os
import sys

from dsd_jax import loading
from dsd_jax.cli import bench_commands, generate_command, profile_command
from dsd_jax.cli.flags import error
from dsd_jax.map_budget import MapLimitError

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsd-jax", description="Dynamic speculative decoding for JAX/XLA.")
    sub = parser.add_subparsers(dest="command", metavar="{profile,generate,bench,demo}")
    for add in (profile_command.add_parser, generate_command.add_parser,
                bench_commands.add_bench_parser, bench_commands.add_demo_parser):
        add(sub)
    return parser


BROKEN_PIPE_STATUS = 141  # 128 + SIGPIPE (13): main's status when the reader of stdout left


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except loading.ArgumentError as e:  # a bad input found by the library, named by its flag
        error(args.command, e.flag, e.message)
    except MapLimitError as e:  # the programs would not fit this machine's memory-map limit
        error(args.command, None, str(e))
    except BrokenPipeError:
        # The reader of stdout left (`dsd-jax generate ... | head -1`): no traceback. Python's
        # recipe (docs: "Note on SIGPIPE"): point stdout at devnull, so that the flush at exit
        # does not fail again, and exit 141 = 128 + SIGPIPE, the status a shell reports for a
        # command that SIGPIPE ended (as `yes | head -1` leaves `yes`).
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (AttributeError, OSError, ValueError):  # a stdout without a descriptor (a test's capture)
            pass
        return BROKEN_PIPE_STATUS
