//! Fill-and-expire cycles: does memory and disk come back after dedup records expire?
//!
//! Each cycle enqueues N keyed jobs (256-byte payloads, batches of 250, fresh keys), drains
//! them (reserve up to 256, ack each), waits for the queue's dedup window to pass and the
//! sweeper to purge the records, then prints the server's RSS and peak RSS (from
//! `/proc/PID/status`), the dedup record count and the data directory's size. Start the
//! server with a short window, for example `[storage] dedup_window_ms = 3000`. SETTLE_SECS
//! (default 8) is the quiet time after the sweep before the figures are read: the server seals
//! its memtables after 5 s without writes.
//!
//! ```text
//! dedup_cycle URL SERVER_PID DATA_DIR JOBS_PER_CYCLE CYCLES [SETTLE_SECS]
//! ```

#[path = "../procfs.rs"]
mod procfs;

use sepp_rs::{EnqueueRequest, ReserveOptions, SeppClient};
use std::time::{Duration, Instant};

/// Prints a failure as its text (with the error's code), not as a debug struct.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    eprintln!("dedup_cycle: {e}");
    std::process::ExitCode::FAILURE
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (url, pid, dir, jobs, cycles, settle) = match args.as_slice() {
        [_, url, pid, dir, jobs, cycles] => (url, pid, dir, jobs, cycles, 8),
        [_, url, pid, dir, jobs, cycles, settle] => (url, pid, dir, jobs, cycles, settle.parse()?),
        _ => {
            eprintln!(
                "usage: dedup_cycle URL SERVER_PID DATA_DIR JOBS_PER_CYCLE CYCLES [SETTLE_SECS]"
            );
            std::process::exit(2);
        }
    };
    let (jobs, cycles): (usize, usize) = (jobs.parse()?, cycles.parse()?);
    let pid: u32 = pid.parse()?;
    let mib = |field: &str| procfs::proc_status_mib(pid, field).unwrap_or(0.0);
    let disk_mib = || procfs::dir_size(std::path::Path::new(dir)) as f64 / (1024.0 * 1024.0);
    let client = SeppClient::connect(url.clone()).await?;
    let window = client
        .get_server_info()
        .await?
        .dedup_window
        .unwrap_or_default();
    println!(
        "| cycle | jobs | seconds | RSS MiB after drain | RSS MiB after expiry | peak RSS MiB | dedup records | disk MiB |"
    );
    println!("|--:|--:|--:|--:|--:|--:|--:|--:|");
    for cycle in 0..cycles {
        let t0 = Instant::now();
        for b in 0..jobs.div_ceil(250) {
            let requests = (0..250)
                .map(|i| {
                    EnqueueRequest::new("dedup-cycle", "t").map(|r| {
                        r.with_payload(vec![7u8; 256], "application/octet-stream")
                            .with_idempotency_key(format!("cycle{cycle}-{b}-{i}-0123456789abcdef"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            for r in client.enqueue_batch(requests).await? {
                r?;
            }
        }
        let mut drained = 0;
        while drained < jobs {
            let batch = client
                .reserve(
                    ReserveOptions::new(["dedup-cycle"], Duration::from_secs(60))
                        .with_max_jobs(256),
                )
                .await?;
            for j in &batch {
                client.ack(&j.id, j.attempt).await?;
            }
            drained += batch.len();
        }
        let after_drain = mib("VmRSS");
        // Past the window, until the sweeper has purged every record, then the quiet time.
        tokio::time::sleep(window).await;
        while client.get_queue_stats("dedup-cycle").await?.dedup_records > 0 {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        tokio::time::sleep(Duration::from_secs(settle)).await;
        let stats = client.get_queue_stats("dedup-cycle").await?;
        println!(
            "| {cycle} | {jobs} | {:.1} | {after_drain:.0} | {:.0} | {:.0} | {} | {:.0} |",
            t0.elapsed().as_secs_f64(),
            mib("VmRSS"),
            mib("VmHWM"),
            stats.dedup_records,
            disk_mib()
        );
    }
    Ok(())
}
