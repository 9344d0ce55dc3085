import time, statistics, sys, jax, jax.numpy as jnp
from flax import nnx
from dsd_jax.models.builtin import builtin
from dsd_jax.drafters.draft_model import DraftModel, DraftParams
from dsd_jax.drafters.base import DraftContext
from dsd_jax.config import SpecConfig
B = int(sys.argv[1]); cap = 261
_, draft, _ = builtin()
g, p = nnx.split(draft)
dr = DraftModel.build(SpecConfig(num_speculative_tokens=4), (g, draft.config), "xla")
params = p
V = draft.config.vocab_size
st = dr.init_state(B, cap)
st = st._replace(length=jnp.full((B,), 126, jnp.int32))
ctx = DraftContext(jax.random.randint(jax.random.PRNGKey(0), (B, cap), 0, 4096, jnp.int32),
                   jnp.full((B,), 128, jnp.int32), jnp.ones((B,), bool), jnp.zeros((B,), jnp.float32),
                   jnp.zeros((B,), jnp.int32), jnp.ones((B,), jnp.float32), jnp.zeros((B,), jnp.uint32))
fns = {}
for K in (1, 2, 3, 4):
    fns[f"propose K={K}"] = jax.jit(lambda params, st, ctx, K=K: dr.propose(DraftParams(params, V), st, ctx, K), donate_argnums=1)
fns["catch_up"] = jax.jit(lambda params, st, ctx: dr.catch_up(DraftParams(params, V), st, ctx), donate_argnums=1)
import numpy as np
flush = np.ones(64 * 2**20 // 8)  # 64 MB: the target's weights' worth of other traffic
cold = len(sys.argv) > 2
times = {k: [] for k in fns}
for k, f in fns.items():  # compile
    out = f(params, st, ctx); st = out.state if hasattr(out, "state") else out; jax.block_until_ready(st)
for rep in range(40):
    for k, f in fns.items():
        if cold:
            flush += 1.0
        t0 = time.perf_counter()
        out = f(params, st, ctx)
        st = out.state if hasattr(out, "state") else out
        jax.block_until_ready(st)
        times[k].append(time.perf_counter() - t0)
for k, v in times.items():
    print(B, "cold" if cold else "warm", k, round(1e3 * statistics.median(v), 3), "ms")
