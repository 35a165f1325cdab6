#!/usr/bin/env python3
"""Plots what the `backlog` bench printed: server RSS and data-directory size per stored job at
each backlog size, one line per build.

    bench/backlog_plot.py OUT.svg LABEL=FILE.jsonl [LABEL=FILE.jsonl ...]

Each FILE holds the JSON lines of one `backlog` run (the markdown table after them is
skipped). As in the table the bench prints: RSS less the empty server's, over N; disk as
found after the restart, over N. Standard library only: the SVG is written by hand.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

MIB = 1024 * 1024
COLOURS = ["#c0392b", "#2471a3", "#1e8449", "#7d3c98"]


def load(path: Path) -> list[dict]:
    points = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            points.append(json.loads(line))
    return points


def per_job(points: list[dict], field: str, less_empty: bool) -> list[tuple[int, float]]:
    base = next((p[field] for p in points if p["jobs"] == 0), 0.0) if less_empty else 0.0
    return [
        (p["jobs"], (p[field] - base) * MIB / p["jobs"])
        for p in points
        if p["jobs"] > 0
    ]


def panel(x0: float, title: str, series: list[tuple[str, str, list[tuple[int, float]]]]) -> str:
    w, h, left, top, bottom = 420, 300, 60, 40, 50
    xs = sorted({n for _, _, s in series for n, _ in s})
    ymax = max((v for _, _, s in series for _, v in s), default=1.0) * 1.15 or 1.0
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    span = (hi - lo) or 1.0

    def px(n: int) -> float:
        return x0 + left + (math.log10(n) - lo) / span * (w - left - 20)

    def py(v: float) -> float:
        return top + (1 - v / ymax) * (h - top - bottom)

    out = [
        f'<text x="{x0 + w / 2}" y="22" text-anchor="middle" font-weight="bold">{title}</text>',
        f'<line x1="{x0 + left}" y1="{py(0)}" x2="{x0 + w - 20}" y2="{py(0)}" stroke="#333"/>',
        f'<line x1="{x0 + left}" y1="{top}" x2="{x0 + left}" y2="{py(0)}" stroke="#333"/>',
    ]
    for i in range(5):
        v = ymax * i / 4
        out.append(
            f'<text x="{x0 + left - 6}" y="{py(v) + 4}" text-anchor="end">{v:.0f}</text>'
            f'<line x1="{x0 + left}" y1="{py(v)}" x2="{x0 + w - 20}" y2="{py(v)}" '
            'stroke="#ddd"/>'
        )
    for n in xs:
        label = f"{n / 1e6:g} M"
        out.append(
            f'<text x="{px(n)}" y="{py(0) + 18}" text-anchor="middle">{label}</text>'
        )
    out.append(
        f'<text x="{x0 + w / 2}" y="{h - 8}" text-anchor="middle">stored jobs</text>'
    )
    for label, colour, s in series:
        pts = " ".join(f"{px(n):.1f},{py(v):.1f}" for n, v in s)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for n, v in s:
            out.append(
                f'<circle cx="{px(n):.1f}" cy="{py(v):.1f}" r="3.5" fill="{colour}"/>'
                f'<text x="{px(n) + 6:.1f}" y="{py(v) - 6:.1f}" fill="{colour}">{v:.0f}</text>'
            )
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out = Path(sys.argv[1])
    runs = []
    for i, arg in enumerate(sys.argv[2:]):
        label, _, file = arg.partition("=")
        runs.append((label, COLOURS[i % len(COLOURS)], load(Path(file))))
    rss = [(l, c, per_job(p, "rss_settled_mib", True)) for l, c, p in runs]
    disk = [(l, c, per_job(p, "disk_after_restart_mib", False)) for l, c, p in runs]
    legend = "\n".join(
        f'<rect x="{70 + 150 * i}" y="312" width="12" height="12" fill="{c}"/>'
        f'<text x="{88 + 150 * i}" y="323">{l}</text>'
        for i, (l, c, _) in enumerate(runs)
    )
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="860" height="335" '
        'font-family="sans-serif" font-size="12">\n'
        '<rect width="100%" height="100%" fill="white"/>\n'
        + panel(0, "server RSS, bytes per stored job", rss)
        + "\n"
        + panel(430, "data directory, bytes per stored job", disk)
        + "\n"
        + legend
        + "\n</svg>\n"
    )
    out.write_text(svg)


if __name__ == "__main__":
    main()
