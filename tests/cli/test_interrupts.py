"""cli.interrupts: Ctrl-C recorded for one command, even where Python drops it."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import pytest

from ndplan.cli import interrupts

CALLBACK = ctypes.CFUNCTYPE(None)


def call_through_c(body) -> None:
    """Run ``body`` as a C callback: what it raises, Python reports and drops."""
    CALLBACK(body)()


def send_sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000):  # the handler runs between bytecodes: here
        pass


@pytest.fixture
def terminal_sigint():
    """SIGINT as a process started from a terminal has it (Python's KeyboardInterrupt
    handler). A test runner started by a shell without job control (``bash .ci/run &``
    from a script, some CI runners) inherits it ignored, where ``guarded`` rightly stays
    out of the way (``test_an_ignored_sigint_stays_ignored``); a CI run failed so."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("terminal_sigint")
def test_a_dropped_ctrl_c_is_recorded_and_raised_at_the_next_check() -> None:
    before = signal.getsignal(signal.SIGINT)
    reported = []
    hook, sys.unraisablehook = sys.unraisablehook, reported.append
    try:
        with interrupts.guarded():
            interrupts.check()  # nothing pending
            call_through_c(send_sigint)
            assert interrupts.pending()
            assert reported == []  # the one line `interrupted` says it, not a traceback
            with pytest.raises(KeyboardInterrupt):
                interrupts.check()
        assert signal.getsignal(signal.SIGINT) is before
        assert sys.unraisablehook == reported.append
        with interrupts.guarded():
            assert not interrupts.pending()  # a record lasts one command
    finally:
        sys.unraisablehook = hook


def test_other_dropped_errors_are_still_reported() -> None:
    reported = []
    hook, sys.unraisablehook = sys.unraisablehook, reported.append

    def fail() -> None:
        raise ValueError("not an interrupt")

    try:
        with interrupts.guarded():
            call_through_c(fail)
        assert [type(r.exc_value) for r in reported] == [ValueError]
    finally:
        sys.unraisablehook = hook


def test_an_ignored_sigint_stays_ignored() -> None:
    """A child of a shell without job control inherits SIGINT ignored, and Python would
    not raise on it either."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.guarded():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
