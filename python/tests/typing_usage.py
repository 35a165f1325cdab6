"""Type-checked with `mypy --strict`, never run: the stub must accept idiomatic use and refuse
wrong types.

Each `# type: ignore[code]` marks a line mypy must reject; `--strict` turns on
`warn_unused_ignores`, so an ignore that is no longer needed (the stub got too loose) fails
the check.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from collections.abc import Coroutine
from typing import Any, Callable, Literal, Optional, Union

from typing_extensions import assert_type

import sepp
from sepp import EnqueueRequest, Payload


async def produce(url: str) -> None:
    async with await sepp.SeppClient.connect(
        url,
        api_key="key",
        tls=sepp.TlsOptions(ca_pem=b"-----BEGIN CERTIFICATE-----"),
        rpc_timeout=None,
        retry_policy=sepp.RetryPolicy(max_retries=2, first_retry_delay=timedelta(milliseconds=20)),
        coalesce=True,
        max_batches_in_flight=2,
    ) as client:
        assert_type(client, sepp.SeppClient)
        assert_type(client.max_idempotency_key_bytes, Optional[int])

        request = EnqueueRequest(
            "thumbnails",
            "resize",
            payload=Payload(b"{}", "application/json"),
            idempotency_key="photo-1",
            priority=5,
            max_attempts=3,
            custom={"tenant": "acme", "n": 1, "ratio": 0.5, "urgent": True},
            trace_context=sepp.TraceContext("00-aa-bb-01"),
            scheduled_at=datetime.now(timezone.utc) + timedelta(minutes=5),
        )
        ack = await client.enqueue(request)
        assert_type(ack, sepp.EnqueueAck)
        assert_type(ack.job_id, str)
        assert_type(ack.deduplicated, bool)

        acks = await asyncio.gather(*(client.enqueue(request) for _ in range(3)))
        assert_type(acks, list[sepp.EnqueueAck])
        task = asyncio.create_task(client.enqueue(request))
        assert_type(await task, sepp.EnqueueAck)

        for result in await client.enqueue_batch([request, request]):
            if isinstance(result, sepp.Rejection):
                assert_type(result.code, str)
                assert_type(result.limit, Optional[int])
                error = sepp.JobRejectedError.for_rejection(result)
                assert_type(error, sepp.JobRejectedError)
            else:
                assert_type(result, sepp.EnqueueAck)

        try:
            assert_type(await client.enqueue_atomic((request,)), list[sepp.EnqueueAck])
        except sepp.IdempotencyKeyTooLongError as e:
            assert_type(e.limit, int)
            assert_type(e.actual, int)
            assert_type(e.rejection, sepp.Rejection)
            assert_type(e.failures, list[tuple[int, sepp.Rejection]])
        except sepp.ScheduledTooFarError as e:
            assert_type(e.horizon, timedelta)
            assert_type(e.scheduled_at, datetime)
        except sepp.QueueFullError as e:
            assert_type(e.queue, str)
            assert_type(e.retryable, bool)
        except sepp.JobRejectedError as e:
            assert_type(e.index, int)
        except sepp.SeppError as e:
            assert_type(e.code, str)
            assert_type(e.grpc_code, Optional[int])


async def consume(client: sepp.SeppClient) -> None:
    jobs = await client.reserve(
        ["thumbnails"],
        lease_duration=timedelta(seconds=30),
        wait_timeout=timedelta(seconds=20),
        max_jobs=10,
        worker_id="w-1",
    )
    assert_type(jobs, list[sepp.Job])
    for job in jobs:
        assert_type(job.attempt, int)
        assert_type(job.payload, Optional[Payload])
        assert_type(job.custom, dict[str, Union[str, int, float, bool]])
        assert_type(job.lease_expires_at, Optional[datetime])
        expiry = await client.extend(job.id, job.attempt, timedelta(minutes=1))
        assert_type(expiry, datetime)
        try:
            assert_type(await client.ack(job.id, job.attempt), None)
        except sepp.LeaseLostError as e:
            assert_type(e.job_id, Optional[str])
            dead = await client.nack(
                job.id, job.attempt, retry=sepp.NackRetry.delay(timedelta(seconds=5)), reason="x"
            )
            assert_type(dead, bool)

    records = await client.drain_dead_letters("thumbnails", max=10)
    assert_type(records, list[sepp.DeadLetterRecord])
    assert_type(
        records[0].cause,
        Literal["UNSPECIFIED", "ATTEMPTS_EXHAUSTED", "REJECTED", "LEASE_EXPIRED", "ADMIN"],
    )
    page = await client.list_dead_letters("thumbnails", page_size=50)
    assert_type(page.records, list[sepp.DeadLetterRecord])
    assert_type(page.next_page_token, Optional[str])
    assert_type(await client.requeue_dead_letters([r.job.id for r in page.records]), list[str])
    assert_type(await client.delete_dead_letters(queue="thumbnails", max=10), list[str])
    job_info = await client.get_job("id")
    job_info.state == "LOST"  # type: ignore[comparison-overlap]  # states are a closed set
    assert_type(job_info.payload, Optional[sepp.Payload])
    assert_type(job_info.trace_context, Optional[sepp.TraceContext])
    assert_type(job_info.custom["tenant"], Union[str, int, float, bool])
    key = await client.lookup_idempotency_key("thumbnails", "photo-1")
    assert_type(key, Optional[sepp.KeyRecord])
    await client.pause_queue("thumbnails")
    stats = await client.get_queue_stats("thumbnails")
    assert_type(stats.paused, bool)
    await client.resume_queue("thumbnails")
    info = await client.get_server_info()
    assert_type(info.max_lease_duration, Optional[timedelta])
    assert_type(sepp.ERROR_CODES, tuple[str, ...])
    assert_type(sepp.errors.error_class("QUEUE_FULL"), Optional[type[sepp.SeppError]])
    await client.close()


async def wrong_types(client: sepp.SeppClient) -> None:
    EnqueueRequest(1, "t")  # type: ignore[arg-type]
    EnqueueRequest("q", "t", "key")  # type: ignore[call-arg, arg-type]
    EnqueueRequest("q", "t", payload=b"data")  # type: ignore[arg-type]
    EnqueueRequest("q", "t", custom={"k": [1]})  # type: ignore[dict-item]
    EnqueueRequest("q", "t", scheduled_at=0.0)  # type: ignore[arg-type]
    Payload("text", "text/plain")  # type: ignore[arg-type]
    await client.enqueue("q")  # type: ignore[arg-type]
    await client.reserve(["q"])  # type: ignore[call-arg]
    await client.reserve(["q"], lease_duration=30)  # type: ignore[arg-type]
    await client.ack("job", "1")  # type: ignore[arg-type]
    await client.nack("job", 1, retry=timedelta(seconds=1))  # type: ignore[arg-type]
    await sepp.SeppClient.connect("h:1", rpc_timeout=30)  # type: ignore[arg-type]
    ack = await client.enqueue(EnqueueRequest("q", "t"))
    ack.job_id = "other"  # type: ignore[misc]


async def work(client: sepp.SeppClient) -> None:
    worker = sepp.Worker(
        client,
        ["emails", "emails-bulk"],
        lease_duration=timedelta(seconds=30),
        max_in_flight=10,
        auto_extend=True,
        wait_timeout=timedelta(seconds=5),
        shutdown_timeout=timedelta(seconds=10),
        worker_id="w-1",
        handle_signals=False,
    )

    @worker.handler("receipt")
    async def send_receipt(ctx: sepp.JobContext) -> None:
        assert_type(ctx.job, sepp.Job)
        assert_type(ctx.attempt, int)
        assert_type(ctx.lease_expires_at, Optional[datetime])
        assert_type(ctx.is_lease_lost, bool)
        if ctx.job.payload is None:
            raise sepp.HandlerError.permanent("no payload")
        if ctx.job.is_last_attempt:
            raise sepp.HandlerError.retry()
        raise sepp.HandlerError.retry_after(timedelta(minutes=1), reason="rate limited")

    # The decorators give the function back unchanged.
    same: Callable[[sepp.JobContext], Coroutine[Any, Any, None]] = send_receipt
    same = worker.handle("refund", send_receipt)

    @worker.fallback
    async def anything(ctx: sepp.JobContext) -> None:
        await ctx.lease_lost()

    handler: sepp.Handler = anything
    worker.handle("other", handler)
    error = sepp.HandlerError.retry("x")
    assert_type(error.reason, Optional[str])
    assert_type(error.outcome.kind, Literal["success", "retry", "retry_after", "permanent"])
    assert_type(error.outcome.delay, Optional[timedelta])
    assert_type(worker.queues, list[str])
    assert_type(worker.running, bool)
    report = await worker.run()
    assert_type(report, sepp.WorkerReport)
    assert_type(report.succeeded, int)
    assert_type(report.abandoned, int)
    worker.stop()


async def worker_wrong_types(client: sepp.SeppClient) -> None:
    sepp.Worker(client, ["q"], lease_duration=30)  # type: ignore[arg-type]
    sepp.Worker(client, ["q"], 10)  # type: ignore[call-arg, arg-type]
    worker = sepp.Worker(client, ["q"])

    def not_async(ctx: sepp.JobContext) -> None: ...

    async def no_context() -> None: ...

    async def returns_a_value(ctx: sepp.JobContext) -> int:
        return 1

    worker.handle("a", not_async)  # type: ignore[type-var]
    worker.handle("b", no_context)  # type: ignore[type-var]
    worker.handle("c", returns_a_value)  # type: ignore[type-var]
    worker.handler("d")(not_async)  # type: ignore[type-var]
    worker.handle(1, send)  # type: ignore[arg-type]
    sepp.HandlerError.retry_after(5)  # type: ignore[arg-type]
    report = await worker.run()
    report.succeeded = 1  # type: ignore[misc]


async def send(ctx: sepp.JobContext) -> None: ...
