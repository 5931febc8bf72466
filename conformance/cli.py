"""`parity`: run engines on scenarios, compare with goldens, regenerate goldens, gate a release.

Exit status (every command): 0 success; 1 a divergence (or a golden that would change, in
--check); 2 a run that could not be compared (engine crash, hang, protocol violation, missing
or invalid golden), bad input (malformed scenario, unknown engine, a bad option or setting) or
an environment that cannot be built; 3 an internal error, a bug of the harness (its traceback
is shown); 130 stopped by Ctrl-C, 143 by SIGTERM (every engine ended, no verdict).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import traceback

from conformance.adequacy import command as adequacy
from conformance.bisect import command as bisect
from conformance.bump import command as bump
from conformance.commands import comparable, compare, docs, drift, envs, gate, merge, run, selfcheck
from conformance.formats.errors import ParityError
from conformance.formats.log import log
from conformance.fuzz import command as fuzz
from conformance.process.reaper import end_all, ended_words, resume
from conformance.regenerate import command as goldens

# Each command's module registers its subparser, its arguments and its handler; `parity --help`
# lists them in this order.
COMMANDS = (envs, run, compare, gate, merge, goldens, bump, bisect, comparable, drift, selfcheck, docs,
            adequacy, fuzz)

# A named refusal (formats/errors.py ParityError: bad input, an environment or an engine that
# cannot be had, a golden write refused) exits with its status and its words, no traceback.
# Anything else escaping a command is a bug of the harness: its traceback, exit INTERNAL_ERROR
# (not 1, which says an engine diverged).
INTERNAL_ERROR = 3


def build_parser() -> argparse.ArgumentParser:
    """Every command's arguments; `main` runs the command named."""
    parser = argparse.ArgumentParser(prog="parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _printable_anywhere()
    with _stop_on_signals():  # also while the engines are ended below
        try:
            return args.handler(args)
        except ParityError as exc:
            log(f"parity {args.command}: error: {exc}")
            return exc.status
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (Interrupted)
            strays = end_all()  # with what was ended while it unwound
            resume()
            signum = getattr(exc, "signum", signal.SIGINT)
            how = ("interrupted (Ctrl-C)" if signum == signal.SIGINT
                   else f"stopped by {signal.Signals(signum).name}")
            log(f"parity {args.command}: {how}: "
                f"{ended_words(strays, 'every engine process and its children')}; no verdict")
            return 128 + signum
        except Exception:  # noqa: BLE001 - not bad input: a bug of the harness, shown whole
            log(traceback.format_exc().rstrip())
            strays = end_all()
            resume()  # parity may be called again in this process (a test, a script)
            log(f"parity {args.command}: internal error (a bug of the harness, not of the engine or "
                f"the input; its traceback is above): "
                f"{ended_words(strays, 'every engine process and its children')}; exit status {INTERNAL_ERROR}")
            return INTERNAL_ERROR


def _printable_anywhere() -> None:
    """Under a locale whose encoding cannot hold a report's text (the C locale with Python's
    UTF-8 mode off is ASCII), characters it cannot encode are printed as escapes instead of
    ending the command. Files are UTF-8 whatever the locale (encoding= on every read and write)."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):  # a real text stream (pytest's capture has it too)
            stream.reconfigure(errors="backslashreplace")


class Interrupted(KeyboardInterrupt):
    """SIGTERM (a CI runner cancelling the job, `kill`), handled as Ctrl-C is."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals():
    """While a command runs, SIGINT and SIGTERM raise Interrupted in the main thread, which
    ends every engine (an engine runs in its own session: no terminal signal reaches it).
    After the first, further signals are noted and ignored: the cleanup runs to its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def later(signum, frame):
        log(f"parity: {signal.Signals(signum).name} again: still ending the engines")

    def first(signum, frame):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, later)
        raise Interrupted(signum)

    before = {sig: signal.signal(sig, first) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
