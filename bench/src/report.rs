//! Turning raw figures into the JSON report, the per-point line and the markdown tables.

use crate::server::ServerExit;
use crate::workload::{Measured, Workload};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// The whole JSON file.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// Always `sepp-bench`.
    pub(crate) tool: &'static str,
    /// UTC start, RFC 3339.
    pub(crate) started_at: String,
    /// UTC end, RFC 3339.
    pub(crate) finished_at: String,
    /// `git describe` of the workspace, when available.
    pub(crate) git: Option<String>,
    /// The machine.
    pub(crate) host: Host,
    /// What was asked for.
    pub(crate) settings: Settings,
    /// One entry per persist mode (or one for `--target`).
    pub(crate) runs: Vec<ModeRun>,
}

/// Facts about the machine.
#[derive(Debug, Serialize)]
pub(crate) struct Host {
    /// Logical CPUs.
    pub(crate) cpus: usize,
    /// `uname -r`.
    pub(crate) kernel: Option<String>,
    /// Clock ticks per second used for CPU figures.
    pub(crate) clk_tck: u64,
    /// 1-minute load average at the start.
    pub(crate) loadavg_1m_start: Option<f64>,
    /// Open files limit (soft, after raising it to the hard limit).
    pub(crate) open_files_limit: Option<u64>,
}

/// The run's settings.
#[derive(Debug, Serialize)]
pub(crate) struct Settings {
    /// `quick` or `full`.
    pub(crate) preset: &'static str,
    /// Measured seconds per timed point.
    pub(crate) duration_s: f64,
    /// Warm-up seconds per timed point.
    pub(crate) warmup_s: f64,
    /// Connection counts.
    pub(crate) connections: Vec<usize>,
    /// Workloads.
    pub(crate) workloads: Vec<Workload>,
    /// Jobs of the `published` workload.
    pub(crate) published_jobs: usize,
    /// Producer and worker counts of the `published` workload.
    pub(crate) published_connections: Vec<usize>,
    /// Whether `published` jobs carry a fresh idempotency key.
    pub(crate) published_keyed: bool,
    /// Persist modes (empty with `--target`).
    pub(crate) modes: Vec<String>,
    /// Payload size in bytes.
    pub(crate) payload_bytes: usize,
    /// Whether payloads are random bytes (`--payload-random`) rather than one repeated byte.
    pub(crate) payload_random: bool,
    /// Keys pre-enqueued for `hits`.
    pub(crate) hit_keys: usize,
    /// Whether all connections' tasks share one client (`--shared-client`).
    pub(crate) shared_client: bool,
    /// Whether the clients coalesce concurrent enqueues (not `--no-coalesce`).
    pub(crate) coalesce: bool,
    /// The clients' `max_batches_in_flight`, when given.
    pub(crate) max_batches_in_flight: Option<usize>,
    /// `--target`, when used.
    pub(crate) target: Option<String>,
    /// The server binary, when the bench started the server.
    pub(crate) server_bin: Option<String>,
    /// Parent of the server data directories.
    pub(crate) data_parent: Option<String>,
}

/// One server lifetime: a persist mode, or the `--target` server.
#[derive(Debug, Serialize)]
pub(crate) struct ModeRun {
    /// `sync_all`, `sync_data`, `buffer`, or `external`.
    pub(crate) mode: String,
    /// The server's address.
    pub(crate) server_addr: Option<String>,
    /// Whether the bench started the server (and so has CPU and RSS figures).
    pub(crate) spawned: bool,
    /// The points, in run order.
    pub(crate) points: Vec<PointReport>,
    /// How the spawned server ended.
    pub(crate) server_exit: Option<ServerExit>,
    /// Why the run stopped early, if it did.
    pub(crate) failure: Option<String>,
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Latency {
    /// Recorded values.
    pub(crate) count: u64,
    /// Mean.
    pub(crate) mean: f64,
    /// Median.
    pub(crate) p50: f64,
    /// 90th percentile.
    pub(crate) p90: f64,
    /// 99th percentile.
    pub(crate) p99: f64,
    /// 99.9th percentile.
    pub(crate) p999: f64,
    /// Largest.
    pub(crate) max: f64,
}

impl Latency {
    fn from_hist(h: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            count: h.len(),
            mean: h.mean() / 1000.0,
            p50: ms(h.value_at_quantile(0.5)),
            p90: ms(h.value_at_quantile(0.9)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
        }
    }
}

/// All figures of one point.
#[derive(Debug, Serialize)]
pub(crate) struct PointReport {
    /// The workload.
    pub(crate) workload: Workload,
    /// Connections used.
    pub(crate) connections: usize,
    /// The queue it used.
    pub(crate) queue: String,
    /// Jobs pre-filled (`drain`).
    pub(crate) drain_jobs: Option<usize>,
    /// Measured seconds.
    pub(crate) elapsed_s: f64,
    /// Jobs done in the window.
    pub(crate) jobs: u64,
    /// RPCs completed in the window.
    pub(crate) rpcs: u64,
    /// Jobs per second.
    pub(crate) jobs_per_s: f64,
    /// RPCs per second.
    pub(crate) rpcs_per_s: f64,
    /// What `latency_ms` times.
    pub(crate) latency_of: &'static str,
    /// Latency per RPC (per cycle for `cycle`).
    pub(crate) latency_ms: Latency,
    /// Latency of each RPC kind, where a workload mixes them.
    pub(crate) rpc_latency_ms: BTreeMap<String, Latency>,
    /// Failed RPCs plus rejected jobs.
    pub(crate) errors: u64,
    /// Successful but wrong answers.
    pub(crate) anomalies: u64,
    /// Distinct error and anomaly messages with counts.
    pub(crate) messages: BTreeMap<String, u64>,
    /// Server CPU seconds (user + system) over the window.
    pub(crate) server_cpu_s: Option<f64>,
    /// Server CPU seconds per 1,000 jobs.
    pub(crate) server_cpu_s_per_1k_jobs: Option<f64>,
    /// Server CPU microseconds per RPC.
    pub(crate) server_cpu_us_per_rpc: Option<f64>,
    /// Server peak RSS (VmHWM) in MiB: of this point when `peak_rss_reset`, else since start.
    pub(crate) server_peak_rss_mib: Option<f64>,
    /// Whether the peak was reset at the start of the point.
    pub(crate) peak_rss_reset: bool,
    /// Server RSS at the end of the point, MiB.
    pub(crate) server_rss_mib: Option<f64>,
    /// The bench's own CPU seconds per 1,000 jobs (it shares the cores with the server).
    pub(crate) client_cpu_s_per_1k_jobs: Option<f64>,
    /// CPU used by other processes during the point, in cores (machine busy time minus the
    /// server's and the bench's, divided by the elapsed time): how much the run was disturbed.
    pub(crate) others_cpu_cores: Option<f64>,
    /// 1-minute load average when the point started.
    pub(crate) loadavg_1m: Option<f64>,
    /// Remarks.
    pub(crate) notes: Vec<String>,
}

/// Inputs to [`PointReport::new`] that do not come from the load loop.
pub(crate) struct PointContext {
    /// The workload.
    pub(crate) workload: Workload,
    /// Connections.
    pub(crate) connections: usize,
    /// Queue.
    pub(crate) queue: String,
    /// Pre-filled jobs for drain.
    pub(crate) drain_jobs: Option<usize>,
    /// Clock ticks per second.
    pub(crate) clk_tck: u64,
    /// Peak RSS, MiB.
    pub(crate) peak_rss_mib: Option<f64>,
    /// Whether the peak was reset at the start.
    pub(crate) peak_rss_reset: bool,
    /// RSS at the end, MiB.
    pub(crate) rss_mib: Option<f64>,
    /// Load average at the start.
    pub(crate) loadavg_1m: Option<f64>,
}

impl PointReport {
    /// Derives the rates and per-job costs.
    pub(crate) fn new(m: Measured, c: PointContext) -> Self {
        let secs = m.elapsed.as_secs_f64().max(1e-9);
        let tck = c.clk_tck as f64;
        let server_cpu_s = m.server_cpu_ticks.map(|t| t as f64 / tck);
        let per_1k = |cpu: Option<f64>| {
            cpu.filter(|_| m.jobs > 0)
                .map(|s| s * 1000.0 / m.jobs as f64)
        };
        PointReport {
            workload: c.workload,
            connections: c.connections,
            queue: c.queue,
            drain_jobs: c.drain_jobs,
            elapsed_s: secs,
            jobs: m.jobs,
            rpcs: m.rpcs,
            jobs_per_s: m.jobs as f64 / secs,
            rpcs_per_s: m.rpcs as f64 / secs,
            latency_of: c.workload.latency_unit(),
            latency_ms: Latency::from_hist(&m.latency),
            rpc_latency_ms: m
                .by_rpc
                .iter()
                .map(|(k, h)| (k.to_string(), Latency::from_hist(h)))
                .collect(),
            errors: m.errors,
            anomalies: m.anomalies,
            messages: m.samples,
            server_cpu_s,
            server_cpu_s_per_1k_jobs: per_1k(server_cpu_s),
            server_cpu_us_per_rpc: server_cpu_s
                .filter(|_| m.rpcs > 0)
                .map(|s| s * 1e6 / m.rpcs as f64),
            server_peak_rss_mib: c.peak_rss_mib,
            peak_rss_reset: c.peak_rss_reset,
            server_rss_mib: c.rss_mib,
            client_cpu_s_per_1k_jobs: per_1k(m.client_cpu_ticks.map(|t| t as f64 / tck)),
            others_cpu_cores: m.machine_busy_ticks.map(|busy| {
                let mine = m.server_cpu_ticks.unwrap_or(0) + m.client_cpu_ticks.unwrap_or(0);
                (busy.saturating_sub(mine) as f64 / tck / secs).max(0.0)
            }),
            loadavg_1m: c.loadavg_1m,
            notes: m.notes,
        }
    }

    /// The one-line progress report.
    pub(crate) fn line(&self, mode: &str) -> String {
        let mut s = format!(
            "{mode:<9} {:<17} c={:<3} {:>9} jobs/s  p50 {:>7.3}  p99 {:>7.3}  p999 {:>7.3} ms  err {}",
            self.workload.name(),
            self.connections,
            fmt_int(self.jobs_per_s),
            self.latency_ms.p50,
            self.latency_ms.p99,
            self.latency_ms.p999,
            self.errors
        );
        if self.anomalies > 0 {
            let _ = write!(s, "  anomalies {}", self.anomalies);
        }
        if let Some(c) = self.server_cpu_s_per_1k_jobs {
            let _ = write!(s, "  srv {c:.3} s/1k");
        }
        if let Some(r) = self.server_peak_rss_mib {
            let _ = write!(s, "  rss {r:.0} MiB");
        }
        if let Some(o) = self.others_cpu_cores {
            let _ = write!(s, "  others {o:.2} cores");
        }
        for n in &self.notes {
            let _ = write!(s, "  [{n}]");
        }
        s
    }
}

/// `12345.6` → `12,346`.
pub(crate) fn fmt_int(x: f64) -> String {
    let n = x.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn opt(x: Option<f64>, prec: usize) -> String {
    x.map_or_else(|| "–".to_string(), |v| format!("{v:.prec$}"))
}

/// The markdown tables: every point, then a durable/buffered comparison when both ran.
pub(crate) fn markdown(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| mode | workload | conns | jobs/s | p50 ms | p99 ms | p999 ms | errors | srv CPU s/1k jobs | srv peak RSS MiB | other load (cores) |"
    );
    let _ = writeln!(s, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for run in &report.runs {
        for p in &run.points {
            let errors = if p.anomalies > 0 {
                format!("{} (+{} anomalies)", p.errors, p.anomalies)
            } else {
                p.errors.to_string()
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {} | {} | {} | {} |",
                run.mode,
                p.workload.name(),
                p.connections,
                fmt_int(p.jobs_per_s),
                p.latency_ms.p50,
                p.latency_ms.p99,
                p.latency_ms.p999,
                errors,
                opt(p.server_cpu_s_per_1k_jobs, 3),
                opt(p.server_peak_rss_mib, 0),
                opt(p.others_cpu_cores, 2),
            );
        }
    }
    let modes: Vec<&str> = report.runs.iter().map(|r| r.mode.as_str()).collect();
    let durable = modes
        .iter()
        .copied()
        .find(|m| *m == "sync_all" || *m == "sync_data");
    if let (Some(d), true) = (durable, modes.contains(&"buffer")) {
        let find = |mode: &str, w: Workload, c: usize| {
            report
                .runs
                .iter()
                .filter(|r| r.mode == mode)
                .flat_map(|r| r.points.iter())
                .find(|p| p.workload == w && p.connections == c)
        };
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "| workload | conns | {d} jobs/s | buffer jobs/s | {d} / buffer |"
        );
        let _ = writeln!(s, "|---|--:|--:|--:|--:|");
        for p in report
            .runs
            .iter()
            .filter(|r| r.mode == d)
            .flat_map(|r| r.points.iter())
        {
            if let Some(b) = find("buffer", p.workload, p.connections) {
                let ratio = if b.jobs_per_s > 0.0 {
                    format!("{:.0} %", 100.0 * p.jobs_per_s / b.jobs_per_s)
                } else {
                    "–".into()
                };
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    p.workload.name(),
                    p.connections,
                    fmt_int(p.jobs_per_s),
                    fmt_int(b.jobs_per_s),
                    ratio
                );
            }
        }
    }
    s
}

/// The `published` rows side by side, in the layout of the public sepp's published figures:
/// one line per mode and producer/worker count, with the mode's `cycle` latency.
pub(crate) fn published_markdown(report: &Report) -> String {
    let mut s = String::new();
    for run in &report.runs {
        let cycle = run.points.iter().find(|p| p.workload == Workload::Cycle);
        for (i, enq) in run.points.iter().enumerate() {
            if enq.workload != Workload::PublishedEnqueue {
                continue;
            }
            let drain = run
                .points
                .get(i + 1)
                .filter(|p| p.workload == Workload::PublishedDrain);
            if s.is_empty() {
                let _ = writeln!(
                    s,
                    "| mode | producers = workers | jobs | enqueue jobs/s | drain jobs/s | cycle p50 / p99 / p999 ms | srv CPU s/1k jobs: enqueue / drain | srv peak RSS MiB: enqueue / drain | other load (cores): enqueue / drain / cycle |"
                );
                let _ = writeln!(s, "|---|--:|--:|--:|--:|--:|--:|--:|--:|");
            }
            let rate = |p: Option<&PointReport>| p.map_or("–".into(), |p| fmt_int(p.jobs_per_s));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} / {} |",
                run.mode,
                enq.connections,
                fmt_int(enq.jobs as f64),
                fmt_int(enq.jobs_per_s),
                rate(drain),
                cycle.map_or("–".into(), |c| format!(
                    "{:.2} / {:.2} / {:.2}",
                    c.latency_ms.p50, c.latency_ms.p99, c.latency_ms.p999
                )),
                opt(enq.server_cpu_s_per_1k_jobs, 3),
                opt(drain.and_then(|d| d.server_cpu_s_per_1k_jobs), 3),
                opt(enq.server_peak_rss_mib, 0),
                opt(drain.and_then(|d| d.server_peak_rss_mib), 0),
                opt(enq.others_cpu_cores, 2),
                opt(drain.and_then(|d| d.others_cpu_cores), 2),
                opt(cycle.and_then(|c| c.others_cpu_cores), 2),
            );
        }
    }
    s
}

/// UTC `(rfc3339, file-name-safe)` timestamps of `t`.
pub(crate) fn timestamps(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, mo, d) = civil_from_days(days);
    let (h, mi, se) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    (
        format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{se:02}Z"),
        format!("{y:04}-{mo:02}-{d:02}T{h:02}-{mi:02}-{se:02}Z"),
    )
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_thousands() {
        assert_eq!(fmt_int(0.4), "0");
        assert_eq!(fmt_int(999.0), "999");
        assert_eq!(fmt_int(1000.0), "1,000");
        assert_eq!(fmt_int(1_234_567.0), "1,234,567");
    }

    #[test]
    fn timestamps_are_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_764_505_845); // 2025-11-30T12:30:45Z
        assert_eq!(
            timestamps(t),
            (
                "2025-11-30T12:30:45Z".to_string(),
                "2025-11-30T12-30-45Z".to_string()
            )
        );
        assert_eq!(timestamps(UNIX_EPOCH).0, "1970-01-01T00:00:00Z");
    }
}
