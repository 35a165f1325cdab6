#!/usr/bin/env node
// Prints the results of bench/peers/run (JSON lines) as markdown tables.
//   node table.mjs RESULTS.jsonl          # every point, then jobs/s by workload
//   node table.mjs --line < one-point.json  # one short line per point (progress output)
import { readFileSync } from 'node:fs';

const f = (v, d = 0) => (v == null || Number.isNaN(v) ? '–' : Number(v).toLocaleString('en-US', { minimumFractionDigits: d, maximumFractionDigits: d }));

function parse(text) {
  return text
    .split('\n')
    .filter((l) => l.trim())
    .map((l) => {
      try {
        return JSON.parse(l);
      } catch {
        return { failed: `unparsable line: ${l.slice(0, 80)}` };
      }
    });
}

function line(p) {
  const head = `${p.label} | ${p.workload} c${p.connections}`;
  if (p.unsupported) return `${head}: unsupported: ${p.unsupported}`;
  if (p.failed) return `${head}: FAILED: ${p.failed}`;
  const l = p.latency_ms || {};
  let s = `${head}: ${f(p.jobs_per_s)} jobs/s  p50 ${f(l.p50, 2)} p99 ${f(l.p99, 2)} ms  srv ${f(p.server_cpu_s_per_1k_jobs, 3)} s/1k jobs  rss ${f(p.server_peak_rss_mib)} MiB  other load ${f(p.other_load_cores, 2)} io ${f(p.io_pressure_pct)}%`;
  if (p.drain_complete === false) s += `  (drain stopped: ${p.jobs} of ${p.drain_jobs} jobs)`;
  if (p.errors || p.anomalies) s += `  errors ${p.errors} anomalies ${p.anomalies} ${JSON.stringify(p.messages)}`;
  return s;
}

if (process.argv[2] === '--line') {
  for (const p of parse(readFileSync(0, 'utf8'))) console.log(line(p));
  process.exit(0);
}

const file = process.argv[2];
if (!file) {
  console.error('usage: node table.mjs RESULTS.jsonl');
  process.exit(2);
}
const points = parse(readFileSync(file, 'utf8'));

console.log('| system, durability | workload | conns | jobs/s | p50 ms | p99 ms | p999 ms | errors | anomalies | srv CPU s/1k jobs | srv peak RSS MiB (PSS) | other load (cores) / IO stall % |');
console.log('|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
for (const p of points) {
  if (p.unsupported || p.failed) {
    console.log(`| ${p.label} | ${p.workload} | ${p.connections} | ${p.unsupported ? `unsupported: ${p.unsupported}` : `FAILED: ${p.failed}`} | | | | | | | | |`);
    continue;
  }
  const l = p.latency_ms || {};
  const rss = p.server_peak_pss_mib != null && Math.abs(p.server_peak_pss_mib - p.server_peak_rss_mib) > 5 ? `${f(p.server_peak_rss_mib)} (${f(p.server_peak_pss_mib)})` : f(p.server_peak_rss_mib);
  const stopped = p.drain_complete === false ? ` (stopped: ${f(p.jobs)} of ${f(p.drain_jobs)})` : '';
  console.log(`| ${p.label} | ${p.workload} | ${p.connections} | ${f(p.jobs_per_s)}${stopped} | ${f(l.p50, 2)} | ${f(l.p99, 2)} | ${f(l.p999, 2)} | ${p.errors} | ${p.anomalies} | ${f(p.server_cpu_s_per_1k_jobs, 3)} | ${rss} | ${f(p.other_load_cores, 2)} / ${f(p.io_pressure_pct)} |`);
}

// Jobs/s by workload, one table per connection count (the layout of ANCHORS.md).
const order = ['nokey', 'unique', 'hits', 'drain', 'cycle'];
const workloads = order.filter((w) => points.some((p) => p.workload === w && w !== 'cycle'));
const counts = [...new Set(points.filter((p) => p.workload !== 'cycle').map((p) => p.connections))].sort((a, b) => a - b);
const labels = [...new Set(points.map((p) => p.label))];
for (const c of counts) {
  console.log(`\njobs/s at ${c} connections${workloads.includes('drain') ? ` (drain: ${c} workers, one job at a time)` : ''}:\n`);
  console.log(`| system, durability | ${workloads.join(' | ')} |`);
  console.log(`|---|${workloads.map(() => '--:').join('|')}|`);
  for (const lab of labels) {
    const cells = workloads.map((w) => {
      const p = points.find((q) => q.label === lab && q.workload === w && q.connections === c);
      if (!p) return '';
      if (p.unsupported) return 'unsupported';
      if (p.failed) return 'failed';
      return f(p.jobs_per_s) + (p.drain_complete === false ? ` (stopped: ${f(p.jobs)} of ${f(p.drain_jobs)} jobs)` : '') + (p.anomalies ? ` (${p.anomalies} anomalies)` : '');
    });
    if (cells.some(Boolean)) console.log(`| ${lab} | ${cells.join(' | ')} |`);
  }
}
const cyc = points.filter((p) => p.workload === 'cycle' && !p.unsupported && !p.failed);
if (cyc.length) {
  console.log('\none connection, enqueue -> reserve -> ack:\n');
  console.log('| system, durability | cycles/s | p50 ms | p99 ms | p999 ms |');
  console.log('|---|--:|--:|--:|--:|');
  for (const p of cyc) console.log(`| ${p.label} | ${f(p.jobs_per_s)} | ${f(p.latency_ms.p50, 2)} | ${f(p.latency_ms.p99, 2)} | ${f(p.latency_ms.p999, 2)} |`);
}
