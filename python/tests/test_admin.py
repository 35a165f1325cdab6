"""Operator calls: job and key lookup, dead-letter listing and repair, pause/resume, stats."""

from __future__ import annotations

from datetime import timedelta

import pytest

import sepp
from sepp import EnqueueRequest, NackRetry

LEASE = timedelta(seconds=30)


async def dead_letters(client: sepp.SeppClient, queue: str, n: int) -> list[str]:
    """Enqueues `n` jobs and dead-letters them, oldest first; returns their ids."""
    ids = []
    for i in range(n):
        await client.enqueue(EnqueueRequest(queue, "t", idempotency_key=f"dl-{i}"))
        [job] = await client.reserve([queue], lease_duration=LEASE)
        await client.nack(job.id, job.attempt, retry=NackRetry.dead_letter(), reason=f"r{i}")
        ids.append(job.id)
    return ids


async def test_get_job_follows_a_job_through_its_states(
    client: sepp.SeppClient, queue: str
) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "report", idempotency_key="week-48"))
    info = await client.get_job(ack.job_id)
    assert isinstance(info, sepp.JobInfo)
    assert (info.job_id, info.state, info.queue, info.job_type) == (
        ack.job_id,
        "READY",
        queue,
        "report",
    )
    assert (info.attempt, info.idempotency_key, info.dead_letter_cause) == (0, "week-48", None)
    assert info.enqueued_at is not None

    [job] = await client.reserve([queue], lease_duration=LEASE, worker_id="w-7")
    info = await client.get_job(job.id)
    assert (info.state, info.attempt, info.worker_id) == ("IN_FLIGHT", 1, "w-7")
    assert info.lease_expires_at == job.lease_expires_at

    await client.ack(job.id, job.attempt)
    info = await client.get_job(job.id)
    assert info.state == "ACKED" and info.finished_at is not None


async def test_get_job_of_an_unknown_id_says_unknown(client: sepp.SeppClient) -> None:
    info = await client.get_job("00000000-0000-4000-8000-000000000000")
    assert info.state == "UNKNOWN"


async def test_lookup_idempotency_key_names_the_job(client: sepp.SeppClient, queue: str) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "t", idempotency_key="order-77"))
    record = await client.lookup_idempotency_key(queue, "order-77")
    assert isinstance(record, sepp.KeyRecord)
    assert record.job_id == ack.job_id
    assert record.created_at is not None and record.expires_at is not None
    assert record.expires_at - record.created_at == timedelta(hours=24)
    assert await client.lookup_idempotency_key(queue, "order-78") is None
    assert await client.lookup_idempotency_key(queue + "-x", "order-77") is None


async def test_dead_letters_are_listed_page_by_page_without_removal(
    client: sepp.SeppClient, queue: str
) -> None:
    ids = await dead_letters(client, queue, 3)
    first = await client.list_dead_letters(queue, page_size=2)
    assert isinstance(first, sepp.DeadLetterPage)
    assert [r.job.id for r in first.records] == ids[:2]
    assert first.records[0].last_reason == "r0" and first.records[0].cause == "REJECTED"
    assert first.next_page_token is not None
    second = await client.list_dead_letters(queue, page_size=2, page_token=first.next_page_token)
    assert [r.job.id for r in second.records] == ids[2:]
    assert second.next_page_token is None
    again = await client.list_dead_letters(queue)
    assert [r.job.id for r in again.records] == ids
    info = await client.get_job(ids[0])
    assert (info.state, info.dead_letter_cause) == ("DEAD_LETTERED", "REJECTED")


async def test_requeued_dead_letters_are_delivered_again(
    client: sepp.SeppClient, queue: str
) -> None:
    ids = await dead_letters(client, queue, 2)
    assert await client.requeue_dead_letters([ids[1], "not-a-dead-letter"]) == [ids[1]]
    [job] = await client.reserve([queue], lease_duration=LEASE)
    assert (job.id, job.attempt) == (ids[1], 1)
    # The requeued job keeps its key.
    again = await client.enqueue(EnqueueRequest(queue, "t", idempotency_key="dl-1"))
    assert (again.job_id, again.deduplicated) == (ids[1], True)

    assert await client.requeue_dead_letters(queue=queue, max=5) == [ids[0]]
    assert (await client.list_dead_letters(queue)).records == []


async def test_deleted_dead_letters_are_gone(client: sepp.SeppClient, queue: str) -> None:
    ids = await dead_letters(client, queue, 3)
    assert await client.delete_dead_letters(queue=queue) == ids[:1]
    assert await client.delete_dead_letters(ids[2:]) == ids[2:]
    assert [r.job.id for r in (await client.list_dead_letters(queue)).records] == [ids[1]]
    assert await client.drain_dead_letters(queue, max=10) != []


async def test_a_dead_letter_selector_is_ids_or_queue_and_max(client: sepp.SeppClient) -> None:
    with pytest.raises(sepp.InvalidArgumentError, match="job_ids"):
        await client.requeue_dead_letters(["a"], queue="q")
    with pytest.raises(sepp.InvalidArgumentError, match="job_ids"):
        await client.delete_dead_letters(["a"], max=3)
    with pytest.raises(TypeError, match="job_ids"):
        await client.delete_dead_letters("a")
    with pytest.raises(sepp.InvalidArgumentError, match="max"):
        await client.delete_dead_letters(max=-1)


async def test_a_paused_queue_is_skipped_by_reserve(client: sepp.SeppClient, queue: str) -> None:
    await client.pause_queue(queue)
    ack = await client.enqueue(EnqueueRequest(queue, "t"))
    assert await client.reserve([queue], lease_duration=LEASE) == []
    stats = await client.get_queue_stats(queue)
    assert isinstance(stats, sepp.QueueStats)
    assert (stats.ready, stats.paused) == (1, True)

    await client.resume_queue(queue)
    [job] = await client.reserve([queue], lease_duration=LEASE)
    assert job.id == ack.job_id
    stats = await client.get_queue_stats(queue)
    assert (stats.ready, stats.in_flight, stats.paused) == (0, 1, False)


async def test_queue_stats_count_jobs_by_state(client: sepp.SeppClient, queue: str) -> None:
    await client.enqueue_batch(
        [EnqueueRequest(queue, "t", idempotency_key=f"s-{i}") for i in range(3)]
    )
    await client.reserve([queue], lease_duration=LEASE)
    stats = await client.get_queue_stats(queue)
    assert (stats.ready, stats.in_flight, stats.scheduled, stats.dead_lettered) == (2, 1, 0, 0)
    assert stats.dedup_records == 3
