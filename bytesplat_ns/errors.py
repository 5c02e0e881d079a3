"""User-facing errors.

A :class:`BytesplatError` is raised for problems the user can fix (bad input data, a missing file, an
unsupported setup). Its message is one line that names the problem (and the file, field or frame
involved); an optional hint says what to do about it. The command-line entry points print these without
a traceback and exit non-zero; everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import Optional


class BytesplatError(Exception):
    """A user error with a one-line message naming the problem and an optional hint.

    ``str(err)`` is the message, followed by ``"\\n  hint: <hint>"`` when a hint is given.
    """

    def __init__(self, message: str, hint: Optional[str] = None):
        # Keep the message on one line whatever the caller passed in (e.g. a multi-line OSError text).
        self.message = " ".join(str(message).split())
        self.hint = " ".join(str(hint).split()) if hint else None
        super().__init__(self.message, self.hint)

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, hint={self.hint!r})"

    def __reduce__(self):
        # Picklable with its hint (multiprocessing / torch.distributed pass exceptions between processes).
        return (type(self), (self.message, self.hint))


class SettingError(BytesplatError, ValueError):
    """A bad value of a bytesplat setting (e.g. a ``FusedOptions`` field given in code): one line on
    the command line like any :class:`BytesplatError`, and a ``ValueError`` to code."""
