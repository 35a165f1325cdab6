"""The exceptions of sepp: one class per stable error code of the core, under `SeppError`.

Every exception carries the core's stable `code` (a SCREAMING_SNAKE string such as
``"JOB_NOT_IN_FLIGHT"``), its `message`, and `retryable`, the core's verdict on whether the same
call may succeed later. The hierarchy::

    SeppError
    ├── TransportError                   TRANSPORT                 (retryable)
    ├── UnauthenticatedError             UNAUTHENTICATED
    ├── PermissionDeniedError            PERMISSION_DENIED
    ├── OverloadedError                  OVERLOADED                (retryable)
    ├── InvalidArgumentError             INVALID_ARGUMENT          (also a ValueError)
    ├── FailedPreconditionError          FAILED_PRECONDITION
    ├── LeaseLostError                                             (.job_id)
    │   ├── JobNotInFlightError          JOB_NOT_IN_FLIGHT
    │   └── AttemptMismatchError         ATTEMPT_MISMATCH
    ├── ServerFaultError                 SERVER_FAULT
    ├── UnsupportedError                 UNSUPPORTED
    ├── InvalidConfigError               INVALID_CONFIG            (also a ValueError)
    └── JobRejectedError                                           (.rejection, .index, .failures)
        ├── UnknownQueueError            UNKNOWN_QUEUE
        ├── PayloadTooLargeError         PAYLOAD_TOO_LARGE
        ├── EncodingNotAllowedError      ENCODING_NOT_ALLOWED
        ├── JobTypeNotAllowedError       JOB_TYPE_NOT_ALLOWED
        ├── CustomEntriesTooManyError    CUSTOM_ENTRIES_TOO_MANY
        ├── CustomMapTooLargeError       CUSTOM_MAP_TOO_LARGE
        ├── CustomKeyTooLongError        CUSTOM_KEY_TOO_LONG
        ├── QueueNameTooLongError        QUEUE_NAME_TOO_LONG
        ├── JobTypeNameTooLongError      JOB_TYPE_NAME_TOO_LONG
        ├── IdempotencyKeyTooLongError   IDEMPOTENCY_KEY_TOO_LONG
        ├── ScheduledTooFarError         SCHEDULED_TOO_FAR
        ├── InvalidRequestError          INVALID_REQUEST           (also a ValueError)
        ├── QueueFullError               QUEUE_FULL                (transient)
        ├── QueueClosingError            QUEUE_CLOSING             (transient)
        ├── IdempotencyKeyConflictError  IDEMPOTENCY_KEY_CONFLICT
        ├── TooManyQueuesError           TOO_MANY_QUEUES
        └── UnknownRejectionError        UNKNOWN_REJECTION

Every class is named for its code, ``<PascalCode>Error``, as in TypeScript; the core's table
is `sepp.ERROR_CLASS_NAMES`. The names of earlier releases without the ``Error`` suffix
(``JobNotInFlight``, ``QueueFull``, ``InvalidRequest``, ...) still work as deprecated aliases
of these classes; using one warns with `DeprecationWarning`.

A job rejection is also a value, `sepp.Rejection`, with the same fields as its exception: it is
what `enqueue_batch` returns in place of an ack, and what `JobRejectedError.rejection` holds.

Using a closed client raises `RuntimeError`, and a wrong argument type raises `TypeError`
naming the argument; neither is a `SeppError`.
"""

from __future__ import annotations

import warnings
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Optional, TypeVar

if TYPE_CHECKING:
    from sepp._native import Rejection

__all__ = [
    "SeppError",
    "TransportError",
    "UnauthenticatedError",
    "PermissionDeniedError",
    "OverloadedError",
    "InvalidArgumentError",
    "FailedPreconditionError",
    "LeaseLostError",
    "JobNotInFlightError",
    "AttemptMismatchError",
    "ServerFaultError",
    "UnsupportedError",
    "InvalidConfigError",
    "JobRejectedError",
    "UnknownQueueError",
    "PayloadTooLargeError",
    "EncodingNotAllowedError",
    "JobTypeNotAllowedError",
    "CustomEntriesTooManyError",
    "CustomMapTooLargeError",
    "CustomKeyTooLongError",
    "QueueNameTooLongError",
    "JobTypeNameTooLongError",
    "IdempotencyKeyTooLongError",
    "ScheduledTooFarError",
    "InvalidRequestError",
    "QueueFullError",
    "QueueClosingError",
    "IdempotencyKeyConflictError",
    "TooManyQueuesError",
    "UnknownRejectionError",
    "error_class",
]

_T = TypeVar("_T")


class SeppError(Exception):
    """The root of every error sepp raises.

    Attributes:
        code: The stable error code, e.g. ``"TRANSPORT"``; `sepp.ERROR_CODES` lists them all.
        message: What happened, naming the field and the limit where there is one.
        retryable: True when the same call may succeed later (transport errors, overload,
            a full or closing queue).
        grpc_code: The numeric gRPC status code when the error came from the server, else None.
    """

    code: str = ""

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        retryable: bool = False,
        grpc_code: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.retryable = retryable
        self.grpc_code = grpc_code


class TransportError(SeppError):
    """The server could not be reached, or the call was cut off (deadline, reset). Retryable."""

    code = "TRANSPORT"


class UnauthenticatedError(SeppError):
    """The API key is missing or wrong. Not retryable: fix `api_key`."""

    code = "UNAUTHENTICATED"


class PermissionDeniedError(SeppError):
    """The API key lacks the role the call needs; the message names it. Not retryable."""

    code = "PERMISSION_DENIED"


class OverloadedError(SeppError):
    """The server sheds load. Retryable after a pause."""

    code = "OVERLOADED"


class InvalidArgumentError(SeppError, ValueError):
    """A call's argument is invalid (checked by the client before sending, or by the server):
    an empty queue list, a zero or negative duration, an empty batch, ..."""

    code = "INVALID_ARGUMENT"


class FailedPreconditionError(SeppError):
    """The server refused the call in its current state: in strict mode, `reserve` listed an
    undeclared queue."""

    code = "FAILED_PRECONDITION"


class LeaseLostError(SeppError):
    """The lease of this delivery is gone (ack, nack or extend came too late or twice).

    Stop working on the job: it is, or will be, delivered again.

    Attributes:
        job_id: The job named in the call.
    """

    def __init__(
        self,
        message: str,
        *,
        job_id: Optional[str] = None,
        code: Optional[str] = None,
        retryable: bool = False,
        grpc_code: Optional[int] = None,
    ) -> None:
        super().__init__(message, code=code, retryable=retryable, grpc_code=grpc_code)
        self.job_id = job_id


class JobNotInFlightError(LeaseLostError):
    """The job is not in flight: acked, lease expired, dead-lettered, or never existed."""

    code = "JOB_NOT_IN_FLIGHT"


class AttemptMismatchError(LeaseLostError):
    """The job is in flight under another attempt: this delivery's lease expired and the job
    was delivered again."""

    code = "ATTEMPT_MISMATCH"


class ServerFaultError(SeppError):
    """The server failed, or sent an answer this client cannot read."""

    code = "SERVER_FAULT"


class UnsupportedError(SeppError):
    """The server does not implement the call."""

    code = "UNSUPPORTED"


class InvalidConfigError(SeppError, ValueError):
    """The address, TLS settings, API key or another connection setting is unusable."""

    code = "INVALID_CONFIG"


class JobRejectedError(SeppError):
    """A job was not accepted, by the client before sending or by the server.

    Raised by `EnqueueRequest(...)` (structural checks), `enqueue` and `enqueue_atomic`; the
    subclass names the reason. `enqueue_batch` returns the same `Rejection` values in its
    result list instead of raising.

    Attributes:
        rejection: The rejection as a value (its fields depend on the code).
        index: The position of the rejected job in the request (0 for a single job; for
            `enqueue_atomic`, the first failing job).
        failures: Every failing job as ``(index, rejection)``, in index order (one entry except
            for `enqueue_atomic`, which writes nothing when any job fails).
    """

    def __init__(
        self,
        rejection: Rejection,
        *,
        index: int = 0,
        failures: Optional[list[tuple[int, Rejection]]] = None,
    ) -> None:
        super().__init__(rejection.message, code=rejection.code, retryable=rejection.transient)
        self.rejection = rejection
        self.index = index
        self.failures = failures if failures is not None else [(index, rejection)]

    @staticmethod
    def for_rejection(
        rejection: Rejection,
        *,
        index: int = 0,
        failures: Optional[list[tuple[int, Rejection]]] = None,
    ) -> JobRejectedError:
        """The exception for `rejection`, of the subclass named by its code.

        Args:
            rejection: A rejection, e.g. from the results of `enqueue_batch`.
            index: The position of the job in its request.
            failures: Every failing job, when there were several.

        Returns:
            An instance of the matching subclass (`JobRejectedError` itself for an unknown code).
        """
        cls = _CLASSES.get(rejection.code)
        if cls is None or not issubclass(cls, JobRejectedError):
            cls = JobRejectedError
        return cls(rejection, index=index, failures=failures)


def _field(value: Optional[_T], name: str) -> _T:
    if value is None:
        raise AttributeError(f"this rejection has no {name}")
    return value


class _LimitActual(JobRejectedError):
    @property
    def limit(self) -> int:
        """The limit, in bytes (or entries for `CustomEntriesTooManyError`)."""
        return _field(self.rejection.limit, "limit")

    @property
    def actual(self) -> int:
        """What the job had, in the unit of `limit`."""
        return _field(self.rejection.actual, "actual")


class _Queue(JobRejectedError):
    @property
    def queue(self) -> str:
        """The queue named in the request."""
        return _field(self.rejection.queue, "queue")


class _Allowed(JobRejectedError):
    @property
    def allowed(self) -> list[str]:
        """What the queue allows."""
        return _field(self.rejection.allowed, "allowed")


class UnknownQueueError(_Queue):
    """Strict mode, and the queue is not declared. Deterministic."""

    code = "UNKNOWN_QUEUE"


class PayloadTooLargeError(_LimitActual):
    """The payload is larger than the queue's `max_payload_bytes` (`limit`, `actual` in bytes)."""

    code = "PAYLOAD_TOO_LARGE"


class EncodingNotAllowedError(_Allowed):
    """The payload's encoding is not in the queue's `allowed_encodings`."""

    code = "ENCODING_NOT_ALLOWED"

    @property
    def encoding(self) -> str:
        """The encoding sent."""
        return _field(self.rejection.encoding, "encoding")


class JobTypeNotAllowedError(_Allowed):
    """The job type is not in the queue's `allowed_job_types`."""

    code = "JOB_TYPE_NOT_ALLOWED"

    @property
    def job_type(self) -> str:
        """The job type sent."""
        return _field(self.rejection.job_type, "job_type")


class CustomEntriesTooManyError(_LimitActual):
    """The custom map has more than `max_custom_entries` entries (`limit`, `actual`)."""

    code = "CUSTOM_ENTRIES_TOO_MANY"


class CustomMapTooLargeError(_LimitActual):
    """The custom map is larger than `max_custom_total_bytes` (`limit`, `actual` in bytes)."""

    code = "CUSTOM_MAP_TOO_LARGE"


class CustomKeyTooLongError(_LimitActual):
    """A custom key is longer than `max_custom_key_bytes` (`limit`, `actual` in UTF-8 bytes)."""

    code = "CUSTOM_KEY_TOO_LONG"

    @property
    def key(self) -> str:
        """The key."""
        return _field(self.rejection.key, "key")


class QueueNameTooLongError(_LimitActual):
    """The queue name is longer than `max_queue_name_bytes` (`limit`, `actual` in UTF-8 bytes)."""

    code = "QUEUE_NAME_TOO_LONG"


class JobTypeNameTooLongError(_LimitActual):
    """The job type is longer than `max_job_type_bytes` (`limit`, `actual` in UTF-8 bytes)."""

    code = "JOB_TYPE_NAME_TOO_LONG"


class IdempotencyKeyTooLongError(_LimitActual):
    """The idempotency key is longer than the server's `max_idempotency_key_bytes`.

    Checked by the client before anything is sent. `limit` and `actual` are UTF-8 bytes.
    """

    code = "IDEMPOTENCY_KEY_TOO_LONG"


class ScheduledTooFarError(JobRejectedError):
    """`scheduled_at` is beyond the queue's schedule horizon."""

    code = "SCHEDULED_TOO_FAR"

    @property
    def horizon(self) -> timedelta:
        """How far ahead a job may be scheduled."""
        return _field(self.rejection.horizon, "horizon")

    @property
    def scheduled_at(self) -> datetime:
        """The requested time (aware, UTC)."""
        return _field(self.rejection.scheduled_at, "scheduled_at")


class InvalidRequestError(JobRejectedError, ValueError):
    """The request is structurally invalid: an empty name or key, a priority over 9,
    `max_attempts` of 0, a naive `scheduled_at`, ... The message names the field."""

    code = "INVALID_REQUEST"


class QueueFullError(_Queue):
    """The queue holds `max_queue_depth` jobs. Transient: the same job may succeed later."""

    code = "QUEUE_FULL"

    @property
    def limit(self) -> int:
        """The queue's `max_queue_depth`, in jobs."""
        return _field(self.rejection.limit, "limit")


class QueueClosingError(_Queue):
    """The queue is being deleted. Transient."""

    code = "QUEUE_CLOSING"


class IdempotencyKeyConflictError(JobRejectedError):
    """The idempotency key's live record names another job, enqueued with a different job
    type, payload, encoding, priority or custom map (queues with ``key_conflict = "reject"``).
    Deterministic: send the original's contents, or use another key."""

    code = "IDEMPOTENCY_KEY_CONFLICT"

    @property
    def original_job_id(self) -> str:
        """The id of the job the key names."""
        return _field(self.rejection.original_job_id, "original_job_id")


class TooManyQueuesError(_Queue):
    """The job's queue does not exist yet and the server holds ``limits.max_queues`` queues
    already. Not retried: it lasts until an operator deletes queues or raises the cap."""

    code = "TOO_MANY_QUEUES"

    @property
    def limit(self) -> int:
        """The server's ``limits.max_queues``, in queues."""
        return _field(self.rejection.limit, "limit")


class UnknownRejectionError(JobRejectedError):
    """A rejection this client does not know (a newer server)."""

    code = "UNKNOWN_REJECTION"


_CLASSES: dict[str, type[SeppError]] = {
    cls.code: cls
    for cls in (
        TransportError,
        UnauthenticatedError,
        PermissionDeniedError,
        OverloadedError,
        InvalidArgumentError,
        FailedPreconditionError,
        JobNotInFlightError,
        AttemptMismatchError,
        ServerFaultError,
        UnsupportedError,
        InvalidConfigError,
        UnknownQueueError,
        PayloadTooLargeError,
        EncodingNotAllowedError,
        JobTypeNotAllowedError,
        CustomEntriesTooManyError,
        CustomMapTooLargeError,
        CustomKeyTooLongError,
        QueueNameTooLongError,
        JobTypeNameTooLongError,
        IdempotencyKeyTooLongError,
        ScheduledTooFarError,
        InvalidRequestError,
        QueueFullError,
        QueueClosingError,
        IdempotencyKeyConflictError,
        TooManyQueuesError,
        UnknownRejectionError,
    )
}


def error_class(code: str) -> Optional[type[SeppError]]:
    """The exception class of a stable error code.

    Args:
        code: A code such as ``"QUEUE_FULL"``.

    Returns:
        The class, or None for a code this package does not know.
    """
    return _CLASSES.get(code)


def _from_native(
    code: str,
    message: str,
    retryable: bool,
    grpc_code: Optional[int],
    job_id: Optional[str],
    failures: Optional[list[tuple[int, Rejection]]],
) -> SeppError:
    """Builds the exception for a failure reported by the native module."""
    if failures:
        index, first = failures[0]
        return JobRejectedError.for_rejection(first, index=index, failures=failures)
    cls = _CLASSES.get(code)
    if cls is None or issubclass(cls, JobRejectedError):
        return SeppError(message, code=code, retryable=retryable, grpc_code=grpc_code)
    if issubclass(cls, LeaseLostError):
        return cls(message, job_id=job_id, retryable=retryable, grpc_code=grpc_code)
    return cls(message, retryable=retryable, grpc_code=grpc_code)


# The names of earlier releases, kept as deprecated aliases: old name -> class.
_DEPRECATED_NAMES: dict[str, str] = {
    "JobNotInFlight": "JobNotInFlightError",
    "AttemptMismatch": "AttemptMismatchError",
    "UnknownQueue": "UnknownQueueError",
    "PayloadTooLarge": "PayloadTooLargeError",
    "EncodingNotAllowed": "EncodingNotAllowedError",
    "JobTypeNotAllowed": "JobTypeNotAllowedError",
    "CustomEntriesTooMany": "CustomEntriesTooManyError",
    "CustomMapTooLarge": "CustomMapTooLargeError",
    "CustomKeyTooLong": "CustomKeyTooLongError",
    "QueueNameTooLong": "QueueNameTooLongError",
    "JobTypeNameTooLong": "JobTypeNameTooLongError",
    "IdempotencyKeyTooLong": "IdempotencyKeyTooLongError",
    "ScheduledTooFar": "ScheduledTooFarError",
    "InvalidRequest": "InvalidRequestError",
    "QueueFull": "QueueFullError",
    "QueueClosing": "QueueClosingError",
    "UnknownRejection": "UnknownRejectionError",
}


def __getattr__(name: str) -> type[SeppError]:
    """Serves the deprecated names of earlier releases, with a `DeprecationWarning`."""
    new = _DEPRECATED_NAMES.get(name)
    if new is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"sepp.errors.{name} is deprecated: use {new}", DeprecationWarning, stacklevel=2
    )
    cls: type[SeppError] = globals()[new]
    return cls


if TYPE_CHECKING:
    # The deprecated aliases, for type checkers (at run time `__getattr__` serves them).
    JobNotInFlight = JobNotInFlightError
    AttemptMismatch = AttemptMismatchError
    UnknownQueue = UnknownQueueError
    PayloadTooLarge = PayloadTooLargeError
    EncodingNotAllowed = EncodingNotAllowedError
    JobTypeNotAllowed = JobTypeNotAllowedError
    CustomEntriesTooMany = CustomEntriesTooManyError
    CustomMapTooLarge = CustomMapTooLargeError
    CustomKeyTooLong = CustomKeyTooLongError
    QueueNameTooLong = QueueNameTooLongError
    JobTypeNameTooLong = JobTypeNameTooLongError
    IdempotencyKeyTooLong = IdempotencyKeyTooLongError
    ScheduledTooFar = ScheduledTooFarError
    InvalidRequest = InvalidRequestError
    QueueFull = QueueFullError
    QueueClosing = QueueClosingError
    UnknownRejection = UnknownRejectionError
