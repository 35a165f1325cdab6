"""Concurrency: many calls at once, coroutines and cancellation, several event loops, exit."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta

import pytest

import sepp
from sepp import EnqueueRequest

from conftest import Server

LEASE = timedelta(seconds=30)


async def test_a_thousand_enqueues_gathered_at_once(client: sepp.SeppClient, queue: str) -> None:
    acks = await asyncio.gather(
        *(client.enqueue(EnqueueRequest(queue, "t", idempotency_key=f"k-{i}")) for i in range(1000))
    )
    assert len({a.job_id for a in acks}) == 1000
    assert not any(a.deduplicated for a in acks)


async def test_concurrent_enqueues_of_one_key_make_one_job(
    client: sepp.SeppClient, queue: str
) -> None:
    acks = await asyncio.gather(
        *(client.enqueue(EnqueueRequest(queue, "t", idempotency_key="once")) for _ in range(100))
    )
    assert len({a.job_id for a in acks}) == 1
    assert sum(not a.deduplicated for a in acks) == 1


async def test_calls_are_coroutines_that_tasks_accept(client: sepp.SeppClient, queue: str) -> None:
    call = client.enqueue(EnqueueRequest(queue, "t"))
    assert asyncio.iscoroutine(call)
    ack = await asyncio.create_task(call)
    assert isinstance(ack, sepp.EnqueueAck)


async def test_a_call_never_awaited_sends_nothing(client: sepp.SeppClient, queue: str) -> None:
    call = client.enqueue(EnqueueRequest(queue, "t"))
    call.close()
    assert await client.reserve([queue], lease_duration=LEASE) == []


async def round_trips(client: sepp.SeppClient, n: int) -> None:
    """Makes `n` calls, one after the other, on the client's connection. The server gives no
    signal that a reserve is waiting; a reserve issued before these, on the same HTTP/2
    connection, has reached the server once they are answered (unless the runtime reordered
    the two sends), with no fixed wait."""
    for _ in range(n):
        await client.get_server_info()


@pytest.mark.parametrize("how", ["cancel", "wait_for"])
@pytest.mark.parametrize("trips", [0, 1, 3])
async def test_a_cancelled_reserve_leases_no_job(
    client: sepp.SeppClient, queue: str, how: str, trips: int
) -> None:
    waiting = client.reserve(
        [queue], lease_duration=timedelta(minutes=5), wait_timeout=timedelta(seconds=30)
    )
    # Cancelled at several points, from still local to (after round trips on the connection)
    # waiting on the server: a reserve only ever queued locally would pass vacuously.
    if how == "cancel":
        task = asyncio.ensure_future(waiting)
        await asyncio.sleep(0)  # the call starts
        await round_trips(client, trips)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    else:
        task = asyncio.ensure_future(waiting)
        await asyncio.sleep(0)
        await round_trips(client, trips)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(task, 0)

    # Cancelling resets the reserve's HTTP/2 stream from a runtime thread, asynchronously. A
    # round trip on the same connection lets that reset reach the server before the enqueue
    # does; a job enqueued while the server has not yet seen the reset may legitimately go to
    # the cancelled reserve and come back only when its lease expires (at-least-once).
    await client.get_server_info()
    # Had the cancelled reserve stayed on the server, it would take this job for 5 minutes.
    ack = await client.enqueue(EnqueueRequest(queue, "t"))
    jobs = await client.reserve([queue], lease_duration=LEASE, wait_timeout=timedelta(seconds=10))
    assert [j.id for j in jobs] == [ack.job_id]


async def test_a_waiting_reserve_gets_a_job_enqueued_meanwhile(
    client: sepp.SeppClient, queue: str
) -> None:
    waiting = asyncio.ensure_future(
        client.reserve([queue], lease_duration=LEASE, wait_timeout=timedelta(seconds=20))
    )
    await asyncio.sleep(0)  # the call starts
    await round_trips(client, 2)
    assert not waiting.done(), "nothing was ready: the reserve must be waiting"
    ack = await client.enqueue(EnqueueRequest(queue, "t"))
    jobs = await waiting
    assert [j.id for j in jobs] == [ack.job_id]


async def test_one_client_serves_event_loops_in_two_threads(
    client: sepp.SeppClient, server: Server, queue: str
) -> None:
    results: dict[str, tuple[int, int]] = {}
    errors: list[BaseException] = []

    async def work(name: str, c: sepp.SeppClient) -> tuple[int, int]:
        q = f"{queue}-{name}"
        acks = await asyncio.gather(*(c.enqueue(EnqueueRequest(q, "t")) for _ in range(40)))
        jobs = await c.reserve([q], lease_duration=LEASE, max_jobs=100)
        await asyncio.gather(*(c.ack(j.id, j.attempt) for j in jobs))
        return len(acks), len(jobs)

    def thread(name: str, own_client: bool) -> None:
        async def main() -> tuple[int, int]:
            if not own_client:
                return await work(name, client)
            # A client connected on this thread's loop, then also used from the test's loop.
            async with await sepp.SeppClient.connect(server.url) as c:
                shared.append(c)
                ready.set()
                result = await work(name, c)
                await asyncio.to_thread(main_done.wait, 30)
                return result

        try:
            results[name] = asyncio.run(main())
        except BaseException as e:  # reported by the test thread
            errors.append(e)
            ready.set()

    shared: list[sepp.SeppClient] = []
    ready = threading.Event()
    main_done = threading.Event()
    threads = [
        threading.Thread(target=thread, args=("a", False)),
        threading.Thread(target=thread, args=("b", True)),
    ]
    for t in threads:
        t.start()
    assert await asyncio.to_thread(ready.wait, 30)
    try:
        main_loop_result = await work("main", shared[0] if shared else client)
    finally:
        main_done.set()
    for t in threads:
        await asyncio.to_thread(t.join, 30)
        assert not t.is_alive()
    assert not errors, errors
    assert results == {"a": (40, 40), "b": (40, 40)}
    assert main_loop_result == (40, 40)


def test_the_interpreter_exits_with_a_client_open(server: Server, queue: str) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, threading
        from datetime import timedelta
        import sepp

        URL, QUEUE = {server.url!r}, {queue!r}
        LONG = dict(lease_duration=timedelta(seconds=5), wait_timeout=timedelta(seconds=60))

        async def main():
            client = await sepp.SeppClient.connect(URL)
            await client.enqueue(sepp.EnqueueRequest(QUEUE, "t"))
            # Left running when the loop closes (a round trip after it: it was sent).
            asyncio.ensure_future(client.reserve([QUEUE + "-empty"], **LONG))
            await asyncio.sleep(0)
            await client.get_server_info()
            return client

        client = asyncio.run(main())  # never closed

        async def reserve_forever():
            waiting = asyncio.ensure_future(client.reserve([QUEUE + "-empty"], **LONG))
            await asyncio.sleep(0)  # the call starts
            started.set()
            await waiting

        def blocked():
            asyncio.run(reserve_forever())

        started = threading.Event()
        threading.Thread(target=blocked, daemon=True).start()
        started.wait()
        # A round trip on the shared connection from here: the daemon thread's reserve, sent
        # before, reaches the server.
        asyncio.run(client.get_server_info())
        print("exiting", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "exiting"


def test_the_interpreter_exits_cleanly_while_results_are_being_delivered(
    server: Server, queue: str
) -> None:
    # Results reach the loop from runtime threads; one still attached to the interpreter when
    # it finalizes crashed the process (abort or segfault, about 1 exit in 10 before the exit
    # gate of bindings/python/src/call.rs). asyncio.run returns after the first of many calls,
    # so the others finish, or are cancelled, while the interpreter exits.
    script = textwrap.dedent(
        f"""
        import asyncio
        import sepp

        async def main():
            client = await sepp.SeppClient.connect({server.url!r})
            calls = [asyncio.ensure_future(client.get_server_info()) for _ in range(300)]
            await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)

        asyncio.run(main())
        """
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(10)
    ]
    for proc in runs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
