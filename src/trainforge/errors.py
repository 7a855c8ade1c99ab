"""Error types that separate the user's mistakes (exit 2, one line) from the job failing (exit 1)."""
from __future__ import annotations


class UserError(ValueError):
    """Bad input: a config field, a path or the data. The message names it and says how to fix it."""


class UnknownNameError(UserError, KeyError):
    """A registry lookup failed; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class JobFailed(RuntimeError):
    """The run itself failed (diverged, too many bad steps): exit code 1."""
