"""``python -m cohort launch [FLAGS] SCRIPT [ARGS...]``: a local cluster of a script.

Each task (the chief, the workers, the parameter servers) is its own process running
``python SCRIPT ARGS...`` with its role in ``TF_CONFIG`` and a certificate from a CA made for
the run, supervised as ``cohort launch`` supervises a Rust program's tasks (a killed task is
restarted). ``FLAGS`` are ``cohort launch``'s: ``--workers N``, ``--ps N``,
``--kill-worker-after 5s``, ``--kill-ps-after 5s``, ``--run-dir DIR``...; with
``--strategy multi-worker-mirrored`` the job is MultiWorkerMirrored (the chief a peer of the
workers, no parameter server). The exit code is the chief's.
"""

from __future__ import annotations

import os
import sys

from . import _native
from ._script import take_stop_requests

# `launch` flags that take no value.
_SWITCHES = {"--no-metrics", "--help", "-h"}
# `--strategy`: whether the job is MultiWorkerMirrored.
_STRATEGIES = {"parameter-server": False, "multi-worker-mirrored": True}

SYNOPSIS = (
    "python -m cohort launch [--strategy parameter-server|multi-worker-mirrored] "
    "[--workers N] [--ps N] [FLAGS...] SCRIPT [ARGS...]"
)
USAGE = f"usage: {SYNOPSIS}"
ABOUT = """Runs a local cluster of a Python script: each task (the chief, the workers, the \
parameter servers) is a process running this Python with SCRIPT ARGS, its role in TF_CONFIG, \
supervised (a task that dies is restarted). The exit code is the chief's.

  --strategy S   parameter-server (the default: a chief, workers and parameter servers) or
                 multi-worker-mirrored (the workers all-reduce; no --ps, no --kill-ps-after)
  SCRIPT ARGS    the script every task runs, and its arguments"""


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


def strategy_of(flags: list[str]) -> tuple[bool, list[str]]:
    """Whether ``--strategy`` asks for a MultiWorkerMirrored job, and the other flags. Raises
    ``ValueError`` naming a strategy that is not one."""
    multi_worker, rest, i = False, [], 0
    while i < len(flags):
        flag = flags[i]
        if flag == "--strategy" or flag.startswith("--strategy="):
            if "=" in flag:
                value = flag.split("=", 1)[1]
            else:
                value = flags[i + 1] if i + 1 < len(flags) else ""
                i += 1
            if value not in _STRATEGIES:
                raise ValueError(
                    f"--strategy {value!r}: not one of {', '.join(sorted(_STRATEGIES))}"
                )
            multi_worker = _STRATEGIES[value]
        else:
            rest.append(flag)
        i += 1
    return multi_worker, rest


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "launch":
        print(USAGE, file=sys.stderr)
        return 2
    flags, task = split_launch_args(argv[1:])
    try:
        multi_worker, flags = strategy_of(flags)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if any(f in ("--help", "-h") for f in flags):
        print(_native.launch_help(SYNOPSIS, ABOUT))
        return 0
    if not task:
        print(f"{USAGE}\nerror: no script given", file=sys.stderr)
        return 2
    script = task[0]
    if not os.path.isfile(script):
        print(f"error: script {script!r}: no such file", file=sys.stderr)
        return 2
    # Ctrl-C stops the job as `cohort launch` does (every task told, exit 143), not with a
    # KeyboardInterrupt here.
    take_stop_requests()
    return _native.launch(
        sys.executable, flags, [os.path.abspath(script), *task[1:]], multi_worker
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
