"""How the user's script ends, as the runtime needs to know it: whether it raised (one
``sys.excepthook``, installed once, for every strategy), and an exit that does not run the
interpreter's shutdown under the runtime's threads."""

from __future__ import annotations

import os
import sys
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
