"""The exception type that carries a user-facing message, and its one kind for a run stopped by a signal.

It lives in the lowest layer so that every layer above can raise it and the
command line can turn it into a clear message and a non-zero exit, never a
traceback. The checks of arguments that raise it are in storage/checks.py,
how a message names items in storage/messages.py, and the hiding of URL
secrets in messages in storage/secrets.py.
"""

from __future__ import annotations

from typing import Any


class DilstoreError(Exception):
    """A problem with the user's input or files, explained in the message."""


class StoppedBySignal(DilstoreError):
    """A command stopped by a signal (SIGINT, SIGTERM or SIGHUP); the message says what is kept and how to go on.

    Not the user's mistake: the command line prints the message and exits
    with 128 + `signal_number`, as a shell reports a process that signal ended.
    """

    def __init__(self, message: str, signal_number: int) -> None:
        super().__init__(message)
        self.signal_number = signal_number

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its signal number: a worker process's stop is rebuilt whole in the parent (api54 F1)."""
        return type(self), (*self.args, self.signal_number), vars(self)
