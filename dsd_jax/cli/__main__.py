"""`python -m dsd_jax.cli`: the `dsd-jax` command."""

import sys

from dsd_jax.cli import main

sys.exit(main())
