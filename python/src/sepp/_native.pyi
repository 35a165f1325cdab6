"""The native module of sepp: the classes over the Rust core sepp-rs.

Import the names from `sepp`, which re-exports them; this module is private. Validation and
retries happen in the core; the classes here convert Python values and map errors to
`sepp.errors`.

Every async method returns a coroutine. Arguments are converted when the method is called (a
wrong type raises `TypeError` at once); the call itself starts when the coroutine runs, and
cancelling the awaiting task cancels the call.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Literal, Optional, Union, final

__all__ = [
    "__version__",
    "ERROR_CODES",
    "ERROR_CLASS_NAMES",
    "DeadLetterPage",
    "DeadLetterRecord",
    "Engine",
    "EngineOptions",
    "EnqueueAck",
    "EnqueueRequest",
    "Job",
    "JobInfo",
    "KeyRecord",
    "Lease",
    "NackRetry",
    "Outcome",
    "Payload",
    "QueueStats",
    "Rejection",
    "RetryPolicy",
    "SeppClient",
    "ServerInfo",
    "TlsOptions",
    "TraceContext",
    "WorkerReport",
]

__version__: str
"""The package version."""

ERROR_CODES: tuple[str, ...]
"""Every stable error code of the core (`ErrorCode::ALL`), e.g. ``"JOB_NOT_IN_FLIGHT"``.

`sepp.errors` has an exception class for each.
"""

ERROR_CLASS_NAMES: dict[str, str]
"""The exception class of each code in `sepp.errors`, by code: the code in PascalCase then
``Error`` (``"JOB_NOT_IN_FLIGHT"`` -> ``"JobNotInFlightError"``), the name TypeScript uses too.
"""

_CustomValue = Union[str, int, float, bool]
_DeadLetterCause = Literal["UNSPECIFIED", "ATTEMPTS_EXHAUSTED", "REJECTED", "LEASE_EXPIRED", "ADMIN"]

@final
class Payload:
    """A job's data and the hint for reading it.

    Example::

        Payload(b'{"photo": 4411}', "application/json")
    """

    def __new__(cls, data: Union[bytes, bytearray], encoding: str) -> Payload:
        """Creates a payload.

        Args:
            data: The bytes (copied from a `bytearray`). Must be non-empty when used in an
                `EnqueueRequest`: omit the payload when there is no data.
            encoding: A non-empty hint such as a MIME type (``"application/json"``). A queue
                may restrict the encodings it accepts (`EncodingNotAllowedError`).

        Raises:
            TypeError: `data` is not `bytes` or `bytearray`, or `encoding` is not a `str`.
        """

    @property
    def data(self) -> bytes:
        """The bytes."""

    @property
    def encoding(self) -> str:
        """The encoding hint."""

@final
class TraceContext:
    """A W3C trace context carried with the job."""

    def __new__(cls, traceparent: str, tracestate: Optional[str] = None) -> TraceContext:
        """Creates a trace context.

        Args:
            traceparent: The ``traceparent`` header value; non-empty.
            tracestate: The ``tracestate`` header value.
        """

    @property
    def traceparent(self) -> str:
        """The ``traceparent`` value."""

    @property
    def tracestate(self) -> Optional[str]:
        """The ``tracestate`` value, if any."""

    def __eq__(self, value: object, /) -> bool: ...

@final
class EnqueueRequest:
    """One job to enqueue.

    Building one checks the argument types only. The values are checked by the core when the
    request is sent (`SeppClient.enqueue`, `enqueue_batch`, `enqueue_atomic`), before anything
    goes out, as in every language: the structural rules with the server's messages (the queue
    name, empty names, priority range, empty key, empty payload, ...), then the lengths up to
    the idempotency key's against the limits the server advertised. A value that cannot be
    held (a negative `priority`, an int over 64 bits in `custom`, a naive `scheduled_at`) is an
    `InvalidRequestError` at that point too; its field then reads None (or is left out of
    `custom`).
    """

    def __new__(
        cls,
        queue: str,
        job_type: str,
        *,
        payload: Optional[Payload] = None,
        idempotency_key: Optional[str] = None,
        priority: Optional[int] = None,
        max_attempts: Optional[int] = None,
        custom: Optional[Mapping[str, _CustomValue]] = None,
        trace_context: Optional[TraceContext] = None,
        scheduled_at: Optional[datetime] = None,
    ) -> EnqueueRequest:
        """Creates a request for a `job_type` job on `queue`.

        Args:
            queue: The target queue; non-empty. Queues are created on first use unless the
                server runs in strict mode.
            job_type: What the job is, for the worker; non-empty.
            payload: The job's data.
            idempotency_key: Names what the job is about (an order id, an event id): within
                the queue's dedup window, a second enqueue with the same key on the same queue
                returns the first job's id instead of creating a job. 1 to
                `max_idempotency_key_bytes` UTF-8 bytes (the server's limit, 256 by default).
            priority: 0 (lowest) to 9 (highest). None: the queue's default.
            max_attempts: Deliveries before the job is dead-lettered; at least 1. None: the
                queue's default. The server clamps it to its ceiling.
            custom: Extra entries delivered with the job; non-empty `str` keys, values `str`,
                `int` (64-bit), `float` or `bool`.
            trace_context: W3C trace context.
            scheduled_at: Not ready before this time; timezone-aware. A past time means at once.

        Raises:
            TypeError: An argument has the wrong type (the message names it). Invalid values
                are reported when the request is sent, not here.
        """

    @property
    def queue(self) -> str:
        """The target queue."""

    @property
    def job_type(self) -> str:
        """The job type."""

    @property
    def payload(self) -> Optional[Payload]:
        """The payload given, if any."""

    @property
    def idempotency_key(self) -> Optional[str]:
        """The idempotency key, if any."""

    @property
    def priority(self) -> Optional[int]:
        """The priority (0-9), or None for the queue's default."""

    @property
    def max_attempts(self) -> Optional[int]:
        """The delivery limit, or None for the queue's default."""

    @property
    def custom(self) -> dict[str, _CustomValue]:
        """A copy of the custom entries."""

    @property
    def trace_context(self) -> Optional[TraceContext]:
        """The trace context, if any."""

    @property
    def scheduled_at(self) -> Optional[datetime]:
        """When the job becomes ready (aware, UTC), or None for at once."""

@final
class EnqueueAck:
    """The answer to an accepted enqueue. Equal acks compare equal and hash alike."""

    @property
    def job_id(self) -> str:
        """The job's id (a UUID): the new job's, or on a dedup hit the original's."""

    @property
    def deduplicated(self) -> bool:
        """True when an earlier enqueue with the same idempotency key, within the dedup window,
        created `job_id`; that job may since have run or been dead-lettered. Read it as "this
        enqueue is already accounted for"."""

    @property
    def original_state(
        self,
    ) -> Optional[
        Literal["SCHEDULED", "READY", "IN_FLIGHT", "DEAD_LETTERED", "ACKED", "CANCELLED", "DELETED"]
    ]:
        """On a dedup hit from a sepp server: where the job `job_id` names is at the time of the
        hit. ``None`` when the job was created, or the server does not say."""

    @property
    def replaced(self) -> bool:
        """On a dedup hit on a queue with ``on_duplicate = "replace_pending"`` (debounce): True
        when this enqueue's payload, encoding, custom map and trace context (and
        `scheduled_at`, when set) replaced those of the job, which had not started yet;
        `original_state` is then where the job is after it. False otherwise."""

    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self, /) -> int: ...

@final
class Rejection:
    """Why one job was not accepted, as a value.

    `SeppClient.enqueue_batch` returns it in place of an `EnqueueAck`; the exceptions raised for
    rejections (`sepp.JobRejectedError` subclasses) carry it as `.rejection` and expose the
    same fields. Only the fields of the rejection's kind are set; the others are None. Sizes
    are UTF-8 bytes.
    """

    @property
    def code(self) -> str:
        """The stable code, e.g. ``"IDEMPOTENCY_KEY_TOO_LONG"``; names the exception class."""

    @property
    def message(self) -> str:
        """What is wrong, naming the field and the limit."""

    @property
    def transient(self) -> bool:
        """True for ``QUEUE_FULL`` and ``QUEUE_CLOSING``: the same job may be accepted later."""

    @property
    def queue(self) -> Optional[str]:
        """The queue, for ``UNKNOWN_QUEUE``, ``QUEUE_FULL``, ``QUEUE_CLOSING`` and
        ``TOO_MANY_QUEUES``."""

    @property
    def limit(self) -> Optional[int]:
        """The limit of a size or count rejection (bytes, or entries for
        ``CUSTOM_ENTRIES_TOO_MANY``), or the depth limit (jobs) for ``QUEUE_FULL``."""

    @property
    def actual(self) -> Optional[int]:
        """What the job had, in the unit of `limit`, for the size and count rejections."""

    @property
    def encoding(self) -> Optional[str]:
        """The encoding sent, for ``ENCODING_NOT_ALLOWED``."""

    @property
    def allowed(self) -> Optional[list[str]]:
        """The allowed encodings or job types, for ``ENCODING_NOT_ALLOWED`` and
        ``JOB_TYPE_NOT_ALLOWED``."""

    @property
    def job_type(self) -> Optional[str]:
        """The job type sent, for ``JOB_TYPE_NOT_ALLOWED``."""

    @property
    def key(self) -> Optional[str]:
        """The custom key, for ``CUSTOM_KEY_TOO_LONG``."""

    @property
    def horizon(self) -> Optional[timedelta]:
        """How far ahead a job may be scheduled, for ``SCHEDULED_TOO_FAR``."""

    @property
    def scheduled_at(self) -> Optional[datetime]:
        """The requested time (aware, UTC), for ``SCHEDULED_TOO_FAR``."""

    @property
    def original_job_id(self) -> Optional[str]:
        """The job the key names, for ``IDEMPOTENCY_KEY_CONFLICT``."""

    def __eq__(self, value: object, /) -> bool: ...

@final
class Job:
    """A job leased by `SeppClient.reserve`. Settle it with `ack` or `nack`, passing `id` and
    `attempt`, before `lease_expires_at` (or `extend` the lease)."""

    @property
    def id(self) -> str:
        """The job's id."""

    @property
    def queue(self) -> str:
        """Its queue."""

    @property
    def job_type(self) -> str:
        """Its type."""

    @property
    def payload(self) -> Optional[Payload]:
        """Its data, if any."""

    @property
    def priority(self) -> int:
        """0 (lowest) to 9 (highest)."""

    @property
    def trace_context(self) -> Optional[TraceContext]:
        """Its trace context, if any."""

    @property
    def enqueued_at(self) -> Optional[datetime]:
        """When it was enqueued (aware, UTC)."""

    @property
    def attempt(self) -> int:
        """Which delivery this is, from 1. Send it back with ack, nack and extend."""

    @property
    def max_attempts(self) -> int:
        """Deliveries allowed before it is dead-lettered."""

    @property
    def is_last_attempt(self) -> bool:
        """True when this delivery is the last one: a nack with retry dead-letters the job."""

    @property
    def lease_expires_at(self) -> Optional[datetime]:
        """When the lease ends unless extended (aware, UTC)."""

    @property
    def custom(self) -> dict[str, _CustomValue]:
        """A copy of its custom entries."""

    @property
    def scheduled_at(self) -> Optional[datetime]:
        """When it was scheduled to become ready, if it was (aware, UTC)."""

@final
class NackRetry:
    """What a nack asks for. Build one with `default`, `delay` or `dead_letter`."""

    @staticmethod
    def default() -> NackRetry:
        """The queue's retry policy (`retry_delay_ms`, `retry_backoff`); dead-lettered on the
        last attempt.

        Returns:
            The strategy.
        """

    @staticmethod
    def delay(delay: timedelta) -> NackRetry:
        """Retry after `delay` (the server clamps it to the schedule horizon); dead-lettered on
        the last attempt.

        Args:
            delay: The wait before the next delivery; 0 or more.

        Returns:
            The strategy.

        Raises:
            TypeError: `delay` is not a `timedelta`.
            InvalidArgumentError: `delay` is negative.
        """

    @staticmethod
    def dead_letter() -> NackRetry:
        """Dead-letter at once, whatever attempts remain.

        Returns:
            The strategy.
        """

    @property
    def kind(self) -> Literal["default", "delay", "dead_letter"]:
        """Which strategy this is."""

    @property
    def retry_delay(self) -> Optional[timedelta]:
        """The delay of a ``"delay"`` strategy, else None."""

    def __eq__(self, value: object, /) -> bool: ...

@final
class RetryPolicy:
    """Automatic retries, only where the core deems them safe: keyed enqueues (a repeat is a
    dedup hit), ack/nack/extend and get_server_info on transport errors and overload; unkeyed
    enqueues only when the request cannot have reached the server; reserve and
    drain_dead_letters never. The pauses between tries grow exponentially, with full jitter.

    The names of earlier releases (`max_attempts`, which counted the first try,
    `initial_backoff`, `max_backoff`) are accepted and readable with a `DeprecationWarning`:
    attempts and backoff are the words of jobs, not of calls.
    """

    def __new__(
        cls,
        *,
        max_retries: Optional[int] = None,
        first_retry_delay: Optional[timedelta] = None,
        max_retry_delay: Optional[timedelta] = None,
        multiplier: Optional[float] = None,
        max_attempts: Optional[int] = None,
        initial_backoff: Optional[timedelta] = None,
        max_backoff: Optional[timedelta] = None,
    ) -> RetryPolicy:
        """Creates a policy; None takes the core's default.

        Args:
            max_retries: Retries after the first try; 0 makes one try. Default 2.
            first_retry_delay: Upper bound of the pause before the first retry. Default 50 ms.
            max_retry_delay: Upper bound of any pause. Default 2 s.
            multiplier: Growth of the bound per retry. Default 2.0.
            max_attempts: Deprecated: tries in all, the first included (``max_retries + 1``).
            initial_backoff: Deprecated: `first_retry_delay`.
            max_backoff: Deprecated: `max_retry_delay`.

        Raises:
            TypeError: An argument has the wrong type.
            InvalidConfigError: A negative duration or count, or a setting given under both
                its names.
        """

    @property
    def max_retries(self) -> int:
        """Retries after the first try."""

    @property
    def first_retry_delay(self) -> timedelta:
        """Upper bound of the pause before the first retry."""

    @property
    def max_retry_delay(self) -> timedelta:
        """Upper bound of any pause."""

    @property
    def multiplier(self) -> float:
        """Growth of the bound per retry."""

    @property
    def max_attempts(self) -> int:
        """Deprecated: tries in all (``max_retries + 1``)."""

    @property
    def initial_backoff(self) -> timedelta:
        """Deprecated: `first_retry_delay`."""

    @property
    def max_backoff(self) -> timedelta:
        """Deprecated: `max_retry_delay`."""

    def __eq__(self, value: object, /) -> bool: ...

@final
class TlsOptions:
    """TLS settings; an ``https://`` URL turns TLS on too."""

    def __new__(
        cls,
        *,
        ca_pem: Union[bytes, bytearray, str, None] = None,
        domain: Optional[str] = None,
        client_cert_pem: Union[bytes, bytearray, str, None] = None,
        client_key_pem: Union[bytes, bytearray, str, None] = None,
    ) -> TlsOptions:
        """Creates TLS settings.

        Args:
            ca_pem: PEM of the CA that signed the server's certificate. None: the public web
                roots.
            domain: The name to verify the certificate against. None: the URL's host.
            client_cert_pem: PEM certificate chain this client presents, for a server that
                asks for client certificates (mutual TLS). Set together with
                ``client_key_pem``; one without the other raises `InvalidConfigError` at
                connect.
            client_key_pem: PEM private key of ``client_cert_pem``.

        Raises:
            TypeError: An argument has the wrong type.
        """

    @property
    def ca_pem(self) -> Optional[bytes]:
        """The CA's PEM, if set."""

    @property
    def client_cert_pem(self) -> Optional[bytes]:
        """The client certificate's PEM, if set (the key is never read back)."""

    @property
    def domain(self) -> Optional[str]:
        """The name verified, if set."""

@final
class DeadLetterRecord:
    """A dead-lettered job, as returned (and removed) by `SeppClient.drain_dead_letters`."""

    @property
    def job(self) -> Job:
        """The job as last delivered."""

    @property
    def cause(self) -> _DeadLetterCause:
        """Why it was dead-lettered: failed on its last attempt, nacked with
        `NackRetry.dead_letter()`, its lease expired on its last attempt, or an operator."""

    @property
    def failed_at(self) -> Optional[datetime]:
        """When it was dead-lettered (aware, UTC)."""

    @property
    def final_attempt(self) -> int:
        """The attempt that failed last."""

    @property
    def last_reason(self) -> Optional[str]:
        """The reason given by the last nack, if any."""

@final
class ServerInfo:
    """The server's version and limits: server-wide defaults (a queue may differ). Sizes are
    bytes."""

    @property
    def server_version(self) -> str:
        """The server's version."""

    @property
    def supported_protocol_versions(self) -> list[str]:
        """Protocol versions, e.g. ``["v1"]``."""

    @property
    def server_time(self) -> Optional[datetime]:
        """The server's clock (aware, UTC)."""

    @property
    def restricts_encodings(self) -> bool:
        """Whether payload encodings are restricted."""

    @property
    def allowed_encodings(self) -> list[str]:
        """The allowed encodings when restricted."""

    @property
    def max_payload_bytes(self) -> int:
        """Largest payload, in bytes."""

    @property
    def max_custom_entries(self) -> int:
        """Most custom entries."""

    @property
    def max_custom_total_bytes(self) -> int:
        """Largest custom map, in bytes."""

    @property
    def max_custom_key_bytes(self) -> int:
        """Longest custom key, in UTF-8 bytes."""

    @property
    def max_queue_name_bytes(self) -> int:
        """Longest queue name, in UTF-8 bytes."""

    @property
    def max_job_type_bytes(self) -> int:
        """Longest job type, in UTF-8 bytes."""

    @property
    def max_idempotency_key_bytes(self) -> int:
        """Longest idempotency key, in UTF-8 bytes."""

    @property
    def max_schedule_horizon(self) -> Optional[timedelta]:
        """Furthest a job may be scheduled ahead."""

    @property
    def max_enqueue_batch(self) -> int:
        """Most jobs per enqueue batch."""

    @property
    def max_reserve_batch(self) -> int:
        """Most jobs per reserve."""

    @property
    def max_reserve_queues(self) -> int:
        """Most queues per reserve."""

    @property
    def max_wait_timeout(self) -> Optional[timedelta]:
        """Longest reserve wait."""

    @property
    def max_lease_duration(self) -> Optional[timedelta]:
        """Longest lease."""

    @property
    def strict_queues(self) -> bool:
        """Whether only declared queues exist."""

    @property
    def dead_letter_retention_enabled(self) -> bool:
        """Whether dead letters are kept (and so can be drained)."""

    @property
    def dedup_window(self) -> Optional[timedelta]:
        """The server-wide default dedup window (None from servers that do not say)."""

@final
class JobInfo:
    """What the server knows about one job (`SeppClient.get_job`)."""

    @property
    def job_id(self) -> str:
        """The id asked about."""

    @property
    def state(
        self,
    ) -> Literal[
        "UNKNOWN", "SCHEDULED", "READY", "IN_FLIGHT", "DEAD_LETTERED", "ACKED", "CANCELLED", "DELETED"
    ]:
        """Where the job is. ``"UNKNOWN"``: never existed, or finished and forgotten;
        ``"ACKED"``: acked, kept while its idempotency key is remembered (earlier releases
        said ``"COMPLETED"``)."""

    @property
    def queue(self) -> str:
        """Its queue (empty when unknown)."""

    @property
    def job_type(self) -> str:
        """Its type."""

    @property
    def attempt(self) -> int:
        """The attempt in flight or the last one made (0 before the first delivery)."""

    @property
    def max_attempts(self) -> int:
        """Deliveries allowed."""

    @property
    def priority(self) -> int:
        """0 (lowest) to 9 (highest)."""

    @property
    def enqueued_at(self) -> Optional[datetime]:
        """When it was enqueued (aware, UTC)."""

    @property
    def scheduled_at(self) -> Optional[datetime]:
        """When it becomes ready, while scheduled (aware, UTC)."""

    @property
    def lease_expires_at(self) -> Optional[datetime]:
        """When its lease ends, while in flight (aware, UTC)."""

    @property
    def last_reason(self) -> Optional[str]:
        """The reason of its last nack."""

    @property
    def finished_at(self) -> Optional[datetime]:
        """When it was acked or dead-lettered (aware, UTC)."""

    @property
    def dead_letter_cause(self) -> Optional[_DeadLetterCause]:
        """Why it was dead-lettered, if it was."""

    @property
    def idempotency_key(self) -> Optional[str]:
        """Its idempotency key, while the job is kept."""

    @property
    def worker_id(self) -> Optional[str]:
        """The worker label of its current lease."""

    @property
    def payload(self) -> Optional[Payload]:
        """Its data, as enqueued (or as a dedup hit replaced it). None when it has none, and
        once only a tombstone is left of the job (acked, cancelled, a dead letter past its
        retention)."""

    @property
    def custom(self) -> dict[str, _CustomValue]:
        """A copy of its custom entries; empty when it has none, or only a tombstone is left."""

    @property
    def trace_context(self) -> Optional[TraceContext]:
        """Its trace context; None when it has none, or only a tombstone is left."""

@final
class KeyRecord:
    """A live dedup record (`SeppClient.lookup_idempotency_key`)."""

    @property
    def job_id(self) -> str:
        """The job the key names."""

    @property
    def created_at(self) -> Optional[datetime]:
        """When the record was written: the first accepted enqueue (aware, UTC)."""

    @property
    def expires_at(self) -> Optional[datetime]:
        """When the key stops deduplicating (aware, UTC)."""

@final
class DeadLetterPage:
    """One page of dead letters, listed without removing them (`SeppClient.list_dead_letters`)."""

    @property
    def records(self) -> list[DeadLetterRecord]:
        """The records, oldest first (a new list on each access)."""

    @property
    def next_page_token(self) -> Optional[str]:
        """Pass it to `list_dead_letters` for the next page; None on the last page."""

@final
class QueueStats:
    """A queue's job counts (`SeppClient.get_queue_stats`)."""

    @property
    def ready(self) -> int:
        """Jobs ready to be reserved."""

    @property
    def scheduled(self) -> int:
        """Jobs waiting for their time or a retry delay."""

    @property
    def in_flight(self) -> int:
        """Leased jobs."""

    @property
    def dead_lettered(self) -> int:
        """Dead letters kept."""

    @property
    def dedup_records(self) -> int:
        """Dedup records held, including expired ones the sweeper has not removed yet (an expired record already counts as absent)."""

    @property
    def paused(self) -> bool:
        """Whether reserve skips the queue."""

    def __eq__(self, value: object, /) -> bool: ...

@final
class SeppClient:
    """A client of a sepp server.

    One client shares one HTTP/2 connection among all its calls; share it between tasks, and
    between threads that run their own event loops. Use it as an async context manager, or
    call `close`.
    """

    @staticmethod
    async def connect(
        url: str,
        *,
        api_key: Optional[str] = None,
        tls: Optional[TlsOptions] = None,
        rpc_timeout: Optional[timedelta] = ...,
        retry_policy: Optional[RetryPolicy] = ...,
        coalesce: Optional[bool] = None,
        max_batches_in_flight: Optional[int] = None,
    ) -> SeppClient:
        """Connects, then reads the server's limits (`get_server_info`), so that requests are
        checked against the real `max_idempotency_key_bytes`.

        Args:
            url: ``http://host:port``, ``https://host:port`` or ``host:port``.
            api_key: Sent as ``authorization: Bearer <key>`` on every call; printable ASCII.
            tls: TLS settings (an ``https://`` URL turns TLS on without them).
            rpc_timeout: Deadline of each call; `reserve` adds its `wait_timeout` (plus 5 s).
                Default 30 seconds; None for no deadline.
            retry_policy: Automatic retries of the calls safe to retry (keyed enqueues, ack,
                nack, extend, get_server_info; never reserve or drain_dead_letters). Default
                ``RetryPolicy()`` (2 retries, 3 tries in all); None for none.
            coalesce: Whether `enqueue` calls made concurrently on this client leave together
                as one ``EnqueueBatch`` call, each caller still getting its own result (see
                docs/coalescing.md). Default True (None: the default); False for one call per
                `enqueue`. An `enqueue` on an idle client leaves at once either way.
            max_batches_in_flight: Most coalesced batches in flight at once, at least 1;
                enqueues made while all are in flight wait for the next. Default 2 (None: the
                default).

        Returns:
            The connected client.

        Raises:
            TypeError: An argument has the wrong type.
            InvalidConfigError: The URL, TLS settings, API key, timeout or
                `max_batches_in_flight` (0, negative) is unusable.
            TransportError: The server cannot be reached.
            UnauthenticatedError: The server requires an API key and `api_key` is missing or
                wrong.
        """

    @property
    def max_idempotency_key_bytes(self) -> Optional[int]:
        """The idempotency key limit requests are checked against before they are sent, in
        UTF-8 bytes: the server's, read at connect and by `get_server_info`. None when the
        server did not advertise one (a server without `GetServerInfo`): key lengths are then
        left to the server.

        Raises:
            RuntimeError: The client is closed.
        """

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""

    async def enqueue(self, request: EnqueueRequest) -> EnqueueAck:
        """Enqueues one job.

        The request is checked first, with no network call (see `EnqueueRequest`): its values,
        then the lengths up to the idempotency key's against the limits the server advertised.
        A job that fails the checks is rejected here, alone, and never joins a batch.

        Enqueues made concurrently on one client leave together as one ``EnqueueBatch`` while
        the client's batches in flight are busy (``coalesce``, on by default); the result is
        still this job's own. Cancelling the awaiting task before its batch left sends
        nothing; after that, the job may have been committed.

        Args:
            request: The job.

        Returns:
            The job's id, and whether the enqueue was a dedup hit.

        Raises:
            TypeError: `request` is not an `EnqueueRequest`.
            RuntimeError: The client is closed.
            JobRejectedError: The job was rejected, before sending or by the server; the
                subclass names why, e.g. `InvalidRequestError`, `IdempotencyKeyTooLongError`
                (`.limit`, `.actual` in UTF-8 bytes), `PayloadTooLargeError`,
                `UnknownQueueError`, `QueueFullError` (transient).
            TransportError: The call failed in transit. A keyed enqueue is safe to repeat; an
                unkeyed one may have been committed.
            UnauthenticatedError: Missing or wrong API key.
            OverloadedError: The server sheds load; retry after a pause.
            InvalidArgumentError: The server refused the call as malformed (e.g. too large).
        """

    async def enqueue_batch(
        self, requests: Sequence[EnqueueRequest]
    ) -> list[Union[EnqueueAck, Rejection]]:
        """Enqueues each job on its own, in one call: the accepted ones are committed together.

        Jobs failing the checks of `enqueue` (a value that cannot be held included) are not sent
        and get their `Rejection` in their slot of the results, as in every language.

        Args:
            requests: The jobs; 1 to the server's `max_enqueue_batch`.

        Returns:
            One result per request, in order: an `EnqueueAck`, or the job's `Rejection`.

        Raises:
            TypeError: `requests` is not a sequence of `EnqueueRequest`.
            RuntimeError: The client is closed.
            InvalidArgumentError: The batch is empty or larger than `max_enqueue_batch`.
            TransportError: The call failed in transit (see `enqueue`).
            UnauthenticatedError: Missing or wrong API key.
            OverloadedError: The server sheds load.
        """

    async def enqueue_atomic(self, requests: Sequence[EnqueueRequest]) -> list[EnqueueAck]:
        """Enqueues all jobs or none.

        Args:
            requests: The jobs; 1 to the server's `max_enqueue_batch`.

        Returns:
            The acks, in request order.

        Raises:
            TypeError: `requests` is not a sequence of `EnqueueRequest`.
            RuntimeError: The client is closed.
            JobRejectedError: At least one job was rejected and nothing was written. The
                exception is the subclass of the first failing job (`.index`); `.failures`
                lists every failing job as ``(index, Rejection)``.
            InvalidArgumentError: The batch is empty or larger than `max_enqueue_batch`.
            TransportError: The call failed in transit (see `enqueue`).
            UnauthenticatedError: Missing or wrong API key.
            OverloadedError: The server sheds load.
        """

    async def reserve(
        self,
        queues: Sequence[str],
        *,
        lease_duration: timedelta,
        wait_timeout: Optional[timedelta] = None,
        max_jobs: Optional[int] = None,
        worker_id: Optional[str] = None,
    ) -> list[Job]:
        """Leases up to `max_jobs` ready jobs from `queues`, waiting up to `wait_timeout` for
        the first. Never retried automatically: a lost reply would lease jobs twice.

        Cancelling the awaiting task cancels the call; a job not yet leased stays ready, and
        one whose lease was committed comes back when the lease expires.

        Args:
            queues: The queues to take from, in order of preference; at least one.
            lease_duration: How long the jobs are leased; positive. The server clamps it to
                the queues' `max_lease_duration_ms`.
            wait_timeout: How long to wait when no job is ready. None: return at once. The
                server clamps it to `max_wait_timeout_ms`.
            max_jobs: At most this many jobs; at least 1. None: 1. The server clamps it to
                `max_reserve_batch`.
            worker_id: A label for the lease.

        Returns:
            The leased jobs; empty when none became ready in time.

        Raises:
            TypeError: An argument has the wrong type (`queues` given as a single `str`
                included).
            RuntimeError: The client is closed.
            InvalidArgumentError: No queues, an empty name, a zero or negative duration, or
                `max_jobs` of 0.
            FailedPreconditionError: Strict mode, and a queue is not declared.
            TransportError: The call failed in transit.
            UnauthenticatedError: Missing or wrong API key.
        """

    async def ack(self, job_id: str, attempt: int) -> None:
        """Acks delivery `attempt` of `job_id`: the job is done and removed.

        Args:
            job_id: `Job.id`.
            attempt: `Job.attempt`.

        Raises:
            TypeError: An argument has the wrong type.
            RuntimeError: The client is closed.
            JobNotInFlightError: The job is not in flight (already acked, lease expired,
                dead-lettered, unknown). The lease is lost.
            AttemptMismatchError: The job is in flight under another attempt. The lease is lost.
            InvalidArgumentError: `attempt` is negative or too large.
            TransportError: The call failed in transit.
        """

    async def ack_then_reserve(
        self,
        job_id: str,
        attempt: int,
        queues: Sequence[str],
        *,
        lease_duration: timedelta,
        max_jobs: Optional[int] = None,
        worker_id: Optional[str] = None,
    ) -> Optional[list[Job]]:
        """Acks delivery `attempt` of `job_id` and, in the same call, leases up to `max_jobs`
        ready jobs from `queues` (without waiting): a worker's ack that brings its next job.
        A sepp server commits the ack and the new leases together. The worker (`sepp.Worker`)
        acks this way already.

        Retried as `ack` is; a retry after the first try took is refused
        (`JobNotInFlightError`) and leases nothing.

        Args:
            job_id: `Job.id`.
            attempt: `Job.attempt`.
            queues: The queues to take the next jobs from, in order of preference.
            lease_duration: The new jobs' lease; positive.
            max_jobs: At most this many jobs; None: 1.
            worker_id: A label for the new leases (see `reserve`).

        Returns:
            The jobs leased (an empty list when none was ready: reserve with a wait), or None
            when the server leased nothing for the call (a server without this extension,
            such as the public sepp 0.1.1, or a lease that failed after the ack took):
            reserve on your own. Either way the job was acked.

        Raises:
            JobNotInFlightError, AttemptMismatchError: As `ack`; nothing was leased.
            InvalidArgumentError: A bad argument (no queues, a zero lease, max_jobs 0, ...);
                nothing was acked.
            TypeError: An argument has the wrong type.
            RuntimeError: The client is closed.
            TransportError: The call failed in transit.
        """

    async def nack(
        self,
        job_id: str,
        attempt: int,
        *,
        retry: Optional[NackRetry] = None,
        reason: Optional[str] = None,
    ) -> bool:
        """Nacks delivery `attempt` of `job_id`: the job failed.

        Args:
            job_id: `Job.id`.
            attempt: `Job.attempt`.
            retry: What to do with the job. None: `NackRetry.default()`, the queue's policy.
            reason: Why it failed; kept with a dead letter.

        Returns:
            True when the job was dead-lettered (the dead-letter strategy, or its last attempt).

        Raises:
            TypeError: An argument has the wrong type.
            RuntimeError: The client is closed.
            JobNotInFlightError: The job is not in flight. The lease is lost.
            AttemptMismatchError: The job is in flight under another attempt. The lease is lost.
            InvalidArgumentError: `attempt` is negative or too large.
            TransportError: The call failed in transit.
        """

    async def extend(self, job_id: str, attempt: int, lease_duration: timedelta) -> datetime:
        """Sets the lease of delivery `attempt` of `job_id` to now + `lease_duration`.

        Args:
            job_id: `Job.id`.
            attempt: `Job.attempt`.
            lease_duration: The new lease, from now; positive. The server clamps it.

        Returns:
            The new lease expiry (aware, UTC).

        Raises:
            TypeError: An argument has the wrong type.
            RuntimeError: The client is closed.
            JobNotInFlightError: The job is not in flight. The lease is lost.
            AttemptMismatchError: The job is in flight under another attempt. The lease is lost.
            InvalidArgumentError: A zero or negative `lease_duration`.
            TransportError: The call failed in transit.
        """

    async def get_server_info(self) -> ServerInfo:
        """Reads the server's version and limits, and refreshes the limits this client checks
        requests against.

        Returns:
            The server's info.

        Raises:
            RuntimeError: The client is closed.
            TransportError: The call failed in transit.
            UnauthenticatedError: Missing or wrong API key.
        """

    async def drain_dead_letters(
        self, queue: Optional[str] = None, max: int = 1
    ) -> list[DeadLetterRecord]:
        """Removes and returns up to `max` dead-letter records, oldest first. Destructive and
        never retried automatically. Records exist only when the server keeps dead letters
        (`dead_letter_retention_ms` > 0).

        Args:
            queue: Only this queue's records. None: every queue's.
            max: At most this many records; at least 1.

        Returns:
            The records removed.

        Raises:
            TypeError: An argument has the wrong type.
            RuntimeError: The client is closed.
            InvalidArgumentError: `max` is 0 or negative.
            TransportError: The call failed in transit.
            UnauthenticatedError: Missing or wrong API key.
        """

    # Operator calls (sepp.admin.v1): sepp servers only; others raise UnsupportedError.

    async def get_job(self, job_id: str) -> JobInfo:
        """Reads everything the server knows about a job.

        Args:
            job_id: The job's id.

        Returns:
            The job's state and details; `JobInfo.state` is ``"UNKNOWN"`` when the server
            knows nothing of it.

        Raises:
            TypeError: `job_id` is not a `str`.
            RuntimeError: The client is closed.
            UnsupportedError: The server has no admin service.
            TransportError: The call failed in transit.
            UnauthenticatedError: Missing or wrong API key.
        """

    async def lookup_idempotency_key(self, queue: str, idempotency_key: str) -> Optional[KeyRecord]:
        """Finds the job an idempotency key names on a queue, while the key is remembered.

        Args:
            queue: The queue the key is scoped to.
            idempotency_key: The key, compared byte for byte.

        Returns:
            The dedup record, or None when no live record has this key.

        Raises:
            TypeError: An argument is not a `str`.
            RuntimeError: The client is closed.
            UnsupportedError: The server has no admin service.
            TransportError: The call failed in transit.
        """

    async def list_dead_letters(
        self,
        queue: Optional[str] = None,
        *,
        page_size: Optional[int] = None,
        page_token: Optional[str] = None,
    ) -> DeadLetterPage:
        """Lists dead letters, oldest first, without removing them.

        Args:
            queue: Only this queue's. None: every queue's.
            page_size: Records per page; 1 to 1000. None: 100.
            page_token: `DeadLetterPage.next_page_token` of the previous page; None for the
                first.

        Returns:
            One page.

        Raises:
            TypeError: An argument has the wrong type.
            RuntimeError: The client is closed.
            InvalidArgumentError: `page_size` of 0, or a token the server did not issue.
            UnsupportedError: The server has no admin service.
            TransportError: The call failed in transit.
        """

    async def requeue_dead_letters(
        self,
        job_ids: Optional[Sequence[str]] = None,
        *,
        queue: Optional[str] = None,
        max: Optional[int] = None,
    ) -> list[str]:
        """Puts dead letters back on their queues: same id, attempt 1, enqueued now (their
        idempotency keys still name them). Never retried automatically.

        Select either by `job_ids` (ids that are not dead letters are skipped), or the
        oldest `max` of `queue` (or of every queue).

        Args:
            job_ids: The jobs to requeue.
            queue: With `max`: only this queue's oldest. None: every queue's.
            max: With `queue`: how many of the oldest; at least 1. None: 1.

        Returns:
            The ids requeued.

        Raises:
            TypeError: An argument has the wrong type (`job_ids` given as one `str` included).
            RuntimeError: The client is closed.
            InvalidArgumentError: Both `job_ids` and `queue`/`max` given, or `max` of 0.
            UnsupportedError: The server has no admin service.
            TransportError: The call failed in transit.
        """

    async def delete_dead_letters(
        self,
        job_ids: Optional[Sequence[str]] = None,
        *,
        queue: Optional[str] = None,
        max: Optional[int] = None,
    ) -> list[str]:
        """Deletes dead letters for good. Selects as `requeue_dead_letters` does.

        Args:
            job_ids: The jobs to delete.
            queue: With `max`: only this queue's oldest. None: every queue's.
            max: With `queue`: how many of the oldest; at least 1. None: 1.

        Returns:
            The ids deleted.

        Raises:
            TypeError: An argument has the wrong type.
            RuntimeError: The client is closed.
            InvalidArgumentError: Both `job_ids` and `queue`/`max` given, or `max` of 0.
            UnsupportedError: The server has no admin service.
            TransportError: The call failed in transit.
        """

    async def pause_queue(self, queue: str) -> None:
        """Pauses a queue: reserve skips it; enqueues are still accepted. Survives restarts.

        Args:
            queue: The queue.

        Raises:
            TypeError: `queue` is not a `str`.
            RuntimeError: The client is closed.
            UnsupportedError: The server has no admin service.
            TransportError: The call failed in transit.
        """

    async def resume_queue(self, queue: str) -> None:
        """Resumes a paused queue.

        Args:
            queue: The queue.

        Raises:
            TypeError: `queue` is not a `str`.
            RuntimeError: The client is closed.
            UnsupportedError: The server has no admin service.
            TransportError: The call failed in transit.
        """

    async def get_queue_stats(self, queue: str) -> QueueStats:
        """Counts a queue's jobs by state.

        Args:
            queue: The queue.

        Returns:
            The counts, and whether the queue is paused.

        Raises:
            TypeError: `queue` is not a `str`.
            RuntimeError: The client is closed.
            UnsupportedError: The server has no admin service.
            TransportError: The call failed in transit.
        """

    async def close(self) -> None:
        """Closes this client: later calls raise `RuntimeError`. Calls already running finish;
        the connection closes when the last one does. Closing twice is harmless."""

    async def __aenter__(self) -> SeppClient:
        """Returns the client.

        Raises:
            RuntimeError: The client is closed.
        """

    async def __aexit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        """Closes the client (see `close`)."""

# The worker engine of the core, under `sepp.Worker`. Use `Worker`; these classes are for it.

@final
class EngineOptions:
    """How an `Engine` reserves, keeps leases and treats the jobs it holds. Checked here, by
    the same rule as `Engine.start` (the Rust core's)."""

    def __new__(
        cls,
        queues: Sequence[str],
        *,
        lease_duration: Optional[timedelta] = None,
        max_in_flight: Optional[int] = None,
        auto_extend: Optional[bool] = None,
        wait_timeout: Optional[timedelta] = None,
        max_backoff: Optional[timedelta] = None,
        worker_id: Optional[str] = None,
        job_types: Optional[Sequence[str]] = None,
        handler_timeout: Optional[timedelta] = None,
        shutdown_timeout: Optional[timedelta] = None,
    ) -> EngineOptions:
        """Creates options; None takes the core's default.

        Args:
            queues: The queues to reserve from, in order of preference; at least one.
            lease_duration: The lease asked for per job; positive. Default 30 seconds. The
                server clamps it to `max_lease_duration_ms`.
            max_in_flight: The most jobs held at once; at least 1. Default 10.
            auto_extend: Extend each lease when a third of it is left. Default True.
            wait_timeout: The long-poll wait of each reserve. Default 5 seconds.
            max_backoff: The longest pause between reserves while they fail. Default 5
                seconds.
            worker_id: A label sent with each reserve, shown by `SeppClient.get_job`.
            job_types: The job types the host has a handler for: a job of another type is
                nacked with the queue's retry policy (reason ``no handler for job type "T"``)
                and never handed out. Default None: every type is handed out.
            handler_timeout: The longest a job may stay handed out; past it the engine nacks
                it (reason ``the handler ran past handler_timeout (N ms)``) and its
                `Lease.done` returns ``"timed_out"``. Default None: no limit.
            shutdown_timeout: How long `Engine.drain` waits for held jobs to be settled
                before it nacks the rest. Default 30 seconds.

        Raises:
            TypeError: An argument has the wrong type (`queues` given as one `str` included).
            InvalidArgumentError: A negative duration or count, no queues, an empty queue name,
                a zero lease, a zero `max_in_flight` or a zero `handler_timeout`.
        """

    @property
    def queues(self) -> list[str]:
        """The queues, in order of preference."""

    @property
    def lease_duration(self) -> timedelta:
        """The lease asked for per job."""

    @property
    def max_in_flight(self) -> int:
        """The most jobs held at once."""

    @property
    def auto_extend(self) -> bool:
        """Whether leases are extended while jobs are held."""

    @property
    def wait_timeout(self) -> timedelta:
        """The long-poll wait of each reserve."""

    @property
    def max_backoff(self) -> timedelta:
        """The longest pause between failing reserves."""

    @property
    def worker_id(self) -> Optional[str]:
        """The label sent with each reserve, if any."""

    @property
    def job_types(self) -> Optional[list[str]]:
        """The job types handed out, or None for all."""

    @property
    def handler_timeout(self) -> Optional[timedelta]:
        """The longest a job may stay handed out, or None."""

    @property
    def shutdown_timeout(self) -> timedelta:
        """How long `Engine.drain` waits for held jobs."""

    def __eq__(self, value: object, /) -> bool: ...

@final
class Outcome:
    """What became of a job, reported to `Engine.settle`. Build one with `success`, `retry`,
    `retry_after` or `permanent`."""

    @staticmethod
    def success() -> Outcome:
        """Done: the job is acked.

        Returns:
            The outcome.
        """

    @staticmethod
    def retry(reason: Optional[str] = None) -> Outcome:
        """Failed: nack with the queue's retry policy; dead-lettered on the last attempt.

        Args:
            reason: Why, kept as the job's last reason.

        Returns:
            The outcome.
        """

    @staticmethod
    def retry_after(delay: timedelta, reason: Optional[str] = None) -> Outcome:
        """Failed: nack, to be retried after `delay`; dead-lettered on the last attempt.

        Args:
            delay: The wait before the next delivery; 0 or more. The server clamps it to the
                queue's schedule horizon.
            reason: Why, kept as the job's last reason.

        Returns:
            The outcome.

        Raises:
            TypeError: `delay` is not a `timedelta`.
            InvalidArgumentError: `delay` is negative.
        """

    @staticmethod
    def permanent(reason: Optional[str] = None) -> Outcome:
        """Failed for good: the job is dead-lettered now, whatever attempts remain.

        Args:
            reason: Why, kept with the dead letter.

        Returns:
            The outcome.
        """

    @property
    def kind(self) -> Literal["success", "retry", "retry_after", "permanent"]:
        """Which outcome this is."""

    @property
    def delay(self) -> Optional[timedelta]:
        """The delay of a ``"retry_after"`` outcome, else None."""

    @property
    def reason(self) -> Optional[str]:
        """The reason given, if any."""

    def __eq__(self, value: object, /) -> bool: ...

@final
class Lease:
    """A job handed out by `Engine.next`, with its lease. Report it with `Engine.settle`."""

    @property
    def job(self) -> Job:
        """The job (`Job.lease_expires_at` is the expiry at reserve time)."""

    @property
    def expires_at(self) -> Optional[datetime]:
        """The lease's current expiry (aware, UTC), moved by each automatic extension."""

    @property
    def is_lost(self) -> bool:
        """Whether the lease is known to be lost."""

    def handler_span(
        self,
    ) -> tuple[str, list[tuple[str, str]], Optional[tuple[str, Optional[str]]]]:
        """The span the job's handler runs in, by the client core's rule: its name
        (``"sepp.handle"``), its attributes, and its parent ``(traceparent, tracestate)`` when
        the job carries a valid W3C trace context (``None``: the span starts a new trace).

        Returns:
            ``(name, attributes, parent)``.
        """

    async def done(self) -> Literal["settled", "lost", "timed_out", "abandoned"]:
        """Returns once the engine has let go of the job, with why: ``"settled"`` (by
        `Engine.settle`), ``"lost"`` (the lease was lost; the slot was freed without a call
        and the server's lease expiry decides), ``"timed_out"`` (past `handler_timeout`; the
        engine nacked the job) or ``"abandoned"`` (the worker shut down; the engine nacked the
        job). Before the job is settled, any of these means: stop its handler."""

    async def lost(self) -> None:
        """Returns once the lease is known to be lost: an extension found the job settled
        elsewhere or redelivered, or the lease ran out (while extensions failed, or without
        them). The job is someone else's then; stop working on it. Never returns otherwise."""

    async def ended(self) -> bool:
        """Returns once the engine has let go of the job.

        Returns:
            True if the lease was lost, False if the job was settled, timed out or abandoned.
        """

@final
class WorkerReport:
    """What a worker run did: counts of jobs, kept by the core's engine."""

    def __new__(
        cls, *, acked: int = 0, nacked: int = 0, lease_lost: int = 0, abandoned: int = 0
    ) -> WorkerReport:
        """Creates a report (for comparisons; runs return theirs)."""

    @property
    def acked(self) -> int:
        """Jobs acked."""

    @property
    def nacked(self) -> int:
        """Jobs nacked (retry, delay or dead-letter): exceptions, job types without a
        handler and handlers past `handler_timeout` included."""

    @property
    def lease_lost(self) -> int:
        """Jobs whose lease was lost while held, or whose ack or nack failed (their leases run out
        and they are delivered again)."""

    @property
    def abandoned(self) -> int:
        """Jobs nacked because the worker shut down before they were settled (or given back
        because they were reserved during shutdown)."""

    @property
    def succeeded(self) -> int:
        """Deprecated: `acked`."""

    @property
    def failed(self) -> int:
        """Deprecated: `nacked`."""

    def __eq__(self, value: object, /) -> bool: ...

@final
class Engine:
    """The core's worker engine, and the whole policy of a worker: a poller that reserves for
    the free slots (backing off while the server fails), lease extension, lease loss (the slot
    is freed without a call), the job types without a handler, the handler timeout,
    settlement of the outcomes reported, shutdown and the counts. It runs on the native
    runtime; the host only takes jobs (`next`), runs their handlers until `Lease.done`, and
    reports them (`settle`).

    Garbage-collected while it holds jobs, it shuts down and nacks them.
    """

    @staticmethod
    def start(client: SeppClient, options: EngineOptions) -> Engine:
        """Starts an engine; its poller begins reserving at once.

        Args:
            client: The client to reserve, extend and settle through.
            options: What to reserve and how.

        Returns:
            The running engine.

        Raises:
            TypeError: An argument has the wrong type.
            RuntimeError: The client is closed.
            InvalidArgumentError: No queues, a zero `lease_duration`, a zero `max_in_flight`
                or a zero `handler_timeout`.
        """

    async def next(self) -> Optional[Lease]:
        """Waits for the next reserved job. With `handler_timeout`, the job's time starts now.

        Do not cancel a waiting `next` while the engine runs: a job it was handing over when
        cancelled stays held, unprocessed, until `drain`. Call `shutdown`, which ends it.

        Returns:
            The job and its lease, or None once the engine is shut down.
        """

    async def next_batch(self, max_leases: int) -> list[Lease]:
        """Waits for the next reserved job, then takes the ones already waiting too, without
        waiting for more: a whole reserved batch in one hand-over to the event loop.

        Do not cancel a waiting `next_batch` while the engine runs (see `next`).

        Args:
            max_leases: At most this many jobs (0 counts as 1).

        Returns:
            The jobs with their leases, at least one; empty once the engine is shut down.

        Raises:
            TypeError: `max_leases` is not an `int`.
            InvalidArgumentError: `max_leases` is negative.
        """

    async def settle(self, job_id: str, attempt: int, outcome: Outcome) -> None:
        """Settles a job handed out by `next` (ack, or nack per `outcome`) and frees its slot.
        The settlement runs to its end even if the awaiting task is cancelled. The engine
        counts the job (`report`) whatever happens.

        Args:
            job_id: `Job.id`.
            attempt: `Job.attempt`.
            outcome: What became of the job.

        Raises:
            TypeError: An argument has the wrong type.
            JobNotInFlightError: The engine no longer holds the job (lost, timed out,
                abandoned, or settled already: nothing was sent), or the server says the
                lease is lost.
            AttemptMismatchError: The lease was lost and the job redelivered.
            TransportError: The call failed in transit; the lease runs out and the job is
                delivered again.
        """

    async def complete(self, job_id: str, attempt: int, outcome: Outcome) -> None:
        """Deprecated: `settle` (warns with `DeprecationWarning`)."""

    def shutdown(self) -> None:
        """Stops reserving; a waiting `next` returns None. Jobs handed out stay held until
        settled or abandoned; jobs reserved but not handed out yet are given back at once
        (nacked without delay)."""

    async def drain(self) -> int:
        """Shuts down gracefully: stops reserving, waits up to `shutdown_timeout` (or until
        `end_grace_period`) for the held jobs to be settled, then nacks the rest with the
        queue's retry policy and the reason ``worker shut down before the job finished``;
        their `Lease.done` returns ``"abandoned"``. Runs to its end even if the awaiting task
        is cancelled.

        Returns:
            How many jobs were nacked.
        """

    def end_grace_period(self) -> None:
        """Ends the grace period of a running (or the next) `drain` at once."""

    @property
    def report(self) -> WorkerReport:
        """The counts of the run so far."""

    @property
    def is_shut_down(self) -> bool:
        """Whether `shutdown` was called."""

    @property
    def in_flight(self) -> int:
        """Jobs held (handed out, or reserved and waiting for `next`), not yet settled."""

    def stop_notice(self) -> Optional[str]:
        """What a worker tells its user as a stop begins with jobs still held: how many, how
        long the stop may wait for their handlers (`shutdown_timeout`), and what becomes of
        the rest. `None` when no job is held."""

    def failure(self) -> Optional[Exception]:
        """Why the engine stopped by itself, or `None`: the server refused a reserve with an
        error no retry can mend (`UnauthenticatedError`, `PermissionDeniedError`,
        `InvalidArgumentError`, `FailedPreconditionError` for a queue strict mode does not
        know, `UnsupportedError`). The engine then shuts down as `shutdown` does."""

    async def wait_idle(self, timeout: timedelta) -> bool:
        """Waits until no job is held, or `timeout` passes.

        Args:
            timeout: The longest wait; 0 or more.

        Returns:
            Whether no job is held.

        Raises:
            TypeError: `timeout` is not a `timedelta`.
            InvalidArgumentError: `timeout` is negative.
        """

    async def abandon_all(self, reason: str) -> int:
        """Nacks every job still held, with the queue's retry policy; their `Lease.done`
        returns ``"abandoned"``. Runs to its end even if the awaiting task is cancelled.

        Args:
            reason: Kept as each job's last reason.

        Returns:
            How many jobs were nacked.
        """
