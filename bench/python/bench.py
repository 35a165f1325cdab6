"""Enqueue throughput and latency from one Python process: the `sepp` package (the Rust core
through pyo3) against a plain `grpc.aio` client of the same protocol, generated at run time
from proto/sepp/v1/queue.proto with grpcio-tools. See README.md.

    python bench/python/bench.py [--mode sync_all,buffer] [--clients sepp,grpcio]
        [--concurrency 50] [--duration 10] [--warmup 1] [--payload-bytes 256] [--rounds 1]
        [--server-bin PATH | --target HOST:PORT] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Awaitable, Callable, Optional

REPO = Path(__file__).resolve().parents[2]
# benchutil.py (bench/) holds the server process the drivers share.
sys.path.insert(0, str(REPO / "bench"))
from benchutil import SeppProcess  # noqa: E402
PROTO = REPO / "proto" / "sepp" / "v1" / "queue.proto"

# One enqueue: awaits the call for job number `n` and checks its answer.
Enqueue = Callable[[int], Awaitable[None]]


@dataclass
class Point:
    """One measured point."""

    mode: str
    client: str
    enqueues: int
    seconds: float
    enqueues_per_s: float
    p50_ms: float
    p99_ms: float
    client_cpu: float  # the process's CPU time over the window, as a share of one core
    load_average: float


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def server_binary(explicit: Optional[str]) -> Path:
    """--server-bin, else $CARGO_TARGET_DIR/release/sepp, else <repo>/target/release/sepp."""
    if explicit:
        return Path(explicit).resolve()
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    return (REPO / target / "release" / "sepp").resolve()


class Server(SeppProcess):
    """A fresh server with `persist_mode = mode`, on a new data directory and port 0."""

    def __init__(self, binary: Path, mode: str) -> None:
        super().__init__(
            binary,
            "sepp-bench-python-",
            lambda d: (
                "[server]\n"
                'listen_addr = "127.0.0.1:0"\n'
                f"db_path = {json.dumps(str(d / 'data'))}\n"
                "[storage]\n"
                f'persist_mode = "{mode}"\n'
            ),
        )


def generate_stubs(out: Path) -> tuple[ModuleType, ModuleType]:
    """Compiles queue.proto with grpcio-tools into `out` and imports the modules.

    The file is compiled as `seppbench/v1/queue.proto`, so the generated Python package does
    not shadow the `sepp` package; the proto package, and so every method path
    (`/sepp.v1.QueueService/EnqueueBatch`), stays `sepp.v1`.
    """
    import grpc_tools
    from grpc_tools import protoc

    source = out / "seppbench" / "v1"
    source.mkdir(parents=True)
    shutil.copy(PROTO, source / "queue.proto")
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{out}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            "seppbench/v1/queue.proto",
        ]
    )
    if status != 0:
        raise SystemExit(f"grpc_tools.protoc failed with status {status}")
    sys.path.insert(0, str(out))
    return (
        importlib.import_module("seppbench.v1.queue_pb2"),
        importlib.import_module("seppbench.v1.queue_pb2_grpc"),
    )


async def sepp_client(url: str, queue: str, payload: bytes, run_id: str) -> tuple[Enqueue, Any]:
    import sepp

    client = await sepp.SeppClient.connect(url)
    data = sepp.Payload(payload, "application/octet-stream")

    async def enqueue(n: int) -> None:
        request = sepp.EnqueueRequest(queue, "bench", payload=data, idempotency_key=f"{run_id}-{n}")
        ack = await client.enqueue(request)
        if ack.deduplicated:
            raise AssertionError(f"job {n} was answered deduplicated")

    return enqueue, client.close


async def grpcio_client(
    url: str, queue: str, payload: bytes, run_id: str, stubs: tuple[ModuleType, ModuleType]
) -> tuple[Enqueue, Any]:
    import grpc

    pb, pb_grpc = stubs
    channel = grpc.aio.insecure_channel(url.removeprefix("http://"))
    stub = pb_grpc.QueueServiceStub(channel)
    data = pb.Payload(data=payload, encoding="application/octet-stream")

    async def enqueue(n: int) -> None:
        job = pb.EnqueueRequest(
            queue=queue, job_type="bench", payload=data, idempotency_key=f"{run_id}-{n}"
        )
        response = await stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job]))
        [result] = response.results
        if result.WhichOneof("outcome") != "success":
            raise AssertionError(f"job {n} was rejected: {result.rejection}")
        if result.success.deduplicated:
            raise AssertionError(f"job {n} was answered deduplicated")

    return enqueue, channel.close


async def measure(
    enqueue: Enqueue, concurrency: int, warmup: float, duration: float
) -> tuple[int, list[float], float]:
    """Runs `concurrency` loops of awaited enqueues for warmup + duration seconds. Returns the
    calls that started after the warm-up and ended within the window, their latencies (s), and
    the process CPU time over the window (s)."""
    counter = iter(range(1 << 62))
    loop = asyncio.get_running_loop()
    start = loop.time() + warmup
    end = start + duration
    latencies: list[float] = []
    cpu: dict[str, float] = {}

    async def worker() -> None:
        while True:
            began = loop.time()
            if began >= end:
                return
            await enqueue(next(counter))
            done = loop.time()
            if began >= start and done <= end:
                latencies.append(done - began)

    async def clock() -> None:
        await asyncio.sleep(max(0.0, start - loop.time()))
        cpu["start"] = time.process_time()
        await asyncio.sleep(max(0.0, end - loop.time()))
        cpu["end"] = time.process_time()

    await asyncio.gather(clock(), *(worker() for _ in range(concurrency)))
    return len(latencies), latencies, cpu["end"] - cpu["start"]


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not sorted_values:
        return float("nan")
    rank = max(1, int(-(-p * len(sorted_values) // 100)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def run_point(
    args: argparse.Namespace,
    mode: str,
    client_name: str,
    url: str,
    stubs: tuple[ModuleType, ModuleType],
) -> Point:
    run_id = uuid.uuid4().hex[:12]
    queue = f"bench-python-{run_id}-{client_name}"
    payload = os.urandom(args.payload_bytes)
    if client_name == "sepp":
        enqueue, close = await sepp_client(url, queue, payload, run_id)
    else:
        enqueue, close = await grpcio_client(url, queue, payload, run_id, stubs)
    try:
        count, latencies, cpu = await measure(enqueue, args.concurrency, args.warmup, args.duration)
    finally:
        await close()
    latencies.sort()
    return Point(
        mode=mode,
        client=client_name,
        enqueues=count,
        seconds=args.duration,
        enqueues_per_s=count / args.duration,
        p50_ms=percentile(latencies, 50) * 1e3,
        p99_ms=percentile(latencies, 99) * 1e3,
        client_cpu=cpu / args.duration,
        load_average=os.getloadavg()[0],
    )


def table(points: list[Point]) -> str:
    rows = [
        "| persist_mode | client | enqueues/s | p50 ms | p99 ms | client CPU "
        "| CPU µs/enqueue | load avg |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        cpu_per_call = p.client_cpu * 1e6 / p.enqueues_per_s if p.enqueues_per_s else 0.0
        rows.append(
            f"| {p.mode} | {p.client} | {p.enqueues_per_s:.0f} | {p.p50_ms:.2f} | "
            f"{p.p99_ms:.2f} | {p.client_cpu:.0%} | {cpu_per_call:.0f} | {p.load_average:.1f} |"
        )
    return "\n".join(rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="sync_all,buffer", help="persist modes, in order")
    parser.add_argument("--clients", default="sepp,grpcio", help="clients, in order")
    parser.add_argument("--concurrency", type=int, default=50, help="concurrent asyncio tasks")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds measured per point")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--payload-bytes", type=int, default=256)
    parser.add_argument(
        "--rounds", type=int, default=1, help="repeat every client per mode, alternating order"
    )
    parser.add_argument("--server-bin", help="server binary (default: the release build)")
    parser.add_argument("--target", help="HOST:PORT of a running server (no server started)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    clients = args.clients.split(",")
    for c in clients:
        if c not in ("sepp", "grpcio"):
            raise SystemExit(f"unknown client {c!r}: sepp or grpcio")
    # Sockets for the server and both clients; the defaults are enough, but say so if not.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    log(f"open files limit {soft}; python {sys.version.split()[0]}")

    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="sepp-bench-grpc-") as generated:
        stubs = generate_stubs(Path(generated))
        modes = ["target"] if args.target else args.mode.split(",")
        for mode in modes:
            server = None if args.target else Server(server_binary(args.server_bin), mode)
            url = f"http://{args.target or server.addr}"  # type: ignore[union-attr]
            try:
                # Odd rounds run the clients in reverse order, so that a drift of the machine
                # weighs on every client alike.
                for round_ in range(args.rounds):
                    for name in clients if round_ % 2 == 0 else clients[::-1]:
                        log(f"{mode} / {name}: {args.duration:g} s after {args.warmup:g} s ...")
                        point = await run_point(args, mode, name, url, stubs)
                        log(
                            f"  {point.enqueues_per_s:.0f}/s, p50 {point.p50_ms:.2f} ms, "
                            f"p99 {point.p99_ms:.2f} ms"
                        )
                        points.append(point)
            finally:
                if server is not None:
                    server.stop()
    if args.json:
        print(json.dumps([asdict(p) for p in points], indent=2))
    else:
        print(table(points))


if __name__ == "__main__":
    asyncio.run(main())
