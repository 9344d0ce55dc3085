"""Replay (true step times, as replay_thompson.py): ROW_PRIOR_STEPS, the weight of the shrink
target in a row's own estimate, at 4 (shipped), 8 and 16."""
import sys
sys.argv = [sys.argv[0]]
exec(open("benchmarks/results/fresh_row_draft/replay_thompson.py").read().split("variants = {")[0])
import dsd_jax.acceptance as A

def with_prior_steps(m):
    def make():
        A.ROW_PRIOR_STEPS = m
        return sim.make_dynamic(prof)
    return make

n = len(sweep["agreement"])
for b in (1, 2, 4, 8, 16):
    parts = []
    for name, make in (("static-0", lambda: sim.static_controller(0)), ("static-1", lambda: sim.static_controller(1)),
                       ("prior-4", with_prior_steps(4)), ("prior-8", with_prior_steps(8)), ("prior-16", with_prior_steps(16))):
        t = []
        for seed in range(8):
            order = np.random.default_rng(100 + seed).permutation(n)
            t.append(sequence.total_ms(make(), sweep, order, b, truth))
        parts.append((name, np.array(t)))
    A.ROW_PRIOR_STEPS = 4
    k0 = parts[0][1]
    print(f"B={b}: " + "  ".join(f"{name} {np.exp(np.log(k0 / v).mean()):.3f}" for name, v in parts), flush=True)
