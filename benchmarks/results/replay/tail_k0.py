"""Are dynamic's K=0 steps in a group's tail (fewer rows live than it started with) a loss?
All of its K=0 steps at B=2 and 4 fall there in the replay (23% and 29% of steps). This
forces K=1 or K=2 where dynamic chose K=0 in such a tail, on the sweep at B=1-8, the
bench's order and six random ones, with the s17 profile.

    PYTHONPATH=. python tail_k0.py > tail_k0_s17.log
"""
import json, sys, numpy as np
sys.path.insert(0, '.')
import sim
from dsd_jax.profile import Profile
prof = Profile.load('../bench_full_s17.profile.json')
sweep, rollout = json.load(open('sweep.json')), json.load(open('rollout.json'))

class TailK1:
    """Dynamic, but a K=0 choice while fewer rows are live than the unit started with runs K=1."""
    def __init__(self, inner, force):
        self.inner, self.force, self.start_b = inner, force, None
    def __getattr__(self, n):
        return getattr(self.inner, n)
    def choose_k(self, b, **kw):
        k = self.inner.choose_k(b, **kw)
        if self.start_b is None or b > self.start_b:
            self.start_b = b
        return self.force if (k == 0 and b < self.start_b) else k
    def forget_request(self, rid):
        self.inner.forget_request(rid)
    def held_k(self, n, **kw):
        self.start_b = n
        return self.inner.held_k(n, **kw)

ws = [sim.Workload(sweep, None, batch_sizes=(1, 2, 4, 8), seed=s) for s in [None, 1, 2, 3, 4, 5, 6]]
base = sim.speedups(lambda: sim.make_dynamic(prof), ws, prof)
print("dynamic      ", sim.summary(base))
for f in (1, 2):
    r = sim.speedups(lambda: TailK1(sim.make_dynamic(prof), f), ws, prof)
    print(f"tail K0->K{f}  ", sim.summary(r))
st1 = sim.speedups(lambda: sim.static_controller(1), ws, prof)
print("static-1     ", sim.summary(st1))
