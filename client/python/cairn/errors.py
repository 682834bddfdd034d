"""Cairn's exceptions: one class per absl status code, all under `Error`.

Every failure of the extension (and of the pure-Python layers above it) is
raised as one of these, never as RuntimeError. The class says what to do
(e.g. UnavailableError: cairnd did not answer, retry later; AbortedError: the
save was aborted by this or another rank; DataLossError: stored bytes are
damaged) and the message names the job, step, rank and tensor (fqn)
involved, as libcairn's C++ messages do.
"""

from typing import Dict, Type


class Error(Exception):
    """A failed Cairn call.

    Attributes:
      code: the absl status code name, e.g. "NOT_FOUND".
      message: libcairn's message (names the job, step, rank and fqn).
    """

    code = "UNKNOWN"

    def __init__(self, message: str = "", code: str = ""):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class CancelledError(Error):
    """The call was cancelled (Checkpointer.cancel, Ctrl-C, a shutdown)."""
    code = "CANCELLED"


class UnknownError(Error):
    """An error without a more specific code."""
    code = "UNKNOWN"


class InvalidArgumentError(Error):
    """The state dict, step or an option is wrong (the message names it)."""
    code = "INVALID_ARGUMENT"


class DeadlineExceededError(Error):
    """A wait ran out of time (e.g. SaveFuture.wait's timeout, or the other
    ranks did not join a save in time)."""
    code = "DEADLINE_EXCEEDED"


class NotFoundError(Error):
    """No such checkpoint (or the job has none)."""
    code = "NOT_FOUND"


class AlreadyExistsError(Error):
    """The checkpoint already exists (e.g. the step was saved before)."""
    code = "ALREADY_EXISTS"


class PermissionDeniedError(Error):
    """Storage or cairnd refused the access."""
    code = "PERMISSION_DENIED"


class ResourceExhaustedError(Error):
    """Out of space (storage, the agent's staging memory, ...)."""
    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(Error):
    """The system is not in a state that allows the call (e.g. describing a
    checkpoint that is not committed)."""
    code = "FAILED_PRECONDITION"


class AbortedError(Error):
    """The save was aborted, by this rank or another (the message says
    which rank and why); no committed checkpoint is affected."""
    code = "ABORTED"


class OutOfRangeError(Error):
    """A read or value beyond the valid range."""
    code = "OUT_OF_RANGE"


class UnimplementedError(Error):
    """Not supported by this build or this cairnd."""
    code = "UNIMPLEMENTED"


class InternalError(Error):
    """A bug: an invariant of Cairn broke."""
    code = "INTERNAL"


class UnavailableError(Error):
    """cairnd (or the agent) did not answer, after the configured retries;
    retry later."""
    code = "UNAVAILABLE"


class DataLossError(Error):
    """Stored bytes are damaged (a crc32c mismatch or a missing object)."""
    code = "DATA_LOSS"


class UnauthenticatedError(Error):
    """The caller's credentials were refused."""
    code = "UNAUTHENTICATED"


_BY_CODE: Dict[str, Type[Error]] = {
    cls.code: cls
    for cls in (CancelledError, UnknownError, InvalidArgumentError,
                DeadlineExceededError, NotFoundError, AlreadyExistsError,
                PermissionDeniedError, ResourceExhaustedError,
                FailedPreconditionError, AbortedError, OutOfRangeError,
                UnimplementedError, InternalError, UnavailableError,
                DataLossError, UnauthenticatedError)
}


def from_status(code_name: str, message: str) -> Error:
    """The exception for an absl status: `code_name` is the code's name
    ("NOT_FOUND", ...); an unknown name gives an UnknownError that keeps
    it as `code`."""
    cls = _BY_CODE.get(code_name)
    if cls is None:
        return UnknownError(message, code=code_name or "UNKNOWN")
    return cls(message)


__all__ = ["Error", "from_status"] + sorted(c.__name__
                                            for c in _BY_CODE.values())
