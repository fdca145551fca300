"""The Ray executor: the same port on a Ray cluster (the optional extra ``ndplan[ray]``).

The recipe is put in the object store once per distinct recipe object; each
contiguous chunk (about ``len(items) / (8 · CPUs)`` items) becomes one remote
task; results are gathered by position. Without an address a local instance is
started with ``jobs`` CPUs; with ``--ray-address`` (``ray://head:10001``,
``auto``, ``host:6379``) the executor joins an existing cluster, whose nodes
need ndplan (and any plugin modules the run loads) installed.

Ray's own logging is kept off stdout: the dashboard is off, worker output is not
forwarded to the driver, Ray's logger only reports errors (on stderr).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from ndplan.core.errors import InternalError, InvalidInputError

from .pool import CHUNKS_PER_WORKER, KEEP_RECIPES, describe_items, error_from, portable

INSTALL_HINT = "pip install 'ndplan[ray]'"


_RECIPES: OrderedDict[str, Any] = OrderedDict()
"""Per Ray worker process: recipes already fetched from the object store, by object id."""


def run_chunk(task: Callable[[Any, Sequence[Any]], Any], boxed: list, chunk: Sequence[Any]):
    """What one remote task runs: the task on its chunk, errors returned as plain data.

    The recipe's reference comes boxed in a list, so Ray does not fetch and unpickle it
    for every task; each worker process fetches it once."""
    try:
        (ref,) = boxed
        key = ref.hex()
        recipe = _RECIPES.get(key)
        if recipe is None:
            import ray

            recipe = _RECIPES[key] = ray.get(ref)
            while len(_RECIPES) > KEEP_RECIPES:
                _RECIPES.popitem(last=False)
        return ("ok", task(recipe, chunk))
    except BaseException as exc:
        return ("error", portable(exc))


def import_ray():
    try:
        import ray
    except ImportError:
        raise InvalidInputError(f"--executor ray: Ray is not installed; {INSTALL_HINT}") from None
    return ray


REACH_TIMEOUT_S = 5.0
"""How long the address may take to accept a connection before the run gives up on it."""

RAY_GCS_PORT = 6379


def check_reachable(address: str) -> None:
    """Refuse an address nothing answers at, in seconds: ``ray.init`` retries an
    unreachable cluster for minutes, logging each attempt, before it fails."""
    if address == "auto":  # Ray finds a local cluster itself, or says there is none
        return
    target = address.removeprefix("ray://")
    host, _, port_text = target.rpartition(":")
    if not host:  # "head": Ray's default GCS port
        host, port_text = target, str(RAY_GCS_PORT)
    try:
        port = int(port_text)
    except ValueError:
        raise InvalidInputError(
            f"--ray-address {address}: the port '{port_text}' is not a number; give "
            "host:port (ray://head:10001, head:6379) or auto"
        ) from None
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise InvalidInputError(
            f"--ray-address {address}: nothing answers at {host}:{port} ({reason}); start "
            "the cluster (ray start --head) or give the address its head prints"
        ) from None


class RayExecutor:
    """Chunks as Ray remote tasks; the recipe in the object store once."""

    name = "ray"

    def __init__(self, workers: int = 2, address: str | None = None) -> None:
        ray = import_ray()
        self._ray = ray
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        self._owns = not ray.is_initialized()
        if self._owns:
            kwargs: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": logging.ERROR,
            }
            if address:
                check_reachable(address)
                kwargs["address"] = address
            else:
                kwargs["num_cpus"] = max(1, int(workers))
            try:
                ray.init(**kwargs)
            except Exception as exc:
                where = f"at {address}" if address else "locally"
                raise InvalidInputError(
                    f"--executor ray: could not start or join a Ray cluster {where}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        cpus = int(ray.cluster_resources().get("CPU", workers) or workers)
        self.workers = max(1, cpus)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(run_chunk)
        self._refs: OrderedDict[tuple[int, ...], tuple[Any, Any]] = OrderedDict()
        self._pending: list[Any] = []
        self._closed = False

    def _put(self, recipe: Any):
        parts = recipe if type(recipe) is tuple else (recipe,)
        key = tuple(id(p) for p in parts)
        found = self._refs.get(key)
        if found is None:
            found = self._refs[key] = (recipe, self._ray.put(recipe))
            while len(self._refs) > KEEP_RECIPES:
                self._refs.popitem(last=False)
        return found[1]

    def map(
        self, task: Callable[[Any, Sequence[Any]], Any], recipe: Any, items: Sequence[Any]
    ) -> list[Any]:
        """``task(recipe, chunk)`` as one remote task per contiguous chunk, in chunk order."""
        items = list(items)
        if not items:
            return []
        if self._closed:
            raise InternalError("the Ray executor was already closed")
        ray = self._ray
        size = max(1, round(len(items) / (CHUNKS_PER_WORKER * self.workers)))
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        try:
            ref = self._put(recipe)
            self._pending = [self._remote.remote(task, [ref], chunk) for chunk in chunks]
            results = []
            for chunk, pending in zip(chunks, self._pending, strict=True):
                try:
                    status, value = ray.get(pending)
                except ray.exceptions.RayError as exc:
                    raise InternalError(
                        f"a Ray task died while pricing {describe_items(task, chunk)}: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    ) from None
                if status != "ok":
                    raise error_from(value)
                results.append(value)
            self._pending = []
            return results
        except BaseException:
            self.terminate()
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._refs.clear()
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()

    def terminate(self) -> None:
        """Cancel what is still running and shut a local instance down."""
        if self._closed:
            return
        self._closed = True
        for ref in self._pending:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self._pending = []
        self._refs.clear()
        if self._owns:
            with contextlib.suppress(Exception):
                self._ray.shutdown()
