"""Replay (true step times, as replay_thompson.py): the makespan objective against its slowest-row
mean alone (no spread: z = 0) and the throughput objective."""
import sys
sys.argv = [sys.argv[0]]
exec(open("benchmarks/results/fresh_row_draft/replay_thompson.py").read().split("variants = {")[0])
import dsd_jax.acceptance as A
def no_spread(ctl):
    rq = ctl._requests
    orig = rq.makespan_steps
    def steps(rows, rem, k, batch_size, acceptance=None):
        return orig(rows, rem, k, 1, acceptance=acceptance)  # z = 0: the slowest row's mean steps
    rq.makespan_steps = steps
    return ctl
variants = {"static-0": lambda: sim.static_controller(0), "static-1": lambda: sim.static_controller(1),
            "dynamic": lambda: sim.make_dynamic(prof),
            "no-spread": lambda: no_spread(sim.make_dynamic(prof)),
            "throughput": lambda: sim.Controller(sim.SpecConfig(method="draft_model", num_speculative_tokens=6,
                dynamic=sim.DynamicConfig(objective="throughput")), prof, 64, batch_buckets=sim.BUCKETS)}
n = len(sweep["agreement"])
for b in (1, 2, 4, 8, 16):
    times = {name: [] for name in variants}
    for seed in range(8):
        order = np.random.default_rng(100 + seed).permutation(n)
        for name, make in variants.items():
            times[name].append(sequence.total_ms(make(), sweep, order, b, truth))
    k0 = np.array(times["static-0"])
    print(f"B={b}: " + "  ".join(f"{name} {np.exp(np.log(k0 / np.array(v)).mean()):.3f}" for name, v in times.items()), flush=True)
