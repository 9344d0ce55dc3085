"""Structural checks of the compiled programs: no whole-KV-cache work.

A step's cost must follow what it reads and writes, not the cache's capacity. The
failure this guards against is silent: XLA's copy insertion materialising a copy of
every layer's cache each step (it did, 64 copies per target forward, before
`kernels.attend_and_write`). So compile the real programs and read their HLO: every
instruction whose result has a KV buffer's shape must be the in-place update itself
(a scatter or dynamic-update-slice, alone or as a fusion's root) or plumbing (a
parameter, a loop, a tuple element). A copy, or a fusion computing a new cache-sized
value, fails. Not a timing test.

Likewise a round must not read the per-slot allowed-id and logit-bias lists unless a live
row has one: only a conditional's branch may compute on values that wide.
"""

from __future__ import annotations

import re

import pytest

from conftest import FixedK, make_engine, tiny_config
from dsd_jax import models

PLUMBING = {"parameter", "get-tuple-element", "tuple", "while", "conditional", "bitcast",
            "call", "opt-barrier"}
IN_PLACE = {"scatter", "dynamic-update-slice"}
INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+\[[\d,]*\])(?:\{[^}]*\})? ([\w-]+)\((.*)$")


def _computations(hlo: str) -> dict[str, list[str]]:
    comps, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%(\S+) ", line)
        if head and line.rstrip().endswith("{"):
            name = head.group(1)
            comps[name] = []
        elif name is not None and line.strip() and line.strip() != "}":
            comps[name].append(line)
    return comps


def _root_opcode(lines: list[str]) -> str:
    for line in lines:
        if line.lstrip().startswith("ROOT"):
            return INSTR.match(line).group(3)
    raise AssertionError("computation without ROOT")


def whole_cache_ops(hlo: str, cache_shapes: set[str]) -> list[str]:
    """Instructions producing a value of a KV buffer's shape that are not the in-place
    update or plumbing: each is whole-cache work."""
    comps = _computations(hlo)
    bad = []
    for lines in comps.values():
        for line in lines:
            m = INSTR.match(line)
            if not m or m.group(2) not in cache_shapes:
                continue
            op = m.group(3)
            if op in PLUMBING or op in IN_PLACE:
                continue
            if op == "fusion":
                called = re.search(r"calls=%([\w.-]+)", line).group(1)
                if _root_opcode(comps[called]) in IN_PLACE:
                    continue
            bad.append(line.strip()[:160])
    return bad


HLO_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def _shape_str(x) -> str:
    return f"{HLO_DTYPES[str(x.dtype)]}[{','.join(map(str, x.shape))}]"


@pytest.fixture(scope="module")
def engine():
    target = models.init_model(tiny_config(), seed=0)
    draft = models.init_model(tiny_config(num_layers=1, hidden_size=16, intermediate_size=32,
                                          num_heads=2, num_kv_heads=1), seed=1)
    # 4 slots, buckets 1/2/4: B < N programs exercise the row selection too
    return make_engine(target, draft, FixedK([2]), max_batch_size=4, max_seq_len=96, batch_buckets=(1, 2, 4),
                       method="draft_model", num_speculative_tokens=2)


def _cache_shapes(engine) -> set[str]:
    kv = [engine.state.target_kv, engine.state.drafter.kv]
    return {_shape_str(x) for cache in kv for x in cache.k + cache.v}


@pytest.mark.parametrize("program", [
    ("step", 0, 1), ("step", 2, 1), ("step", 2, 2), ("step", 1, 4),
    ("prefill", 1, 16), ("prefill", 2, 16), ("move", 1), ("slot_rows", 1), ("copy", 2), ("copy", 4)])
def test_no_whole_cache_work(engine, program):
    exe = getattr(engine.programs, program[0])(*program[1:])
    hlo = exe.as_text()
    assert "custom-call" not in hlo or "Pallas" not in hlo  # the XLA path is what runs on CPU
    bad = whole_cache_ops(hlo, _cache_shapes(engine))
    assert not bad, f"{program}: whole-cache ops in the compiled HLO:\n" + "\n".join(bad)


REFERENCES = re.compile(r"(?:calls|to_apply|body|condition)=%([\w.\-]+)")


def unconditional_ops(hlo: str, width: int) -> list[str]:
    """Instructions computing a value [..., width] wide that run whatever the data: those
    reachable from the entry without entering a conditional's branch (plumbing aside)."""
    comps = _computations(hlo)
    entry = re.search(r"^ENTRY %(\S+) ", hlo, re.M).group(1)
    seen, todo, found = set(), [entry], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in comps[name]:
            m = INSTR.match(line)
            if not m:
                continue
            if m.group(3) != "conditional":  # a branch runs only when its case holds
                todo += REFERENCES.findall(line)
            if re.search(rf",{width}\]", m.group(2)) and m.group(3) not in PLUMBING | {"slice"}:
                found.append(f"{name}: {line.strip()[:160]}")
    return found


@pytest.mark.parametrize("program", [("step", 2, 4), ("step", 1, 2)])
def test_rounds_read_the_id_lists_only_when_a_live_row_has_one(engine, program):
    """allowed_token_ids and logit_bias are [slots, 4096] and [slots, 300] on the device.
    Whether a live row lists any reads column 0 (`sampling.lists_any`); the whole lists are
    read only in the branch that applies them (scanning every column each round made a
    small model's round up to 1.3x as long on CPU: `lists_any`)."""
    from dsd_jax.sampling import MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS
    hlo = getattr(engine.programs, program[0])(*program[1:]).as_text()
    for width in (MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS):
        assert not unconditional_ops(hlo, width), (width, unconditional_ops(hlo, width)[:5])


def test_the_list_check_catches_a_scan_of_every_column(engine, monkeypatch):
    """Not vacuous: scanning every column, as before `lists_any`, is caught."""
    import jax.numpy as jnp
    from dsd_jax import sampling
    monkeypatch.setattr(sampling, "lists_any", lambda ids: jnp.any(ids >= 0, axis=-1))
    hlo = engine.programs.step_with_drafter(engine.programs.drafter, 2, 4).as_text()
    assert unconditional_ops(hlo, sampling.MAX_ALLOWED_TOKEN_IDS)


def test_checker_catches_a_whole_cache_copy(engine):
    """The check is not vacuous: the pre-fix pattern (scatter into the cache, then read
    the updated buffer outside any loop) compiles to whole-cache copies, and is caught."""
    import jax
    import jax.numpy as jnp

    cache = engine.state.target_kv.k[0]

    def write_then_read(cache, new, pos):
        cache = cache.at[:, :, pos].set(new)
        return cache, jnp.einsum("bhsd,bhsd->bh", cache, cache)

    new = jnp.zeros((cache.shape[0], cache.shape[1], cache.shape[3]), cache.dtype)
    hlo = jax.jit(write_then_read, donate_argnums=0).lower(cache, new, 3).compile().as_text()
    assert whole_cache_ops(hlo, {_shape_str(cache)})


def test_group_copy_needs_no_second_cache(engine):
    """Copying a group's prefilled prompt into its siblings' slots (SamplingParams.n > 1)
    gathered every source row first: n rows of every layer's cache at once, at n = the slot
    count a second whole cache (20 GiB for 8B + 1B at 64 slots x 2048). Pair by pair in
    place, the program's scratch is about one slot's rows."""
    import jax
    slots = engine.max_batch_size
    kv = sum(x.nbytes for x in jax.tree.leaves((engine.state.target_kv, engine.state.drafter)))
    temp = engine.programs.copy(slots).memory_analysis().temp_size_in_bytes
    assert temp < 2 * kv / slots, (temp, kv)


def test_batched_slot_moves_work_in_place_and_hold_only_their_rows():
    """16 slots move up to 2 swaps a call: the move does no whole-cache work, and the rows
    program, which holds the destinations' rows, holds no more than those."""
    import jax
    from dsd_jax import step
    target = models.init_model(tiny_config(), seed=0)
    draft = models.init_model(tiny_config(num_layers=1, hidden_size=16, intermediate_size=32,
                                          num_heads=2, num_kv_heads=1), seed=1)
    engine = make_engine(target, draft, FixedK([2]), max_batch_size=16, max_seq_len=96,
                         method="draft_model", num_speculative_tokens=2)
    assert engine.programs.move_rows == (1, 2)
    slot_bytes = sum(x.nbytes // 16 for x in jax.tree.leaves(step.per_slot(engine.state)))
    for program in ("move", "slot_rows"):
        bad = whole_cache_ops(getattr(engine.programs, program)(2).as_text(), _cache_shapes(engine))
        assert not bad, f"{program}(2): whole-cache ops in the compiled HLO:\n" + "\n".join(bad)
    rows = engine.programs.slot_rows(2).memory_analysis()
    assert rows.output_size_in_bytes + rows.temp_size_in_bytes < 3 * slot_bytes, slot_bytes  # 2 rows, aligned


def test_memory_report_counts_the_programs_scratch(engine):
    """memory_report gave params and state only; a step's scratch (logits, probabilities, noise
    over [B, K+1, V]) was nowhere, so a size that 'fit' ran out of memory at run time. Once
    programs are compiled it reports the largest scratch among them."""
    engine.programs.step(2, 4)
    engine.programs.copy(4)
    report = engine.memory_report()
    temps = [engine.programs.step(2, 4).memory_analysis().temp_size_in_bytes,
             engine.programs.copy(4).memory_analysis().temp_size_in_bytes]
    assert report["scratch"] >= max(temps) > 0
    assert report["total_with_scratch"] == report["total"] + report["scratch"]
