"""sepp: the asyncio client of sepp, a durable job queue with idempotent enqueue.

The work happens in the Rust core (sepp-rs) through the native module `sepp._native`; this
package re-exports its classes and defines the exceptions (`sepp.errors`).

Example::

    import asyncio
    from datetime import timedelta

    import sepp


    async def main() -> None:
        async with await sepp.SeppClient.connect("http://127.0.0.1:50051") as client:
            request = sepp.EnqueueRequest(
                "thumbnails",
                "resize",
                payload=sepp.Payload(b'{"photo": 4411}', "application/json"),
                # The photo id names the job, so sending this again is harmless.
                idempotency_key="resize-photo-4411",
            )
            ack = await client.enqueue(request)
            print(ack.job_id, "(repeat)" if ack.deduplicated else "(new)")

            for job in await client.reserve(["thumbnails"], lease_duration=timedelta(seconds=30)):
                await client.ack(job.id, job.attempt)


    asyncio.run(main())

Jobs are processed by a `Worker` (`sepp.worker`): async handlers per job type, with leases kept
and jobs settled by the core.

Layout: `sepp._native` (classes over the core), `sepp.errors` (exceptions), `sepp.worker`
(`Worker`, `HandlerError`, `JobContext`, `WorkerReport`).
"""

from typing import TYPE_CHECKING

from sepp._native import (
    ERROR_CLASS_NAMES,
    ERROR_CODES,
    DeadLetterPage,
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    Job,
    JobInfo,
    KeyRecord,
    NackRetry,
    Payload,
    QueueStats,
    Rejection,
    RetryPolicy,
    SeppClient,
    ServerInfo,
    TlsOptions,
    TraceContext,
    __version__,
)
from sepp import errors
from sepp.errors import *  # noqa: F403 -- exactly the names of errors.__all__
from sepp.worker import Handler, HandlerError, JobContext, Worker, WorkerReport

__all__ = [
    "ERROR_CODES",
    "ERROR_CLASS_NAMES",
    "__version__",
    # client and values
    "SeppClient",
    "EnqueueRequest",
    "Payload",
    "TraceContext",
    "EnqueueAck",
    "Rejection",
    "Job",
    "NackRetry",
    "DeadLetterRecord",
    "ServerInfo",
    "JobInfo",
    "KeyRecord",
    "DeadLetterPage",
    "QueueStats",
    "RetryPolicy",
    "TlsOptions",
    # worker
    "Worker",
    "Handler",
    "HandlerError",
    "JobContext",
    "WorkerReport",
]
__all__ += errors.__all__


def __getattr__(name: str) -> type[SeppError]:  # noqa: F405 -- from sepp.errors
    """Serves the deprecated error names of earlier releases (see `sepp.errors`)."""
    if name in errors._DEPRECATED_NAMES:
        cls: type[SeppError] = getattr(errors, name)  # noqa: F405 -- warns
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    from sepp.errors import (
        AttemptMismatch as AttemptMismatch,
        CustomEntriesTooMany as CustomEntriesTooMany,
        CustomKeyTooLong as CustomKeyTooLong,
        CustomMapTooLarge as CustomMapTooLarge,
        EncodingNotAllowed as EncodingNotAllowed,
        IdempotencyKeyTooLong as IdempotencyKeyTooLong,
        InvalidRequest as InvalidRequest,
        JobNotInFlight as JobNotInFlight,
        JobTypeNameTooLong as JobTypeNameTooLong,
        JobTypeNotAllowed as JobTypeNotAllowed,
        PayloadTooLarge as PayloadTooLarge,
        QueueClosing as QueueClosing,
        QueueFull as QueueFull,
        QueueNameTooLong as QueueNameTooLong,
        ScheduledTooFar as ScheduledTooFar,
        UnknownQueue as UnknownQueue,
        UnknownRejection as UnknownRejection,
    )
