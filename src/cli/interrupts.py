"""Ctrl-C that lands where Python cannot raise it still stops the command.

A SIGINT that arrives while numba compiles a kernel (a fresh install's first searches)
is raised inside llvmlite's ctypes callback, where Python prints "Exception ignored
..." and drops the KeyboardInterrupt: the command ran to its end, wrote its outputs and
exited 0. The handler here also records the signal, and the CLI checks the record
before it writes a result (``check``) and when the command returns. The traceback
Python would print for the dropped exception is not shown: the one line
``interrupted`` says it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_pending = False


def _on_sigint(signum, frame) -> None:
    global _pending
    _pending = True
    raise KeyboardInterrupt


@contextmanager
def guarded() -> Iterator[None]:
    """Record Ctrl-C for the duration of one command. Left alone where Python would not
    raise on SIGINT either: off the main thread, or where SIGINT is ignored (a child of a
    shell without job control)."""
    global _pending
    _pending = False
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        yield
        return
    previous_hook = sys.unraisablehook

    def quiet_when_recorded(unraisable) -> None:
        if not (_pending and isinstance(unraisable.exc_value, KeyboardInterrupt)):
            previous_hook(unraisable)

    signal.signal(signal.SIGINT, _on_sigint)
    sys.unraisablehook = quiet_when_recorded
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = previous_hook


def pending() -> bool:
    """Whether Ctrl-C came during this command, raised or swallowed."""
    return _pending


def check() -> None:
    """Raise the KeyboardInterrupt a C callback swallowed, before a result is written."""
    if _pending:
        raise KeyboardInterrupt
