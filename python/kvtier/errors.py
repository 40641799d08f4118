"""Status codes of the C ABI and the exceptions they become."""

from __future__ import annotations

import enum


class Status(enum.IntEnum):
    """``kvt_status``: outcome of a call, of a job, or of one key inside a job."""

    OK = 0
    NULL_ARGUMENT = 1
    INVALID_ARGUMENT = 2
    CONFIG = 3
    CONNECT = 4
    IO = 5
    NOT_FOUND = 6
    STATE = 7
    PANIC = 8
    DUPLICATE_JOB = 9
    SHUT_DOWN = 10
    CANCELLED = 11
    TIMEOUT = 12
    LENGTH_MISMATCH = 13
    CORRUPT = 14
    AUTH = 15
    PERMISSION_DENIED = 16
    BUCKET_NOT_FOUND = 17
    TLS = 18
    FORKED = 19
    BLOCK_BUSY = 20
    UNDECRYPTABLE = 21


#: Every known code's ``Status``: a table, since the binding converts codes per key on the
#: poll path and the enum constructor costs several times a dict lookup.
STATUS_BY_CODE: dict[int, Status] = {int(s): s for s in Status}


def as_status(value: int) -> Status | int:
    """``Status(value)``, or the plain int for a code newer than this binding."""
    return STATUS_BY_CODE.get(value, value)


class KvtierError(RuntimeError):
    """A kvtier call failed.

    ``status`` is the :class:`Status` the C function returned and ``message`` the text of
    ``kvt_last_error()`` (never contains secrets). Subclasses exist per status; the ones
    for bad arguments and configuration are also :class:`ValueError`.
    """

    status: Status | int = Status.PANIC

    def __init__(self, status: Status | int, message: str = ""):
        self.status = as_status(int(status))
        self.message = message
        name = self.status.name if isinstance(self.status, Status) else f"status {self.status}"
        super().__init__(f"{message} [{name}]" if message else name)


class NullArgumentError(KvtierError, ValueError):
    pass


class InvalidArgumentError(KvtierError, ValueError):
    pass


class ConfigError(KvtierError, ValueError):
    pass


class ConnectError(KvtierError):
    pass


class StorageIOError(KvtierError):
    pass


class NotFoundError(KvtierError):
    pass


class StateError(KvtierError):
    pass


class PanicError(KvtierError):
    pass


class DuplicateJobError(KvtierError):
    pass


class ShutDownError(KvtierError):
    pass


class CancelledError(KvtierError):
    pass


class TimedOutError(KvtierError):
    pass


class LengthMismatchError(KvtierError):
    pass


class CorruptError(KvtierError):
    pass


class AuthError(KvtierError):
    pass


class PermissionDeniedError(KvtierError):
    pass


class BucketNotFoundError(KvtierError):
    pass


class TlsError(KvtierError):
    pass


class ForkedError(KvtierError):
    """The tier was created by another process (this one is a ``fork()`` child of it)."""


class BlockBusyError(KvtierError):
    """A block of the job is held by another job whose result has not been polled."""


class UndecryptableError(KvtierError):
    """An encrypted object did not open with the tier's keyring (a key not in the ring, or
    a failed authentication tag): the key answers MISS and its next store rewrites it."""


_BY_STATUS: dict[int, type[KvtierError]] = {
    Status.NULL_ARGUMENT: NullArgumentError,
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.CONFIG: ConfigError,
    Status.CONNECT: ConnectError,
    Status.IO: StorageIOError,
    Status.NOT_FOUND: NotFoundError,
    Status.STATE: StateError,
    Status.PANIC: PanicError,
    Status.DUPLICATE_JOB: DuplicateJobError,
    Status.SHUT_DOWN: ShutDownError,
    Status.CANCELLED: CancelledError,
    Status.TIMEOUT: TimedOutError,
    Status.LENGTH_MISMATCH: LengthMismatchError,
    Status.CORRUPT: CorruptError,
    Status.AUTH: AuthError,
    Status.PERMISSION_DENIED: PermissionDeniedError,
    Status.BUCKET_NOT_FOUND: BucketNotFoundError,
    Status.TLS: TlsError,
    Status.FORKED: ForkedError,
    Status.BLOCK_BUSY: BlockBusyError,
    Status.UNDECRYPTABLE: UndecryptableError,
}


def error_for(status: int, message: str) -> KvtierError:
    """The exception for a failed call's status and message."""
    return _BY_STATUS.get(status, KvtierError)(status, message)
