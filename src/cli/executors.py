"""Choosing and opening the executor that prices candidates (spec/executors.md)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Annotated

import typer

from ndplan.bootstrap import create
from ndplan.core.errors import InvalidInputError, PluginError
from ndplan.core.ports import Executor

from .options import State
from .output import note

JobsOpt = Annotated[
    int | None,
    typer.Option(
        "--jobs",
        "-j",
        min=1,
        help="Worker processes [default: NDPLAN_JOBS, else half the logical cores, at most 4].",
        show_default=False,
    ),
]
ExecutorOpt = Annotated[
    str | None,
    typer.Option(
        "--executor",
        help="serial, pool or ray [default: pool when more than one job, else serial].",
        show_default=False,
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="Join an existing Ray cluster (e.g. "
        "ray://head:10001) instead of starting a local one.",
        show_default=False,
    ),
]
PER_CANDIDATE_VERBOSITY = 2
"""At -vv a line is printed per priced candidate, so pricing stays in one process."""


def default_jobs() -> int:
    """``NDPLAN_JOBS``, else half the logical cores, at most 4, at least 1."""
    env = os.environ.get("NDPLAN_JOBS")
    if env:
        try:
            jobs = int(env)
        except ValueError:
            raise InvalidInputError(
                f"NDPLAN_JOBS: expected a positive integer, got {env!r}"
            ) from None
        if jobs < 1:
            raise InvalidInputError(f"NDPLAN_JOBS: expected a positive integer, got {env!r}")
        return jobs
    return max(1, min(4, (os.cpu_count() or 1) // 2))


def choose(
    jobs: int | None, name: str | None, verbosity: int, ray_address: str | None = None
) -> tuple[str, int]:
    """(executor name, worker count) from -j, --executor, --ray-address, NDPLAN_JOBS and
    the verbosity. ``--ray-address`` alone implies ``--executor ray``."""
    count = jobs if jobs is not None else default_jobs()
    if verbosity >= PER_CANDIDATE_VERBOSITY:
        return "serial", 1
    if name is None:
        name = "ray" if ray_address else "pool" if count > 1 else "serial"
    elif ray_address and name != "ray":
        raise InvalidInputError(
            f"--ray-address: only the ray executor joins a cluster (got --executor {name})"
        )
    return name, count


@contextlib.contextmanager
def open_executor(
    state: State, *, jobs: int | None, name: str | None, ray_address: str | None, verbosity: int = 0
) -> Iterator[Executor]:
    """Start the executor now (before inputs are parsed); close it on success, terminate on error."""
    chosen, count = choose(jobs, name, verbosity, ray_address)
    registry = state.components().executors
    if "serial" not in registry and chosen not in registry:
        # Nothing to fall back to: the built-in plugin that provides it is disabled.
        raise PluginError(
            f"no executor to price with ({', '.join(dict.fromkeys((chosen, 'serial')))}: "
            "not registered); "
            "NDPLAN_DISABLE_PLUGINS must leave ndplan.builtin on, or a plugin register one"
        )
    if chosen not in registry:
        if chosen == "ray":
            raise InvalidInputError(
                "--executor ray: Ray is not installed; pip install 'ndplan[ray]'"
            )
        if name is not None:
            registry.get(chosen)  # unknown name: one line listing the known ones
        note(f"executor '{chosen}' is not available; pricing in one process", warning=True)
        chosen, count = "serial", 1
    cores = os.cpu_count() or 1
    if chosen == "pool" and count > cores:
        # Honoured as asked, but each worker beyond the cores only adds start-up and
        # contention: -j 200 on 2 cores ran 40 times slower than one process.
        note(
            f"warning: -j {count} starts more workers than this machine's {cores} logical "
            f"cores; -j {cores} or fewer is faster",
            warning=True,
        )
    if verbosity >= 1:
        how = "in this process" if chosen == "serial" else f"{count} workers"
        if verbosity >= PER_CANDIDATE_VERBOSITY:
            how += " (-vv prices serially, so its per-candidate lines come out in order)"
        note(f"pricing: the {chosen} executor, {how}")
    executor = create(
        registry,
        chosen,
        Executor,
        count,
        {"ray_address": ray_address, "plugins": tuple(state.plugins)},
    )
    try:
        yield executor
    except BaseException:
        executor.terminate()
        raise
    else:
        executor.close()
