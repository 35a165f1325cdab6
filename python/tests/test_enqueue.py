"""Enqueue: single, batch, atomic, and the idempotency key walkthrough."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone

import pytest

import sepp
from sepp import EnqueueRequest, Payload

from conftest import Server

LEASE = timedelta(seconds=30)


async def test_enqueue_returns_a_new_job_id(client: sepp.SeppClient, queue: str) -> None:
    ack = await client.enqueue(EnqueueRequest(queue, "render"))
    assert isinstance(ack, sepp.EnqueueAck)
    assert len(ack.job_id) == 36
    assert ack.deduplicated is False


async def test_a_repeated_key_returns_the_first_job_marked_deduplicated(
    client: sepp.SeppClient, queue: str
) -> None:
    # A producer that times out and tries again sends the same key: one job results.
    first = await client.enqueue(EnqueueRequest(queue, "render", idempotency_key="invoice-1042"))
    again = await client.enqueue(EnqueueRequest(queue, "render", idempotency_key="invoice-1042"))
    assert first.deduplicated is False
    assert again.deduplicated is True
    assert again.job_id == first.job_id

    jobs = await client.reserve([queue], lease_duration=LEASE, max_jobs=10)
    assert [j.id for j in jobs] == [first.job_id]
    await client.ack(jobs[0].id, jobs[0].attempt)

    # The key outlives the job: within the window it still names the first job.
    after = await client.enqueue(EnqueueRequest(queue, "render", idempotency_key="invoice-1042"))
    assert (after.job_id, after.deduplicated) == (first.job_id, True)


async def test_a_hit_on_a_pending_job_of_a_debounced_queue_replaces_its_payload(
    client: sepp.SeppClient,
) -> None:
    # "debounced" has on_duplicate = "replace_pending" (conftest.MAIN_CONFIG).
    def version(v: bytes) -> EnqueueRequest:
        return EnqueueRequest(
            "debounced", "index", idempotency_key="doc-1", payload=Payload(v, "text/plain")
        )

    first = await client.enqueue(version(b"v1"))
    second = await client.enqueue(version(b"v2"))
    assert (second.job_id, second.deduplicated, second.replaced) == (first.job_id, True, True)
    assert second.original_state == "READY"
    assert first.replaced is False
    [job] = await client.reserve(["debounced"], lease_duration=LEASE)
    assert job.payload is not None
    assert (job.payload.data, job.payload.encoding) == (b"v2", "text/plain")
    # In flight: a hit keeps the job as it is.
    third = await client.enqueue(version(b"v3"))
    assert (third.deduplicated, third.replaced, third.original_state) == (True, False, "IN_FLIGHT")
    await client.ack(job.id, job.attempt)


async def test_the_same_key_on_two_queues_makes_two_jobs(
    client: sepp.SeppClient, queue: str
) -> None:
    a = await client.enqueue(EnqueueRequest(queue, "t", idempotency_key="shared"))
    b = await client.enqueue(EnqueueRequest(queue + "-other", "t", idempotency_key="shared"))
    assert a.job_id != b.job_id
    assert not b.deduplicated


async def test_every_request_field_reaches_the_worker(client: sepp.SeppClient, queue: str) -> None:
    past = datetime.now(timezone.utc) - timedelta(minutes=1)
    request = EnqueueRequest(
        queue,
        "resize",
        payload=Payload(b'{"w": 640}', "application/json"),
        idempotency_key="photo-7",
        priority=7,
        max_attempts=5,
        custom={"tenant": "acme", "retries": 3, "ratio": 0.5, "urgent": True},
        trace_context=sepp.TraceContext(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=x"
        ),
        scheduled_at=past,
    )
    ack = await client.enqueue(request)
    [job] = await client.reserve([queue], lease_duration=LEASE)
    assert job.id == ack.job_id
    assert (job.queue, job.job_type, job.priority) == (queue, "resize", 7)
    assert job.payload is not None
    assert (job.payload.data, job.payload.encoding) == (b'{"w": 640}', "application/json")
    assert job.custom == {"tenant": "acme", "retries": 3, "ratio": 0.5, "urgent": True}
    assert type(job.custom["urgent"]) is bool and type(job.custom["retries"]) is int
    assert job.trace_context == request.trace_context
    assert (job.attempt, job.max_attempts, job.is_last_attempt) == (1, 5, False)
    now = datetime.now(timezone.utc)
    assert job.enqueued_at is not None and job.enqueued_at.tzinfo is not None
    assert abs(job.enqueued_at - now) < timedelta(seconds=30)
    assert job.lease_expires_at is not None and job.lease_expires_at > now
    await client.ack(job.id, job.attempt)


async def test_a_job_scheduled_later_is_not_ready_yet(client: sepp.SeppClient, queue: str) -> None:
    later = datetime.now(timezone.utc) + timedelta(hours=1)
    await client.enqueue(EnqueueRequest(queue, "t", scheduled_at=later))
    assert await client.reserve([queue], lease_duration=LEASE) == []


def test_a_request_exposes_what_it_was_built_with() -> None:
    payload = Payload(bytearray(b"abc"), "text/plain")
    at = datetime(2030, 1, 2, 3, 4, 5, 600000, tzinfo=timezone(timedelta(hours=2)))
    r = EnqueueRequest(
        "q", "t", payload=payload, idempotency_key="k", priority=0, custom={"n": -1}, scheduled_at=at
    )
    assert (r.queue, r.job_type, r.idempotency_key, r.priority, r.max_attempts) == (
        "q",
        "t",
        "k",
        0,
        None,
    )
    assert r.payload is payload and payload.data == b"abc"
    assert r.custom == {"n": -1}
    assert r.scheduled_at == at and r.scheduled_at is not None
    assert r.scheduled_at.utcoffset() == timedelta(0)
    assert r.trace_context is None
    assert repr(r) == "EnqueueRequest('q', 't', idempotency_key='k')"


async def test_enqueue_batch_returns_acks_and_rejections_in_order(
    client: sepp.SeppClient, queue: str
) -> None:
    results = await client.enqueue_batch(
        [
            EnqueueRequest(queue, "t", idempotency_key="b-1"),
            EnqueueRequest(queue, "t", idempotency_key="x" * 300),  # refused by the client
            EnqueueRequest("limited", "not-allowed"),  # refused by the server
            EnqueueRequest(queue, "t", idempotency_key="b-1"),  # a dedup hit of the first
        ]
    )
    assert len(results) == 4
    first, too_long, not_allowed, repeat = results
    assert isinstance(first, sepp.EnqueueAck) and not first.deduplicated
    assert isinstance(too_long, sepp.Rejection)
    assert (too_long.code, too_long.limit, too_long.actual) == ("IDEMPOTENCY_KEY_TOO_LONG", 256, 300)
    assert isinstance(not_allowed, sepp.Rejection)
    assert not_allowed.code == "JOB_TYPE_NOT_ALLOWED"
    assert (not_allowed.job_type, not_allowed.allowed) == ("not-allowed", ["ok"])
    assert not_allowed.transient is False
    assert isinstance(repeat, sepp.EnqueueAck)
    assert (repeat.job_id, repeat.deduplicated) == (first.job_id, True)


async def test_a_batch_rejection_converts_to_its_exception(client: sepp.SeppClient) -> None:
    [rejection] = await client.enqueue_batch([EnqueueRequest("q", "t", idempotency_key="é" * 200)])
    assert isinstance(rejection, sepp.Rejection)
    error = sepp.JobRejectedError.for_rejection(rejection, index=0)
    assert isinstance(error, sepp.IdempotencyKeyTooLongError)
    assert (error.limit, error.actual, error.code) == (256, 400, rejection.code)
    assert error.rejection == rejection


async def test_enqueue_atomic_writes_all_jobs(client: sepp.SeppClient, queue: str) -> None:
    acks = await client.enqueue_atomic([EnqueueRequest(queue, "t") for _ in range(3)])
    assert len({a.job_id for a in acks}) == 3
    jobs = await client.reserve([queue], lease_duration=LEASE, max_jobs=10)
    assert sorted(j.id for j in jobs) == sorted(a.job_id for a in acks)


async def test_enqueue_atomic_writes_nothing_when_one_job_fails(
    client: sepp.SeppClient, queue: str
) -> None:
    with pytest.raises(sepp.JobTypeNotAllowedError) as caught:
        await client.enqueue_atomic(
            [
                EnqueueRequest(queue, "t"),
                EnqueueRequest("limited", "nope"),
                EnqueueRequest("limited", "ok", payload=Payload(b"123456789", "application/json")),
            ]
        )
    e = caught.value
    assert e.index == 1 and e.job_type == "nope"
    assert [(i, r.code) for i, r in e.failures] == [
        (1, "JOB_TYPE_NOT_ALLOWED"),
        (2, "PAYLOAD_TOO_LARGE"),
    ]
    assert await client.reserve([queue], lease_duration=LEASE) == []


async def test_enqueue_atomic_refuses_a_too_long_key_before_sending(
    client: sepp.SeppClient, queue: str
) -> None:
    with pytest.raises(sepp.IdempotencyKeyTooLongError) as caught:
        await client.enqueue_atomic(
            [EnqueueRequest(queue, "t"), EnqueueRequest(queue, "t", idempotency_key="k" * 257)]
        )
    assert (caught.value.index, caught.value.limit, caught.value.actual) == (1, 256, 257)
    assert await client.reserve([queue], lease_duration=LEASE) == []


async def test_keys_are_checked_against_the_limit_the_server_advertises(
    launch: Callable[[str], Server], queue: str
) -> None:
    # A server configured for 1,024-byte keys: the client checks against its limit, not 256.
    server = launch("[limits]\nmax_idempotency_key_bytes = 1024")
    async with await sepp.SeppClient.connect(server.url) as client:
        assert client.max_idempotency_key_bytes == 1024
        ack = await client.enqueue(EnqueueRequest(queue, "t", idempotency_key="k" * 300))
        assert not ack.deduplicated
        with pytest.raises(sepp.IdempotencyKeyTooLongError) as caught:
            await client.enqueue(EnqueueRequest(queue, "t", idempotency_key="k" * 1025))
        assert (caught.value.limit, caught.value.actual) == (1024, 1025)
