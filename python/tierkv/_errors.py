"""tierkv's errors as Python exceptions.

Every tierkv call that fails raises a subclass of :class:`Error` named after
the status code of the C++ API (``tierkv/status.h``). Where a built-in
exception means the same thing, the class derives from it too, so that
``except ValueError`` or ``except TimeoutError`` catches tierkv's errors of
that kind.
"""

from __future__ import annotations


class Error(Exception):
    """A failed tierkv call: ``code`` (e.g. "UNAVAILABLE") and ``message``."""

    code: str = "UNKNOWN"

    def __init__(self, message: str = "", code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"

    def __reduce__(self):
        return (error_for, (self.code, self.message))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Error):
            return NotImplemented
        return self.code == other.code and self.message == other.message

    def __hash__(self) -> int:
        return hash((self.code, self.message))


class InvalidArgumentError(Error, ValueError):
    """The caller passed something malformed."""

    code = "INVALID_ARGUMENT"


class NotFoundError(Error):
    """The thing asked for does not exist."""

    code = "NOT_FOUND"


class AlreadyExistsError(Error):
    """Creating something that is already there."""

    code = "ALREADY_EXISTS"


class ResourceExhaustedError(Error):
    """Not enough free blocks, slots or bytes right now."""

    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(Error):
    """The store or client is not in a state that allows this call."""

    code = "FAILED_PRECONDITION"


class OutOfRangeError(Error, IndexError):
    """An index or id past the valid range."""

    code = "OUT_OF_RANGE"


class PermissionDeniedError(Error, PermissionError):
    """The caller may not do this."""

    code = "PERMISSION_DENIED"


class UnavailableError(Error, ConnectionError):
    """A peer (tierkvd, a worker) is gone; retrying may help."""

    code = "UNAVAILABLE"


class DataLossError(Error):
    """Stored bytes failed verification."""

    code = "DATA_LOSS"


class UnimplementedError(Error, NotImplementedError):
    """Not supported by this build or backend."""

    code = "UNIMPLEMENTED"


class InternalError(Error):
    """An invariant broke: a bug in tierkv."""

    code = "INTERNAL"


class DeadlineExceededError(Error, TimeoutError):
    """A peer did not answer in time (wedged or slow)."""

    code = "DEADLINE_EXCEEDED"


class AbortedError(Error):
    """Cancelled before it took effect."""

    code = "ABORTED"


_BY_CODE: dict[str, type[Error]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        NotFoundError,
        AlreadyExistsError,
        ResourceExhaustedError,
        FailedPreconditionError,
        OutOfRangeError,
        PermissionDeniedError,
        UnavailableError,
        DataLossError,
        UnimplementedError,
        InternalError,
        DeadlineExceededError,
        AbortedError,
    )
}


for _cls in (Error, *_BY_CODE.values()):
    _cls.__module__ = "tierkv"  # Where users name them: tierkv.UnavailableError.


def error_for(code: str, message: str) -> Error:
    """The exception for status `code` ("INVALID_ARGUMENT", ...)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return Error(message, code=code)
    return cls(message)
