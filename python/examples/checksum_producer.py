"""Enqueues one `sha256-file` job per regular file under a directory.

Each job carries the file's path as its payload and is keyed by the file's modification time
and path, so a second run over an unchanged tree creates no job (every enqueue is a dedup
hit), while a file modified since gets a new one. The keys are the ones the Rust example
(`core/examples/checksum_producer.rs`) uses, so the two producers deduplicate each other.

Usage::

    python python/examples/checksum_producer.py /usr/share --server http://127.0.0.1:50051

Then run `checksum_worker.py` to compute the checksums.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import time
from collections.abc import Iterator

import sepp

JOB_TYPE = "sha256-file"
ENCODING = "text/plain; charset=utf-8"


def regular_files(root: str) -> Iterator[tuple[str, int]]:
    """Yields `(path, mtime in ns)` for the regular files under `root`, depth first. Symbolic
    links are not followed; directories that cannot be read are skipped."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from regular_files(entry.path)
            elif entry.is_file(follow_symlinks=False):
                yield entry.path, entry.stat(follow_symlinks=False).st_mtime_ns
        except OSError:
            continue


def idempotency_key(path: str, mtime_ns: int, limit: int) -> str:
    """`<mtime>:<path>`, or its SHA-256 in hex when that is longer than `limit` UTF-8 bytes
    (or the path is not valid UTF-8)."""
    raw = f"{mtime_ns}:".encode() + os.fsencode(path)
    try:
        key = raw.decode("utf-8")
    except UnicodeDecodeError:
        return hashlib.sha256(raw).hexdigest()
    return key if len(raw) <= limit else hashlib.sha256(raw).hexdigest()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="directory to walk")
    parser.add_argument("--server", default="http://127.0.0.1:50051", help="server URL")
    parser.add_argument("--queue", default="checksums", help="queue to enqueue on")
    parser.add_argument("--batch", type=int, default=200, help="jobs per enqueue_batch call")
    args = parser.parse_args()

    async with await sepp.SeppClient.connect(args.server) as client:
        # The server advertised its key limit at connect (256 unless configured otherwise).
        limit = client.max_idempotency_key_bytes or 256
        started = time.perf_counter()
        files = list(regular_files(args.root))
        walked = time.perf_counter() - started

        created = deduplicated = rejected = 0
        started = time.perf_counter()
        for i in range(0, len(files), max(args.batch, 1)):
            requests = [
                sepp.EnqueueRequest(
                    args.queue,
                    JOB_TYPE,
                    # The raw bytes of the path: any file name round-trips, UTF-8 or not.
                    payload=sepp.Payload(os.fsencode(path), ENCODING),
                    idempotency_key=idempotency_key(path, mtime_ns, limit),
                )
                for path, mtime_ns in files[i : i + args.batch]
            ]
            for result in await client.enqueue_batch(requests):
                if isinstance(result, sepp.Rejection):
                    rejected += 1
                    print(f"rejected: {result.message}", file=sys.stderr)
                elif result.deduplicated:
                    deduplicated += 1
                else:
                    created += 1
        enqueued = time.perf_counter() - started

    print(
        f"{len(files)} files under {args.root} (walked in {walked:.2f} s); "
        f"enqueued in {enqueued:.2f} s: {created} new, {deduplicated} already enqueued, "
        f"{rejected} rejected"
    )
    return 1 if rejected else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
