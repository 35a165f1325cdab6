//! `sepp-bench`: a load generator for `sepp.v1` servers.
//!
//! It starts the release `sepp` binary once per persist mode on a fresh data directory (or
//! drives an already running server with `--target`), runs each workload at each connection
//! count for a fixed time, and reports jobs/s, per-RPC latency percentiles, errors, and the
//! server's CPU seconds per 1,000 jobs and peak RSS. See `bench/README.md`.

mod report;
mod server;
mod workload;

use clap::Parser;
use report::{Host, ModeRun, PointContext, PointReport, Report, Settings};
use server::{BoxError, ServerProcess};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use workload::{PointSpec, Workload};

/// Persist modes of the generated server config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// fsync before every reply.
    #[value(name = "sync_all")]
    SyncAll,
    /// fdatasync before every reply.
    #[value(name = "sync_data")]
    SyncData,
    /// Written to the OS only.
    #[value(name = "buffer")]
    Buffer,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::SyncAll => "sync_all",
            Mode::SyncData => "sync_data",
            Mode::Buffer => "buffer",
        }
    }
}

/// Load generator for sepp: throughput, latency, server CPU and memory per workload.
#[derive(Debug, Parser)]
#[command(name = "sepp-bench", version, about, long_about = None)]
struct Cli {
    /// Short points (1.5 s + 0.25 s warm-up), sync_all only unless --mode is given.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Long points (10 s + 1 s warm-up), sync_all and buffer unless --mode is given (default).
    #[arg(long)]
    full: bool,
    /// Measured seconds per point (overrides the preset).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Unmeasured warm-up seconds per point (overrides the preset).
    #[arg(long, value_name = "SECS")]
    warmup: Option<f64>,
    /// Connection counts; each connection is its own client with one call in flight.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    connections: Vec<usize>,
    /// Workloads to run, in this order.
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// Persist modes; a fresh server is started for each.
    #[arg(long, value_enum, value_delimiter = ',')]
    mode: Vec<Mode>,
    /// Drive an already running sepp.v1 server at HOST:PORT instead of starting one (no CPU
    /// or RSS figures; --mode is ignored).
    #[arg(long, value_name = "HOST:PORT")]
    target: Option<String>,
    /// The server binary. Default: $CARGO_TARGET_DIR/release/sepp, else the `sepp` next to
    /// this binary, else <workspace>/target/release/sepp.
    #[arg(long, value_name = "PATH")]
    server_bin: Option<PathBuf>,
    /// Where the servers' temporary data directories go (default: the system temp dir).
    /// Put it on the disk you want to measure: a tmpfs makes fsync free.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Keep the servers' data directories and logs.
    #[arg(long)]
    keep_data: bool,
    /// Payload bytes per job.
    #[arg(long, default_value_t = 256)]
    payload_bytes: usize,
    /// Keys pre-enqueued for the `hits` workload (connections cycle through them).
    #[arg(long, default_value_t = 1000)]
    hit_keys: usize,
    /// Jobs pre-filled for each `drain` point (default: sized to take about --duration,
    /// from the previous drain point's rate).
    #[arg(long)]
    drain_jobs: Option<usize>,
    /// Where the JSON results go.
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    results_dir: PathBuf,
    /// Do not write the JSON file.
    #[arg(long)]
    no_json: bool,
}

fn workspace_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

fn default_server_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("release").join("sepp");
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(sibling) = exe.parent().map(|d| d.join("sepp"))
        && sibling.is_file()
    {
        return sibling;
    }
    workspace_root().join("target").join("release").join("sepp")
}

fn git_describe() -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(workspace_root())
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn kernel() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Resolved settings of one run.
struct Plan {
    preset: &'static str,
    duration: Duration,
    warmup: Duration,
    connections: Vec<usize>,
    workloads: Vec<Workload>,
    modes: Vec<Mode>,
    server_bin: PathBuf,
    data_parent: PathBuf,
    clk_tck: u64,
    run_id: String,
}

fn plan(cli: &Cli, run_id: String) -> Result<Plan, BoxError> {
    let quick = cli.quick;
    let secs = |x: f64, what: &str| -> Result<Duration, BoxError> {
        Duration::try_from_secs_f64(x).map_err(|_| format!("{what} {x} is not a duration").into())
    };
    let duration = secs(
        cli.duration.unwrap_or(if quick { 1.5 } else { 10.0 }),
        "--duration",
    )?;
    if duration.is_zero() {
        return Err("--duration must be positive".into());
    }
    let warmup = secs(
        cli.warmup.unwrap_or(if quick { 0.25 } else { 1.0 }),
        "--warmup",
    )?;
    if cli.connections.is_empty() || cli.connections.contains(&0) {
        return Err("--connections needs positive counts".into());
    }
    if cli.payload_bytes == 0 {
        return Err(
            "--payload-bytes must be at least 1 (the protocol forbids empty payloads)".into(),
        );
    }
    let workloads = if cli.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        cli.workloads.clone()
    };
    let modes = if !cli.mode.is_empty() {
        cli.mode.clone()
    } else if quick {
        vec![Mode::SyncAll]
    } else {
        vec![Mode::SyncAll, Mode::Buffer]
    };
    Ok(Plan {
        preset: if quick { "quick" } else { "full" },
        duration,
        warmup,
        connections: cli.connections.clone(),
        workloads,
        modes,
        server_bin: cli.server_bin.clone().unwrap_or_else(default_server_bin),
        data_parent: cli.data_dir.clone().unwrap_or_else(std::env::temp_dir),
        clk_tck: server::clock_ticks(),
        run_id,
    })
}

/// Runs every point against the server at `addr`.
async fn run_points(
    cli: &Cli,
    plan: &Plan,
    mode: &str,
    addr: &str,
    mut server: Option<&mut ServerProcess>,
    run: &mut ModeRun,
) {
    let payload = Arc::new(vec![b'x'; cli.payload_bytes]);
    // Drain rate estimate (jobs/s) used to size the next drain point.
    let mut drain_rate = 1000.0_f64;
    let mut drain_conns = 1usize;
    let mut seq = 0usize;
    for &workload in &plan.workloads {
        let conn_list: Vec<usize> = if workload == Workload::Cycle {
            vec![1]
        } else {
            plan.connections.clone()
        };
        for conns in conn_list {
            if let Some(s) = server.as_deref_mut()
                && !s.is_running()
            {
                run.failure = Some(format!(
                    "the server exited before {} c={conns}; log tail:\n{}",
                    workload.name(),
                    s.log_tail(20)
                ));
                eprintln!("{mode}: {}", run.failure.as_deref().unwrap_or_default());
                return;
            }
            let pid = server.as_deref().map(|s| s.pid);
            seq += 1;
            let queue = format!(
                "bench-{}-{seq:02}-{}-c{conns}",
                plan.run_id,
                workload.name()
            );
            // Sized from the last drain point's rate, scaled by the square root of the
            // connection ratio (drains speed up sublinearly with workers).
            let drain_jobs = (workload == Workload::Drain).then(|| {
                cli.drain_jobs.unwrap_or_else(|| {
                    let scale = (conns as f64 / drain_conns as f64).sqrt().clamp(0.25, 4.0);
                    (drain_rate * scale * plan.duration.as_secs_f64()).clamp(1000.0, 500_000.0)
                        as usize
                })
            });
            let spec = PointSpec {
                addr: addr.to_string(),
                workload,
                connections: conns,
                queue: queue.clone(),
                payload: payload.clone(),
                hit_keys: cli.hit_keys.max(1),
                drain_jobs: drain_jobs.unwrap_or(0),
                drain_cap: plan.duration * 3 + Duration::from_secs(2),
                duration: plan.duration,
                warmup: plan.warmup,
                server_pid: pid,
            };
            let peak_rss_reset = pid.is_some_and(server::reset_peak_rss);
            let loadavg = server::loadavg();
            let measured = match workload::run_point(spec).await {
                Ok(m) => m,
                Err(e) => {
                    let msg = format!("{} c={conns} failed: {e}", workload.name());
                    eprintln!("{mode}: {msg}");
                    run.failure = Some(msg);
                    return;
                }
            };
            let ctx = PointContext {
                workload,
                connections: if workload == Workload::Cycle {
                    1
                } else {
                    conns
                },
                queue,
                drain_jobs,
                clk_tck: plan.clk_tck,
                peak_rss_mib: pid.and_then(|p| server::proc_status_mib(p, "VmHWM")),
                peak_rss_reset,
                rss_mib: pid.and_then(|p| server::proc_status_mib(p, "VmRSS")),
                loadavg_1m: loadavg,
            };
            let point = PointReport::new(measured, ctx);
            if workload == Workload::Drain && point.jobs_per_s > 0.0 {
                drain_rate = point.jobs_per_s;
                drain_conns = conns;
            }
            println!("{}", point.line(mode));
            for (msg, n) in &point.messages {
                println!("    {n} × {msg}");
            }
            run.points.push(point);
        }
    }
}

async fn run(cli: Cli) -> Result<bool, BoxError> {
    let started = SystemTime::now();
    let (started_at, file_stamp) = report::timestamps(started);
    let run_id = file_stamp.replace(['-', ':'], "").to_lowercase();
    let plan = plan(&cli, run_id)?;
    let mut report = Report {
        tool: "sepp-bench",
        started_at,
        finished_at: String::new(),
        git: git_describe(),
        host: Host {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel: kernel(),
            clk_tck: plan.clk_tck,
            loadavg_1m_start: server::loadavg(),
        },
        settings: Settings {
            preset: plan.preset,
            duration_s: plan.duration.as_secs_f64(),
            warmup_s: plan.warmup.as_secs_f64(),
            connections: plan.connections.clone(),
            workloads: plan.workloads.clone(),
            modes: if cli.target.is_some() {
                Vec::new()
            } else {
                plan.modes.iter().map(|m| m.as_str().to_string()).collect()
            },
            payload_bytes: cli.payload_bytes,
            hit_keys: cli.hit_keys,
            target: cli.target.clone(),
            server_bin: cli
                .target
                .is_none()
                .then(|| plan.server_bin.display().to_string()),
            data_parent: cli
                .target
                .is_none()
                .then(|| plan.data_parent.display().to_string()),
        },
        runs: Vec::new(),
    };
    println!(
        "sepp-bench: {} points of {:.1} s (+{:.2} s warm-up), {}-byte payloads, workloads {}, connections {:?}",
        plan.preset,
        plan.duration.as_secs_f64(),
        plan.warmup.as_secs_f64(),
        cli.payload_bytes,
        plan.workloads
            .iter()
            .map(|w| w.name())
            .collect::<Vec<_>>()
            .join(","),
        plan.connections
    );

    let mut ok = true;
    if let Some(target) = &cli.target {
        println!("driving {target} (no server CPU or RSS figures)");
        let mut run = ModeRun {
            mode: "external".into(),
            server_addr: Some(target.clone()),
            spawned: false,
            points: Vec::new(),
            server_exit: None,
            failure: None,
        };
        run_points(&cli, &plan, "external", target, None, &mut run).await;
        ok &= run.failure.is_none();
        report.runs.push(run);
    } else {
        for &mode in &plan.modes {
            let mut srv = match ServerProcess::start(
                &plan.server_bin,
                mode.as_str(),
                &plan.data_parent,
                cli.keep_data,
            ) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("{}: cannot start the server: {e}", mode.as_str());
                    report.runs.push(ModeRun {
                        mode: mode.as_str().into(),
                        server_addr: None,
                        spawned: true,
                        points: Vec::new(),
                        server_exit: None,
                        failure: Some(format!("cannot start the server: {e}")),
                    });
                    ok = false;
                    continue;
                }
            };
            println!(
                "started {} (pid {}, persist_mode = {}) on {}, data in {}",
                plan.server_bin.display(),
                srv.pid,
                mode.as_str(),
                srv.addr,
                srv.dir()
                    .map_or_else(String::new, |d| d.display().to_string())
            );
            let addr = srv.addr.clone();
            let mut run = ModeRun {
                mode: mode.as_str().into(),
                server_addr: Some(addr.clone()),
                spawned: true,
                points: Vec::new(),
                server_exit: None,
                failure: None,
            };
            run_points(&cli, &plan, mode.as_str(), &addr, Some(&mut srv), &mut run).await;
            let exit = srv.stop(Duration::from_secs(30));
            println!(
                "stopped the {} server: {} after {:.2} s; data dir {:.1} MiB",
                mode.as_str(),
                exit.status,
                exit.shutdown_s,
                exit.data_bytes as f64 / (1024.0 * 1024.0)
            );
            if !exit.log_problems.is_empty() {
                println!("server log warnings/errors:");
                for l in &exit.log_problems {
                    println!("    {l}");
                }
            }
            ok &= run.failure.is_none() && exit.clean;
            run.server_exit = Some(exit);
            report.runs.push(run);
        }
    }

    report.finished_at = report::timestamps(SystemTime::now()).0;
    println!();
    print!("{}", report::markdown(&report));
    let problems: u64 = report
        .runs
        .iter()
        .flat_map(|r| r.points.iter())
        .map(|p| p.errors + p.anomalies)
        .sum();
    if problems > 0 {
        println!("\n{problems} errors/anomalies in total: see the per-point messages above.");
    }
    if !cli.no_json {
        std::fs::create_dir_all(&cli.results_dir)?;
        let path = cli.results_dir.join(format!("{file_stamp}.json"));
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(&path, json + "\n")?;
        println!("\nwrote {}", path.display());
    }
    Ok(ok)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("sepp-bench: the run had failures (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("sepp-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
