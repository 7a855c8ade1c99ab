"""Error types that separate the user's mistakes (exit 2, one line) from the job failing (exit 1)."""
from __future__ import annotations

import re
import unicodedata
from typing import Any, Union

MAX_QUOTE_CHARS = 200  # the most of a user's value an error message repeats
MAX_MESSAGE_CHARS = 1000  # a message that still came out longer keeps its start (the field) and end (the fix)


def quote(value: Any, limit: int = MAX_QUOTE_CHARS) -> str:
    """repr(value), cut to about `limit` characters: an error names a value, it never echoes a document.
    repr shows control characters as escapes (\\x1b), so the quote is safe to print anywhere."""
    if isinstance(value, int) and value.bit_length() > 10_000:  # repr would raise past 4300 digits (int_max_str_digits)
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


# What a terminal, a log file or a browser would act on or hide rather than show: control characters (C0, DEL,
# C1: ESC starts terminal sequences), format characters (bidi overrides, zero-width), lone surrogates, and the
# Unicode line and paragraph separators.
HIDDEN_CATEGORIES = ("Cc", "Cf", "Cs", "Zl", "Zp")
_NOT_PLAIN_ASCII = re.compile(r"[^ -~]")


def escape_char(char: str) -> str:
    """A character as a visible escape: \\x1b, \\u202e, \\U000e0001."""
    n = ord(char)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def printable(text: str, keep: str = "") -> str:
    """`text` with every hidden character (HIDDEN_CATEGORIES) but those in `keep` shown as its escape, so what
    is printed or logged is what the text holds: an ESC from a job name or a data file never reaches a terminal."""

    def visible(m: re.Match) -> str:
        c = m.group()
        return c if c in keep or unicodedata.category(c) not in HIDDEN_CATEGORIES else escape_char(c)

    return _NOT_PLAIN_ASCII.sub(visible, text)


def clip_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """One line of at most about `limit` characters, the middle dropped."""
    text = " ".join(text.split("\n"))
    if len(text) <= limit:
        return text
    tail = limit // 4
    return f"{text[:limit - tail]} ... {text[-tail:]}"


class UserError(ValueError):
    """Bad input: a config field, a path or the data. The message names it and says how to fix it.

    The message is one line and bounded in length whatever the input was (`clip_message`).
    `public` says what may be shown to someone who did not write the data (the job server's API, which
    never echoes file content): True when the message itself holds no data content (only field names,
    counts and the submitter's own values), or a replacement line that names the field and the problem.
    False (the default): the server shows only the field and a generic problem (`public_message`)."""

    def __init__(self, *args: Any, public: Union[bool, str] = False) -> None:
        if args and isinstance(args[0], str):
            args = (clip_message(args[0]), *args[1:])
        super().__init__(*args)
        self.public = clip_message(public) if isinstance(public, str) else public


def public_message(error: UserError, context: str = "data") -> str:
    """A line about `error` fit for anyone to read: its own text if marked public, else its field only."""
    if isinstance(error.public, str):
        return error.public
    text = str(error)
    if error.public:
        return text
    field = text.split(":", 1)[0] if ":" in text else ""
    if not re.fullmatch(r"[a-z_]+(\.[A-Za-z0-9_]+|\[[0-9]+\])*", field):
        field = context
    return f"{field}: the {context} cannot be used as given (details are in the server's log, not shown here)"


class UnknownNameError(UserError, KeyError):
    """A registry lookup failed; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class JobFailed(RuntimeError):
    """The run itself failed (diverged, too many bad steps): exit code 1."""
