"""``python -m cohort launch [FLAGS] SCRIPT [ARGS...]``: a local cluster of a script.

Each task (the chief, the workers, the parameter servers) is its own process running
``python SCRIPT ARGS...`` with its role in ``TF_CONFIG`` and a certificate from a CA made for
the run, supervised as ``cohort launch`` supervises a Rust program's tasks (a killed task is
restarted). ``FLAGS`` are ``cohort launch``'s: ``--workers N``, ``--ps N``,
``--kill-worker-after 5s``, ``--kill-ps-after 5s``, ``--run-dir DIR``... The exit code is the
chief's.
"""

from __future__ import annotations

import os
import sys

from . import _native

# `launch` flags that take no value.
_SWITCHES = {"--no-metrics", "--help", "-h"}

USAGE = "usage: python -m cohort launch [--workers N] [--ps N] [FLAGS...] SCRIPT [ARGS...]"


def split_launch_args(args: list[str]) -> tuple[list[str], list[str]]:
    """``launch``'s flags, and the script with its arguments (from the first word that is no
    flag and no flag's value)."""
    flags: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return flags, args[i + 1 :]
        if not arg.startswith("-"):
            return flags, args[i:]
        flags.append(arg)
        if arg not in _SWITCHES and "=" not in arg and i + 1 < len(args):
            flags.append(args[i + 1])
            i += 1
        i += 1
    return flags, []


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "launch":
        print(USAGE, file=sys.stderr)
        return 2
    flags, task = split_launch_args(argv[1:])
    if any(f in ("--help", "-h") for f in flags):
        return _native.launch(sys.executable, flags, [])
    if not task:
        print(f"{USAGE}\nerror: no script given", file=sys.stderr)
        return 2
    script = task[0]
    if not os.path.isfile(script):
        print(f"error: script {script!r}: no such file", file=sys.stderr)
        return 2
    return _native.launch(sys.executable, flags, [os.path.abspath(script), *task[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
