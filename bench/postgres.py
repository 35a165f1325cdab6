#!/usr/bin/env python3
"""sepp on PostgreSQL, side by side in one run: 1, 2 and 3 sepp servers on one database, pg-boss
on the same PostgreSQL, and the embedded backend for reference. Usually started by
`bench/postgres`, which builds what it needs first.

Each round runs every system once, in alternating order (the second round reversed, and so on),
so a machine that slows down during the run does not favour one system. Per system and round:

  unique  durable enqueues with a fresh idempotency key each, at --connections callers
  drain   a backlog of --drain-jobs jobs reserved and acked by --connections workers

The PostgreSQL is a private cluster this script starts (initdb in a temp dir, its own port,
fsync and synchronous_commit on, pg_stat_statements loaded) and stops at the end, so nothing
else on the machine shares it. Every sepp run gets a fresh database. The figures:

  jobs/s              the load generator's rate (sepp-bench for sepp, bench/peers for pg-boss)
  sepp CPU / 1k jobs  user + system seconds of the sepp server processes per 1,000 jobs
  pg CPU / 1k jobs    the same for the PostgreSQL cluster (the postmaster and every backend)

After the 1-server run of the first round it prints pg_stat_statements' top statements (calls,
mean and total time, rows), which is where the database's time goes. Results:
bench/results/postgres-<stamp>.json; --write-docs also writes docs/bench/postgres.svg and the
table between the GENERATED markers of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchutil import ROOT, target_dir, free_port, logger

log = logger("postgres-bench")

BENCH = ROOT / "bench"
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- CPU from /proc


def proc_ticks(pid: int, children_too: bool = False) -> int:
    """utime + stime of one process (and, for a parent, of its children that have exited)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    f = raw[raw.rindex(")") + 2 :].split()
    ticks = int(f[11]) + int(f[12])
    if children_too:
        ticks += int(f[13]) + int(f[14])
    return ticks


def cluster_ticks(postmaster: int) -> int:
    """The postmaster (with its exited children) and every live backend it forked."""
    total = proc_ticks(postmaster, children_too=True)
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2 :].split()
        if int(f[1]) == postmaster:
            total += int(f[11]) + int(f[12])
    return total


# ---------------------------------------------------------------- the private cluster


class Cluster:
    def __init__(self, work: Path):
        self.dir = work / "pgdata"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}"
        work.chmod(0o755)
        as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.as_pg = as_pg
        self.dir.mkdir(mode=0o700)
        if as_pg:
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(
            as_pg + [str(PG_BIN / "initdb"), "-D", str(self.dir), "-A", "trust", "-U", "postgres"],
            check=True, stdout=subprocess.DEVNULL,
        )
        with open(self.dir / "postgresql.conf", "a") as f:
            f.write(
                "\n# sepp bench/postgres\n"
                f"port = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\n"
                "max_connections = 400\nshared_buffers = '512MB'\n"
                "fsync = on\nsynchronous_commit = on\n"
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = top\n"
            )
        subprocess.run(
            as_pg + [str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-l", str(self.dir / "log"), "-w", "start"],
            check=True, stdout=subprocess.DEVNULL,
        )
        self.postmaster = int((self.dir / "postmaster.pid").read_text().split()[0])
        self.version = self.sql("postgres", "show server_version").split()[0]

    def sql(self, db: str, query: str) -> str:
        return subprocess.run(
            ["psql", "-X", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d", db,
             "-v", "ON_ERROR_STOP=1", "-Atq", "-F", "\t", "-c", query],
            check=True, capture_output=True, text=True,
        ).stdout.strip()

    def stop(self) -> None:
        subprocess.run(
            self.as_pg + [str(PG_BIN / "pg_ctl"), "-D", str(self.dir), "-m", "fast", "-w", "stop"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )


# ---------------------------------------------------------------- sepp servers


class SeppServers:
    """n sepp servers on one database, each on its own port."""

    def __init__(self, n: int, url: str, work: Path, pool: int):
        self.procs: list[subprocess.Popen] = []
        self.addrs: list[str] = []
        self.logs: list[Path] = []
        for i in range(n):
            d = work / f"sepp{i}"
            d.mkdir()
            cfg = d / "sepp.toml"
            cfg.write_text(
                "[server]\nlisten_addr = \"127.0.0.1:0\"\n"
                f"db_path = '{d / 'unused'}'\n\n"
                "[storage]\nbackend = \"postgres\"\n"
                f"postgres_url = '{url}'\npostgres_pool_size = {pool}\n"
            )
            logf = d / "server.log"
            env = {k: v for k, v in os.environ.items() if not k.startswith("SEPP_") or k == "SEPP_LOG"}
            env["NO_COLOR"] = "1"
            p = subprocess.Popen(
                [str(target_dir() / "release" / "sepp"), "--config", str(cfg)],
                stdout=subprocess.PIPE, stderr=open(logf, "w"), stdin=subprocess.DEVNULL,
                text=True, env=env, cwd=d,
            )
            line = p.stdout.readline().strip()
            if not line.startswith("sepp listening on "):
                p.kill()
                raise RuntimeError(f"server {i} did not start: {line!r}\n{logf.read_text()[-2000:]}")
            self.procs.append(p)
            self.addrs.append(line.removeprefix("sepp listening on "))
            self.logs.append(logf)

    def ticks(self) -> int:
        return sum(proc_ticks(p.pid) for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def sepp_bench(args: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="sepp-pgbench-") as out:
        cmd = [str(target_dir() / "release" / "sepp-bench"), *args, "--results-dir", out]
        log(" ".join(cmd[1:]))
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        report = json.loads(sorted(Path(out).glob("*.json"))[-1].read_text())
    points = []
    for run in report["runs"]:
        if run.get("failure"):
            raise RuntimeError(f"sepp-bench failed: {run['failure']}")
        points.extend(run["points"])
    return points


# ---------------------------------------------------------------- one system, one round


def run_embedded(a: argparse.Namespace) -> dict:
    res = {}
    for w in ("unique", "drain"):
        (p,) = sepp_bench([
            "--mode", "sync_all", "--workloads", w, "--connections", str(a.connections),
            "--duration", str(a.duration), "--warmup", str(a.warmup), "--drain-jobs", str(a.drain_jobs),
        ])
        res[w] = {"jobs_per_s": p["jobs_per_s"], "sepp_cpu_s_per_1k": p.get("server_cpu_s_per_1k_jobs"),
                  "pg_cpu_s_per_1k": None, "p99_ms": (p.get("latency_ms") or {}).get("p99")}
    return res


def run_sepp_pg(a: argparse.Namespace, cluster: Cluster, n: int, rnd: int, work: Path, stats: bool) -> dict:
    db = f"sepp_bench_n{n}_r{rnd}"
    cluster.sql("postgres", f"drop database if exists {db}")
    cluster.sql("postgres", f"create database {db}")
    d = work / f"{db}"
    d.mkdir()
    servers = SeppServers(n, f"{cluster.url}/{db}", d, a.pool_size)
    res = {}
    try:
        if stats:
            cluster.sql(db, "create extension if not exists pg_stat_statements")
            cluster.sql(db, "select pg_stat_statements_reset()")
        for w in ("unique", "drain"):
            s0, g0 = servers.ticks(), cluster_ticks(cluster.postmaster)
            (p,) = sepp_bench([
                "--target", ",".join(servers.addrs), "--workloads", w,
                "--connections", str(a.connections), "--duration", str(a.duration),
                "--warmup", str(a.warmup), "--drain-jobs", str(a.drain_jobs),
            ])
            s1, g1 = servers.ticks(), cluster_ticks(cluster.postmaster)
            # The ticks cover the warm-up and (for drain) the prefill too; the jobs counted are
            # the measured ones plus what the warm-up or prefill enqueued.
            jobs = p["jobs"] + (a.drain_jobs if w == "drain" else p["jobs_per_s"] * a.warmup)
            res[w] = {
                "jobs_per_s": p["jobs_per_s"],
                "p99_ms": (p.get("latency_ms") or {}).get("p99"),
                "sepp_cpu_s_per_1k": (s1 - s0) / CLK_TCK / jobs * 1000 if jobs else None,
                "pg_cpu_s_per_1k": (g1 - g0) / CLK_TCK / jobs * 1000 if jobs else None,
            }
        if stats:
            rows = cluster.sql(
                db,
                "select calls, round(mean_exec_time::numeric, 3), round(total_exec_time::numeric), rows, "
                "regexp_replace(left(query, 110), '\\s+', ' ', 'g') from pg_stat_statements "
                "where dbid = (select oid from pg_database where datname = current_database()) "
                "order by total_exec_time desc limit 10",
            )
            res["pg_stat_statements"] = [r.split("\t") for r in rows.splitlines()]
    finally:
        servers.stop()
        for i, lf in enumerate(servers.logs):
            bad = [ln for ln in lf.read_text().splitlines() if " ERROR " in ln or "panicked" in ln]
            if bad:
                log(f"server {i} of {n} logged {len(bad)} ERROR lines, first: {bad[0][:300]}")
        cluster.sql("postgres", f"drop database if exists {db}")
    return res


def run_pgboss(a: argparse.Namespace, cluster: Cluster) -> dict:
    res = {}
    out = Path(tempfile.mktemp(prefix="pgboss-", suffix=".jsonl"))
    env = dict(os.environ, PG_PORT=str(cluster.port), PG_DB="pgboss_bench")
    cmd = [str(BENCH / "peers" / "run"), "--systems", "pgboss", "--durability", "durable",
           "--workloads", "unique,drain", "--connections", str(a.connections),
           "--duration", str(a.duration), "--warmup", str(a.warmup),
           "--drain-jobs", str(a.drain_jobs), "--out", str(out)]
    log("pg-boss: " + " ".join(cmd[1:]))
    subprocess.run(cmd, stdout=sys.stderr, env=env, check=False)
    for line in out.read_text().splitlines() if out.exists() else []:
        p = json.loads(line)
        if p.get("failed"):
            log(f"pg-boss {p.get('workload')}: {p['failed']}")
            continue
        res[p["workload"]] = {
            "jobs_per_s": p["jobs_per_s"],
            "p99_ms": (p.get("latency_ms") or {}).get("p99"),
            "sepp_cpu_s_per_1k": None,
            "pg_cpu_s_per_1k": p.get("server_cpu_s_per_1k_jobs"),
            "label": p.get("label"),
        }
    out.unlink(missing_ok=True)
    cluster.sql("postgres", "drop database if exists pgboss_bench")
    return res


# ---------------------------------------------------------------- report


SYSTEMS = ["embedded", "pg1", "pg2", "pg3", "pgboss"]
NAMES = {
    "embedded": "sepp, embedded (sync_all)",
    "pg1": "sepp, 1 server on PostgreSQL",
    "pg2": "sepp, 2 servers on PostgreSQL",
    "pg3": "sepp, 3 servers on PostgreSQL",
    "pgboss": "pg-boss",
}


def median(rounds: list[dict], system: str, workload: str, field: str):
    vals = [r[system][workload][field] for r in rounds
            if workload in r.get(system, {}) and r[system][workload].get(field) is not None]
    return statistics.median(vals) if vals else None


def fmt(v, digits=0):
    if v is None:
        return "–"
    return f"{v:,.{digits}f}"


def table(rounds: list[dict], a: argparse.Namespace, pg_version: str) -> str:
    lines = [
        f"{a.connections} connections, {a.duration} s enqueue points, a {a.drain_jobs:,}-job drain, "
        f"median of {len(rounds)} rounds; PostgreSQL {pg_version} (a private cluster: fsync and "
        "synchronous_commit on).",
        "",
        "| system | unique-key enqueues/s | enqueue p99 ms | drain jobs/s | sepp CPU s / 1k enqueues | "
        "PostgreSQL CPU s / 1k enqueues |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in SYSTEMS:
        lines.append(
            f"| {NAMES[s]} | {fmt(median(rounds, s, 'unique', 'jobs_per_s'))} | "
            f"{fmt(median(rounds, s, 'unique', 'p99_ms'), 1)} | "
            f"{fmt(median(rounds, s, 'drain', 'jobs_per_s'))} | "
            f"{fmt(median(rounds, s, 'unique', 'sepp_cpu_s_per_1k'), 3)} | "
            f"{fmt(median(rounds, s, 'unique', 'pg_cpu_s_per_1k'), 3)} |"
        )

    def ratio(x, y, w):
        a_, b_ = median(rounds, x, w, "jobs_per_s"), median(rounds, y, w, "jobs_per_s")
        return f"{a_ / b_:.2f}×" if a_ and b_ else "–"

    lines += [
        "",
        "| ratio | measured | target |",
        "|---|---:|---:|",
        f"| 1 server on PostgreSQL ÷ pg-boss, unique-key enqueues | {ratio('pg1', 'pgboss', 'unique')} | ≥ 5× |",
        f"| 1 server on PostgreSQL ÷ embedded, unique-key enqueues | {ratio('pg1', 'embedded', 'unique')} | ≥ 0.5× |",
        f"| 1 server on PostgreSQL ÷ pg-boss, drain | {ratio('pg1', 'pgboss', 'drain')} | ≥ 20× |",
        f"| 3 servers ÷ 1 server, unique-key enqueues | {ratio('pg3', 'pg1', 'unique')} | ≥ 1.5× |",
        f"| 2 servers ÷ 1 server, unique-key enqueues | {ratio('pg2', 'pg1', 'unique')} | |",
    ]
    return "\n".join(lines)


def plot(rounds: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, w, title in ((axes[0], "unique", "unique-key enqueues/s"), (axes[1], "drain", "drain jobs/s")):
        vals = [median(rounds, s, w, "jobs_per_s") or 0 for s in SYSTEMS]
        ax.barh([NAMES[s] for s in SYSTEMS][::-1], vals[::-1],
                color=["#9467bd", "#d62728", "#d62728", "#d62728", "#ff9896"])
        ax.set_title(title)
        for i, v in enumerate(vals[::-1]):
            ax.text(v, i, f" {v:,.0f}", va="center", fontsize=8)
        ax.margins(x=0.25)
    axes[1].set_yticklabels([])
    fig.tight_layout()
    fig.savefig(path)


def write_docs(text: str) -> None:
    doc = ROOT / "docs" / "benchmarks.md"
    s = doc.read_text()
    start, end = "<!-- GENERATED postgres begin -->", "<!-- GENERATED postgres end -->"
    block = f"{start}\n{text}\n\n![sepp on PostgreSQL beside pg-boss](bench/postgres.svg)\n{end}"
    if start in s:
        s = s[: s.index(start)] + block + s[s.index(end) + len(end) :]
    else:
        s = s.rstrip() + "\n\n## sepp on PostgreSQL, beside pg-boss\n\nWritten by `bench/postgres --write-docs`.\n\n" + block + "\n"
    doc.write_text(s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=1)
    ap.add_argument("--drain-jobs", type=int, default=10000)
    ap.add_argument("--pool-size", type=int, default=16, help="storage.postgres_pool_size per server")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="subset of " + ",".join(SYSTEMS))
    ap.add_argument("--quick", action="store_true", help="1 round, 2 s points, a 2,000-job drain")
    ap.add_argument("--write-docs", action="store_true")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.duration, a.warmup, a.drain_jobs = 1, 2, 0.5, 2000
    systems = [s for s in a.systems.split(",") if s]
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s}")

    work = Path(tempfile.mkdtemp(prefix="sepp-pgbench-"))
    try:
        cluster = Cluster(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log(f"PostgreSQL {cluster.version} on port {cluster.port}, postmaster {cluster.postmaster}")
    rounds: list[dict] = []
    statements = None
    try:
        for r in range(a.rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            res: dict = {}
            for s in order:
                log(f"round {r + 1}/{a.rounds}: {NAMES[s]}")
                if s == "embedded":
                    res[s] = run_embedded(a)
                elif s == "pgboss":
                    res[s] = run_pgboss(a, cluster)
                else:
                    n = int(s[2:])
                    res[s] = run_sepp_pg(a, cluster, n, r, work, stats=(n == 1 and statements is None))
                    if "pg_stat_statements" in res[s]:
                        statements = res[s].pop("pg_stat_statements")
            rounds.append(res)
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)

    text = table(rounds, a, cluster.version)
    print(text)
    if statements:
        print("\npg_stat_statements, 1 server, unique then drain (calls, mean ms, total ms, rows, query):")
        for row in statements:
            print("  " + " | ".join(row))
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = BENCH / "results" / f"postgres-{stamp}.json"
    out.write_text(json.dumps({"args": vars(a), "postgres": cluster.version, "rounds": rounds,
                               "pg_stat_statements": statements}, indent=1))
    log(f"results: {out}")
    if a.write_docs:
        plot(rounds, ROOT / "docs" / "bench" / "postgres.svg")
        write_docs(text)
        log("wrote docs/benchmarks.md and docs/bench/postgres.svg")


if __name__ == "__main__":
    main()
