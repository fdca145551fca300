"""The process pool: worker processes, contiguous chunks, results by position (spec/executors.md).

Workers are started in the constructor, from a fork server that has ndplan and
numba loaded where the platform has one, else spawned; the CLI opens the executor
before it parses the model and configs, so their start overlaps that work. Each
worker has its own duplex pipe. ``map`` cuts the items into contiguous chunks of
about ``len(items) / (8 · workers)`` (at least one item), hands them out as workers
free up (at most two outstanding per worker), and writes each result at its
chunk's index, so the output reads as if one process had written it.

A recipe is pickled once per distinct recipe object (the objects of a tuple
recipe, by identity) and sent to each worker once; tasks carry only the chunk.

Faults: an exception in a task comes back as data (its error class and one-line
message) and is raised here after every worker has been terminated; a worker
that dies (killed, crashed) is seen through its process sentinel and reported
with the items it held. Ctrl-C in the main process propagates as
KeyboardInterrupt after the workers are terminated. Workers ignore SIGINT (a
terminal's Ctrl-C reaches the whole process group; the main process decides)
and exit by themselves when the main process's end of the pipe closes.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from ndplan.core import errors

CHUNKS_PER_WORKER = 8
MAX_OUTSTANDING = 2
"""Chunks queued per worker, so a worker never waits for the main process between chunks."""
SMALL_MESSAGE = 16 * 1024
"""A second chunk is queued only when its message is this small: it then fits in the pipe's
buffer, and sending it cannot block while the worker is itself writing a result."""
KEEP_RECIPES = 4
"""Recipes a worker keeps (first in, first out; a search alternates two)."""
TERMINATE_GRACE_S = 2.0
PROTOCOL = pickle.HIGHEST_PROTOCOL


def _start_method() -> Any:
    """Fork server where the platform has one (Linux, macOS), else spawn.

    Both start workers from a fresh interpreter, never a fork of this process (which
    may hold threads, locks and a user's state). The fork server has ndplan and numba
    loaded (``preload``) once for every worker; a spawned worker loaded them itself.
    If a fork server is already running (one the embedding program started), its
    preload stays as it was and workers warm themselves up as spawned ones do."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["ndplan.adapters.executors.preload"])
        return context
    return multiprocessing.get_context("spawn")


def split(items: Sequence[Any], workers: int) -> list[list[Any]]:
    """Contiguous chunks of about ``len(items) / (8 · workers)`` items (at least one)."""
    size = max(1, round(len(items) / (CHUNKS_PER_WORKER * max(1, workers))))
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def describe_items(task: Callable, chunk: Sequence[Any]) -> str:
    """How an error line names a chunk: the task's own ``describe`` for its first item."""
    describe = getattr(task, "describe", None) or repr
    first = f"{describe(chunk[0])}" if chunk else "nothing"
    more = f" (and {len(chunk) - 1} more in its chunk)" if len(chunk) > 1 else ""
    return first + more


def error_from(payload: tuple[str, str]) -> errors.NdplanError:
    """The main-process exception for an error a worker reported as (class name, message)."""
    name, message = payload
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.NdplanError)):
        cls = errors.InternalError
    return cls(message)


def portable(exc: BaseException) -> tuple[str, str]:
    """An exception as plain data (any exception object might not pickle)."""
    if isinstance(exc, errors.NdplanError):
        return type(exc).__name__, str(exc)
    return (
        "InternalError",
        f"internal error in a worker: {type(exc).__name__}: {exc} "
        "(rerun with -j 1 and NDPLAN_DEBUG=1 for a traceback)",
    )


def how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped responding"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


# ----------------------------------------------------------------------------- worker side


def _silence() -> None:
    """Worker output goes nowhere: anything a worker reports comes back as data."""
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (lives as long as the worker)
    sys.stderr = sys.stdout


def load_pricing() -> None:
    """What every worker needs whatever the run: the pricing code, and the knapsack
    kernels loaded (numba's type registries and cached machine code). The fork server
    does it once for all its workers (``preload``); a spawned worker does it itself."""
    try:
        import importlib

        from ndplan.core.kernels.knapsack import warm_engine

        importlib.import_module("ndplan.planner")
        importlib.import_module("ndplan.adapters.executors.worker")
        warm_engine()
    except Exception:
        pass  # a missing numba is reported by the first task that needs it


def _warm(plugins: tuple[str, ...]) -> None:
    """Load what pricing needs (and the run's plugins) while the main process parses inputs."""
    load_pricing()
    try:
        from ndplan.bootstrap import bootstrap

        bootstrap(plugins=plugins)
    except Exception:
        pass  # a broken plugin is reported by the first task that needs it


def worker_main(
    conn: Connection, plugins: tuple[str, ...], environ: dict[str, str] | None = None
) -> None:
    """One worker: receive recipes and chunks, send back (status, index, value).

    ``environ`` is the main process's environment when it started the worker, which a
    worker forked from the fork server would otherwise see as it was when the server
    started (``NDPLAN_ENGINE``, say, set in between).

    The cyclic garbage collector stays off, as in the ``ndplan`` process (see
    ``cli.app.main``): pricing makes no reference cycles, and the collector's passes
    over the worker's growing caches, after every chunk and at exit, were pure cost."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    gc.disable()
    try:
        _serve(conn, plugins)
    finally:
        gc.freeze()  # the worker is ending: spare its shutdown a pass over every object


def _serve(conn: Connection, plugins: tuple[str, ...]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _silence()
    _warm(plugins)
    recipes: OrderedDict[bytes, Any] = OrderedDict()
    while True:
        try:
            message = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return  # the main process went away: nothing left to do
        if message[0] == "stop":
            return
        if message[0] == "recipe":
            _, digest, payload = message
            try:
                recipes[digest] = ("ok", pickle.loads(payload))
            except Exception as exc:
                recipes[digest] = ("error", exc)
            while len(recipes) > KEEP_RECIPES:
                recipes.popitem(last=False)
            continue
        _, index, digest, task, chunk = message
        try:
            status, recipe = recipes[digest]
            if status == "error":
                raise recipe
            reply = pickle.dumps(("ok", index, task(recipe, chunk)), PROTOCOL)
        except BaseException as exc:
            reply = pickle.dumps(("error", index, portable(exc)), PROTOCOL)
        try:
            conn.send_bytes(reply)
        except (EOFError, OSError):
            return


# ----------------------------------------------------------------------------- main side


def _ignore_sigint() -> Any:
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave signals alone
        return None


def _restore_sigint(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


class PoolExecutor:
    """Worker processes pricing contiguous chunks; results by position."""

    name = "pool"

    def __init__(self, workers: int = 2, plugins: Sequence[str] = ()) -> None:
        self.workers = max(1, int(workers))
        self._mp = _start_method()
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._held: list[OrderedDict[bytes, None]] = []
        self._pickled: OrderedDict[tuple[int, ...], tuple[Any, bytes, bytes]] = OrderedDict()
        self._closed = False
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None
        # Workers are born ignoring SIGINT (the disposition survives exec), so a terminal's
        # Ctrl-C, which reaches the whole process group, leaves the decision to this process.
        previous = _ignore_sigint()
        try:
            if self._mp.get_start_method() == "forkserver":
                # The server starts now (so it is born ignoring SIGINT too, and its workers
                # with it), but a worker forks only once the server has loaded ndplan and
                # numba: workers are started from a thread, so this process goes on.
                from multiprocessing import forkserver

                forkserver.ensure_running()
                self._starting = threading.Thread(
                    target=self._start_workers, args=(tuple(plugins),), daemon=True
                )
                self._starting.start()
            else:
                self._start_workers(tuple(plugins))
                self._started()
        except BaseException:
            self.terminate()
            raise
        finally:
            _restore_sigint(previous)

    def _start_workers(self, plugins: tuple[str, ...]) -> None:
        try:
            for i in range(self.workers):
                parent, child = self._mp.Pipe(duplex=True)
                proc = self._mp.Process(
                    target=worker_main,
                    args=(child, plugins, dict(os.environ)),
                    name=f"ndplan-pool-{i}",
                    daemon=True,  # multiprocessing also reaps daemons at interpreter exit
                )
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
                self._held.append(OrderedDict())
        except BaseException as exc:
            self._start_error = exc

    def _started(self) -> None:
        """Wait until every worker has started; raise what starting one raised."""
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        if self._start_error is not None:
            error, self._start_error = self._start_error, None
            raise error

    @property
    def pids(self) -> list[int]:
        self._started()
        return [p.pid for p in self._procs if p.pid is not None]

    # ------------------------------------------------------------------ the port

    def map(
        self, task: Callable[[Any, Sequence[Any]], Any], recipe: Any, items: Sequence[Any]
    ) -> list[Any]:
        """``task(recipe, chunk)`` over contiguous chunks of ``items``, in chunk order."""
        items = list(items)
        if not items:
            return []
        if self._closed:
            raise errors.InternalError("the worker pool was already closed")
        try:
            self._started()
            return self._map(task, recipe, items)
        except BaseException:
            self.terminate()
            raise

    def close(self) -> None:
        """Tell the workers to stop and wait for them (a stuck one is terminated)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BaseException):  # a worker that failed to start: none to stop
            self._started()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send_bytes(pickle.dumps(("stop",), PROTOCOL))
        deadline = time.monotonic() + 10.0
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._stop_all()

    def terminate(self) -> None:
        """Stop every worker at once (SIGTERM, then SIGKILL), leaving no orphan processes."""
        self._closed = True
        self._stop_all()

    # ------------------------------------------------------------------ internals

    def _stop_all(self) -> None:
        with contextlib.suppress(BaseException):  # a worker that failed to start: none to stop
            self._started()
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + TERMINATE_GRACE_S
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
                proc.join(TERMINATE_GRACE_S)
        for conn in self._conns:
            conn.close()
        self._conns = []
        self._procs = [p for p in self._procs if p.is_alive()]

    def _payload(self, recipe: Any) -> tuple[bytes, bytes]:
        """(digest, pickle) of a recipe, pickled once per distinct recipe object."""
        parts = recipe if type(recipe) is tuple else (recipe,)
        key = tuple(id(p) for p in parts)
        found = self._pickled.get(key)
        if found is None:
            try:
                payload = pickle.dumps(recipe, PROTOCOL)
            except Exception as exc:
                raise errors.InternalError(
                    f"the task's recipe cannot be sent to worker processes: {type(exc).__name__}: {exc}"
                ) from None
            digest = hashlib.blake2b(payload, digest_size=16).digest()
            # The recipe itself is kept too, so its id is not reused while cached.
            found = self._pickled[key] = (recipe, digest, payload)
            while len(self._pickled) > KEEP_RECIPES:
                self._pickled.popitem(last=False)
        return found[1], found[2]

    def _send(self, w: int, data: bytes, what: str) -> None:
        try:
            self._conns[w].send_bytes(data)
        except OSError:
            raise self._died(w, what) from None

    def _died(self, w: int, what: str) -> errors.InternalError:
        proc = self._procs[w]
        proc.join(1.0)
        return errors.InternalError(
            f"worker process {proc.pid} died ({how_it_ended(proc.exitcode)}) {what}"
        )

    def _map(self, task: Callable, recipe: Any, items: list[Any]) -> list[Any]:
        digest, payload = self._payload(recipe)
        chunks = split(items, self.workers)
        results: list[Any] = [None] * len(chunks)
        todo = deque(range(len(chunks)))
        outstanding: list[deque[int]] = [deque() for _ in self._procs]
        finished: set[int] = set()
        failed: dict[int, BaseException] = {}
        while len(finished) < len(chunks):
            if failed:
                # The failure of the earliest chunk is raised, once every chunk before it has
                # answered: the one a serial run meets first, whichever worker was quicker.
                first = min(failed)
                if all(i in finished for i in range(first)):
                    raise failed[first]
            for w in range(len(self._procs)):
                while todo and not failed and len(outstanding[w]) < MAX_OUTSTANDING:
                    index = todo[0]
                    message = pickle.dumps(("task", index, digest, task, chunks[index]), PROTOCOL)
                    if outstanding[w] and len(message) > SMALL_MESSAGE:
                        break
                    if digest not in self._held[w]:
                        if outstanding[w]:
                            break  # a recipe is sent only to an idle worker (it may be large)
                        self._send(
                            w, pickle.dumps(("recipe", digest, payload), PROTOCOL), "at start-up"
                        )
                        self._held[w][digest] = None
                        while len(self._held[w]) > KEEP_RECIPES:
                            self._held[w].popitem(last=False)
                    self._send(w, message, f"while pricing {describe_items(task, chunks[index])}")
                    outstanding[w].append(todo.popleft())
            sentinels = {p.sentinel: w for w, p in enumerate(self._procs)}
            conns = {id(c): w for w, c in enumerate(self._conns)}
            ready = wait([*self._conns, *sentinels])
            # Replies first: a worker that answered and then died still answered.
            for obj in sorted(ready, key=lambda o: isinstance(o, int)):
                if isinstance(obj, int):
                    w = sentinels[obj]
                    if self._conns[w].poll():
                        continue  # its last reply is read on the next round
                    raise self._died(w, self._holding(task, chunks, outstanding[w]))
                w = conns[id(obj)]
                try:
                    status, index, value = pickle.loads(obj.recv_bytes())
                except (EOFError, OSError):
                    raise self._died(w, self._holding(task, chunks, outstanding[w])) from None
                outstanding[w].remove(index)
                finished.add(index)
                if status != "ok":
                    failed[index] = error_from(value)
                    continue
                results[index] = value
        if failed:
            raise failed[min(failed)]
        return results

    @staticmethod
    def _holding(task: Callable, chunks: list[list[Any]], held: deque[int]) -> str:
        if not held:
            return "while idle"
        return f"while pricing {describe_items(task, chunks[held[0]])}"
