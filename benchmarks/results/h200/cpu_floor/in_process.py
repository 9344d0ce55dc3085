"""Where a draft token's cost goes inside the step, all in one process, interleaved: the step
(spec_step), the same step with zero drafts and no draft model (verify_only), and the
drafter alone (propose; catch_up then propose). B = argv[1], 128 committed tokens, built-in pair."""
import sys, time, statistics, functools
import numpy as np, jax, jax.numpy as jnp
import dsd_jax as dsd
from dsd_jax.models.builtin import builtin
from dsd_jax import step as step_lib
from dsd_jax import profiler as P
from dsd_jax.drafters.base import DraftContext

B = int(sys.argv[1]) if len(sys.argv) > 1 else 1
target, draft, _ = builtin()
eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=4), max_batch_size=B,
                     max_seq_len=256, batch_buckets=(B,))
progs = P._state_programs(eng)
state = eng.state; eng.state = None
state = progs.fill(state, jax.random.PRNGKey(0), eng.target_config.vocab_size, 0.0)
dr = eng.drafter if hasattr(eng, "drafter") else eng.programs.drafter
tg = eng.programs._graph
opts = eng.programs.opts
tp, dp = eng._target_params, eng._draft_params

def one_step(K, tp, dp, st):
    st, out = step_lib.spec_step(tg, dr, opts, K, B, tp, dp, st)
    return st, out.tokens
def propose_only(K, tp, dp, st):
    ctx = DraftContext(st.tokens[:B], st.length[:B], st.active[:B], st.temperature[:B], st.top_k[:B], st.top_p[:B], st.seed[:B])
    params = dr.bind_params(dp, tg, tp)
    prop = dr.propose(params, st.drafter, ctx, K)
    return st._replace(drafter=prop.state), prop.drafts
def catch_propose(K, tp, dp, st):
    ctx = DraftContext(st.tokens[:B], st.length[:B], st.active[:B], st.temperature[:B], st.top_k[:B], st.top_p[:B], st.seed[:B])
    params = dr.bind_params(dp, tg, tp)
    ds = dr.catch_up(params, st.drafter, ctx)
    prop = dr.propose(params, ds, ctx, K)
    return st._replace(drafter=prop.state), prop.drafts

import dataclasses
from dsd_jax.drafters.base import Proposal
from dsd_jax.drafters.draft_model import DraftModel
class ZeroDraft(DraftModel):
    def propose(self, params, state, ctx, K):
        return Proposal(jnp.zeros((ctx.length.shape[0], K), jnp.int32), None, state)
    def catch_up(self, params, state, ctx):
        return state
zd = ZeroDraft(**{f.name: getattr(dr, f.name) for f in dataclasses.fields(dr)})
def verify_only(K, tp, dp, st):
    st, out = step_lib.spec_step(tg, zd, opts, K, B, tp, dp, st)
    return st, out.tokens
fns = {}
for K in range(5):
    pass
    fns[("spec_step", K)] = jax.jit(functools.partial(one_step, K), donate_argnums=2)
    fns[("verify_only", K)] = jax.jit(functools.partial(verify_only, K), donate_argnums=2)
    if K:
        fns[("propose", K)] = jax.jit(functools.partial(propose_only, K), donate_argnums=2)
        fns[("catch+propose", K)] = jax.jit(functools.partial(catch_propose, K), donate_argnums=2)

def run(key, st):
    st = progs.reset(st, np.int32(B), np.int32(128), np.int32(0)); jax.block_until_ready(st)
    f = fns[key]
    t0 = time.perf_counter()
    if key[0] == "rounds":
        st, out = f(tp, dp, st, np.int32(4)); jax.block_until_ready((st, out)); n = 4
    else:
        st, out = f(tp, dp, st); jax.block_until_ready((st, out)); n = 1
    return st, (time.perf_counter() - t0) / n
for key in fns:
    state, _ = run(key, state)
times = {k: [] for k in fns}
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 30):
    for key in fns:
        state, t = run(key, state)
        times[key].append(t)
for key, v in times.items():
    print(f"{key[0]:>14} K={key[1]}  {1e3*statistics.median(v):7.3f} ms  (q25 {1e3*np.percentile(v,25):.3f}, q75 {1e3*np.percentile(v,75):.3f})")
