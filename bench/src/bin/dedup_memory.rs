//! Memory and disk of a large dedup index, and enqueue latency while the sweeper purges it.
//!
//! 1. Fills queue `dedup-memory` with RECORDS keyed jobs (KEY_BYTES-byte keys, 16-byte
//!    payloads, batches of 250 on 4 connections), then drains them (reserve 256, ack each, on 16
//!    connections), so that only the dedup records (and the jobs' tombstones, which live as long
//!    as their record) remain.
//! 2. Prints the server's RSS and the data directory's size with the records live.
//! 3. Runs a probe (8 connections, each a keyed enqueue on queue `dedup-probe` every 4 ms, so
//!    2,000 enqueues/s in all, 16-byte payloads) for PROBE_SECS with no sweep due: the baseline
//!    p50/p99.
//! 4. Starts the probe again 3 s before the first record expires (the server's dedup window,
//!    counted from each record's enqueue) and keeps it running through the sweep (the records,
//!    then their jobs' tombstones: as long again after the record count reaches zero), printing
//!    per second the probe's p99 and the record count; then drains the probe's jobs and prints
//!    RSS and disk after the sweep and again after SETTLE_SECS.
//!
//! Start the server with a dedup window long enough for steps 1-3 (`[storage] dedup_window_ms`,
//! for example 120000 for a million records on 2 cores), a short one for the probe queue (so
//! that its own records are gone by the end), and pass its pid and data directory:
//!
//! ```toml
//! [storage]
//! dedup_window_ms = 120000
//! [[queues]]
//! name = "dedup-probe"
//! dedup_window_ms = 5000
//! ```
//!
//! ```text
//! dedup_memory URL SERVER_PID DATA_DIR [RECORDS] [KEY_BYTES] [PROBE_SECS] [SETTLE_SECS]
//! ```

#[path = "../procfs.rs"]
mod procfs;

use hdrhistogram::Histogram;
use sepp_rs::{EnqueueRequest, ReserveOptions, SeppClient};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const QUEUE: &str = "dedup-memory";
const PROBE_QUEUE: &str = "dedup-probe";

/// A key of exactly `len` bytes, unique per `n`.
fn key(prefix: &str, n: usize, len: usize) -> String {
    let mut k = format!("{prefix}{n:x}-");
    while k.len() < len {
        k.push('k');
    }
    k.truncate(len);
    k
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Fills the queue with `records` fresh keys; returns every call's latency.
async fn fill(url: &str, records: usize, key_bytes: usize) -> Result<Vec<Duration>, BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = SeppClient::connect(url.to_string()).await?;
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let start = next.fetch_add(250, Ordering::Relaxed);
                if start >= records {
                    return Ok::<Vec<Duration>, BoxError>(took);
                }
                let requests = (start..(start + 250).min(records))
                    .map(|n| {
                        EnqueueRequest::new(QUEUE, "t").map(|r| {
                            r.with_payload(vec![7u8; 16], "application/octet-stream")
                                .with_idempotency_key(key("m", n, key_bytes))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let t = Instant::now();
                let results = client.enqueue_batch(requests).await?;
                took.push(t.elapsed());
                for r in results {
                    if r?.deduplicated {
                        return Err("a fresh key was answered deduplicated".into());
                    }
                }
            }
        }));
    }
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await??);
    }
    took.sort();
    Ok(took)
}

/// Reserves and acks `records` jobs of `queue`; returns the slowest ack.
async fn drain_queue(url: &str, queue: &'static str, records: usize) -> Result<Duration, BoxError> {
    let acked = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let client = SeppClient::connect(url.to_string()).await?;
        let acked = acked.clone();
        tasks.push(tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            while acked.load(Ordering::Relaxed) < records {
                let jobs = client
                    .reserve(
                        ReserveOptions::new([queue], Duration::from_secs(300))
                            .with_max_jobs(256)
                            .with_wait_timeout(Duration::from_millis(200)),
                    )
                    .await?;
                for j in &jobs {
                    let t = Instant::now();
                    client.ack(&j.id, j.attempt).await?;
                    slowest = slowest.max(t.elapsed());
                }
                acked.fetch_add(jobs.len(), Ordering::Relaxed);
            }
            Ok::<Duration, BoxError>(slowest)
        }));
    }
    let mut slowest = Duration::ZERO;
    for t in tasks {
        slowest = slowest.max(t.await??);
    }
    Ok(slowest)
}

/// Keyed enqueues on 8 connections, each paced at one per 4 ms, until `stop`; every latency goes
/// into `hist` (µs).
async fn probe(
    url: &str,
    stop: Arc<AtomicBool>,
    hist: Arc<Mutex<Histogram<u64>>>,
) -> Result<Vec<tokio::task::JoinHandle<Result<(), BoxError>>>, BoxError> {
    let mut tasks = Vec::new();
    for c in 0..8 {
        let client = SeppClient::connect(url.to_string()).await?;
        let (stop, hist) = (stop.clone(), hist.clone());
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            let mut tick = tokio::time::interval(Duration::from_millis(4));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let r = EnqueueRequest::new(PROBE_QUEUE, "t")?
                    .with_payload(vec![1u8; 16], "application/octet-stream")
                    .with_idempotency_key(key(&format!("p{c}-"), n, 32));
                n += 1;
                let t = Instant::now();
                client.enqueue(r).await?;
                let us = t.elapsed().as_micros() as u64;
                hist.lock().expect("histogram").record(us.max(1))?;
            }
            Ok(())
        }));
    }
    Ok(tasks)
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Prints a failure as its text (with the error's code), not as a debug struct.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    eprintln!("dedup_memory: {e}");
    std::process::ExitCode::FAILURE
}

async fn run() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!(
            "usage: dedup_memory URL SERVER_PID DATA_DIR [RECORDS] [KEY_BYTES] [PROBE_SECS] [SETTLE_SECS]"
        );
        std::process::exit(2);
    }
    let (url, pid, dir) = (&args[1], &args[2], &args[3]);
    let arg = |i: usize, d: usize| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (records, key_bytes, probe_secs, settle_secs) =
        (arg(4, 1_000_000), arg(5, 32), arg(6, 10), arg(7, 30));
    let client = SeppClient::connect(url.clone()).await?;
    let window = client
        .get_server_info()
        .await?
        .dedup_window
        .unwrap_or_default();
    let pid: u32 = pid.parse()?;
    let rss = || procfs::proc_status_mib(pid, "VmRSS").unwrap_or(0.0);
    let dir_mib =
        |dir: &str| procfs::dir_size(std::path::Path::new(dir)) as f64 / (1024.0 * 1024.0);
    println!(
        "records {records}, keys {key_bytes} bytes, dedup window {:.0} s",
        window.as_secs_f64()
    );
    println!("start: RSS {:.0} MiB, disk {:.0} MiB", rss(), dir_mib(dir));

    let t0 = Instant::now();
    let calls = fill(url, records, key_bytes).await?;
    let filled = t0.elapsed();
    let at = |q: f64| {
        calls
            .get(((calls.len() as f64 * q) as usize).min(calls.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    };
    println!(
        "filled in {:.1} s: RSS {:.0} MiB, disk {:.0} MiB; {} EnqueueBatch calls of 250: p50 {:.1} ms, p99 {:.1} ms, slowest {:.1} ms",
        filled.as_secs_f64(),
        rss(),
        dir_mib(dir),
        calls.len(),
        at(0.5),
        at(0.99),
        calls.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    );
    let slowest_ack = drain_queue(url, QUEUE, records).await?;
    let stats = client.get_queue_stats(QUEUE).await?;
    println!(
        "drained at {:.1} s: RSS {:.0} MiB, disk {:.0} MiB, dedup records {}, ready {}; slowest ack {:.1} ms",
        t0.elapsed().as_secs_f64(),
        rss(),
        dir_mib(dir),
        stats.dedup_records,
        stats.ready,
        slowest_ack.as_secs_f64() * 1000.0
    );
    let live_rss = rss();

    // Baseline: no record is due yet.
    let stop = Arc::new(AtomicBool::new(false));
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let tasks = probe(url, stop.clone(), hist.clone()).await?;
    tokio::time::sleep(Duration::from_secs(probe_secs as u64)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    let base = std::mem::replace(&mut *hist.lock().expect("histogram"), Histogram::new(3)?);
    let first_expiry = window.saturating_sub(t0.elapsed());
    println!(
        "probe without a sweep ({probe_secs} s, first expiry in {:.0} s): {} enqueues, p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms",
        first_expiry.as_secs_f64(),
        base.len(),
        ms(base.value_at_quantile(0.5)),
        ms(base.value_at_quantile(0.99)),
        ms(base.value_at_quantile(0.999)),
    );
    if first_expiry.is_zero() {
        println!("warning: the window is shorter than fill + drain + probe; lengthen it");
    }

    // Through the expiry: from 3 s before it, one line per second while records remain.
    tokio::time::sleep(first_expiry.saturating_sub(Duration::from_secs(3))).await;
    stop.store(false, Ordering::Relaxed);
    let tasks = probe(url, stop.clone(), hist.clone()).await?;
    println!("| s | dedup records | probe enqueues | p50 ms | p99 ms | RSS MiB |");
    println!("|--:|--:|--:|--:|--:|--:|");
    let mut sweep = Histogram::<u64>::new(3)?;
    // The sweep purges the records first, then the tombstones of their jobs (as many, on the
    // same deadlines); the record count shows only the first half, so the probe runs on after
    // it reaches zero for as long again.
    let mut sweep_started: Option<Instant> = None;
    let mut records_gone: Option<Instant> = None;
    let deadline = Instant::now() + first_expiry + filled * 2 + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let h = std::mem::replace(&mut *hist.lock().expect("histogram"), Histogram::new(3)?);
        let left = client.get_queue_stats(QUEUE).await?.dedup_records;
        if left < records as u64 && sweep_started.is_none() {
            sweep_started = Some(Instant::now() - Duration::from_secs(1));
        }
        if sweep_started.is_some() {
            sweep.add(&h)?;
        }
        if left == 0 && sweep_started.is_some() && records_gone.is_none() {
            records_gone = Some(Instant::now());
        }
        println!(
            "| {:.0} | {left} | {} | {:.2} | {:.2} | {:.0} |",
            t0.elapsed().as_secs_f64(),
            h.len(),
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.99)),
            rss()
        );
        let tombstones_done = match (sweep_started, records_gone) {
            (Some(s), Some(g)) => g.elapsed() >= g - s,
            _ => false,
        };
        if tombstones_done || Instant::now() > deadline {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await??;
    }
    println!(
        "probe during the sweep: {} enqueues, p50 {:.2} ms, p99 {:.2} ms ({:.2}× the baseline p99), p999 {:.2} ms",
        sweep.len(),
        ms(sweep.value_at_quantile(0.5)),
        ms(sweep.value_at_quantile(0.99)),
        sweep.value_at_quantile(0.99) as f64 / base.value_at_quantile(0.99).max(1) as f64,
        ms(sweep.value_at_quantile(0.999)),
    );
    // The probe's own jobs would otherwise stay in the figures below.
    let probe_jobs = client.get_queue_stats(PROBE_QUEUE).await?.ready as usize;
    drain_queue(url, PROBE_QUEUE, probe_jobs).await?;
    println!(
        "after the sweep (and a drain of the probe's {probe_jobs} jobs): RSS {:.0} MiB (live: {live_rss:.0}), disk {:.0} MiB, dedup records {}",
        rss(),
        dir_mib(dir),
        client.get_queue_stats(QUEUE).await?.dedup_records
    );
    tokio::time::sleep(Duration::from_secs(settle_secs as u64)).await;
    println!(
        "{settle_secs} s later: RSS {:.0} MiB, disk {:.0} MiB, peak RSS {:.0} MiB",
        rss(),
        dir_mib(dir),
        procfs::proc_status_mib(pid, "VmHWM").unwrap_or(0.0)
    );
    Ok(())
}
