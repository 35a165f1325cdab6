"""Processes `sha256-file` jobs: hashes each file with SHA-256 and appends `<hex>  <path>` to
an output file, the format `sha256sum` prints and `sha256sum --check` reads.

Runs until SIGTERM or Ctrl-C, or with `--exit-when-idle` until the queue has had no ready,
scheduled or leased job for two seconds. A file that cannot be read (gone, no permission) is
dead-lettered: reading it again would not help.

Usage::

    python python/examples/checksum_worker.py --out sums.txt --exit-when-idle
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import time
from datetime import timedelta
from typing import Optional

import sepp

JOB_TYPE = "sha256-file"
CHUNK_BYTES = 1 << 20
IDLE_SECONDS = 2.0


def sha256_file(path: str) -> tuple[str, int]:
    """The file's SHA-256 in hex and its size in bytes. Blocking: run it in a thread."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


async def stop_when_idle(client: sepp.SeppClient, queue: str, worker: sepp.Worker) -> None:
    """Stops `worker` once `queue` has had nothing to do for IDLE_SECONDS."""
    idle_since: Optional[float] = None
    while True:
        await asyncio.sleep(0.25)
        try:
            stats = await client.get_queue_stats(queue)
        except sepp.SeppError:
            idle_since = None
            continue
        if stats.ready + stats.scheduled + stats.in_flight > 0:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= IDLE_SECONDS:
            worker.stop()
            return


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="checksums.txt", help="file the results are appended to")
    parser.add_argument("--server", default="http://127.0.0.1:50051", help="server URL")
    parser.add_argument("--queue", default="checksums", help="queue to work on")
    parser.add_argument("--concurrency", type=int, default=16, help="jobs processed at once")
    parser.add_argument(
        "--exit-when-idle", action="store_true", help="stop once the queue stays empty for 2 s"
    )
    args = parser.parse_args()

    hashed_bytes = 0
    # Written from the event loop's thread only, so the lines never interleave.
    with open(args.out, "a", encoding="utf-8", errors="surrogateescape") as out:
        async with await sepp.SeppClient.connect(args.server) as client:
            worker = sepp.Worker(
                client,
                [args.queue],
                max_in_flight=args.concurrency,
                wait_timeout=timedelta(seconds=1),
            )

            @worker.handler(JOB_TYPE)
            async def checksum(ctx: sepp.JobContext) -> None:
                nonlocal hashed_bytes
                payload = ctx.job.payload
                if payload is None:
                    raise sepp.HandlerError.permanent("no path in the payload")
                path = os.fsdecode(payload.data)
                try:
                    # hashlib releases the GIL while hashing; the file reads block, so both
                    # happen on a thread of the loop's default executor.
                    hex_digest, size = await asyncio.to_thread(sha256_file, path)
                except OSError as e:
                    raise sepp.HandlerError.permanent(f"{path}: {e.strerror or e}") from e
                hashed_bytes += size
                out.write(f"{hex_digest}  {path}\n")

            started = time.perf_counter()
            watcher = (
                asyncio.ensure_future(stop_when_idle(client, args.queue, worker))
                if args.exit_when_idle
                else None
            )
            try:
                report = await worker.run()
            finally:
                if watcher is not None:
                    watcher.cancel()
            seconds = time.perf_counter() - started

    print(
        f"{report.acked} files hashed ({report.nacked} failed) in {seconds:.1f} s: "
        f"{report.acked / seconds:.0f} files/s, {hashed_bytes / (1 << 20):.1f} MiB hashed; "
        f"results in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
