"""XLA flags for the suite and its subprocesses.

The suite is bound by XLA:CPU compile time, not run time, and nothing in it is timed. A
lower backend optimisation level and the older elemental fusion emitters (not the
MLIR-based ones, which compile each fusion through their own pipeline) together build
the engine's programs 3x faster: 53 programs of a tiny pair in 11 s instead of 34 s
(25 s with the optimisation level alone), with the same tokens.
"""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
