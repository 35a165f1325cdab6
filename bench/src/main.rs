//! `sepp-bench`: a load generator for `sepp.v1` servers.
//!
//! It starts the release `sepp` binary once per persist mode on a fresh data directory (or
//! drives an already running server with `--target`), runs each workload at each connection
//! count for a fixed time, and reports jobs/s, per-RPC latency percentiles, errors, and the
//! server's CPU seconds per 1,000 jobs and peak RSS. See `bench/README.md`.

mod procfs;
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
use workload::{ClientSpec, Payloads, PointSpec, Workload};

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
    /// Short points (1.5 s + 0.25 s warm-up), `published` with 20,000 jobs; sync_all only
    /// unless --mode is given.
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Long points (10 s + 1 s warm-up), `published` with 200,000 jobs; sync_all and buffer
    /// unless --mode is given (default).
    #[arg(long)]
    full: bool,
    /// The public sepp's published method only: workloads `published` and `cycle`, modes
    /// sync_data and buffer (unless given). Alone: 20,000 jobs and a 5 s cycle point; with
    /// --full: 200,000 jobs; with --quick: 20,000 jobs and a 1.5 s cycle point.
    #[arg(long)]
    published: bool,
    /// Jobs of the `published` workload (overrides the preset).
    #[arg(long, value_name = "N")]
    published_jobs: Option<usize>,
    /// Producer and worker counts of the `published` workload (one run per count).
    #[arg(long, value_delimiter = ',', default_value = "50")]
    published_connections: Vec<usize>,
    /// Give every `published` job a fresh idempotency key (default: no key).
    #[arg(long)]
    published_keyed: bool,
    /// Measured seconds per point (overrides the preset).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Unmeasured warm-up seconds per point (overrides the preset).
    #[arg(long, value_name = "SECS")]
    warmup: Option<f64>,
    /// Connection counts; each connection is its own client with one call in flight
    /// (`published` uses --published-connections, `cycle` always 1).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64")]
    connections: Vec<usize>,
    /// Workloads to run, in this order (`published` is followed by `cycle` if not listed).
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<Workload>,
    /// Persist modes; a fresh server is started for each.
    #[arg(long, value_enum, value_delimiter = ',')]
    mode: Vec<Mode>,
    /// Drive an already running sepp.v1 server at HOST:PORT instead of starting one (no CPU
    /// or RSS figures; --mode is ignored). Several servers on one database: HOST:PORT,HOST:PORT
    /// (connections are spread over them round-robin).
    #[arg(long, value_name = "HOST:PORT")]
    target: Option<String>,
    /// With --target: the pid of the server process behind it, so that the points report its
    /// CPU per 1,000 jobs and RSS as when the bench starts the server (user + system time of
    /// the process and its children, from /proc, over each measured window).
    #[arg(long, value_name = "PID", requires = "target")]
    server_pid: Option<u32>,
    /// The server binary. Default: $CARGO_TARGET_DIR/release/sepp, else the `sepp` next to
    /// this binary, else `<workspace>/target/release/sepp`.
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
    /// Random payloads (1,024 different ones, taken in turn), which compression cannot
    /// shrink, instead of one repeated byte, which it shrinks to almost nothing.
    #[arg(long)]
    payload_random: bool,
    /// Keys pre-enqueued for the `hits` workload (connections cycle through them).
    #[arg(long, default_value_t = 1000)]
    hit_keys: usize,
    /// Jobs pre-filled for each `drain` point (default: sized to take about --duration,
    /// from the previous drain point's rate).
    #[arg(long)]
    drain_jobs: Option<usize>,
    /// Drain with a Reserve and an Ack per job (two calls, two commits) instead of acks that
    /// ask for the next job (`ack_then_reserve`; against a server without it, such as the
    /// public sepp, each ack answers no job and the worker reserves: the same two calls).
    #[arg(long)]
    drain_separate_calls: bool,
    /// Where the JSON results go.
    #[arg(long, value_name = "DIR", default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    results_dir: PathBuf,
    /// Do not write the JSON file.
    #[arg(long)]
    no_json: bool,
    /// Every connection's task shares ONE client (one HTTP/2 connection) instead of opening
    /// its own: each of the --connections counts is then the number of concurrent tasks
    /// calling one client, each with one call in flight.
    #[arg(long)]
    shared_client: bool,
    /// Builds the clients with `coalesce(false)`: one EnqueueBatch per enqueue, even when
    /// concurrent enqueues share a client.
    #[arg(long)]
    no_coalesce: bool,
    /// The clients' `max_batches_in_flight` (default: the client's).
    #[arg(long, value_name = "N")]
    max_batches_in_flight: Option<usize>,
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
    published_jobs: usize,
    modes: Vec<Mode>,
    server_bin: PathBuf,
    data_parent: PathBuf,
    clk_tck: u64,
    run_id: String,
}

fn plan(cli: &Cli, run_id: String) -> Result<Plan, BoxError> {
    let quick = cli.quick;
    // (name, seconds, warm-up seconds, published jobs)
    let (preset, dur, warm, jobs) = match (cli.published, quick, cli.full) {
        (_, true, _) => ("quick", 1.5, 0.25, 20_000),
        (true, false, false) => ("published", 5.0, 0.5, 20_000),
        _ => ("full", 10.0, 1.0, 200_000),
    };
    let secs = |x: f64, what: &str| -> Result<Duration, BoxError> {
        Duration::try_from_secs_f64(x).map_err(|_| format!("{what} {x} is not a duration").into())
    };
    let duration = secs(cli.duration.unwrap_or(dur), "--duration")?;
    if duration.is_zero() {
        return Err("--duration must be positive".into());
    }
    let warmup = secs(cli.warmup.unwrap_or(warm), "--warmup")?;
    if cli.connections.is_empty() || cli.connections.contains(&0) {
        return Err("--connections needs positive counts".into());
    }
    if cli.published_connections.is_empty() || cli.published_connections.contains(&0) {
        return Err("--published-connections needs positive counts".into());
    }
    let published_jobs = cli.published_jobs.unwrap_or(jobs);
    if published_jobs == 0 {
        return Err("--published-jobs must be positive".into());
    }
    if cli.payload_bytes == 0 {
        return Err(
            "--payload-bytes must be at least 1 (the protocol forbids empty payloads)".into(),
        );
    }
    let mut workloads = if !cli.workloads.is_empty() {
        cli.workloads.clone()
    } else if cli.published {
        vec![Workload::Published]
    } else {
        Workload::ALL.to_vec()
    };
    // The published method includes the single-connection cycle latency.
    if let Some(i) = workloads.iter().position(|w| *w == Workload::Published)
        && !workloads.contains(&Workload::Cycle)
    {
        workloads.insert(i + 1, Workload::Cycle);
    }
    let modes = if !cli.mode.is_empty() {
        cli.mode.clone()
    } else if cli.published {
        vec![Mode::SyncData, Mode::Buffer]
    } else if quick {
        vec![Mode::SyncAll]
    } else {
        vec![Mode::SyncAll, Mode::Buffer]
    };
    Ok(Plan {
        preset,
        duration,
        warmup,
        connections: cli.connections.clone(),
        workloads,
        published_jobs,
        modes,
        server_bin: cli.server_bin.clone().unwrap_or_else(default_server_bin),
        data_parent: cli.data_dir.clone().unwrap_or_else(std::env::temp_dir),
        clk_tck: server::clock_ticks(),
        run_id,
    })
}

/// Runs one point (or one phase of `published`), prints its line and returns its report, or
/// the reason it failed.
async fn measure(
    spec: PointSpec,
    plan: &Plan,
    mode: &str,
    drain_jobs: Option<usize>,
) -> Result<PointReport, String> {
    let pid = spec.server_pid;
    let workload = spec.workload;
    let conns = spec.connections;
    let queue = spec.queue.clone();
    let peak_rss_reset = pid.is_some_and(server::reset_peak_rss);
    let loadavg = server::loadavg();
    let measured = workload::run_point(spec)
        .await
        .map_err(|e| format!("{} c={conns} failed: {e}", workload.name()))?;
    let ctx = PointContext {
        workload,
        connections: conns,
        queue,
        drain_jobs,
        clk_tck: plan.clk_tck,
        peak_rss_mib: pid.and_then(|p| procfs::proc_status_mib(p, "VmHWM")),
        peak_rss_reset,
        rss_mib: pid.and_then(|p| procfs::proc_status_mib(p, "VmRSS")),
        loadavg_1m: loadavg,
    };
    let point = PointReport::new(measured, ctx);
    println!("{}", point.line(mode));
    for (msg, n) in &point.messages {
        println!("    {n} × {msg}");
    }
    Ok(point)
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
    let payload = Arc::new(Payloads::new(cli.payload_bytes, cli.payload_random));
    // Drain rate estimate (jobs/s) used to size the next drain point.
    let mut drain_rate = 1000.0_f64;
    let mut drain_conns = 1usize;
    let mut seq = 0usize;
    for &workload in &plan.workloads {
        let conn_list: Vec<usize> = match workload {
            Workload::Cycle => vec![1],
            Workload::Published => cli.published_connections.clone(),
            _ => plan.connections.clone(),
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
            let pid = server.as_deref().map(|s| s.pid).or(cli.server_pid);
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
                queue,
                payload: payload.clone(),
                hit_keys: cli.hit_keys.max(1),
                drain_jobs: drain_jobs.unwrap_or(0),
                drain_cap: plan.duration * 3 + Duration::from_secs(2),
                drain_separate_calls: cli.drain_separate_calls,
                published_jobs: plan.published_jobs,
                published_keyed: cli.published_keyed,
                duration: plan.duration,
                warmup: plan.warmup,
                server_pid: pid,
                client: ClientSpec {
                    shared: cli.shared_client,
                    coalesce: !cli.no_coalesce,
                    max_batches_in_flight: cli.max_batches_in_flight,
                },
            };
            let result = if workload == Workload::Published {
                published(spec, plan, mode, run).await
            } else {
                measure(spec, plan, mode, drain_jobs).await.map(|point| {
                    if workload == Workload::Drain && point.jobs_per_s > 0.0 {
                        drain_rate = point.jobs_per_s;
                        drain_conns = conns;
                    }
                    run.points.push(point);
                })
            };
            if let Err(msg) = result {
                eprintln!("{mode}: {msg}");
                run.failure = Some(msg);
                return;
            }
        }
    }
}

/// The two phases of `published` on one queue: the producers enqueue every job, then as many
/// workers drain exactly the jobs that were enqueued. Each phase is its own report row.
async fn published(
    spec: PointSpec,
    plan: &Plan,
    mode: &str,
    run: &mut ModeRun,
) -> Result<(), String> {
    let enqueue = PointSpec {
        workload: Workload::PublishedEnqueue,
        ..spec.clone()
    };
    let point = measure(enqueue, plan, mode, None).await?;
    let enqueued = usize::try_from(point.jobs).unwrap_or(usize::MAX);
    run.points.push(point);
    // Generous: a drain of a healthy server ends long before, and one that finds the queue
    // empty early stops at once.
    let cap = Duration::from_secs(60) + Duration::from_secs_f64(enqueued as f64 / 200.0);
    let drain = PointSpec {
        workload: Workload::PublishedDrain,
        drain_jobs: enqueued,
        drain_cap: cap,
        ..spec
    };
    let point = measure(drain, plan, mode, Some(enqueued)).await?;
    run.points.push(point);
    Ok(())
}

/// Open files beyond one per connection: the server's storage files, the bench's own.
const FD_HEADROOM: u64 = 256;

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
            open_files_limit: None,
        },
        settings: Settings {
            preset: plan.preset,
            duration_s: plan.duration.as_secs_f64(),
            warmup_s: plan.warmup.as_secs_f64(),
            connections: plan.connections.clone(),
            workloads: plan.workloads.clone(),
            published_jobs: plan.published_jobs,
            published_connections: cli.published_connections.clone(),
            published_keyed: cli.published_keyed,
            modes: if cli.target.is_some() {
                Vec::new()
            } else {
                plan.modes.iter().map(|m| m.as_str().to_string()).collect()
            },
            payload_bytes: cli.payload_bytes,
            payload_random: cli.payload_random,
            hit_keys: cli.hit_keys,
            shared_client: cli.shared_client,
            coalesce: !cli.no_coalesce,
            max_batches_in_flight: cli.max_batches_in_flight,
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
    let swept = plan
        .workloads
        .iter()
        .any(|w| !matches!(w, Workload::Cycle | Workload::Published));
    println!(
        "sepp-bench: {} points of {:.1} s (+{:.2} s warm-up), {}-byte {} payloads, workloads {}{}",
        plan.preset,
        plan.duration.as_secs_f64(),
        plan.warmup.as_secs_f64(),
        cli.payload_bytes,
        if cli.payload_random {
            "random"
        } else {
            "repeated-byte"
        },
        plan.workloads
            .iter()
            .map(|w| w.name())
            .collect::<Vec<_>>()
            .join(","),
        if swept {
            format!(", connections {:?}", plan.connections)
        } else {
            String::new()
        }
    );
    if plan.workloads.contains(&Workload::Published) {
        println!(
            "published: {} jobs ({}), producers then workers {:?}",
            report::fmt_int(plan.published_jobs as f64),
            if cli.published_keyed {
                "fresh idempotency key each"
            } else {
                "no idempotency key"
            },
            cli.published_connections
        );
    }
    // One socket per connection in the bench and in the server it starts (which inherits
    // the limit), plus the server's storage files.
    let most = plan
        .workloads
        .iter()
        .map(|w| match w {
            Workload::Cycle => 1,
            Workload::Published => cli.published_connections.iter().copied().max().unwrap_or(1),
            _ => plan.connections.iter().copied().max().unwrap_or(1),
        })
        .max()
        .unwrap_or(1) as u64;
    let need = most + FD_HEADROOM;
    match server::raise_open_files_limit() {
        Some(limit) => {
            report.host.open_files_limit = Some(limit);
            if limit < need {
                return Err(format!(
                    "{most} connections need about {need} open files in the bench and the \
                     server, but the limit is {limit} (`ulimit -n`; the hard limit too)"
                )
                .into());
            }
        }
        None => eprintln!("sepp-bench: cannot read the open files limit (RLIMIT_NOFILE)"),
    }
    if cli.target.is_some() && most > 500 {
        println!(
            "note: the server at --target needs {need} open files too; a sepp started with a \
             lower `ulimit -n` spins on failed accepts instead of serving"
        );
    }

    let mut ok = true;
    if let Some(target) = &cli.target {
        match cli.server_pid {
            Some(pid) => println!("driving {target} (server pid {pid})"),
            None => println!("driving {target} (no server CPU or RSS figures)"),
        }
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
    let published = report::published_markdown(&report);
    if !published.is_empty() {
        println!();
        print!("{published}");
    }
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
