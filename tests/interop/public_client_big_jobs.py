"""Five 1 MB jobs through the public sepp-py client (4 MiB default receive limit): every job
must be delivered, none lost to an oversized reply."""
import asyncio, datetime, sys
from sepp import EnqueueRequest, Payload, ReserveOptions, SeppClient

async def main(url):
    c = await SeppClient.connect(url)
    for _ in range(5):
        await c.enqueue(EnqueueRequest("big", "t", payload=Payload(b"x" * 1_000_000, "application/octet-stream")))
    opts = ReserveOptions(["big"], lease_duration=datetime.timedelta(seconds=30),
                          wait_timeout=datetime.timedelta(milliseconds=100), max_jobs=5)
    got = 0
    for _ in range(5):
        jobs = await c.reserve(opts) or []
        print("reply with", len(jobs), "jobs")
        for j in jobs:
            await c.ack(j.ctx)
            got += 1
        if got == 5:
            break
    assert got == 5, got
    print("all 5 delivered")

asyncio.run(main(sys.argv[1]))
