"""dsd_jax: dynamic speculative decoding for JAX/XLA."""
