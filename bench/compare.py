#!/usr/bin/env python3
"""sepp against its peers, side by side in one run: tables and plots.

Runs the same workloads against sepp (through `sepp-bench`, the Rust client) and against the
peers (through `bench/peers/run`, each with its native Node client), repeats the whole round
`--repeats` times, and reports the median with the min-max of every figure. Usually started by
`bench/compare`, which builds what it needs first.

Output:
  bench/results/compare-<stamp>.json    every raw point of every repetition, and the medians
  docs/bench/*.svg                      the plots (with --write-docs)
  docs/benchmarks.md, README.md         the text between their GENERATED markers (--write-docs)

Figures: jobs/s, per-call latency percentiles in ms (one enqueue; for sepp's drain one ack that
brings the next job, or a reserve; for cycle one enqueue -> reserve -> ack), the server's CPU seconds per 1,000 jobs (user + system
of the server process and its children, from /proc) and its peak RSS in MiB.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchutil import ROOT, target_dir, logger

log = logger("compare")

BENCH = ROOT / "bench"

WORKLOAD_TITLES = {
    "nokey": "no key",
    "unique": "unique key",
    "hits": "every enqueue a dedup hit",
    "drain": "drain (take a job, ack it)",
    "cycle": "enqueue → reserve → ack, 1 connection",
}

# (system, durability) -> the row label. The peers' labels come from their JSON; these are the
# defaults and the sepp rows.
SEPP_ROWS = [("sepp", "durable", "sync_all"), ("sepp", "buffered", "buffer")]
PEER_SYSTEMS = ["bullmq", "nats", "pgboss"]
SYSTEM_NAMES = {"sepp": "sepp", "bullmq": "BullMQ", "nats": "NATS JetStream", "pgboss": "pg-boss"}
COLORS = {"sepp": "#d62728", "bullmq": "#1f77b4", "nats": "#2ca02c", "pgboss": "#9467bd"}


# ---------------------------------------------------------------- running


def plan_calls(plan: dict) -> list[tuple[list[str], list[int]]]:
    """The (workloads, connection counts) invocations of one system: the sweep, the fixed
    points, and the cycle at one connection."""
    fixed = [w for w in plan["fixed_workloads"] if w != "cycle"]
    calls = [(plan["sweep_workloads"], plan["sweep"]), (fixed, [plan["fixed_connections"]])]
    if "cycle" in plan["fixed_workloads"]:
        calls.append((["cycle"], [1]))
    return [(w, c) for w, c in calls if w]


def run_sepp(mode: str, plan: dict, durability: str) -> list[dict]:
    """Runs sepp-bench for one persist mode; returns points in the common shape."""
    points: list[dict] = []
    for workloads, conns in plan_calls(plan):
        with tempfile.TemporaryDirectory(prefix="sepp-compare-") as out:
            cmd = [
                str(target_dir() / "release" / "sepp-bench"),
                "--mode", mode,
                "--workloads", ",".join(workloads),
                "--connections", ",".join(map(str, conns)),
                "--duration", str(plan["duration"]),
                "--warmup", str(plan["warmup"]),
                "--drain-jobs", str(plan["drain_jobs"]),
                "--results-dir", out,
            ]
            log("sepp " + mode + ": " + " ".join(cmd[1:]))
            subprocess.run(cmd, check=True, stdout=sys.stderr)
            files = sorted(Path(out).glob("*.json"))
            report = json.loads(files[-1].read_text())
        version = report.get("git")
        for run in report["runs"]:
            if run.get("failure"):
                log(f"sepp {mode}: run failed: {run['failure']}")
            for p in run["points"]:
                points.append({
                    "system": "sepp",
                    "durability": durability,
                    "label": f"sepp, {mode}",
                    "workload": p["workload"],
                    "connections": p["connections"],
                    "jobs_per_s": p["jobs_per_s"],
                    "latency_ms": p["latency_ms"],
                    "errors": p["errors"],
                    "anomalies": p["anomalies"],
                    "server_cpu_s_per_1k_jobs": p.get("server_cpu_s_per_1k_jobs"),
                    "server_peak_rss_mib": p.get("server_peak_rss_mib"),
                    "client_cpu_s_per_1k_jobs": p.get("client_cpu_s_per_1k_jobs"),
                    "notes": p.get("notes", []),
                    "versions": {"sepp": version},
                })
    return points


def run_peer(system: str, durability: str, plan: dict) -> list[dict]:
    """Runs bench/peers/run for one system and durability; returns its points."""
    points: list[dict] = []
    for workloads, conns in plan_calls(plan):
        with tempfile.NamedTemporaryFile(prefix="peers-", suffix=".jsonl", delete=False) as f:
            out = Path(f.name)
        cmd = [
            str(BENCH / "peers" / "run"),
            "--systems", system,
            "--durability", durability,
            "--workloads", ",".join(workloads),
            "--connections", ",".join(map(str, conns)),
            "--duration", str(plan["duration"]),
            "--warmup", str(plan["warmup"]),
            "--drain-jobs", str(plan["drain_jobs"]),
            "--out", str(out),
        ]
        log(f"{system} {durability}: " + " ".join(cmd[1:]))
        res = subprocess.run(cmd, stdout=sys.stderr)
        if res.returncode != 0:
            log(f"{system} {durability}: exit {res.returncode}")
        for line in out.read_text().splitlines() if out.exists() else []:
            if not line.strip():
                continue
            p = json.loads(line)
            p.setdefault("system", system)
            p["durability"] = durability
            if p.get("client_cpu_s") is not None and p.get("jobs"):
                p["client_cpu_s_per_1k_jobs"] = p["client_cpu_s"] / p["jobs"] * 1000
            points.append(p)
        out.unlink(missing_ok=True)
    return points


# ---------------------------------------------------------------- aggregating


def key(p: dict) -> tuple:
    return (p["system"], p["durability"], p["workload"], p["connections"])


def first_notes(ps: list[dict]) -> list[str]:
    """The notes of a point's runs, one per kind (the text before the first colon): a note that
    carries a count differs from run to run and would otherwise repeat."""
    seen: dict[str, str] = {}
    for p in ps:
        for n in p.get("notes") or []:
            seen.setdefault(n.split(":", 1)[0], n)
    return list(seen.values())


def aggregate(rounds: list[list[dict]]) -> dict:
    """Median and min-max over the repetitions of every figure, per point."""
    by_key: dict[tuple, list[dict]] = {}
    for rnd in rounds:
        for p in rnd:
            by_key.setdefault(key(p), []).append(p)
    agg = {}
    for k, ps in by_key.items():
        measured = [p for p in ps if not p.get("unsupported") and p.get("jobs_per_s")]
        entry = {
            "system": k[0],
            "durability": k[1],
            "workload": k[2],
            "connections": k[3],
            "label": next((p.get("label") for p in ps if p.get("label")), k[0]),
            "runs": len(measured),
            "unsupported": next((p["unsupported"] for p in ps if p.get("unsupported")), None),
            "errors": sum(p.get("errors") or 0 for p in ps),
            "anomalies": sum(p.get("anomalies") or 0 for p in ps),
            "notes": first_notes(ps),
        }

        def stat(values: list) -> dict | None:
            values = [v for v in values if v is not None]
            if not values:
                return None
            return {"median": statistics.median(values), "min": min(values), "max": max(values)}

        entry["jobs_per_s"] = stat([p["jobs_per_s"] for p in measured])
        for q in ("p50", "p99", "p999"):
            entry[q] = stat([(p.get("latency_ms") or {}).get(q) for p in measured])
        entry["cpu_s_per_1k"] = stat([p.get("server_cpu_s_per_1k_jobs") for p in measured])
        # PSS where the peer driver has it: PostgreSQL's backends share their buffers, and
        # summing their RSS would count those once per process.
        entry["peak_rss_mib"] = stat([
            p.get("server_peak_pss_mib") or p.get("server_peak_rss_mib") for p in measured
        ])
        entry["client_cpu_s_per_1k"] = stat([p.get("client_cpu_s_per_1k_jobs") for p in measured])
        agg[k] = entry
    return agg


# ---------------------------------------------------------------- formatting


def fmt_num(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_stat(s: dict | None, runs: int) -> str:
    if not s:
        return "–"
    if runs > 1 and s["min"] != s["max"]:
        return f"{fmt_num(s['median'])} ({fmt_num(s['min'])}–{fmt_num(s['max'])})"
    return fmt_num(s["median"])


def row_order(agg: dict) -> list[tuple[str, str]]:
    rows = []
    for system in ["sepp", *PEER_SYSTEMS]:
        for durability in ["durable", "buffered"]:
            if any(k[0] == system and k[1] == durability for k in agg):
                rows.append((system, durability))
    return rows


def label_of(agg: dict, system: str, durability: str) -> str:
    for k, e in agg.items():
        if k[0] == system and k[1] == durability and e.get("label"):
            return e["label"]
    return f"{SYSTEM_NAMES[system]} ({durability})"


def cell(agg: dict, system: str, durability: str, workload: str, conns: int) -> str:
    e = agg.get((system, durability, workload, conns))
    if e is None:
        return "not run"
    if e["unsupported"] and not e["jobs_per_s"]:
        return "cannot: " + e["unsupported"]
    text = fmt_stat(e["jobs_per_s"], e["runs"])
    if e["anomalies"]:
        text += f" ⚠ {e['anomalies']} wrong answers"
    if e["errors"]:
        text += f" ⚠ {e['errors']} errors"
    return text


def headline_table(agg: dict, conns: int) -> str:
    cols = ["nokey", "unique", "hits", "drain"]
    out = [
        "| system, durability | " + " | ".join(WORKLOAD_TITLES[c] for c in cols)
        + " | cycle p50 / p99 ms | server CPU s / 1k jobs (unique) |",
        "|---|" + "--:|" * (len(cols) + 2),
    ]
    for system, durability in row_order(agg):
        cyc = agg.get((system, durability, "cycle", 1))
        cyc_txt = "–"
        if cyc and cyc["p50"] and cyc["p99"]:
            cyc_txt = f"{fmt_num(cyc['p50']['median'])} / {fmt_num(cyc['p99']['median'])}"
        uni = agg.get((system, durability, "unique", conns))
        cpu = fmt_num(uni["cpu_s_per_1k"]["median"]) if uni and uni["cpu_s_per_1k"] else "–"
        label = label_of(agg, system, durability)
        if system == "sepp":
            label = f"**{label}**"
        out.append(
            f"| {label} | "
            + " | ".join(cell(agg, system, durability, c, conns) for c in cols)
            + f" | {cyc_txt} | {cpu} |"
        )
    return "\n".join(out)


def ratio_table(rounds: list[list[dict]], agg: dict) -> str:
    """sepp's jobs/s over each peer's of the same durability, taken within each round (the
    rounds alternate the order of the systems), as the median with the min-max of the rounds."""
    by_round = [{key(p): p for p in rnd} for rnd in rounds]
    order = {w: i for i, w in enumerate(WORKLOAD_TITLES)}
    points = sorted(
        {(k[2], k[3]) for k in agg if k[0] == "sepp"}, key=lambda w: (order.get(w[0], 99), w[1])
    )
    peers = [(s, d) for s, d in row_order(agg) if s != "sepp" and ("sepp", d) in row_order(agg)]
    out = [
        "| workload | connections | "
        + " | ".join(f"sepp {d} / {label_of(agg, s, d)}" for s, d in peers) + " |",
        "|---|--:|" + "--:|" * len(peers),
    ]
    for workload, conns in points:
        cells = []
        for system, durability in peers:
            ratios = []
            for rnd in by_round:
                a = rnd.get(("sepp", durability, workload, conns))
                b = rnd.get((system, durability, workload, conns))
                if a and b and a.get("jobs_per_s") and b.get("jobs_per_s"):
                    ratios.append(a["jobs_per_s"] / b["jobs_per_s"])
            if not ratios:
                cells.append("–")
                continue
            ratios.sort()
            med = statistics.median(ratios)
            text = f"{med:.2f}"
            if len(ratios) > 1 and ratios[0] != ratios[-1]:
                text += f" ({ratios[0]:.2f}–{ratios[-1]:.2f})"
            cells.append(text)
        out.append(f"| {WORKLOAD_TITLES.get(workload, workload)} | {conns} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def detail_table(agg: dict) -> str:
    out = [
        "| system, durability | workload | connections | jobs/s | p50 ms | p99 ms | p999 ms "
        "| server CPU s / 1k jobs | client CPU s / 1k jobs | server peak memory MiB | notes |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    order = {w: i for i, w in enumerate(WORKLOAD_TITLES)}
    rows = row_order(agg)
    for system, durability in rows:
        entries = sorted(
            (e for k, e in agg.items() if k[0] == system and k[1] == durability),
            key=lambda e: (order.get(e["workload"], 99), e["connections"]),
        )
        for e in entries:
            if e["unsupported"] and not e["jobs_per_s"]:
                out.append(
                    f"| {e['label']} | {WORKLOAD_TITLES.get(e['workload'], e['workload'])} "
                    f"| {e['connections']} | cannot | | | | | | | {e['unsupported']} |"
                )
                continue
            notes = "; ".join(e["notes"])
            if e["anomalies"]:
                notes = f"{e['anomalies']} wrong answers; " + notes
            if e["errors"]:
                notes = f"{e['errors']} errors; " + notes
            out.append(
                f"| {e['label']} | {WORKLOAD_TITLES.get(e['workload'], e['workload'])} "
                f"| {e['connections']} | {fmt_stat(e['jobs_per_s'], e['runs'])} "
                f"| {fmt_stat(e['p50'], 1)} | {fmt_stat(e['p99'], 1)} | {fmt_stat(e['p999'], 1)} "
                f"| {fmt_stat(e['cpu_s_per_1k'], 1)} | {fmt_stat(e['client_cpu_s_per_1k'], 1)} "
                f"| {fmt_stat(e['peak_rss_mib'], 1)} "
                f"| {notes.replace('|', '/')} |"
            )
    return "\n".join(out)


# ---------------------------------------------------------------- plots


def plots(agg: dict, plan: dict, out_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    sweep = plan["sweep"]
    for workload in plan["sweep_workloads"]:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, durability in zip(axes, ["durable", "buffered"]):
            for system in ["sepp", *PEER_SYSTEMS]:
                xs, ys, lo, hi = [], [], [], []
                for c in sweep:
                    e = agg.get((system, durability, workload, c))
                    if e and e["jobs_per_s"]:
                        xs.append(c)
                        ys.append(e["jobs_per_s"]["median"])
                        lo.append(e["jobs_per_s"]["median"] - e["jobs_per_s"]["min"])
                        hi.append(e["jobs_per_s"]["max"] - e["jobs_per_s"]["median"])
                if xs:
                    ax.errorbar(
                        xs, ys, yerr=[lo, hi], marker="o", capsize=3,
                        color=COLORS[system], label=label_of(agg, system, durability),
                        linewidth=2.5 if system == "sepp" else 1.5,
                    )
            ax.set_xscale("log", base=2)
            ax.set_xticks(sweep)
            ax.set_xticklabels([str(c) for c in sweep])
            ax.set_xlabel("concurrent connections (one call in flight each)")
            ax.set_title(f"{durability}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        axes[0].set_ylabel("jobs/s (median of runs, bars: min–max)")
        fig.suptitle(f"Enqueue throughput against connections: {WORKLOAD_TITLES[workload]}")
        fig.tight_layout()
        name = f"throughput-{workload}.svg"
        fig.savefig(out_dir / name)
        plt.close(fig)
        written.append(name)

    # Latency percentiles at the fixed connection count, per system and durability.
    for workload, conns in (("unique", plan["fixed_connections"]), ("cycle", 1)):
        labels, vals = [], {q: [] for q in ("p50", "p99", "p999")}
        colors = []
        for system, durability in row_order(agg):
            e = agg.get((system, durability, workload, conns))
            if not e or not e["p50"]:
                continue
            labels.append(label_of(agg, system, durability))
            colors.append(COLORS[system])
            for q in vals:
                vals[q].append(e[q]["median"] if e[q] else 0)
        if not labels:
            continue
        fig, ax = plt.subplots(figsize=(11, 4.5))
        width = 0.27
        for i, (q, shade) in enumerate((("p50", 1.0), ("p99", 0.65), ("p999", 0.35))):
            xs = [j + (i - 1) * width for j in range(len(labels))]
            ax.bar(xs, vals[q], width, color=colors, alpha=shade, label=q, edgecolor="black")
        ax.set_yscale("log")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("ms (log scale)")
        what = "per enqueue" if workload == "unique" else "per cycle"
        ax.set_title(
            f"Latency percentiles {what}: {WORKLOAD_TITLES[workload]}, {conns} connection(s) "
            "(bars left to right: p50, p99, p999)"
        )
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        name = f"latency-{workload}.svg"
        fig.savefig(out_dir / name)
        plt.close(fig)
        written.append(name)
    return written


# ---------------------------------------------------------------- docs


def replace_between(path: Path, marker: str, body: str) -> None:
    begin = f"<!-- BEGIN GENERATED {marker} -->"
    end = f"<!-- END GENERATED {marker} -->"
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: markers {begin} / {end} not found")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def machine_line() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} CPUs ({cpu}), {mem_gib:.0f} GiB, Linux {platform.release()}; "
        "load generator and server on the same cores, loopback TCP"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="one round, 1.5 s points, 32 connections only (about 2 minutes)")
    ap.add_argument("--repeats", type=int, help="rounds (default: 3, quick: 1)")
    ap.add_argument("--duration", type=float, help="measured seconds per point (default 3)")
    ap.add_argument("--warmup", type=float, help="warm-up seconds per point (default 1)")
    ap.add_argument("--sweep", help="connection counts of the sweep (default 1,8,32,64,256)")
    ap.add_argument("--connections", type=int, default=32,
                    help="connections of the fixed points (hits, drain) and the headline")
    ap.add_argument("--drain-jobs", type=int, help="jobs per drain point (default 10000)")
    ap.add_argument("--systems", default="sepp,bullmq,nats,pgboss",
                    help="comma-separated, from sepp, bullmq, nats, pgboss (default: all)")
    ap.add_argument("--durability", default="durable,buffered",
                    help="comma-separated, from durable, buffered (default: both); sepp's "
                    "durable is sync_all, its buffered is buffer")
    ap.add_argument("--write-docs", action="store_true",
                    help="write plots to docs/bench/ and the tables into docs/benchmarks.md "
                    "and README.md between their GENERATED markers")
    ap.add_argument("--from-json", type=Path, help="re-render from an earlier compare JSON")
    args = ap.parse_args()

    quick = args.quick
    plan = {
        "repeats": args.repeats or (1 if quick else 3),
        "duration": args.duration or (1.5 if quick else 3.0),
        "warmup": args.warmup or (0.25 if quick else 1.0),
        "sweep": [int(c) for c in (args.sweep or ("32" if quick else "1,8,32,64,256")).split(",")],
        "sweep_workloads": ["unique"],
        "fixed_workloads": ["nokey", "hits", "drain", "cycle"],
        "fixed_connections": args.connections,
        "drain_jobs": args.drain_jobs or (5000 if quick else 10000),
    }
    systems = args.systems.split(",")
    durabilities = args.durability.split(",")

    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        plan = saved["plan"]
        rounds = saved["rounds"]
        started = saved["started_at"]
    else:
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        rounds = []
        for r in range(plan["repeats"]):
            log(f"round {r + 1} of {plan['repeats']}")
            points: list[dict] = []
            # Alternate the order between rounds so that drift in the machine's state does not
            # always favour the same system.
            order = systems if r % 2 == 0 else list(reversed(systems))
            for system in order:
                for durability in durabilities:
                    if system == "sepp":
                        mode = dict((d, m) for _, d, m in SEPP_ROWS)[durability]
                        points += run_sepp(mode, plan, durability)
                    else:
                        points += run_peer(system, durability, plan)
            rounds.append(points)

    agg = aggregate(rounds)
    if args.from_json:
        # Re-rendering: the raw figures are the file read, not a new copy of them.
        raw = args.from_json.resolve()
        machine = saved.get("machine", machine_line())
    else:
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        results = BENCH / "results"
        results.mkdir(exist_ok=True)
        raw = results / f"compare-{stamp}.json"
        machine = machine_line()
        raw.write_text(json.dumps({
            "started_at": started,
            "machine": machine,
            "plan": plan,
            "rounds": rounds,
            "medians": [dict(e, key=list(k)) for k, e in agg.items()],
        }, indent=1) + "\n")
        log(f"raw figures: {raw}")

    headline = headline_table(agg, plan["fixed_connections"])
    ratios = ratio_table(rounds, agg)
    detail = detail_table(agg)
    print(f"\n{plan['fixed_connections']} connections, jobs/s, median (min–max) of "
          f"{plan['repeats']} run(s):\n")
    print(headline)
    print("\nsepp over each peer, jobs/s ratio per round, median (min–max):\n")
    print(ratios)
    print()
    print(detail)

    if args.write_docs:
        names = plots(agg, plan, ROOT / "docs" / "bench")
        meta = (
            f"Measured {started[:10]} on {machine}. {plan['repeats']} rounds; each point "
            f"{plan['duration']:g} s after {plan['warmup']:g} s of warm-up; drain of "
            f"{plan['drain_jobs']:,} jobs; cells are the median with the min–max of the rounds. "
            f"Raw figures: `bench/results/{raw.name}`."
        )
        replace_between(ROOT / "docs" / "benchmarks.md", "meta", meta)
        replace_between(ROOT / "docs" / "benchmarks.md", "headline", headline)
        replace_between(ROOT / "docs" / "benchmarks.md", "ratios", ratios)
        replace_between(ROOT / "docs" / "benchmarks.md", "detail", detail)
        replace_between(
            ROOT / "docs" / "benchmarks.md", "plots",
            "\n\n".join(f"![{n}](bench/{n})" for n in names),
        )
        replace_between(ROOT / "README.md", "headline", headline + "\n\n" + meta.split(". ")[0]
                        + f"; {plan['fixed_connections']} connections, jobs/s, median (min–max) "
                        f"of {plan['repeats']} rounds. Method, every figure and plots: "
                        "[docs/benchmarks.md](docs/benchmarks.md).")
        log("docs updated: docs/benchmarks.md, README.md, docs/bench/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
