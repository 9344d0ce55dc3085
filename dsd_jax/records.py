"""`dsd-jax generate`'s JSONL records: written in prompt order as they finish, kept in
FILE.partial until the run ends (then renamed to FILE), and resumed from there.

A run with `--out FILE` also writes the settings that decide its records (sampling flags,
models, speculative config) to FILE.partial.settings.json before the first record. A run
that stops (killed, Ctrl-C, a full disk) leaves FILE as it was and the finished records in
FILE.partial; `--resume` checks the settings and each kept record against its prompt,
drops a last line torn by the kill, and generates only the prompts after the kept ones.
Request i is seeded `--seed + i` whichever run generates it, so a greedy run resumes to
the records an uninterrupted run writes, and so does a sampled one with --seed under
drafter-invariant acceptance (under rejection acceptance a sampled record is an exact
sample either way, but its tokens depend on the drafts, which depend on the batch). Both up
to floating point: the resumed run batches other requests together, and on a GPU another
batch shape can round a near-tie of two logits the other way.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from dsd_jax import loading

PARTIAL = ".partial"  # --out's records while the run goes on: renamed to --out at the end
SETTINGS = ".settings.json"  # beside the partial file: what its records were generated with


def partial_path(out: str | None) -> str | None:
    """Where `generate --out` keeps its records until the run ends (beside the file a symlink
    names), or None: no --out, or one written in place (`layout.writes_through`)."""
    if not out or loading.writes_through(out):
        return None
    return os.path.realpath(out) + PARTIAL


def settings_path(out: str | None) -> str | None:
    """The settings file beside `partial_path(out)` (None where that is None)."""
    partial = partial_path(out)
    return None if partial is None else partial + SETTINGS


class InOrder:
    """`generate(on_output=)` writing one JSON line per request in prompt order as they
    finish: a request finishing early waits for those before it; each line is flushed, so a
    run that stops midway has written every record before the first unfinished one.
    `first`: the index of the first prompt this run generates (a resumed run's kept
    records come before it); the engine's request i is prompt first + i."""

    def __init__(self, logprobs: bool, raw_prompts, prompts, f, out: str | None = None, first: int = 0):
        self.logprobs, self.raw_prompts, self.prompts, self.f = logprobs, raw_prompts, prompts, f
        self.out = out  # --out (a failed write names it); None: stdout, whose errors pass as they are
        self.first = self.next = first
        self.waiting: dict[int, Any] = {}

    def __call__(self, i: int, out) -> None:
        self.waiting[self.first + i] = out
        while self.next in self.waiting:
            with loading.writing("--out", self.out) if self.out else contextlib.nullcontext():
                self.f.write(self.line(self.next, self.waiting.pop(self.next)))
                self.f.flush()
            self.next += 1

    def line(self, i: int, o) -> str:
        rec: dict[str, Any] = {"prompt": self.raw_prompts[i].get("prompt"), "prompt_token_ids": self.prompts[i],
                               "text": o.text, "token_ids": o.token_ids, "finish_reason": o.finish_reason,
                               "stop_reason": o.stop_reason}
        if self.logprobs:
            rec["logprobs"] = o.logprobs
            rec["raw_logprobs"] = o.raw_logprobs
        # JSON keys are strings: each entry as [id, logprob] pairs, likeliest first
        pairs = lambda entries: [None if e is None else [[t, lp] for t, lp in e.items()] for e in entries]
        if o.top_logprobs is not None:
            rec["top_logprobs"] = pairs(o.top_logprobs)
        if o.prompt_logprobs is not None:
            rec["prompt_logprobs"] = pairs(o.prompt_logprobs)
        return json.dumps(rec, ensure_ascii=False) + "\n"


def write_settings(out: str, settings: dict) -> None:
    """The run's settings beside its partial file (before its first record)."""
    path = settings_path(out)
    text = json.dumps(settings, indent=1, sort_keys=True) + "\n"
    with loading.writing("--out", path):
        loading.atomic_write(path, lambda f: f.write(text))


def finish(out: str) -> None:
    """The run is complete: its partial file becomes --out, and its settings go."""
    with loading.writing("--out", out):
        os.replace(partial_path(out), os.path.realpath(out))
        with contextlib.suppress(FileNotFoundError):
            os.remove(settings_path(out))


def discard(out: str) -> None:
    """Nothing finished: neither an empty partial file nor its settings stay to be refused
    (or resumed) next time."""
    for path in (partial_path(out), settings_path(out)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def check_settings(out: str, settings: dict, added: dict | None = None) -> None:
    """Raises `loading.ArgumentError` (flag --resume) where the interrupted `--out` run's
    saved settings differ from `settings` in a key `settings` has (a run checks its flags
    before loading models, the rest after); nothing to check without a partial file.
    added: settings newer than some saved files, with the value a file lacking one meant."""
    if os.path.exists(partial_path(out)):
        _check_settings(out, settings, set(settings), added)


def resumable(out: str, settings: dict, prompts: list, added: dict | None = None,
              texts: list | None = None) -> int:
    """How many records of an interrupted `--out` run can be kept: those in its partial file,
    each checked against its prompt (`prompts`: token-id lists; `texts`: each prompt's text,
    None for token ids, as a record's "prompt" holds it), after checking that the run
    was started with `settings`. A last line the kill tore (no newline) is cut from the file;
    any other line that is not a record is an error. 0 when there is no partial file. Raises
    `loading.ArgumentError` (flag --resume) naming what does not match. added: as
    `check_settings`."""
    partial, saved_at = partial_path(out), settings_path(out)
    if not os.path.exists(partial):
        if os.path.exists(saved_at):
            os.remove(saved_at)  # a run that stopped before its first record
        return 0
    _check_settings(out, settings, None, added)
    kept, size = _complete_records(partial)
    if len(kept) > len(prompts):
        raise loading.ArgumentError("--resume", f"{partial!r} holds {len(kept)} records and --prompts "
                                    f"{len(prompts)} prompts: it is another run's")
    for i, rec in enumerate(kept):
        differs = ("prompt_token_ids" if rec.get("prompt_token_ids") != list(prompts[i]) else
                   "prompt" if texts is not None and rec.get("prompt") != texts[i] else None)
        if differs:  # ("prompt": the same ids from another text, or from a JSONL file of ids)
            raise loading.ArgumentError("--resume", f"record {i + 1} of {partial!r} is not for prompt {i + 1} "
                                        f"of --prompts (its {differs} field differs): it is another run's, or "
                                        "--prompts changed")
    with loading.writing("--out", partial):
        os.truncate(partial, size)
    return len(kept)


def _check_settings(out: str, settings: dict, keys: set | None, added: dict | None) -> None:
    """The saved settings of the `--out` run against `settings`, on `keys` (None: all)."""
    partial, saved_at = partial_path(out), settings_path(out)
    if not os.path.exists(saved_at):
        raise loading.ArgumentError("--resume", f"{partial!r} has no settings file beside it ({saved_at!r}), "
                                    "so what its records were generated with is unknown; pass --overwrite "
                                    "to start over")
    try:
        with open(saved_at, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise loading.ArgumentError("--resume", f"cannot read {saved_at!r}: {e}") from e
    if not isinstance(saved, dict):
        raise loading.ArgumentError("--resume", f"{saved_at!r} is not a settings file")
    saved = {**(added or {}), **saved}  # a file from before a setting existed was run without it
    keys = set(saved) | set(settings) if keys is None else keys
    differ = sorted(k for k in keys if saved.get(k) != settings.get(k))
    if differ:
        was = ", ".join(f"{k} {saved.get(k)!r} (now {settings.get(k)!r})" for k in differ)
        raise loading.ArgumentError("--resume", f"{partial!r} was generated with other settings: {was}; "
                                    "resume with the same ones, or pass --overwrite to start over")


def _complete_records(partial: str) -> tuple[list[dict], int]:
    """(the JSON records of `partial` before a torn last line, the bytes they take up)."""
    with open(partial, "rb") as f:
        data = f.read()
    kept, size = [], 0
    # each record is written with its newline in one flushed write: what follows the last
    # newline is a record the kill cut short, to be generated again
    for n, raw in enumerate(data.split(b"\n")[:-1]):
        try:
            rec = json.loads(raw.decode("utf-8"))
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise loading.ArgumentError("--resume", f"line {n + 1} of {partial!r} is not a generate record")
        kept.append(rec)
        size += len(raw) + 1
    return kept, size
