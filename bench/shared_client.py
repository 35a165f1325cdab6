#!/usr/bin/env python3
"""One client shared by many tasks: sepp's client-side coalescing beside BullMQ's own.

Usually started by `bench/shared-client`, which builds what it needs first. Four parts, each
A/B alternating over the rounds (A B, B A, A B, ...) so that a drift of the machine weighs on
both sides alike; every ratio is taken within one round, never across rounds:

  bullmq    32 tasks on ONE Rust client (`sepp-bench --shared-client`, durable unique-key
            enqueues, sync_all) against BullMQ on Redis with `appendfsync always`, 32
            concurrent `Queue.add` calls with fresh `jobId`s on ONE ioredis connection with
            `enableAutoPipelining` (`bench/peers/peer.mjs --shared-connection`).
            Target: sepp >= 3x BullMQ.
  latency   one connection, one call in flight (`sepp-bench --connections 1`, unique keys),
            with coalescing (the default) and without (`--no-coalesce`): p50 and p99.
            Target: unchanged by coalescing.
  python    `bench/python/bench.py`: the `sepp` package against `grpc.aio`,
            50 asyncio tasks, one connection each. Target: sepp >= 3x grpc.aio.
  node      `bench/node/bench.mjs`: the `sepp` package against
            `@grpc/grpc-js`, 50 promises. Target: sepp >= 4x grpc-js.

The python and node parts run each client alone against a fresh server started here
(`--target`), so that the server's CPU per job and the jobs per `EnqueueBatch` it saw are
known, and add a reference row: the Rust client shared by as many tasks (`sepp-bench
--shared-client --connections 50`), i.e. what the same server gives a client with no binding.

Each sepp point runs on a fresh release server (its default configuration, so `sync_all`,
plus `[metrics]` on a free port, read before and after the point for the jobs per
`EnqueueBatch` call and per group commit). Each BullMQ point runs on a fresh private Redis
(`--appendonly yes --appendfsync always --save ""`, a temporary directory, `--redis-port`).

Output: bench/results/shared-client-<stamp>.json (every point, the machine, the medians) and
Markdown tables on stdout.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Optional

from benchutil import ROOT, SeppProcess, free_port, logger, target_dir

log = logger("shared-client")
PARTS = ["bullmq", "latency", "python", "node"]


def loadavg() -> float:
    return os.getloadavg()[0]


def machine() -> dict[str, Any]:
    model = None
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        m = re.search(r"^Model name:\s*(.+)$", out, re.M)
        model = m.group(1).strip() if m else None
    except (OSError, subprocess.CalledProcessError):
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def git_describe() -> Optional[str]:
    r = subprocess.run(
        ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True
    )
    return r.stdout.strip() if r.returncode == 0 else None


# ---------------------------------------------------------------- sepp


class SeppServer(SeppProcess):
    """A fresh release server: its defaults (sync_all), port 0, metrics on a free port."""

    def __init__(self, binary: Path) -> None:
        self.metrics_port = free_port()
        super().__init__(
            binary,
            "sepp-shared-client-",
            lambda d: (
                "[server]\n"
                'listen_addr = "127.0.0.1:0"\n'
                f"db_path = {json.dumps(str(d / 'data'))}\n"
                "[metrics]\n"
                "enabled = true\n"
                f'listen_addr = "127.0.0.1:{self.metrics_port}"\n'
            ),
        )

    def scrape(self) -> dict[str, float]:
        """The counters this script reads: EnqueueBatch calls, jobs enqueued, group commits
        and the writes they carried."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        out = {"enqueue_batch_calls": 0.0, "jobs_enqueued": 0.0, "commits": 0.0, "commit_writes": 0.0}
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            name, _, value = line.rpartition(" ")
            try:
                v = float(value)
            except ValueError:
                continue
            if name.startswith("sepp_rpc_duration_seconds_count") and 'rpc="EnqueueBatch"' in name:
                out["enqueue_batch_calls"] += v
            elif name.startswith("sepp_jobs_enqueued_total"):
                out["jobs_enqueued"] += v
            elif name.startswith("sepp_storage_commit_writes_count"):
                out["commits"] += v
            elif name.startswith("sepp_storage_commit_writes_sum"):
                out["commit_writes"] += v
        return out


def sepp_point(args: argparse.Namespace, conns: int, extra: list[str]) -> dict[str, Any]:
    """One sepp-bench point against a fresh server; the point's JSON plus batch figures."""
    server = SeppServer(target_dir() / "release" / "sepp")
    out = Path(tempfile.mkdtemp(prefix="sepp-shared-client-results-"))
    try:
        before = server.scrape()
        load0 = loadavg()
        cmd = [
            str(target_dir() / "release" / "sepp-bench"),
            "--target", server.addr,
            "--server-pid", str(server.proc.pid),
            "--workloads", "unique",
            "--connections", str(conns),
            "--duration", str(args.duration),
            "--warmup", str(args.warmup),
            "--results-dir", str(out),
            *extra,
        ]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"sepp-bench failed ({r.returncode}): {r.stderr[-2000:]}")
        after = server.scrape()
        [path] = list(out.glob("*.json"))
        report = json.loads(path.read_text())
        [point] = report["runs"][0]["points"]
    finally:
        server.stop()
        shutil.rmtree(out, ignore_errors=True)
    d = {k: after[k] - before[k] for k in after}
    # The counters cover warm-up and window alike: the ratios are what matters.
    point["jobs_per_enqueue_batch"] = (
        round(d["jobs_enqueued"] / d["enqueue_batch_calls"], 2) if d["enqueue_batch_calls"] else None
    )
    point["writes_per_commit"] = round(d["commit_writes"] / d["commits"], 1) if d["commits"] else None
    point["loadavg_1m_start"] = load0
    point["loadavg_1m_end"] = loadavg()
    shown = ["sepp-bench", "--target", "ADDR", "--server-pid", "PID", *cmd[5:-2 - len(extra)], *extra]
    point["command"] = " ".join(shown)
    return point


# ---------------------------------------------------------------- BullMQ


def bullmq_point(args: argparse.Namespace, conns: int) -> dict[str, Any]:
    """One BullMQ point (unique keys, one autopipelined connection) on a fresh Redis."""
    port = args.redis_port
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise SystemExit(f"port {port} is taken: pick another with --redis-port")
    d = Path(tempfile.mkdtemp(prefix="sepp-shared-client-redis-"))
    redis = subprocess.Popen(
        [
            "redis-server", "--port", str(port), "--bind", "127.0.0.1",
            "--appendonly", "yes", "--appendfsync", "always", "--save", "",
            "--dir", str(d), "--daemonize", "no", "--logfile", str(d / "redis.log"),
        ],
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True).returncode != 0:
            if redis.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"redis-server did not start: {(d / 'redis.log').read_text()}")
            time.sleep(0.1)
        load0 = loadavg()
        cmd = [
            "node", str(ROOT / "bench" / "peers" / "peer.mjs"),
            "--system", "bullmq", "--url", f"redis://127.0.0.1:{port}",
            "--workload", "unique", "--connections", str(conns), "--shared-connection",
            "--duration", str(args.duration), "--warmup", str(args.warmup),
            "--server-pid", str(redis.pid),
        ]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True)
        lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
        if r.returncode != 0 or not lines:
            raise RuntimeError(f"peer.mjs failed ({r.returncode}): {r.stderr[-2000:]}")
        point = json.loads(lines[-1])
        point["loadavg_1m_start"] = load0
        point["loadavg_1m_end"] = loadavg()
        shown = ["node", "bench/peers/peer.mjs", *cmd[2:5], "redis://127.0.0.1:PORT", *cmd[6:-2]]
        point["command"] = " ".join(shown)
        return point
    finally:
        redis.send_signal(signal.SIGTERM)
        try:
            redis.wait(timeout=30)
        except subprocess.TimeoutExpired:
            redis.kill()
            redis.wait()
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- parts


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(a / b, 3) if a and b else None


def med(xs: list[Optional[float]]) -> Optional[float]:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def part_bullmq(args: argparse.Namespace) -> dict[str, Any]:
    rounds = []
    for i in range(args.rounds):
        order = ["sepp", "bullmq"] if i % 2 == 0 else ["bullmq", "sepp"]
        got: dict[str, Any] = {}
        for side in order:
            log(f"bullmq part, round {i + 1}/{args.rounds}: {side}")
            if side == "sepp":
                got[side] = sepp_point(args, args.tasks, ["--shared-client"])
            else:
                got[side] = bullmq_point(args, args.tasks)
            p = got[side]
            log(f"  {p['jobs_per_s']:,.0f} jobs/s, p50 {p['latency_ms']['p50']} ms, load {loadavg():.1f}")
        got["ratio"] = ratio(got["sepp"]["jobs_per_s"], got["bullmq"]["jobs_per_s"])
        log(f"  sepp / BullMQ = {got['ratio']}")
        rounds.append(got)
    return {"rounds": rounds, "median_ratio": med([r["ratio"] for r in rounds]), "target": 3.0}


def part_latency(args: argparse.Namespace) -> dict[str, Any]:
    rounds = []
    for i in range(args.rounds):
        order = ["coalesce", "no_coalesce"] if i % 2 == 0 else ["no_coalesce", "coalesce"]
        got: dict[str, Any] = {}
        for side in order:
            log(f"latency part, round {i + 1}/{args.rounds}: {side}")
            got[side] = sepp_point(args, 1, [] if side == "coalesce" else ["--no-coalesce"])
            lat = got[side]["latency_ms"]
            log(f"  {got[side]['jobs_per_s']:,.0f} calls/s, p50 {lat['p50']} ms, p99 {lat['p99']} ms")
        rounds.append(got)
    summary = {}
    for side in ("coalesce", "no_coalesce"):
        summary[side] = {
            q: med([r[side]["latency_ms"][q] for r in rounds]) for q in ("p50", "p99")
        } | {"jobs_per_s": med([r[side]["jobs_per_s"] for r in rounds])}
    summary["p50_ratio"] = med([ratio(r["coalesce"]["latency_ms"]["p50"], r["no_coalesce"]["latency_ms"]["p50"]) for r in rounds])
    summary["p99_ratio"] = med([ratio(r["coalesce"]["latency_ms"]["p99"], r["no_coalesce"]["latency_ms"]["p99"]) for r in rounds])
    return {"rounds": rounds, "summary": summary}


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def binding_point(args: argparse.Namespace, which: str, client: str) -> dict[str, Any]:
    """One client of bench/python/bench.py or bench/node/bench.mjs against a fresh server
    started here, so that the server's CPU and the batch sizes it saw are known."""
    server = SeppServer(target_dir() / "release" / "sepp")
    try:
        common = ["--target", server.addr, "--clients", client, "--concurrency", str(args.binding_tasks),
                  "--duration", str(args.duration), "--warmup", str(args.warmup), "--json"]  # fmt: skip
        if which == "python":
            cmd = [args.python, str(ROOT / "bench" / "python" / "bench.py"), *common]
        else:
            cmd = ["node", str(ROOT / "bench" / "node" / "bench.mjs"), *common]
        before, cpu0, load0 = server.scrape(), proc_cpu_s(server.proc.pid), loadavg()
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{which} bench failed ({r.returncode}): {r.stderr[-3000:]}")
        after, cpu1 = server.scrape(), proc_cpu_s(server.proc.pid)
    finally:
        server.stop()
    data = json.loads(r.stdout)
    if which == "python":
        [p] = data
    else:  # bench.mjs: {setup, results: [{client, enqueuesPerSec, p50Ms, ...}]}
        [q] = data["results"]
        p = {
            "client": q["client"],
            "enqueues_per_s": q["enqueuesPerSec"],
            "p50_ms": q["p50Ms"],
            "p99_ms": q["p99Ms"],
            "client_cpu": q["clientCpuPct"] / 100,
            "errors": q["errors"],
        }
    d = {k: after[k] - before[k] for k in after}
    # Server CPU and counters cover the whole call (connect, warm-up, window) alike.
    p["server_cpu_us_per_job"] = round((cpu1 - cpu0) * 1e6 / d["jobs_enqueued"], 1) if d["jobs_enqueued"] else None
    p["client_cpu_us_per_job"] = round(p["client_cpu"] * 1e6 / p["enqueues_per_s"], 1) if p["enqueues_per_s"] else None
    p["jobs_per_enqueue_batch"] = (
        round(d["jobs_enqueued"] / d["enqueue_batch_calls"], 2) if d["enqueue_batch_calls"] else None
    )
    p["loadavg_1m_start"], p["loadavg_1m_end"] = load0, loadavg()
    shown = [Path(cmd[0]).name, str(Path(cmd[1]).relative_to(ROOT)), "--target", "ADDR", *common[2:]]
    p["command"] = " ".join(shown)
    return p


def rust_reference(args: argparse.Namespace) -> dict[str, Any]:
    """sepp-bench --shared-client with the bindings' task count, in their figures' shape."""
    q = sepp_point(args, args.binding_tasks, ["--shared-client"])
    return {
        "client": "rust",
        "enqueues_per_s": q["jobs_per_s"],
        "p50_ms": q["latency_ms"]["p50"],
        "p99_ms": q["latency_ms"]["p99"],
        "client_cpu_us_per_job": round(q["client_cpu_s_per_1k_jobs"] * 1000, 1),
        "server_cpu_us_per_job": round(q["server_cpu_s_per_1k_jobs"] * 1000, 1),
        "jobs_per_enqueue_batch": q["jobs_per_enqueue_batch"],
        "loadavg_1m_start": q["loadavg_1m_start"],
        "loadavg_1m_end": q["loadavg_1m_end"],
        "command": q["command"],
        "others_cpu_cores": q["others_cpu_cores"],
    }


def part_binding(args: argparse.Namespace, which: str) -> dict[str, Any]:
    """bench/python/bench.py (sepp against grpcio) or bench/node/bench.mjs (sepp against
    grpc-js), one client per call, alternating, each on a fresh server."""
    other = "grpcio" if which == "python" else "grpc-js"
    rounds = []
    for i in range(args.rounds):
        # The Rust client shared by as many tasks (sepp-bench --shared-client) runs beside
        # them as a reference: the binding's throughput with no binding cost at all.
        order = ["sepp", other, "rust"] if i % 2 == 0 else ["rust", other, "sepp"]
        got: dict[str, Any] = {}
        for client in order:
            log(f"{which} part, round {i + 1}/{args.rounds}: {client}")
            if client == "rust":
                got[client] = rust_reference(args)
            else:
                got[client] = binding_point(args, which, client)
            p = got[client]
            log(
                f"  {p['enqueues_per_s']:,.0f}/s, p50 {p['p50_ms']:.2f} ms, client {p['client_cpu_us_per_job']} µs/job, "
                f"server {p['server_cpu_us_per_job']} µs/job, {p['jobs_per_enqueue_batch']} jobs/batch"
            )
        got["ratio"] = ratio(got["sepp"]["enqueues_per_s"], got[other]["enqueues_per_s"])
        log(f"  sepp / {other} = {got['ratio']}")
        rounds.append(got)
    return {
        "other": other,
        "rounds": rounds,
        "median_ratio": med([r["ratio"] for r in rounds]),
        "target": 3.0 if which == "python" else 4.0,
    }


# ---------------------------------------------------------------- report


def f0(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:,.0f}"


def tables(res: dict[str, Any]) -> str:
    out = []
    if "bullmq" in res:
        b = res["bullmq"]
        out += [
            f"### 32 tasks on one Rust client against BullMQ, one autopipelined connection (target ≥ {b['target']:g}×)",
            "",
            "| round | sepp jobs/s | p50 / p99 ms | jobs per EnqueueBatch | server CPU s/1k | BullMQ jobs/s | p50 / p99 ms | Redis CPU s/1k | sepp ÷ BullMQ | load |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for i, r in enumerate(b["rounds"], 1):
            s, q = r["sepp"], r["bullmq"]
            out.append(
                f"| {i} | {f0(s['jobs_per_s'])} | {s['latency_ms']['p50']:.2f} / {s['latency_ms']['p99']:.2f} "
                f"| {s['jobs_per_enqueue_batch']} | {s['server_cpu_s_per_1k_jobs']:.3f} "
                f"| {f0(q['jobs_per_s'])} | {q['latency_ms']['p50']:.2f} / {q['latency_ms']['p99']:.2f} "
                f"| {q['server_cpu_s_per_1k_jobs']:.3f} | {r['ratio']:.2f}× "
                f"| {s['loadavg_1m_start']:.1f}–{q['loadavg_1m_end']:.1f} |"
            )
        out += ["", f"Median sepp ÷ BullMQ: **{b['median_ratio']:.2f}×** (target ≥ {b['target']:g}×)", ""]
    if "latency" in res:
        lt = res["latency"]
        out += [
            "### One connection, one call in flight: coalescing on and off",
            "",
            "| round | on: calls/s | p50 ms | p99 ms | off (`--no-coalesce`): calls/s | p50 ms | p99 ms |",
            "|---|--:|--:|--:|--:|--:|--:|",
        ]
        for i, r in enumerate(lt["rounds"], 1):
            a, o = r["coalesce"], r["no_coalesce"]
            out.append(
                f"| {i} | {f0(a['jobs_per_s'])} | {a['latency_ms']['p50']:.3f} | {a['latency_ms']['p99']:.3f} "
                f"| {f0(o['jobs_per_s'])} | {o['latency_ms']['p50']:.3f} | {o['latency_ms']['p99']:.3f} |"
            )
        s = lt["summary"]
        out += ["", f"Median on ÷ off: p50 {s['p50_ratio']}, p99 {s['p99_ratio']}", ""]
    for which in ("python", "node"):
        if which not in res:
            continue
        p = res[which]
        other = p["other"]
        out += [
            f"### {which}: the sepp package against {other} (target ≥ {p['target']:g}×); "
            f"rust: the Rust client shared by as many tasks, for reference",
            "",
            "| round | client | enqueues/s | p50 ms | p99 ms | client CPU µs/job | server CPU µs/job | jobs per EnqueueBatch | ratio | load |",
            "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for i, r in enumerate(p["rounds"], 1):
            for c in ("sepp", other, "rust"):
                pt = r[c]
                out.append(
                    f"| {i} | {c} | {f0(pt['enqueues_per_s'])} | {pt['p50_ms']:.2f} | {pt['p99_ms']:.2f} "
                    f"| {pt['client_cpu_us_per_job']} | {pt['server_cpu_us_per_job']} | {pt['jobs_per_enqueue_batch']} "
                    f"| {r['ratio']:.2f}× | {pt['loadavg_1m_start']:.1f} |"
                )
        out += ["", f"Median sepp ÷ {other}: **{p['median_ratio']:.2f}×** (target ≥ {p['target']:g}×)", ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="bullmq,latency", help=f"comma list of {','.join(PARTS)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per point")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per point")
    ap.add_argument("--tasks", type=int, default=32, help="concurrent tasks on the one client")
    ap.add_argument(
        "--binding-tasks", type=int, default=50, help="the Python and Node benches' concurrency (reference row)"
    )
    ap.add_argument("--redis-port", type=int, default=6392)
    ap.add_argument("--python", default=sys.executable, help="the Python with sepp, grpcio, grpcio-tools")
    ap.add_argument("--out", help="JSON file (default bench/results/shared-client-<stamp>.json)")
    args = ap.parse_args()
    parts = args.parts.split(",")
    for p in parts:
        if p not in PARTS:
            raise SystemExit(f"unknown part {p!r}: {', '.join(PARTS)}")
    started = dt.datetime.now(dt.timezone.utc)
    res: dict[str, Any] = {
        "tool": "bench/shared-client",
        "started_at": started.isoformat(timespec="seconds"),
        "git": git_describe(),
        "machine": machine(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
    }
    for p in parts:
        if p == "bullmq":
            res["bullmq"] = part_bullmq(args)
        elif p == "latency":
            res["latency"] = part_latency(args)
        else:
            res[p] = part_binding(args, p)
    res["finished_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"shared-client-{started:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    m = res["machine"]
    print(f"{res['started_at']} – {res['finished_at']}, {m['nproc']} CPUs ({m['cpu_model']}), Linux {m['kernel']}, git {res['git']}")
    print()
    print(tables(res))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
