#!/usr/bin/env python3
"""sepp beside the public sepp 0.1.1 and the gRPC ceiling, side by side in one run.

Usually started by `bench/vs-public`, which builds what it needs first. Each round starts every
system fresh (a new data directory, its default configuration, a free port on 127.0.0.1), drives
it with the same load generator (`sepp-bench --target ADDR --server-pid PID`, our Rust client),
stops it, and goes on with the next; the order alternates from round to round (A B C, C B A, ...)
so that a drift of the machine weighs on every system alike. The report gives, per workload, the
median over the rounds of each system's figure with its min-max, and the median of the per-round
ratios sepp / public sepp and sepp / ceiling (a ratio is taken within one round, never across).

Systems:
  sepp     this repository's release `sepp`, its defaults (embedded store, persist_mode sync_all)
  public   the public sepp 0.1.1 (`cargo install sepp --version 0.1.1`), its defaults
           (both with `[limits] max_enqueue_batch = 1000` when batch1000 is asked for: their
           default is 256)
  ceiling  `bench/src/bin/ceiling.rs`: the same protocol on tonic, storing nothing. It answers
           every enqueue as new and leases nothing, so it runs the enqueue workloads only.

Figures per point: jobs/s, per-call latency p50 and p99 in ms, and the server's CPU in
microseconds per job (user + system of the server process, from /proc, over the measured
window).

Output: bench/results/vs-public-<stamp>.json (every point of every round and the medians), a
Markdown table on stdout, and with --write-docs the same table in docs/benchmarks.md between
the `vs-public` GENERATED markers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchutil import ROOT, target_dir, free_port, wait_listening, logger

log = logger("vs-public")

SYSTEMS = ["sepp", "public", "ceiling"]
ENQUEUE_WORKLOADS = {"unique", "nokey", "batch100", "batch1000"}
NAMES = {"sepp": "sepp", "public": "public sepp 0.1.1", "ceiling": "ceiling (stores nothing)"}
TITLES = {
    "unique": "unique-key enqueue",
    "hits": "enqueue, every one a dedup hit",
    "nokey": "enqueue without a key",
    "batch100": "EnqueueBatch of 100 keyed jobs",
    "batch1000": "EnqueueBatch of 1,000 keyed jobs",
    "drain": "drain (take a job, ack it)",
}


def start(system: str, args: argparse.Namespace, work: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    data = work / "data"
    log_file = open(work / "server.log", "wb")
    if system == "ceiling":
        cmd = [str(target_dir() / "release" / "ceiling"), "--listen", f"127.0.0.1:{port}"]
    else:
        # Both default to at most 256 jobs per batch; batch1000 needs the limit raised.
        limits = "[limits]\nmax_enqueue_batch = 1000\n" if "batch1000" in args.workloads else ""
        if system == "sepp":
            binary = str(target_dir() / "release" / "sepp")
            toml = f'[server]\nlisten_addr = "127.0.0.1:{port}"\ndb_path = "{data}"\n{limits}'
        else:
            binary = args.public_bin
            # Its admin UI binds a fixed port: off, so that nothing else is disturbed.
            toml = (
                f'[server]\nlisten_addr = "127.0.0.1:{port}"\ndb_path = "{data}"\n'
                f"[admin]\nenabled = false\n{limits}"
            )
        cfg = work / "sepp.toml"
        cfg.write_text(toml)
        cmd = [binary, "--config", str(cfg)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_")}
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    wait_listening(port, proc, NAMES[system])
    return proc, port


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_system(system: str, args: argparse.Namespace) -> list[dict]:
    workloads = [w for w in args.workloads if system != "ceiling" or w in ENQUEUE_WORKLOADS]
    with tempfile.TemporaryDirectory(prefix=f"vs-public-{system}-") as tmp:
        work = Path(tmp)
        proc, port = start(system, args, work)
        try:
            out = work / "results"
            cmd = [
                str(target_dir() / "release" / "sepp-bench"),
                "--target", f"127.0.0.1:{port}",
                "--server-pid", str(proc.pid),
                "--workloads", ",".join(workloads),
                "--connections", ",".join(str(c) for c in args.connections),
                "--duration", str(args.duration),
                "--warmup", str(args.warmup),
                "--results-dir", str(out),
            ]
            res = subprocess.run(cmd, stdout=sys.stderr)
            files = sorted(out.glob("*.json"))
            if not files:
                raise RuntimeError(f"sepp-bench wrote no results against {NAMES[system]}")
            report = json.loads(files[-1].read_text())
            points = [p for run in report["runs"] for p in run["points"]]
            if res.returncode != 0:
                log(f"{NAMES[system]}: sepp-bench exited with {res.returncode}")
        finally:
            stop(proc)
    return [
        {
            "system": system,
            "workload": p["workload"],
            "connections": p["connections"],
            "jobs_per_s": p["jobs_per_s"],
            "p50_ms": p["latency_ms"]["p50"],
            "p99_ms": p["latency_ms"]["p99"],
            "cpu_us_per_job": (p["server_cpu_s_per_1k_jobs"] or 0) * 1000
            if p.get("server_cpu_s_per_1k_jobs") is not None
            else None,
            "errors": p["errors"],
            "anomalies": p["anomalies"],
            "others_cpu_cores": p.get("others_cpu_cores"),
        }
        for p in points
    ]


def spread(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarise(rounds: list[list[dict]], args: argparse.Namespace) -> list[dict]:
    rows = []
    for w in args.workloads:
        for c in args.connections:
            row: dict = {"workload": w, "connections": c, "systems": {}, "ratios": {}}
            per_round: dict[str, list[dict | None]] = {s: [] for s in args.systems}
            for points in rounds:
                for s in args.systems:
                    match = [
                        p for p in points
                        if p["system"] == s and p["workload"] == w and p["connections"] == c
                    ]
                    per_round[s].append(match[0] if match else None)
            for s, pts in per_round.items():
                got = [p for p in pts if p]
                if got:
                    row["systems"][s] = {
                        k: spread([p[k] for p in got])
                        for k in ("jobs_per_s", "p50_ms", "p99_ms", "cpu_us_per_job")
                    }
            for other in ("public", "ceiling"):
                if other not in per_round or "sepp" not in per_round:
                    continue
                ratios = [
                    a["jobs_per_s"] / b["jobs_per_s"]
                    for a, b in zip(per_round["sepp"], per_round[other])
                    if a and b and b["jobs_per_s"] > 0
                ]
                if ratios:
                    row["ratios"][f"sepp/{other}"] = spread(ratios)
                if other == "public":
                    p99 = [
                        a["p99_ms"] / b["p99_ms"]
                        for a, b in zip(per_round["sepp"], per_round[other])
                        if a and b and b["p99_ms"] > 0
                    ]
                    if p99:
                        row["ratios"]["p99 sepp/public"] = spread(p99)
            rows.append(row)
    return rows


def fmt(v: dict | None, digits: int = 0) -> str:
    if not v:
        return "–"
    f = f"{{:,.{digits}f}}"
    return f"{f.format(v['median'])} ({f.format(v['min'])}–{f.format(v['max'])})"


def table(rows: list[dict], meta: dict) -> str:
    lines = [
        f"{meta['rounds']} rounds, A/B alternating, {meta['duration_s']} s points after a "
        f"{meta['warmup_s']} s warm-up, 256-byte payloads, {meta['started_at']} on "
        f"{meta['cpus']} cores (load average at start {meta['loadavg_start']}). Median "
        "(min–max) over the rounds; ratios are taken within each round.",
        "",
        "| workload | conns | system | jobs/s | p50 ms | p99 ms | server CPU µs/job |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        for s, fig in row["systems"].items():
            lines.append(
                f"| {TITLES.get(row['workload'], row['workload'])} | {row['connections']} | "
                f"{NAMES[s]} | {fmt(fig['jobs_per_s'])} | {fmt(fig['p50_ms'], 2)} | "
                f"{fmt(fig['p99_ms'], 2)} | {fmt(fig['cpu_us_per_job'], 1)} |"
            )
    lines += ["", "| workload | conns | sepp / public sepp | p99 sepp / public | sepp / ceiling |",
              "|---|---:|---:|---:|---:|"]
    for row in rows:
        r = row["ratios"]
        lines.append(
            f"| {TITLES.get(row['workload'], row['workload'])} | {row['connections']} | "
            f"{fmt(r.get('sepp/public'), 2)} | {fmt(r.get('p99 sepp/public'), 2)} | "
            f"{fmt(r.get('sepp/ceiling'), 2)} |"
        )
    return "\n".join(lines) + "\n"


def write_docs(text: str, stamp: str) -> None:
    path = ROOT / "docs" / "benchmarks.md"
    doc = path.read_text()
    begin, end = "<!-- BEGIN GENERATED vs-public -->", "<!-- END GENERATED vs-public -->"
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path} has no {begin} ... {end} markers")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    body = f"\n<!-- written by bench/vs-public --write-docs; raw: bench/results/vs-public-{stamp}.json -->\n{text}"
    path.write_text(head + begin + body + end + tail)
    log(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--duration", type=float, default=5.0, help="measured seconds per point (5)")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per point (1)")
    ap.add_argument("--connections", default="32", help="connection counts, comma-separated (32)")
    ap.add_argument("--workloads", default="unique,hits,batch100,batch1000,drain",
                    help="sepp-bench workloads (unique,hits,batch100,batch1000,drain)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="sepp,public,ceiling")
    ap.add_argument("--public-bin", default=os.environ.get("PUBLIC_SEPP_BIN"),
                    help="the public sepp binary (default $PUBLIC_SEPP_BIN)")
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/benchmarks.md")
    args = ap.parse_args()
    args.connections = [int(c) for c in args.connections.split(",")]
    args.workloads = args.workloads.split(",")
    args.systems = args.systems.split(",")
    if "public" in args.systems and not (args.public_bin and Path(args.public_bin).exists()):
        raise SystemExit("the public sepp binary is missing: set PUBLIC_SEPP_BIN or --public-bin")

    started = dt.datetime.now(dt.timezone.utc)
    meta = {
        "started_at": f"{started:%Y-%m-%d %H:%M} UTC",
        "rounds": args.rounds,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "cpus": os.cpu_count(),
        "loadavg_start": f"{os.getloadavg()[0]:.2f}",
        "git": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True).stdout.strip(),
    }
    rounds: list[list[dict]] = []
    for r in range(args.rounds):
        order = args.systems if r % 2 == 0 else list(reversed(args.systems))
        points: list[dict] = []
        for system in order:
            log(f"round {r + 1}/{args.rounds}: {NAMES[system]}")
            points += run_system(system, args)
        rounds.append(points)
    rows = summarise(rounds, args)
    text = table(rows, meta)
    stamp = f"{started:%Y%m%d-%H%M%S}"
    out = ROOT / "bench" / "results" / f"vs-public-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rounds": rounds, "rows": rows}, indent=1))
    log(f"raw figures: {out}")
    print(text)
    if args.write_docs:
        write_docs(text, stamp)


if __name__ == "__main__":
    main()
