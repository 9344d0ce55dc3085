"""Where a dispatch's own cost goes on XLA:CPU: the compiled (K=4, bucket 1) step program
called directly, on a state with one live row (the built-in pair).

1. Paired: 8 one-round dispatches (pipelined as the engine does: launch the next, then
   read the last) against one 8-round dispatch, interleaved; the difference over 7 is
   a dispatch's cost. At two max_seq_len, so a copy of the state would show as growth.
2. A call that runs no round (num_rounds 0) of each (K, bucket) program, beside an identity
   program over the same arguments (the state donated and returned): the program's own
   entry and exit.
3. A switch of program: 8 one-round dispatches alternating K=4 and K=5 (bucket 2, two live
   rows) against 8 of K=4 and 8 of K=5, interleaved.

    python benchmarks/results/controller_host/dispatch_cost.py [reps] > dispatch_cost.log
"""

import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dsd_jax import SpecConfig, SpecEngine
from dsd_jax.models import builtin


def engine(max_seq_len: int, max_k: int):
    target, draft, _ = builtin()
    eng = SpecEngine(target, draft, SpecConfig(method="draft_model", num_speculative_tokens=max_k),
                     max_batch_size=4, max_seq_len=max_seq_len, batch_buckets=[1, 2, 4])
    eng.warmup()
    return eng


def live_rows(state, rows: int = 1):
    """The state with its first `rows` slots live at 64 tokens and no length limit in reach."""
    n = state.length.shape[0]
    return state._replace(active=jnp.asarray(np.arange(n) < rows), length=jnp.full((n,), 64, jnp.int32),
                          limit=jnp.full((n,), 10**6, jnp.int32))


def rewind(state):
    """Back to 64 tokens, so every arm runs the same positions."""
    return jax.block_until_ready(state._replace(length=jnp.full(state.length.shape, 64, jnp.int32)))


def pipelined(programs, params, state, ks, rounds=1):
    """One dispatch of `rounds` rounds per K in `ks`, as the engine runs them: launch the next,
    then read the last back."""
    last = None
    for k in ks:
        state, out = programs[k](*params, state, np.int32(rounds))
        if last is not None:
            np.asarray(last)
        last = out
    np.asarray(last)
    return state


def interleaved(arms: dict, reps: int, run) -> dict:
    """{arm: [seconds]}: each rep runs every arm once, in a rotated order."""
    times = {name: [] for name in arms}
    names = list(arms)
    for rep in range(reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            t0 = time.perf_counter()
            run(arms[name])
            times[name].append(time.perf_counter() - t0)
    return times


def bootstrap_median(x: np.ndarray) -> tuple[float, float]:
    boot = [np.median(np.random.default_rng(i).choice(x, x.size)) for i in range(2000)]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return lo, hi


def paired(max_seq_len: int, reps: int, k: int = 4, n: int = 8) -> None:
    eng = engine(max_seq_len, k)
    state = [live_rows(eng.state)]
    programs, params = {k: eng.programs.step(k, 1)}, (eng._target_params, eng._draft_params)
    state_mib = sum(x.nbytes for x in jax.tree.leaves(state[0])) / 2**20

    def run(arm):  # (ks, rounds a dispatch)
        state[0] = pipelined(programs, params, rewind(state[0]), *arm)

    times = interleaved({"one": ([k], n), "many": ([k] * n, 1)}, reps, run)
    per = (np.array(times["many"]) - np.array(times["one"])) / (n - 1) * 1e3
    lo, hi = bootstrap_median(per)
    print(f"max_seq_len {max_seq_len} (state {state_mib:.1f} MiB): one {n}-round dispatch "
          f"{1e3 * np.median(times['one']):.1f} ms, {n} one-round dispatches {1e3 * np.median(times['many']):.1f} ms "
          f"-> {np.median(per):.2f} ms a dispatch [{lo:.2f}, {hi:.2f}] ({reps} pairs)", flush=True)


def switches(reps: int, ks=(4, 5), n: int = 8) -> None:
    eng = engine(448, max(ks))
    state = [live_rows(eng.state, 2)]
    programs, params = {k: eng.programs.step(k, 2) for k in ks}, (eng._target_params, eng._draft_params)

    def run(arm):
        state[0] = pipelined(programs, params, rewind(state[0]), arm)

    arms = {"alternating": list(ks) * (n // 2), **{f"K={k}": [k] * n for k in ks}}
    times = {name: np.array(v) for name, v in interleaved(arms, reps, run).items()}
    extra = (times["alternating"] - sum(times[f"K={k}"] for k in ks) / len(ks)) / (n - 1) * 1e3
    lo, hi = bootstrap_median(extra)
    print(f"{n} one-round dispatches at bucket 2 (two live rows): "
          + ", ".join(f"{name} {1e3 * np.median(v):.1f} ms" for name, v in times.items())
          + f" -> {np.median(extra):.2f} ms a switch [{lo:.2f}, {hi:.2f}] ({reps} reps)", flush=True)


def zero_rounds(calls: int = 300) -> None:
    eng = engine(448, 6)
    st, tp, dp = eng.state, eng._target_params, eng._draft_params

    def timed(prog):
        nonlocal st
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            st, out = prog(tp, dp, st, np.int32(0))
            np.asarray(out)
            ts.append(time.perf_counter() - t0)
        return 1e3 * np.median(ts)

    identity = jax.jit(lambda tp, dp, st, r: (st, r), donate_argnums=2).lower(tp, dp, st, np.int32(0)).compile()
    print(f"identity program over the same arguments: {timed(identity):.3f} ms a call")
    for k, b in ((0, 1), (1, 1), (4, 1), (6, 1), (6, 4)):
        prog = eng.programs.step(k, b)
        instructions = len(re.findall(r"^\s+%\S+ = ", prog.as_text(), re.M))
        temp = prog.memory_analysis().temp_size_in_bytes / 2**20
        print(f"K={k} bucket {b}: a call of no round {timed(prog):.3f} ms ({instructions} HLO instructions, "
              f"temp {temp:.2f} MiB)", flush=True)


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    for max_seq_len in (448, 1792):
        paired(max_seq_len, reps)
    zero_rounds()
    switches(reps)


if __name__ == "__main__":
    main()
