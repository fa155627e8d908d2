"""The ``simspec`` command: every subcommand, and the package's only argparse importer.

Imports: argparse and simspec's library. Each flag maps to one config field
(defaults come from the config dataclasses, never written here); each
handler builds a config and calls one library function. Bad input ends with
one line on stderr and exit status 2, never a traceback. One module a
command family, each registering its subcommands with ``add(subparsers)``.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import signal
import sys
import threading

from simspec import __version__
from simspec.types import InputError

COMMANDS = {"simulate": "simulate", "presets": "simulate", "costs": "costs", "train": "live", "live": "live",
            "validate": "live", "profile-gpu": "profile", "sweep": "sweep", "report": "report", "tune": "tune",
            "export": "export", "dashboard": "dashboard", "vllm-models": "vllm_models", "calibrate": "calibrate", "plan": "plan"}
"""Each subcommand, in the order ``--help`` lists them, and the module of
simspec.cli that registers it (``add(subparsers)``). A command imports only
its own module and what that imports (the others' ~0.1 s a simulate never
uses); a test checks each module registers exactly its names here."""


class Parser(argparse.ArgumentParser):
    """argparse with the project's one-line errors: a wrong flag or value
    says which, and where the usage is, in one line (exit 2)."""

    def _get_value(self, action: argparse.Action, arg_string: str):
        if not arg_string.strip() and not isinstance(action, argparse._SubParsersAction):  # no flag takes an empty value: `--out ""` is a slip, not "no output"
            name = action.option_strings[0] if action.option_strings else action.metavar or action.dest
            self.error(f"{name}: an empty value (give one, or leave the flag out)")
        return super()._get_value(action, arg_string)

    def error(self, message: str):
        command = self.prog.removeprefix("simspec").strip()
        flag, _, rest = message.removeprefix("argument ").partition(": ")
        if message.startswith("argument ") and flag.split("/")[0] in rest:
            message = rest  # the value's own error names the flag already
        self.exit(2, f"simspec: error: {command + ': ' if command else ''}{message} (see {self.prog} --help)\n")


def _modules(command: str | None) -> list:
    """The modules of simspec.cli that register ``command`` (one of
    COMMANDS), imported; every one for any other word or None."""
    names = [COMMANDS[command]] if command in COMMANDS else dict.fromkeys(COMMANDS.values())
    return [importlib.import_module(f"simspec.cli.{name}") for name in names]


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``simspec`` parser: every subcommand, or, for ``command`` (one
    of COMMANDS), only those its module registers."""
    top = Parser(prog="simspec", description="Which speculative-decoding verification "
                                  "strategy should a VLM server use, and what latency will users see?")
    top.add_argument("--version", action="version", version=f"simspec {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    for module in _modules(command):
        module.add(sub)
    return top


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP: handled as Ctrl-C is, so what a command started
    (pools, servers) is ended and what it finished is kept."""


_stopped_by: list[str] = []  # the stop signal received, if any


def _stop(signum, frame) -> None:
    _stopped_by.append(signal.Signals(signum).name)
    raise Stopped(_stopped_by[-1])


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, _stop)
    argv = sys.argv[1:] if argv is None else argv
    args = parser(argv[0] if argv else None).parse_args(argv)
    if not getattr(args, "handler", None):
        parser().print_help()
        return 2
    try:
        return args.handler(args)
    except InputError as err:
        print(f"simspec: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`simspec ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:  # a file that cannot be read or written: a full or read-only disk, a path under a file
        where = f"{err.filename}: " if err.filename else ""
        print(f"simspec: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2
    except Stopped as stop:
        print(f"simspec: stopped ({stop})", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("simspec: interrupted", file=sys.stderr)
        return 130
    except Exception:
        if not _stopped_by:
            raise
        # The stop arrived inside a library (a compiler, a C callback) that
        # turned it into its own error: still a stop, not a failure.
        print(f"simspec: stopped ({_stopped_by[-1]})", file=sys.stderr)
        return 143


def entry() -> None:
    """The ``simspec`` console script: :func:`main` on ``sys.argv``, then exit.

    The heap is frozen (``gc.freeze``) twice: after the imports (the
    command's module and what it imports), so the command's garbage
    collections do not walk numba's and numpy's objects again and again,
    and before exiting, so the interpreter's last collections skip
    everything (the OS frees a process's memory; that teardown took ~0.4 s
    of a simulate process). atexit handlers and reference-count finalizers
    still run; only cyclic garbage left at exit is not collected.
    """
    _modules(sys.argv[1] if len(sys.argv) > 1 else None)
    gc.freeze()
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry()
