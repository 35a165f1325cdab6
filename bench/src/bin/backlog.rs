//! A large backlog: what N stored jobs cost the embedded server in memory and disk, how fast it
//! still takes in and hands out work, and how long it takes to come back after a restart.
//!
//! For each N (an empty server first, as the baseline), on a fresh release `sepp` with the
//! default config (`sync_all`) except `[limits] max_enqueue_batch = 1000`, in a fresh data
//! directory:
//!
//! 1. fill: N jobs through `EnqueueBatch` calls of 1,000 (4 callers), spread round-robin over
//!    QUEUES queues, unkeyed, PAYLOAD-byte payloads; every other job is scheduled 20 days out
//!    (plus its number in milliseconds, so that due times differ), the rest ready;
//! 2. memory and disk: the server's RSS and the data directory's size (blocks allocated, as
//!    `du` counts), right after the fill and again after SETTLE seconds (the table shows the
//!    RSS after SETTLE, per stored job with the empty server's figure subtracted);
//! 3. enqueue: SECS seconds of unkeyed single-job enqueues (`EnqueueBatch` of one, the client's
//!    coalescing off) from 32 callers, each its own connection with one call in flight, on the
//!    filled queues;
//! 4. reserve + ack: SECS seconds of 32 callers, each reserving up to 16 jobs from all the
//!    queues and acking each; before it, the ready stock is topped up to STOCK jobs if the
//!    server holds fewer (the empty server), so that no caller runs dry;
//! 5. restart: SIGTERM, wait for the exit, start the server again on the same directory and
//!    time from spawn until it prints its address and until it answers `GetQueueStats` for
//!    every queue; the stored count (ready + scheduled + in flight over the queues) must equal
//!    the count read before the stop, or the run fails. The data directory's size after the
//!    restart (fjall's journals replayed into tables), over N, is the table's disk figure.
//!
//! Prints one JSON object per N on stdout as it goes, then a markdown table.
//!
//! ```text
//! backlog SERVER_BIN N[,N...] [--queues 4] [--secs 5] [--payload 256] [--settle 5]
//!         [--stock 100000] [--dir DIR] [--no-baseline]
//! ```

#[path = "../procfs.rs"]
#[allow(dead_code)]
mod procfs;
#[path = "../server.rs"]
#[allow(dead_code)]
mod server;

use clap::Parser;
use sepp_rs::{EnqueueRequest, ReserveOptions, SeppClient};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Memory, disk, throughput and restart time of the embedded server at N stored jobs.
#[derive(Parser)]
#[command(name = "backlog")]
struct Args {
    /// The release `sepp` binary.
    server_bin: PathBuf,
    /// Stored job counts, comma separated (an empty server runs first unless --no-baseline).
    #[arg(value_delimiter = ',')]
    jobs: Vec<u64>,
    /// Queues the jobs are spread over.
    #[arg(long, default_value_t = 4)]
    queues: usize,
    /// Seconds of each throughput measurement.
    #[arg(long, default_value_t = 5.0)]
    secs: f64,
    /// Payload bytes per job.
    #[arg(long, default_value_t = 256)]
    payload: usize,
    /// Seconds to wait after the fill before the second memory reading.
    #[arg(long, default_value_t = 5.0)]
    settle: f64,
    /// Ready jobs the reserve measurement needs in stock (topped up on a smaller server).
    #[arg(long, default_value_t = 100_000)]
    stock: u64,
    /// Parent of the server directories (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Skip the empty server.
    #[arg(long)]
    no_baseline: bool,
}

/// A running `sepp`.
struct Server {
    child: Child,
    pid: u32,
    url: String,
    /// Seconds from spawn to the readiness line.
    ready_line_s: f64,
}

impl Server {
    fn start(bin: &Path, config: &Path) -> Result<(Self, Instant), BoxError> {
        let t0 = Instant::now();
        let mut cmd = Command::new(bin);
        cmd.arg("--config")
            .arg(config)
            .stderr(Stdio::inherit())
            .env("SEPP_LOG", "warn");
        let (child, addr) = server::spawn_ready(&mut cmd, Duration::from_secs(1800))?;
        Ok((
            Server {
                pid: child.id(),
                child,
                url: format!("http://{addr}"),
                ready_line_s: t0.elapsed().as_secs_f64(),
            },
            t0,
        ))
    }

    fn rss_mib(&self) -> f64 {
        procfs::proc_status_mib(self.pid, "VmRSS").unwrap_or(f64::NAN)
    }

    fn peak_mib(&self) -> f64 {
        procfs::proc_status_mib(self.pid, "VmHWM").unwrap_or(f64::NAN)
    }

    /// SIGTERM, then waits for the exit; returns the seconds it took.
    fn stop(mut self) -> Result<f64, BoxError> {
        let t0 = Instant::now();
        Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()?;
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!("the server exited with {status} after SIGTERM").into());
        }
        Ok(t0.elapsed().as_secs_f64())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn queue_name(i: usize) -> String {
    format!("backlog-{i}")
}

async fn client(url: &str) -> Result<SeppClient, BoxError> {
    Ok(SeppClient::builder(url.to_string())
        .coalesce(false)
        .connect()
        .await?)
}

/// Enqueues jobs `from..to` (numbered across runs so that their due times differ) in batches of
/// 1,000 from 4 callers; odd-numbered jobs are scheduled when `schedule_odd`.
async fn fill(
    url: &str,
    queues: usize,
    payload: usize,
    from: u64,
    to: u64,
    schedule_odd: bool,
) -> Result<(), BoxError> {
    const BATCH: u64 = 1000;
    let next = Arc::new(AtomicU64::new(from));
    let base = SystemTime::now() + Duration::from_secs(20 * 24 * 3600);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let c = client(url).await?;
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(BATCH, Ordering::Relaxed);
                if start >= to {
                    return Ok::<(), BoxError>(());
                }
                let end = (start + BATCH).min(to);
                let q = queue_name((start / BATCH) as usize % queues);
                let mut reqs = Vec::with_capacity((end - start) as usize);
                for n in start..end {
                    let mut r = EnqueueRequest::new(q.clone(), "backlog")?
                        .with_payload(vec![b'p'; payload], "application/octet-stream");
                    if schedule_odd && n % 2 == 1 {
                        r = r.with_scheduled_at(base + Duration::from_millis(n));
                    }
                    reqs.push(r);
                }
                for r in c.enqueue_batch(reqs).await? {
                    r?;
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Ready, scheduled and in flight over the queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
struct Count {
    ready: u64,
    scheduled: u64,
    in_flight: u64,
}

impl Count {
    fn stored(&self) -> u64 {
        self.ready + self.scheduled + self.in_flight
    }
}

async fn count(c: &SeppClient, queues: usize) -> Result<Count, BoxError> {
    let mut n = Count::default();
    for i in 0..queues {
        let s = c.get_queue_stats(&queue_name(i)).await?;
        n.ready += s.ready;
        n.scheduled += s.scheduled;
        n.in_flight += s.in_flight;
    }
    Ok(n)
}

/// Jobs per second over `secs` of 32 callers, each with its own client, each calling `step`
/// (which returns the jobs it finished) in a loop until the time is up. `step` gets the
/// client and the caller's number.
async fn timed_rate<F, Fut>(url: &str, secs: f64, step: F) -> Result<f64, BoxError>
where
    F: Fn(Arc<SeppClient>, usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<u64, BoxError>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..32 {
        let c = Arc::new(client(url).await?);
        let (stop, done, step) = (stop.clone(), done.clone(), step.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = step(c.clone(), w).await?;
                done.fetch_add(n, Ordering::Relaxed);
            }
            Ok::<(), BoxError>(())
        }));
    }
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let n = done.load(Ordering::Relaxed);
    let elapsed = t0.elapsed().as_secs_f64();
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / elapsed)
}

/// Jobs per second of 32 single-job enqueue callers over `secs`.
async fn enqueue_rate(
    url: &str,
    queues: usize,
    payload: usize,
    secs: f64,
) -> Result<f64, BoxError> {
    timed_rate(url, secs, move |c, w| async move {
        let r = EnqueueRequest::new(queue_name(w % queues), "probe")?
            .with_payload(vec![b'e'; payload], "application/octet-stream");
        c.enqueue(r).await?;
        Ok(1)
    })
    .await
}

/// Acked jobs per second of 32 callers (reserve up to 16 from every queue, ack each) over
/// `secs`; every reserved job is acked before it returns. Fails if a caller finds no job.
async fn reserve_ack_rate(url: &str, queues: usize, secs: f64) -> Result<f64, BoxError> {
    let names: Arc<Vec<String>> = Arc::new((0..queues).map(queue_name).collect());
    timed_rate(url, secs, move |c, _| {
        let names = names.clone();
        async move {
            let jobs = c
                .reserve(
                    ReserveOptions::new(names.to_vec(), Duration::from_secs(60))
                        .with_max_jobs(16)
                        .with_wait_timeout(Duration::ZERO),
                )
                .await?;
            if jobs.is_empty() {
                return Err::<u64, BoxError>("the ready stock ran out; raise --stock".into());
            }
            for j in &jobs {
                c.ack(&j.id, j.attempt).await?;
            }
            Ok(jobs.len() as u64)
        }
    })
    .await
}

/// Waits until `url` answers `GetQueueStats` for every queue; returns the count.
async fn wait_answering(url: &str, queues: usize) -> Result<Count, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let attempt = async {
            let c = client(url).await?;
            count(&c, queues).await
        };
        match attempt.await {
            Ok(n) => return Ok(n),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

#[derive(Debug, serde::Serialize)]
struct Point {
    jobs: u64,
    queues: usize,
    payload_bytes: usize,
    fill_s: f64,
    fill_jobs_per_s: f64,
    rss_after_fill_mib: f64,
    rss_settled_mib: f64,
    peak_rss_mib: f64,
    disk_after_fill_mib: f64,
    disk_settled_mib: f64,
    enqueue_jobs_per_s: f64,
    reserve_ack_jobs_per_s: f64,
    stored_before_restart: u64,
    shutdown_s: f64,
    restart_ready_line_s: f64,
    restart_answering_s: f64,
    stored_after_restart: u64,
    rss_after_restart_mib: f64,
    disk_after_restart_mib: f64,
    load_average: f64,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Bytes allocated to the files under `p` (as `du` counts them, not their lengths: fjall
/// creates its journal files at their full size), recursively.
fn disk_bytes(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = std::fs::read_dir(p) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// The 1-minute load average (other work on the machine skews the rates).
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

async fn run_point(args: &Args, parent: &Path, n: u64) -> Result<Point, BoxError> {
    let dir = parent.join(format!("sepp-backlog-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let data = dir.join("data");
    let config = dir.join("sepp.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten_addr = \"127.0.0.1:0\"\ndb_path = {:?}\n\n[storage]\n\
             persist_mode = \"sync_all\"\n\n[limits]\nmax_enqueue_batch = 1000\n",
            data.display().to_string()
        ),
    )?;
    let result = async {
        let (server, _) = Server::start(&args.server_bin, &config)?;
        let c = client(&server.url).await?;
        let t0 = Instant::now();
        fill(&server.url, args.queues, args.payload, 0, n, true).await?;
        let fill_s = t0.elapsed().as_secs_f64();
        let rss_after_fill_mib = server.rss_mib();
        let disk_after_fill_mib = mib(disk_bytes(&data));
        let filled = count(&c, args.queues).await?;
        if filled.stored() != n {
            return Err(format!("{} jobs stored after filling {n}", filled.stored()).into());
        }
        tokio::time::sleep(Duration::from_secs_f64(args.settle)).await;
        let rss_settled_mib = server.rss_mib();
        let disk_settled_mib = mib(disk_bytes(&data));
        eprintln!(
            "backlog: {n} jobs filled in {fill_s:.1} s, RSS {rss_settled_mib:.0} MiB, disk {disk_settled_mib:.0} MiB"
        );

        let enqueue_jobs_per_s =
            enqueue_rate(&server.url, args.queues, args.payload, args.secs).await?;
        let ready = count(&c, args.queues).await?.ready;
        if ready < args.stock {
            // Numbered past every earlier job, all ready.
            let from = 1u64 << 40;
            fill(
                &server.url,
                args.queues,
                args.payload,
                from,
                from + (args.stock - ready),
                false,
            )
            .await?;
        }
        let reserve_ack_jobs_per_s = reserve_ack_rate(&server.url, args.queues, args.secs).await?;
        let before = count(&c, args.queues).await?;
        let peak_rss_mib = server.peak_mib();
        drop(c);
        eprintln!(
            "backlog: {n}: enqueue {enqueue_jobs_per_s:.0}/s, reserve+ack {reserve_ack_jobs_per_s:.0}/s; restarting"
        );

        let shutdown_s = server.stop()?;
        let (server, t0) = Server::start(&args.server_bin, &config)?;
        let after = wait_answering(&server.url, args.queues).await?;
        let restart_answering_s = t0.elapsed().as_secs_f64();
        if after != before {
            return Err(format!(
                "after the restart the server holds {after:?}, before it held {before:?}"
            )
            .into());
        }
        let point = Point {
            jobs: n,
            queues: args.queues,
            payload_bytes: args.payload,
            fill_s,
            fill_jobs_per_s: n as f64 / fill_s.max(1e-9),
            rss_after_fill_mib,
            rss_settled_mib,
            peak_rss_mib,
            disk_after_fill_mib,
            disk_settled_mib,
            enqueue_jobs_per_s,
            reserve_ack_jobs_per_s,
            stored_before_restart: before.stored(),
            shutdown_s,
            restart_ready_line_s: server.ready_line_s,
            restart_answering_s,
            stored_after_restart: after.stored(),
            rss_after_restart_mib: server.rss_mib(),
            disk_after_restart_mib: mib(disk_bytes(&data)),
            load_average: loadavg(),
        };
        server.stop()?;
        Ok::<Point, BoxError>(point)
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("backlog: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), BoxError> {
    let parent = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let mut ns = Vec::new();
    if !args.no_baseline {
        ns.push(0);
    }
    ns.extend(args.jobs.iter().copied().filter(|&n| n > 0));
    let mut points = Vec::new();
    for n in ns {
        let p = run_point(args, &parent, n).await?;
        println!("{}", serde_json::to_string(&p)?);
        points.push(p);
    }
    let base = points.iter().find(|p| p.jobs == 0);
    println!();
    println!(
        "| stored jobs | RSS MiB | RSS B/job | disk MiB | disk B/job | enqueue/s | vs empty | reserve+ack/s | vs empty | restart s | exact |"
    );
    println!("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|");
    for p in &points {
        let per_job = |v: f64, b: f64| {
            if p.jobs == 0 {
                "-".to_string()
            } else {
                format!("{:.0}", (v - b) * 1024.0 * 1024.0 / p.jobs as f64)
            }
        };
        let ratio = |v: f64, b: Option<f64>| match b {
            Some(b) if p.jobs > 0 && b > 0.0 => format!("{:.2}", v / b),
            _ => "-".to_string(),
        };
        println!(
            "| {} | {:.0} | {} | {:.0} | {} | {:.0} | {} | {:.0} | {} | {:.2} | {} |",
            p.jobs,
            p.rss_settled_mib,
            per_job(p.rss_settled_mib, base.map_or(0.0, |b| b.rss_settled_mib)),
            p.disk_after_restart_mib,
            // Not less the empty server's: its measurement left jobs' remains on disk too.
            per_job(p.disk_after_restart_mib, 0.0),
            p.enqueue_jobs_per_s,
            ratio(p.enqueue_jobs_per_s, base.map(|b| b.enqueue_jobs_per_s)),
            p.reserve_ack_jobs_per_s,
            ratio(
                p.reserve_ack_jobs_per_s,
                base.map(|b| b.reserve_ack_jobs_per_s)
            ),
            p.restart_answering_s,
            if p.stored_after_restart == p.stored_before_restart {
                "yes"
            } else {
                "no"
            },
        );
    }
    Ok(())
}
