"""How the user's script ends, as the runtime needs to know it: whether it raised (one
``sys.excepthook``, installed once, for every strategy), an exit that does not run the
interpreter's shutdown under the runtime's threads, and Ctrl-C taken as the stop request it is
in cohort's Rust programs."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any


class ScriptEnd:
    """Whether the script ended with an uncaught exception, and which."""

    failure: str | None = None
    # The exception asked for the chief's restart (cohort set its ``restarts_chief``: a
    # parameter server lost past recovery): the chief exits 172 and its supervisor restarts it.
    restart: bool = False
    _installed = False

    @classmethod
    def watch(cls) -> None:
        """Records an uncaught exception from now on (then runs the hook that was there)."""
        if cls._installed:
            return
        cls._installed = True
        previous = sys.excepthook

        def hook(kind: Any, value: Any, tb: Any) -> None:
            cls.failure = f"the script raised {kind.__name__}: {value}"
            cls.restart = bool(getattr(value, "restarts_chief", False))
            previous(kind, value, tb)

        sys.excepthook = hook

    @classmethod
    def raised(cls) -> bool:
        """Whether the script raised an exception it did not catch."""
        return cls.failure is not None


def exit_now(code: int) -> None:
    """Exits now with ``code``: the runtime's threads end with the process (no interpreter
    shutdown under them)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def take_stop_requests() -> None:
    """From now on Ctrl-C (SIGINT) is a stop request, as SIGTERM is and as in cohort's Rust
    programs: the runtime, whose handler is installed after this one (and calls it in turn),
    takes it as a preemption notice (the chief's script sees ``preemption_requested()`` and
    saves, the process exits 143, or is ended after the preemption grace); Python raises no
    ``KeyboardInterrupt`` in the middle of it. Call it before the runtime takes the process's
    signals (``ParameterServerStrategy``, the evaluator, ``launch``); only the main thread
    can. A MultiWorkerMirrored script keeps Python's Ctrl-C: its workers take a notice only at
    a step boundary, which a loop without them never reaches."""
    # Once only: set again after the runtime installed its handler, it would take that one's
    # place (a strategy made again after a failed try).
    if signal.getsignal(signal.SIGINT) is _stop_request:
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _stop_request)


def _stop_request(signum: int, frame: Any) -> None:
    """Python's part of a Ctrl-C: nothing (the runtime's handler recorded the stop request)."""
