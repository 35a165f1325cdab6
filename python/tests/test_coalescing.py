"""Coalescing: concurrent enqueues of one client leave together, each caller gets its own result;
`coalesce=False` makes one call per enqueue (counted by the server's metrics)."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from collections.abc import Callable
from typing import Union

import pytest

import sepp
from sepp import EnqueueRequest

from conftest import Server

METRICS_CONFIG = """
[metrics]
enabled = true
listen_addr = "127.0.0.1:0"
"""
ENQUEUE_BATCH_CALLS = re.compile(
    r'^sepp_rpc_duration_seconds_count\{rpc="EnqueueBatch",code="OK"\} (\d+)$', re.M
)


def request(queue: str, i: int) -> EnqueueRequest:
    """Caller `i`'s job, by `i % 4`: keyed, unkeyed, refused by the client's checks (a key over
    the advertised 256 bytes), or rejected by the server (a job type the queue "limited" does
    not allow). The job type `t{i}` tells the caller's job from the others'."""
    kind = i % 4
    if kind == 0:
        return EnqueueRequest(queue, f"t{i}", idempotency_key=f"k-{i}")
    if kind == 1:
        return EnqueueRequest(queue, f"t{i}")
    if kind == 2:
        return EnqueueRequest(queue, f"t{i}", idempotency_key="k" * 300)
    return EnqueueRequest("limited", f"t{i}")


async def check_each_caller(
    client: sepp.SeppClient,
    queue: str,
    results: list[Union[sepp.EnqueueAck, BaseException]],
) -> None:
    ids = set()
    for i, r in enumerate(results):
        kind = i % 4
        if kind in (0, 1):
            assert isinstance(r, sepp.EnqueueAck), f"caller {i}: {r!r}"
            assert r.job_id not in ids, f"caller {i}: a shared job id"
            ids.add(r.job_id)
            assert (await client.get_job(r.job_id)).job_type == f"t{i}", f"caller {i}"
            if kind == 0:
                record = await client.lookup_idempotency_key(queue, f"k-{i}")
                assert record is not None and record.job_id == r.job_id, f"caller {i}"
        elif kind == 2:
            assert isinstance(r, sepp.IdempotencyKeyTooLongError), f"caller {i}: {r!r}"
            assert (r.limit, r.actual) == (256, 300)
        else:
            assert isinstance(r, sepp.JobTypeNotAllowedError), f"caller {i}: {r!r}"


@pytest.mark.parametrize("coalesce", [True, False])
async def test_concurrent_mixed_enqueues_each_get_their_own_result(
    server: Server, queue: str, coalesce: bool
) -> None:
    async with await sepp.SeppClient.connect(
        server.url, coalesce=coalesce, max_batches_in_flight=1
    ) as client:
        results = await asyncio.gather(
            *(client.enqueue(request(queue, i)) for i in range(400)), return_exceptions=True
        )
        await check_each_caller(client, queue, results)


def metrics_url(s: Server) -> str:
    """The metrics endpoint of `s`, from the line the server logs when it binds it."""
    log = (s.data_dir / "server.log").read_text()
    found = re.search(r"metrics on (http://\S+/metrics)", log)
    assert found, f"no metrics address in the server's log:\n{log}"
    return found.group(1)


async def enqueue_batch_calls(url: str) -> int:
    def scrape() -> str:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.read().decode()

    found = ENQUEUE_BATCH_CALLS.search(await asyncio.to_thread(scrape))
    return int(found.group(1)) if found else 0


async def test_with_coalescing_off_each_enqueue_is_its_own_call(
    launch: Callable[[str], Server], queue: str
) -> None:
    s = launch(METRICS_CONFIG)
    url = metrics_url(s)
    async with await sepp.SeppClient.connect(s.url, coalesce=False) as client:
        acks = await asyncio.gather(
            *(client.enqueue(EnqueueRequest(queue, f"t{i}")) for i in range(100))
        )
        assert [(await client.get_job(a.job_id)).job_type for a in acks] == [
            f"t{i}" for i in range(100)
        ]
    assert await enqueue_batch_calls(url) == 100


async def test_max_batches_in_flight_must_be_at_least_one(server: Server) -> None:
    with pytest.raises(sepp.InvalidConfigError, match="max_batches_in_flight is 0"):
        await sepp.SeppClient.connect(server.url, max_batches_in_flight=0)


class HoldingRelay:
    """A TCP relay in front of the server whose replies (the bytes from the server) wait while
    `open` is clear, so that a batch stays in flight until the test lets it return."""

    def __init__(self, addr: str) -> None:
        host, port = addr.rsplit(":", 1)
        self.target = (host, int(port))
        self.open = asyncio.Event()
        self.open.set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        listener = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.listener = listener
        return "http://127.0.0.1:%d" % listener.sockets[0].getsockname()[1]

    async def _relay(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection(*self.target)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, held: bool) -> None:
            while data := await r.read(65536):
                if held:
                    await self.open.wait()
                w.write(data)
                await w.drain()
            w.close()

        self.tasks.add(asyncio.ensure_future(pipe(cr, sw, False)))
        self.tasks.add(asyncio.ensure_future(pipe(sr, cw, True)))

    def close(self) -> None:
        self.listener.close()
        for t in self.tasks:
            t.cancel()


async def test_a_cancelled_enqueue_that_has_not_left_is_not_sent(
    server: Server, queue: str
) -> None:
    relay = HoldingRelay(server.addr)
    url = await relay.start()
    try:
        async with await sepp.SeppClient.connect(url, max_batches_in_flight=1) as client:
            relay.open.clear()
            calls = {
                key: asyncio.create_task(
                    client.enqueue(EnqueueRequest(queue, key, idempotency_key=key))
                )
                for key in ("first", "a", "gives-up", "b")
            }
            # One turn of the loop: each task makes its call. "first" takes the only slot and
            # its reply is held at the relay; the other three wait in the client's queue.
            await asyncio.sleep(0)
            calls["gives-up"].cancel()
            relay.open.set()
            for key in ("first", "a", "b"):
                await calls[key]
            with pytest.raises(asyncio.CancelledError):
                await calls["gives-up"]
            for key, sent in (("first", True), ("a", True), ("gives-up", False), ("b", True)):
                found = await client.lookup_idempotency_key(queue, key)
                assert (found is not None) == sent, key
    finally:
        relay.close()
