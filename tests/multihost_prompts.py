"""The models, prompts and engine shared by the multi-host processes (multihost_cases.py)
and the single-device reference they are compared with (test_multihost.py)."""

from conftest import FixedK, scaled, tiny_config
from dsd_jax import SamplingParams, SpecConfig, SpecEngine, models

PROMPTS = [[1, 2, 3], [5], [7, 8, 9, 10, 11, 12, 13], [3, 3, 3, 3, 9, 3], [4, 6], [9, 9, 9]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)
COUPLED = SamplingParams(temperature=1.0, max_tokens=10, seed=5)


def engine(mesh=None, controller=None, **kwargs):
    """Drafter-invariant acceptance, so sampled tokens are comparable across engines."""
    target = scaled(models.init_model(tiny_config(), seed=0), 3.0)
    draft = models.init_model(tiny_config(num_layers=1, hidden_size=16, intermediate_size=32,
                                          num_heads=2, num_kv_heads=1), seed=1)
    per_shard = 4 // (1 if mesh is None else mesh.shape["data"])
    return SpecEngine(target, draft, SpecConfig(num_speculative_tokens=2,
                                                acceptance="drafter_invariant"),
                      max_batch_size=4, max_seq_len=48, prefill_chunk=16,
                      batch_buckets=sorted({1, per_shard}),
                      controller=controller or FixedK([1]), mesh=mesh, **kwargs)
