import dsd_jax as dsd
from dsd_jax.models.builtin import builtin
from dsd_jax.device_check.floor import floor_point
from dsd_jax.device_check.profile import profile_with_acceptance, _k0_ms, _draft_token_ms
target, draft, _tok = builtin()
for B in (1, 8):
    eng = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=4), max_batch_size=B,
                         max_seq_len=256, batch_buckets=(B,))
    prof = profile_with_acceptance(eng, [0.7, 0.4, 0.2, 0.1], context_lengths=(128,), repeats=7, batch_sizes=[B])
    print(prof.latency_ms)
    print(floor_point(target, "target", B, 128, _k0_ms(prof, B), 7, None))
    print(floor_point(draft, "draft", B, 128, _draft_token_ms(prof, B), 7, None))
