"""A test plugin (``ndplan -p swallowed_interrupt``): Ctrl-C that Python drops. Its
refusal rule, on its first call, sends the process SIGINT from inside a ctypes callback,
where the KeyboardInterrupt is raised and dropped ("Exception ignored on calling ctypes
callback function"), as when Ctrl-C lands while numba compiles a kernel. It refuses
nothing. Loaded through PYTHONPATH=tests/plugins."""

from __future__ import annotations

import ctypes
import os
import signal

from ndplan.plugins.hookspecs import hookimpl

_CALLBACK = ctypes.CFUNCTYPE(None)
_fired: list[bool] = []


def _send_sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(10_000):  # Python runs the handler between bytecodes: here, inside
        pass


_in_c = _CALLBACK(_send_sigint)


def interrupt_once(layout, context):
    if not _fired:
        _fired.append(True)
        _in_c()  # through C and back: what the callback raises, Python drops
    return None


@hookimpl
def ndplan_register_refusal_rules(registry):
    registry.add("swallowed_interrupt", interrupt_once)
