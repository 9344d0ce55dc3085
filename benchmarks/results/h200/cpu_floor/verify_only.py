import sys
import jax.numpy as jnp
import dsd_jax as dsd
from dsd_jax.models.builtin import builtin
from dsd_jax.drafters import draft_model as dm
from dsd_jax.drafters.base import Proposal
from dsd_jax.device_check.profile import profile_with_acceptance
mode = sys.argv[1]
if mode == "verify_only":
    def propose(self, params, state, ctx, K):
        B = ctx.length.shape[0]
        return Proposal(jnp.zeros((B, K), jnp.int32), None, state)
    dm.DraftModel.propose = propose
    dm.DraftModel.catch_up = lambda self, params, state, ctx: state
elif mode == "no_catchup":
    dm.DraftModel.catch_up = lambda self, params, state, ctx: state
target, draft, _ = builtin()
B = int(sys.argv[2])
eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=4), max_batch_size=B,
                     max_seq_len=256, batch_buckets=(B,))
prof = profile_with_acceptance(eng, [0.7, 0.4, 0.2, 0.1], context_lengths=(128,), repeats=9, batch_sizes=[B])
print(mode, B, [round(x, 3) for x in prof.meta["latency_ms_raw"][0][0]])
