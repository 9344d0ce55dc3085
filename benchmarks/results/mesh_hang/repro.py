"""XLA:CPU's in-process collectives deadlock: a jitted sum over an axis sharded on 4 fake
CPU devices, called in a loop without waiting, hangs on this 2-core machine after its
first call. The tests' mesh job (`tests/background.py`) hangs the same way, rarely alone
and within minutes beside other processes; docs/design.md, section 11, has its trace.

    MODE=step python repro.py 3000               # hangs: XLA:CPU aborts after 25 s
    MODE=step BLOCK=1 python repro.py 3000       # waits for each result: finishes
    MODE=step DEVICES=2 python repro.py 3000     # 2 fake devices: finishes
    MODE=step SYNC=1 python repro.py 3000        # jax_cpu_enable_async_dispatch=False: hangs

MODE=host runs a row update instead (its gather of row 0 all-reduces too), MODE=step,host
both, as the engine's slot moves follow its steps: both hang. `repro.log` has what each
printed (jax/jaxlib 0.10.2).
"""
import os
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["JAX_NUM_CPU_DEVICES"] = os.environ.get("DEVICES", "4")
os.environ["XLA_FLAGS"] = "--xla_cpu_collective_call_terminate_timeout_seconds=25"
MODE = os.environ.get("MODE", "step,host")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

if os.environ.get("SYNC"):
    jax.config.update("jax_cpu_enable_async_dispatch", False)
devices = len(jax.devices())
mesh = jax.make_mesh((devices,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
x = jax.device_put(np.ones((devices, 256), np.float32), NamedSharding(mesh, P("d")))


@jax.jit
def step(x, i):
    return x + jnp.sum(x) * 1e-9 + i  # a sum over the sharded axis: an all-reduce


@jax.jit
def host(x, i):
    return jax.lax.dynamic_update_index_in_dim(x, x[0] * 0.5, i % devices, 0)


start = time.time()
for n in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3000):
    if "step" in MODE:
        x = step(x, np.int32(n))
    if "host" in MODE:
        x = host(x, np.int32(n))
    if os.environ.get("BLOCK"):
        x.block_until_ready()
    if n % 200 == 0:
        print(n, f"{time.time() - start:.1f}s", flush=True)
print("done", float(x[0, 0]))
