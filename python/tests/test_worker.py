"""The Worker: handlers per job type, outcomes, lease loss, shutdown and signals."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import sepp
from sepp import EnqueueRequest, HandlerError, JobContext, Worker, WorkerReport

from conftest import Server

# Short long-polls, so that a worker's reserve notices new jobs and shutdown promptly.
WAIT = timedelta(milliseconds=500)


@pytest.fixture
async def client(worker_server: Server) -> AsyncIterator[sepp.SeppClient]:
    """A client of the worker tests' server."""
    async with await sepp.SeppClient.connect(worker_server.url) as c:
        yield c


async def run_until(worker: Worker, done: Awaitable[object]) -> WorkerReport:
    """Runs `worker` until `done` resolves, then stops it and returns its report."""
    running = asyncio.ensure_future(worker.run())
    waiting = asyncio.ensure_future(done)
    finished, _ = await asyncio.wait({running, waiting}, return_when=asyncio.FIRST_COMPLETED)
    if running in finished:
        waiting.cancel()
        running.result()  # raises what ended the run
        raise AssertionError("the worker stopped by itself")
    worker.stop()
    return await running


class Seen:
    """What handlers saw, and an event set once `expected` calls have been recorded."""

    def __init__(self, expected: int = 1) -> None:
        self.calls: list[tuple[str, int]] = []
        self.expected = expected
        self.enough = asyncio.Event()

    def record(self, ctx: JobContext) -> None:
        self.calls.append((ctx.job.id, ctx.attempt))
        if len(self.calls) >= self.expected:
            self.enough.set()


async def wait_for_state(
    client: sepp.SeppClient, job_id: str, state: str, timeout: float = 10.0
) -> sepp.JobInfo:
    """Polls `get_job` until the job is in `state` (the server gives no signal for it)."""
    deadline = time.monotonic() + timeout
    while True:
        info = await client.get_job(job_id)
        if info.state == state or time.monotonic() > deadline:
            return info
        await asyncio.sleep(0.05)


async def test_a_worker_acks_every_job_its_handler_returns_from(
    client: sepp.SeppClient, queue: str
) -> None:
    acks = await client.enqueue_batch(
        [
            EnqueueRequest(queue, "echo", payload=sepp.Payload(b"%d" % i, "text/plain"))
            for i in range(20)
        ]
    )
    seen = Seen(expected=20)
    payloads: list[bytes] = []
    worker = Worker(client, [queue], wait_timeout=WAIT)

    @worker.handler("echo")
    async def echo(ctx: JobContext) -> None:
        assert ctx.job.payload is not None
        payloads.append(ctx.job.payload.data)
        seen.record(ctx)

    report = await run_until(worker, seen.enough.wait())
    assert report == WorkerReport(acked=20)
    assert sorted(payloads) == sorted(b"%d" % i for i in range(20))
    assert {job_id for job_id, _ in seen.calls} == {
        a.job_id for a in acks if isinstance(a, sepp.EnqueueAck)
    }
    stats = await client.get_queue_stats(queue)
    assert (stats.ready, stats.scheduled, stats.in_flight) == (0, 0, 0)


async def test_a_worker_runs_at_most_max_in_flight_handlers_at_once(
    client: sepp.SeppClient, queue: str
) -> None:
    await client.enqueue_batch([EnqueueRequest(queue, "slow") for _ in range(9)])
    seen = Seen(expected=9)
    running = 0
    most = 0
    worker = Worker(client, [queue], max_in_flight=3, wait_timeout=WAIT)

    @worker.handler("slow")
    async def slow(ctx: JobContext) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.1)
        running -= 1
        seen.record(ctx)

    report = await run_until(worker, seen.enough.wait())
    assert report.acked == 9
    assert most == 3


async def test_failing_jobs_are_retried_and_dead_lettered_on_their_last_attempt(
    client: sepp.SeppClient, queue: str
) -> None:
    flaky = await client.enqueue(EnqueueRequest(queue, "flaky", max_attempts=3))
    doomed = await client.enqueue(EnqueueRequest(queue, "doomed", max_attempts=3))
    seen = Seen(expected=5)
    worker = Worker(client, [queue], wait_timeout=WAIT)

    @worker.handler("flaky")
    async def fails_once(ctx: JobContext) -> None:
        seen.record(ctx)
        if ctx.attempt == 1:
            raise HandlerError.retry("not yet")

    @worker.handler("doomed")
    async def always_fails(ctx: JobContext) -> None:
        seen.record(ctx)
        raise HandlerError.retry(f"failure {ctx.attempt}")

    report = await run_until(worker, seen.enough.wait())
    assert sorted(seen.calls) == sorted(
        [(flaky.job_id, 1), (flaky.job_id, 2)] + [(doomed.job_id, n) for n in (1, 2, 3)]
    )
    assert report == WorkerReport(acked=1, nacked=4)

    page = await client.list_dead_letters(queue)
    [record] = page.records
    assert (record.job.id, record.cause, record.final_attempt) == (
        doomed.job_id,
        "ATTEMPTS_EXHAUSTED",
        3,
    )
    assert record.last_reason == "failure 3"
    assert (await client.get_job(flaky.job_id)).state in ("ACKED", "UNKNOWN")


async def test_retry_after_delivers_the_job_again_after_the_delay(
    client: sepp.SeppClient, queue: str
) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "later"))
    seen = Seen(expected=2)
    delivered: list[float] = []
    worker = Worker(client, [queue], wait_timeout=WAIT)

    @worker.handler("later")
    async def later(ctx: JobContext) -> None:
        delivered.append(time.monotonic())
        seen.record(ctx)
        if ctx.attempt == 1:
            raise HandlerError.retry_after(timedelta(seconds=1), "come back later")

    report = await run_until(worker, seen.enough.wait())
    assert seen.calls == [(ack.job_id, 1), (ack.job_id, 2)]
    assert delivered[1] - delivered[0] >= 0.9
    assert (report.acked, report.nacked) == (1, 1)


async def test_permanent_dead_letters_the_job_whatever_attempts_remain(
    client: sepp.SeppClient, queue: str
) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "bad", max_attempts=5))
    seen = Seen()
    worker = Worker(client, [queue], wait_timeout=WAIT)

    @worker.handler("bad")
    async def bad(ctx: JobContext) -> None:
        seen.record(ctx)
        raise HandlerError.permanent("malformed input")

    report = await run_until(worker, seen.enough.wait())
    assert report.nacked == 1
    info = await wait_for_state(client, ack.job_id, "DEAD_LETTERED")
    assert (info.state, info.dead_letter_cause, info.attempt) == ("DEAD_LETTERED", "REJECTED", 1)
    assert info.last_reason == "malformed input"


async def test_an_exception_nacks_the_job_with_the_queue_s_retry_policy_and_the_worker_goes_on(
    client: sepp.SeppClient,
) -> None:
    # "retry-in-a-minute" retries after 45-60 s (its retry_delay_ms with jitter).
    queue = "retry-in-a-minute"
    broken = await client.enqueue(
        EnqueueRequest(queue, "broken", idempotency_key=str(uuid.uuid4()))
    )
    fine = await client.enqueue(EnqueueRequest(queue, "fine", idempotency_key=str(uuid.uuid4())))
    seen = Seen(expected=2)
    worker = Worker(client, [queue], max_in_flight=1, wait_timeout=WAIT)

    @worker.fallback
    async def handle_any(ctx: JobContext) -> None:
        seen.record(ctx)
        if ctx.job.job_type == "broken":
            raise ValueError("no such customer")

    before = datetime.now(timezone.utc)
    report = await run_until(worker, seen.enough.wait())
    assert (report.acked, report.nacked) == (1, 1)
    assert {job_id for job_id, _ in seen.calls} == {broken.job_id, fine.job_id}
    info = await client.get_job(broken.job_id)
    assert info.state == "SCHEDULED"
    assert info.last_reason == "no such customer"
    assert info.scheduled_at is not None
    assert before + timedelta(seconds=40) < info.scheduled_at < before + timedelta(seconds=70)


async def test_a_job_type_without_a_handler_is_nacked_with_the_retry_policy(
    client: sepp.SeppClient, queue: str
) -> None:
    orphan = await client.enqueue(EnqueueRequest(queue, "unknown-type", max_attempts=1))
    known = await client.enqueue(EnqueueRequest(queue, "known"))
    seen = Seen()
    worker = Worker(client, [queue], wait_timeout=WAIT)

    @worker.handler("known")
    async def handle_known(ctx: JobContext) -> None:
        seen.record(ctx)

    async def both_settled() -> None:
        await seen.enough.wait()
        await wait_for_state(client, orphan.job_id, "DEAD_LETTERED")

    report = await run_until(worker, both_settled())
    assert seen.calls == [(known.job_id, 1)]
    assert (report.acked, report.nacked) == (1, 1)
    info = await client.get_job(orphan.job_id)
    assert (info.state, info.dead_letter_cause) == ("DEAD_LETTERED", "ATTEMPTS_EXHAUSTED")
    assert info.last_reason == 'no handler for job type "unknown-type"'


async def test_a_handler_that_returns_no_awaitable_fails_its_job(
    client: sepp.SeppClient, queue: str
) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "sync", max_attempts=1))
    worker = Worker(client, [queue], wait_timeout=WAIT)
    worker.handle("sync", lambda ctx: None)  # type: ignore[type-var]

    report = await run_until(worker, wait_for_state(client, ack.job_id, "DEAD_LETTERED"))
    assert report.nacked == 1
    info = await client.get_job(ack.job_id)
    assert info.last_reason is not None and "handlers must be async functions" in info.last_reason


async def test_auto_extend_keeps_the_lease_of_a_handler_running_past_it(
    client: sepp.SeppClient, queue: str
) -> None:
    await client.enqueue(EnqueueRequest(queue, "long"))
    seen = Seen()
    expiries: list[datetime] = []
    worker = Worker(client, [queue], lease_duration=timedelta(seconds=1), wait_timeout=WAIT)

    @worker.handler("long")
    async def long(ctx: JobContext) -> None:
        assert ctx.lease_expires_at is not None
        expiries.append(ctx.lease_expires_at)
        await asyncio.sleep(2.5)
        assert ctx.lease_expires_at is not None
        expiries.append(ctx.lease_expires_at)
        assert not ctx.is_lease_lost
        seen.record(ctx)

    report = await run_until(worker, seen.enough.wait())
    assert report == WorkerReport(acked=1)
    assert expiries[1] > expiries[0] + timedelta(seconds=1)


async def test_a_lost_lease_cancels_the_handler(client: sepp.SeppClient, queue: str) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "stuck"))
    started: asyncio.Queue[JobContext] = asyncio.Queue()
    cancelled = asyncio.Event()
    worker = Worker(client, [queue], lease_duration=timedelta(seconds=1), wait_timeout=WAIT)

    @worker.handler("stuck")
    async def stuck(ctx: JobContext) -> None:
        started.put_nowait(ctx)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def lose_the_lease() -> None:
        ctx = await started.get()
        # Someone else settles the job: the worker's next extension finds it gone.
        await client.ack(ctx.job.id, ctx.attempt)
        await cancelled.wait()
        assert ctx.is_lease_lost
        await ctx.lease_lost()  # resolved already

    report = await run_until(worker, lose_the_lease())
    assert report == WorkerReport(lease_lost=1)
    assert (await client.get_job(ack.job_id)).state in ("ACKED", "UNKNOWN")


async def test_an_expired_lease_cancels_the_handler_without_auto_extend(
    client: sepp.SeppClient, queue: str
) -> None:
    await client.enqueue(EnqueueRequest(queue, "stuck"))
    cancelled = asyncio.Event()
    worker = Worker(
        client,
        [queue],
        lease_duration=timedelta(seconds=1),
        auto_extend=False,
        max_in_flight=1,
        wait_timeout=WAIT,
        shutdown_timeout=timedelta(0),
    )

    @worker.handler("stuck")
    async def stuck(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    started = time.monotonic()
    report = await run_until(worker, cancelled.wait())
    # The lease ran out after 1 s; the redelivery may have been taken before the stop.
    assert 0.9 <= time.monotonic() - started < 10
    assert (report.lease_lost, report.acked, report.nacked) == (1, 0, 0)


async def test_stop_lets_a_running_handler_finish(client: sepp.SeppClient, queue: str) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "slow"))
    started = asyncio.Event()
    finished = False
    worker = Worker(client, [queue], wait_timeout=WAIT, shutdown_timeout=timedelta(seconds=10))

    @worker.handler("slow")
    async def slow(ctx: JobContext) -> None:
        nonlocal finished
        started.set()
        await asyncio.sleep(0.5)
        finished = True

    report = await run_until(worker, started.wait())
    assert finished
    assert report == WorkerReport(acked=1)
    assert (await client.get_job(ack.job_id)).state in ("ACKED", "UNKNOWN")
    assert not worker.running


async def test_a_handler_past_the_shutdown_timeout_is_cancelled_and_its_job_nacked(
    client: sepp.SeppClient, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "endless"))
    started = asyncio.Event()
    cancelled = False
    # One slot, taken by the job: no reserve is waiting when the job is nacked back (see
    # test_the_engine_hands_out_leases_and_settles_what_it_is_told).
    worker = Worker(
        client,
        [queue],
        max_in_flight=1,
        wait_timeout=WAIT,
        shutdown_timeout=timedelta(milliseconds=300),
    )

    @worker.handler("endless")
    async def endless(ctx: JobContext) -> None:
        nonlocal cancelled
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled = True
            raise

    stopping = time.monotonic()
    report = await run_until(worker, started.wait())
    assert time.monotonic() - stopping < 5
    assert cancelled
    assert report == WorkerReport(abandoned=1)
    # The stop said, once, what it was waiting for (the core's words, as in Rust and Node).
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.name == "sepp.worker" and r.levelname == "WARNING"
    ]
    notice = (
        "sepp worker stopping: waiting up to 300 ms (shutdown_timeout) for 1 running job to"
        " finish; if not done by then, it is given back to the queue (nacked, counting the"
        " attempt)"
    )
    assert warned.count(notice) == 1, warned
    assert warned.index(notice) == 0, warned
    info = await client.get_job(ack.job_id)
    assert (info.state, info.attempt) == ("READY", 1)
    assert info.last_reason == "worker shut down before the job finished"


async def test_cancelling_run_cancels_the_handlers_and_nacks_their_jobs(
    client: sepp.SeppClient, queue: str
) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "endless"))
    started = asyncio.Event()
    worker = Worker(client, [queue], max_in_flight=1, wait_timeout=WAIT)

    @worker.handler("endless")
    async def endless(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(3600)

    running = asyncio.ensure_future(worker.run())
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    info = await client.get_job(ack.job_id)
    assert (info.state, info.last_reason) == ("READY", "worker shut down before the job finished")


async def test_stop_before_run_makes_run_return_at_once(
    client: sepp.SeppClient, queue: str
) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "t"))
    for _ in range(3):
        worker = Worker(client, [queue], wait_timeout=timedelta(seconds=30))
        worker.handle("t", _noop)
        worker.stop()
        report = await asyncio.wait_for(worker.run(), 5)
        assert report == WorkerReport()
    # Not leased and given back three times over: no attempt was spent.
    info = await client.get_job(ack.job_id)
    assert info.state == "READY" and info.attempt == 0


async def test_a_worker_whose_key_lacks_the_worker_role_raises_instead_of_waiting(
    auth_server: Server, queue: str
) -> None:
    async with await sepp.SeppClient.connect(auth_server.url, api_key="secret") as admin:
        ack = await admin.enqueue(EnqueueRequest(queue, "t"))
        async with await sepp.SeppClient.connect(
            auth_server.url, api_key="producer-only"
        ) as producer:
            worker = Worker(producer, [queue])

            @worker.handler("t")
            async def handle(job: JobContext) -> None:
                raise AssertionError("no job can be reserved with this key")

            with pytest.raises(sepp.PermissionDeniedError, match="worker"):
                await asyncio.wait_for(worker.run(), 20)
        info = await admin.get_job(ack.job_id)
        assert info.state == "READY"
        assert info.attempt == 0


async def test_stop_may_be_called_from_another_thread(client: sepp.SeppClient, queue: str) -> None:
    worker = Worker(client, [queue], wait_timeout=timedelta(seconds=30))
    running = asyncio.ensure_future(worker.run())
    while not worker.running:
        await asyncio.sleep(0.01)
    threading.Thread(target=worker.stop).start()
    assert await asyncio.wait_for(running, 5) == WorkerReport()


async def test_a_worker_refuses_bad_arguments(client: sepp.SeppClient) -> None:
    with pytest.raises(TypeError, match="queues"):
        Worker(client, "emails")
    with pytest.raises(TypeError, match="client"):
        Worker("http://127.0.0.1:1", ["q"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="lease_duration"):
        Worker(client, ["q"], lease_duration=30)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="max_in_flight"):
        Worker(client, ["q"], max_in_flight=2.5)  # type: ignore[arg-type]
    with pytest.raises(sepp.InvalidArgumentError, match="lease_duration"):
        Worker(client, ["q"], lease_duration=timedelta(seconds=-1))
    with pytest.raises(sepp.InvalidArgumentError, match="shutdown_timeout"):
        Worker(client, ["q"], shutdown_timeout=timedelta(seconds=-1))
    with pytest.raises(sepp.InvalidArgumentError, match="queues is empty"):
        Worker(client, [])
    with pytest.raises(sepp.InvalidArgumentError, match="queues contains an empty name"):
        Worker(client, ["q", ""])
    with pytest.raises(sepp.InvalidArgumentError, match="max_in_flight is 0"):
        Worker(client, ["q"], max_in_flight=0)
    with pytest.raises(sepp.InvalidArgumentError, match="lease_duration is 0"):
        Worker(client, ["q"], lease_duration=timedelta(0))
    with pytest.raises(sepp.InvalidArgumentError, match="handler_timeout is 0"):
        Worker(client, ["q"], handler_timeout=timedelta(0))
    with pytest.raises(
        sepp.InvalidArgumentError, match="lease_duration is 500µs: it must be at least 1 ms"
    ):
        Worker(client, ["q"], lease_duration=timedelta(microseconds=500))
    with pytest.raises(
        sepp.InvalidArgumentError, match="handler_timeout is 500µs: it must be at least 1 ms"
    ):
        Worker(client, ["q"], handler_timeout=timedelta(microseconds=500))
    # The option's name is in the message itself, not only in a note.
    with pytest.raises(TypeError, match="^auto_extend must be bool, not str$"):
        Worker(client, ["q"], auto_extend="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^worker_id must be str, not int$"):
        Worker(client, ["q"], worker_id=5)  # type: ignore[arg-type]

    worker = Worker(client, ["q"])
    worker.handle("t", _noop)
    with pytest.raises(ValueError, match="already has a handler"):
        worker.handle("t", _noop)
    with pytest.raises(TypeError, match="handler"):
        worker.handle("u", "not a function")  # type: ignore[type-var]
    with pytest.raises(TypeError, match="job_type"):
        worker.handler(1)  # type: ignore[arg-type]
    worker.fallback(_noop)
    with pytest.raises(ValueError, match="fallback"):
        worker.fallback(_noop)


async def test_a_worker_runs_one_run_at_a_time(client: sepp.SeppClient, queue: str) -> None:
    worker = Worker(client, [queue], wait_timeout=WAIT)
    running = asyncio.ensure_future(worker.run())
    while not worker.running:
        await asyncio.sleep(0.01)
    with pytest.raises(RuntimeError, match="already running"):
        await worker.run()
    worker.stop()
    await running
    # Once stopped, it may run again.
    worker.stop()
    assert await worker.run() == WorkerReport()


async def test_the_engine_hands_out_leases_and_settles_what_it_is_told(
    client: sepp.SeppClient, queue: str
) -> None:
    from sepp._native import Engine, EngineOptions, Outcome

    acks = await client.enqueue_batch([EnqueueRequest(queue, "t") for _ in range(3)])
    options = EngineOptions([queue], max_in_flight=3, wait_timeout=WAIT, worker_id="engine-1")
    assert (options.max_in_flight, options.lease_duration, options.auto_extend) == (
        3,
        timedelta(seconds=30),
        True,
    )
    engine = Engine.start(client, options)
    leases: list[sepp._native.Lease] = []
    while len(leases) < 3:
        leases += await engine.next_batch(3)
    assert sorted(lease.job.id for lease in leases) == sorted(
        a.job_id for a in acks if isinstance(a, sepp.EnqueueAck)
    )
    assert engine.in_flight == 3
    first, second, third = leases
    assert first.expires_at is not None and not first.is_lost
    assert (await client.get_job(first.job.id)).worker_id == "engine-1"

    # Every slot is taken, so the poller is not reserving: shutting down cancels no reserve
    # (a cancelled long-poll may still take a job the server makes ready meanwhile).
    engine.shutdown()
    assert engine.is_shut_down
    assert await engine.next() is None
    await engine.settle(first.job.id, first.job.attempt, Outcome.success())
    assert await first.done() == "settled"
    assert await first.ended() is False
    await engine.settle(
        second.job.id, second.job.attempt, Outcome.retry_after(timedelta(hours=1), "later")
    )
    # Settled already: refused without a call.
    with pytest.raises(sepp.JobNotInFlightError):
        await engine.settle(first.job.id, first.job.attempt, Outcome.success())
    with pytest.warns(DeprecationWarning, match="settle"):
        with pytest.raises(sepp.JobNotInFlightError):
            await engine.complete(first.job.id, first.job.attempt, Outcome.success())
    assert await engine.wait_idle(timedelta(milliseconds=50)) is False
    assert await engine.abandon_all("test over") == 1
    assert await third.done() == "abandoned"
    assert await engine.wait_idle(timedelta(seconds=5)) is True
    assert engine.report == WorkerReport(acked=1, nacked=1, abandoned=1)
    info = await client.get_job(third.job.id)
    assert (info.state, info.last_reason) == ("READY", "test over")
    assert (await client.get_job(second.job.id)).state == "SCHEDULED"


async def test_a_handler_past_handler_timeout_is_cancelled_and_its_job_nacked(
    client: sepp.SeppClient, queue: str
) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "slow", max_attempts=1))
    cancelled = asyncio.Event()
    worker = Worker(
        client, [queue], wait_timeout=WAIT, handler_timeout=timedelta(milliseconds=300)
    )

    @worker.handler("slow")
    async def slow(ctx: JobContext) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def dead_lettered() -> None:
        await cancelled.wait()
        await wait_for_state(client, ack.job_id, "DEAD_LETTERED")

    report = await run_until(worker, dead_lettered())
    assert report == WorkerReport(nacked=1)
    info = await client.get_job(ack.job_id)
    assert (info.dead_letter_cause, info.last_reason) == (
        "ATTEMPTS_EXHAUSTED",
        "the handler ran past handler_timeout (300 ms)",
    )


async def test_a_lost_lease_on_the_last_attempt_is_left_to_the_server_s_expiry(
    client: sepp.SeppClient, queue: str
) -> None:
    # No nack for a lost lease: it would spend the attempt (ATTEMPTS_EXHAUSTED).
    ack = await client.enqueue(EnqueueRequest(queue, "stuck", max_attempts=1))
    worker = Worker(
        client,
        [queue],
        lease_duration=timedelta(milliseconds=500),
        auto_extend=False,
        wait_timeout=WAIT,
    )

    @worker.handler("stuck")
    async def stuck(ctx: JobContext) -> None:
        await asyncio.sleep(3600)

    report = await run_until(worker, wait_for_state(client, ack.job_id, "DEAD_LETTERED"))
    assert report == WorkerReport(lease_lost=1)
    info = await client.get_job(ack.job_id)
    assert (info.dead_letter_cause, info.attempt) == ("LEASE_EXPIRED", 1)


def test_the_report_s_old_names_still_work_with_a_warning() -> None:
    report = WorkerReport(acked=2, nacked=1)
    with pytest.warns(DeprecationWarning, match="acked"):
        assert report.succeeded == 2
    with pytest.warns(DeprecationWarning, match="nacked"):
        assert report.failed == 1


def test_handler_errors_carry_their_outcome() -> None:
    e = HandlerError.retry_after(timedelta(seconds=5), "rate limited")
    assert (e.outcome.kind, e.outcome.delay, e.reason) == (
        "retry_after",
        timedelta(seconds=5),
        "rate limited",
    )
    assert str(e) == "retry after 0:00:05 (rate limited)"
    assert e.outcome == sepp._native.Outcome.retry_after(timedelta(seconds=5), "rate limited")
    assert str(HandlerError.retry()) == "retry (no reason)"
    assert HandlerError.permanent("x").outcome.kind == "permanent"
    with pytest.raises(TypeError, match="delay"):
        HandlerError.retry_after(5)  # type: ignore[arg-type]
    with pytest.raises(sepp.InvalidArgumentError):
        HandlerError.retry_after(timedelta(seconds=-1))
    with pytest.raises(TypeError, match="Outcome"):
        HandlerError("message")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        HandlerError(sepp._native.Outcome.success())


SIGTERM_WORKER = """
import asyncio, sys
from datetime import timedelta
import sepp

async def main() -> None:
    async with await sepp.SeppClient.connect(sys.argv[1]) as client:
        worker = sepp.Worker(client, [sys.argv[2]], wait_timeout=timedelta(milliseconds=500))

        @worker.handler("slow")
        async def slow(ctx: sepp.JobContext) -> None:
            print("started", ctx.job.id, flush=True)
            await asyncio.sleep(1)
            print("finished", ctx.job.id, flush=True)

        report = await worker.run()
        print("report", report.acked, report.abandoned, flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_stops_a_worker_process_gracefully(
    client: sepp.SeppClient, worker_server: Server, queue: str, tmp_path: Path, sig: int
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(SIGTERM_WORKER))
    ack = await client.enqueue(EnqueueRequest(queue, "slow"))
    proc = subprocess.Popen(
        [sys.executable, str(script), worker_server.url, queue],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.to_thread(proc.stdout.readline)
        assert line.split() == ["started", ack.job_id]
        proc.send_signal(sig)
        out, err = await asyncio.to_thread(proc.communicate, timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.split("\n")[:2] == [f"finished {ack.job_id}", "report 1 0"]
    assert (await client.get_job(ack.job_id)).state in ("ACKED", "UNKNOWN")


async def _noop(ctx: JobContext) -> None:
    pass
