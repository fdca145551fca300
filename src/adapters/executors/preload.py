"""What the pool's fork server loads once, before any worker forks from it.

A spawned worker imported ndplan and numba and loaded numba's type registries and
cached kernels on its own: about 2 s of CPU per worker, on the machine the
workers share with the main process. Workers forked from a server that did it
once start with all of it in memory. Nothing here depends on the run (plugins
load in each worker), so one server serves every search of the process.
"""

from __future__ import annotations

from ndplan.adapters.executors.pool import load_pricing

load_pricing()
