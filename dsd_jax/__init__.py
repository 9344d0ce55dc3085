"""dsd_jax: dynamic speculative decoding for JAX/XLA.

    import dsd_jax as dsd
    engine = dsd.SpecEngine(target, draft, dsd.SpecConfig(num_speculative_tokens=4))
    outs = engine.generate(prompts, dsd.SamplingParams(temperature=0.0, max_tokens=128))
"""

from dsd_jax.config import DynamicConfig, SpecConfig
from dsd_jax.engine import RequestOutput, SpecEngine
from dsd_jax.sampling import SamplingParams

__all__ = ["DynamicConfig", "RequestOutput", "SamplingParams", "SpecConfig", "SpecEngine"]
