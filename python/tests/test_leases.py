"""Reserve, ack, nack, extend, dead letters and server info."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

import sepp
from sepp import EnqueueRequest, NackRetry

LEASE = timedelta(seconds=30)


async def reserve_one(client: sepp.SeppClient, queue: str) -> sepp.Job:
    [job] = await client.reserve([queue], lease_duration=LEASE, wait_timeout=timedelta(seconds=5))
    return job


async def test_reserve_leases_a_ready_job(client: sepp.SeppClient, queue: str) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "t"))
    before = datetime.now(timezone.utc)
    jobs = await client.reserve([queue], lease_duration=LEASE, worker_id="w-1")
    assert [j.id for j in jobs] == [ack.job_id]
    assert jobs[0].attempt == 1
    assert jobs[0].lease_expires_at is not None
    assert before + timedelta(seconds=20) < jobs[0].lease_expires_at
    assert "Job(id=" in repr(jobs[0])


async def test_reserve_on_an_empty_queue_returns_no_job_at_once(
    client: sepp.SeppClient, queue: str
) -> None:
    started = time.monotonic()
    assert await client.reserve([queue], lease_duration=LEASE) == []
    assert time.monotonic() - started < 5


async def test_reserve_waits_up_to_wait_timeout(client: sepp.SeppClient, queue: str) -> None:
    started = time.monotonic()
    jobs = await client.reserve(
        [queue], lease_duration=LEASE, wait_timeout=timedelta(milliseconds=300)
    )
    assert jobs == []
    assert time.monotonic() - started >= 0.25


async def test_reserve_takes_up_to_max_jobs_across_queues_in_order(
    client: sepp.SeppClient, queue: str
) -> None:
    await client.enqueue_batch([EnqueueRequest(queue + "-b", "t") for _ in range(2)])
    await client.enqueue_batch([EnqueueRequest(queue + "-a", "t") for _ in range(2)])
    jobs = await client.reserve([queue + "-a", queue + "-b"], lease_duration=LEASE, max_jobs=3)
    assert [j.queue for j in jobs] == [queue + "-a", queue + "-a", queue + "-b"]


async def test_ack_removes_the_job_and_a_second_ack_finds_it_gone(
    client: sepp.SeppClient, queue: str
) -> None:
    await client.enqueue(EnqueueRequest(queue, "t"))
    job = await reserve_one(client, queue)
    assert await client.ack(job.id, job.attempt) is None
    with pytest.raises(sepp.JobNotInFlightError) as caught:
        await client.ack(job.id, job.attempt)
    e = caught.value
    assert e.code == "JOB_NOT_IN_FLIGHT" and e.job_id == job.id
    assert isinstance(e, sepp.LeaseLostError) and not e.retryable
    assert e.grpc_code is None or isinstance(e.grpc_code, int)
    assert await client.reserve([queue], lease_duration=LEASE) == []


async def test_ack_then_reserve_acks_and_brings_the_next_job(
    client: sepp.SeppClient, queue: str
) -> None:
    for _ in range(2):
        await client.enqueue(EnqueueRequest(queue, "t"))
    job = await reserve_one(client, queue)
    with pytest.raises(sepp.InvalidArgumentError):
        await client.ack_then_reserve(job.id, job.attempt, [], lease_duration=LEASE)
    with pytest.raises(sepp.AttemptMismatchError):
        await client.ack_then_reserve(job.id, job.attempt + 1, [queue], lease_duration=LEASE)
    nxt = await client.ack_then_reserve(job.id, job.attempt, [queue], lease_duration=LEASE)
    assert nxt is not None and len(nxt) == 1
    assert nxt[0].id != job.id and nxt[0].attempt == 1
    with pytest.raises(sepp.JobNotInFlightError):
        await client.ack(job.id, job.attempt)
    # Nothing left: acked, and an empty list.
    assert await client.ack_then_reserve(nxt[0].id, 1, [queue], lease_duration=LEASE) == []
    with pytest.raises(sepp.JobNotInFlightError):
        await client.ack(nxt[0].id, 1)


async def test_nack_with_the_default_policy_redelivers_with_the_next_attempt(
    client: sepp.SeppClient, queue: str
) -> None:
    await client.enqueue(EnqueueRequest(queue, "t", max_attempts=3))
    first = await reserve_one(client, queue)
    assert await client.nack(first.id, first.attempt, reason="flaky") is False
    second = await reserve_one(client, queue)
    assert (second.id, second.attempt) == (first.id, 2)

    # The first delivery's lease is gone: its attempt no longer matches.
    with pytest.raises(sepp.AttemptMismatchError) as caught:
        await client.ack(first.id, first.attempt)
    assert caught.value.job_id == first.id and caught.value.code == "ATTEMPT_MISMATCH"
    await client.ack(second.id, second.attempt)


async def test_nack_with_a_delay_holds_the_job_back(client: sepp.SeppClient, queue: str) -> None:
    await client.enqueue(EnqueueRequest(queue, "t"))
    job = await reserve_one(client, queue)
    retry = NackRetry.delay(timedelta(hours=1))
    assert (retry.kind, retry.retry_delay) == ("delay", timedelta(hours=1))
    assert await client.nack(job.id, job.attempt, retry=retry) is False
    assert await client.reserve([queue], lease_duration=LEASE) == []


async def test_nack_with_dead_letter_keeps_a_record_to_drain(
    client: sepp.SeppClient, queue: str
) -> None:
    await client.enqueue(EnqueueRequest(queue, "t", payload=sepp.Payload(b"x", "text/plain")))
    job = await reserve_one(client, queue)
    dead = await client.nack(job.id, job.attempt, retry=NackRetry.dead_letter(), reason="bad input")
    assert dead is True
    [record] = await client.drain_dead_letters(queue, max=10)
    assert isinstance(record, sepp.DeadLetterRecord)
    assert (record.job.id, record.cause, record.final_attempt) == (job.id, "REJECTED", 1)
    assert record.last_reason == "bad input"
    assert record.job.payload is not None and record.job.payload.data == b"x"
    assert record.failed_at is not None and record.failed_at.tzinfo is not None
    assert await client.drain_dead_letters(queue) == []


async def test_a_failed_last_attempt_dead_letters_the_job(client: sepp.SeppClient) -> None:
    # "single-shot" allows one delivery.
    ack = await client.enqueue(EnqueueRequest("single-shot", "t"))
    job = await reserve_one(client, "single-shot")
    assert job.id == ack.job_id and job.is_last_attempt
    assert await client.nack(job.id, job.attempt, retry=NackRetry.default()) is True
    records = await client.drain_dead_letters("single-shot", max=100)
    assert [(r.job.id, r.cause) for r in records] == [(job.id, "ATTEMPTS_EXHAUSTED")]


async def test_extend_moves_the_lease_out(client: sepp.SeppClient, queue: str) -> None:
    await client.enqueue(EnqueueRequest(queue, "t"))
    job = await reserve_one(client, queue)
    assert job.lease_expires_at is not None
    expiry = await client.extend(job.id, job.attempt, timedelta(minutes=4))
    assert isinstance(expiry, datetime) and expiry.tzinfo is not None
    assert expiry > job.lease_expires_at + timedelta(minutes=3)
    await client.ack(job.id, job.attempt)
    with pytest.raises(sepp.JobNotInFlightError):
        await client.extend(job.id, job.attempt, timedelta(minutes=1))


async def test_get_server_info_reports_the_limits(client: sepp.SeppClient) -> None:
    info = await client.get_server_info()
    assert info.server_version
    assert "v1" in info.supported_protocol_versions
    assert info.max_idempotency_key_bytes == client.max_idempotency_key_bytes == 256
    assert info.max_enqueue_batch == 256
    assert info.max_lease_duration == timedelta(minutes=5)
    assert info.dead_letter_retention_enabled is True
    assert info.dedup_window == timedelta(hours=24)
    assert info.server_time is not None
    assert abs(info.server_time - datetime.now(timezone.utc)) < timedelta(minutes=1)
