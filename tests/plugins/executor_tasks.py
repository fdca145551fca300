"""Tasks for the executor tests, importable by spawned workers (tests/plugins is put on
sys.path before a pool starts, and spawned workers inherit the parent's sys.path)."""

from __future__ import annotations

import os
import sys

LOADS = {"count": 0}
"""Per process: how many recipes were unpickled."""


class CountingRecipe:
    """A recipe that counts how often a process unpickles it."""

    def __init__(self, payload: int) -> None:
        self.payload = payload

    def __getstate__(self):
        return {"payload": self.payload}

    def __setstate__(self, state):
        LOADS["count"] += 1
        self.payload = state["payload"]


def echo(recipe, chunk):
    """The chunk back, with this worker's pid and how many recipes it has unpickled."""
    return {"items": list(chunk), "pid": os.getpid(), "loads": LOADS["count"]}


echo.describe = lambda item: f"item {item}"


def chatty(recipe, chunk):
    print("worker stdout should go nowhere")
    print("worker stderr should go nowhere", file=sys.stderr)
    return list(chunk)


def fail_on(recipe, chunk):
    """Raises (a plain exception: an internal error) on the item equal to the recipe."""
    for item in chunk:
        if item == recipe:
            raise ZeroDivisionError(f"item {item} divides by zero")
    return list(chunk)


def environ(recipe, chunk):
    """This worker's value of the environment variable named by the recipe."""
    return [os.environ.get(recipe) for _ in chunk]


def warmed(recipe, chunk):
    """Whether this worker had the knapsack kernels loaded before its first task."""
    numba_engine = sys.modules.get("ndplan.core.kernels._knapsack_nb")
    return [numba_engine is not None and bool(numba_engine.dp_choose.signatures) for _ in chunk]


def fail_slow_then_fast(recipe, chunk):
    """Raises on every chunk: the first chunk after a pause, the others at once, so a
    later chunk's failure reaches the pool before the first's."""
    import time

    if chunk[0] == 0:
        time.sleep(recipe)
    raise ZeroDivisionError(f"chunk from item {chunk[0]} divides by zero")
