"""Bad input: the base of every error that says something a user gave the harness (a file, an
argument, an environment setting, a folder) is not what was expected. Its message says what was
expected, what arrived and where. `parity` (conformance/cli.py) exits 2 on it with its words
and no traceback; an exception it does not name is a bug of the harness: exit 3, its traceback
shown. Standard library only."""

from __future__ import annotations


class ParityError(Exception):
    """Every refusal the harness names: `parity` exits `status` with the error's words and no
    traceback. Bad input, an environment or an engine that cannot be had, a golden write refused
    all derive from it; any other exception escaping a command is a bug of the harness."""

    status = 2


class InputError(ParityError, ValueError):
    """Bad input (a ValueError, as every bad input was before it had a name of its own)."""
