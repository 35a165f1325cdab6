//! Memory of long polls on ever new queue names (issue 12, `make soak-long-poll`): starts a
//! sepp server, sends RESERVES long-poll Reserves (each waits WAIT_MS on an empty queue whose
//! name no other Reserve uses) on CONNECTIONS connections, and prints the server's RSS before,
//! during and after.
//!
//! A waiting Reserve registers a wake-up signal under its queue's name; the signal must go
//! when nobody waits on the queue any more, or these names would pile up in server memory
//! without bound. The start figure is taken after a warm-up of WARMUP Reserves on their own
//! names (so that connection buffers and the allocator have settled). Exits 1 when the RSS
//! after the run is more than 10 MiB above the start figure, or a Reserve fails.
//!
//! ```text
//! long-poll-names SERVER_BIN [RESERVES=200000] [CONNECTIONS=64] [WAIT_MS=1]
//! ```

#[path = "../procfs.rs"]
#[allow(dead_code)]
mod procfs;
#[path = "../server.rs"]
#[allow(dead_code)]
mod server;

use sepp_rs::{ReserveOptions, SeppClient};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const WARMUP: usize = 10_000;
const LIMIT_MIB: f64 = 10.0;

use server::{BoxError, ServerProcess};

/// Sends Reserves on queues `lp-<prefix>-<n>` for `n` in `0..count`, spread over `clients`.
async fn reserves(
    clients: &[SeppClient],
    prefix: &str,
    count: usize,
    wait: Duration,
) -> Result<(), BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in clients {
        let (c, next, prefix) = (c.clone(), next.clone(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return Ok::<(), BoxError>(());
                }
                let opts =
                    ReserveOptions::new([format!("lp-{prefix}-{n}")], Duration::from_secs(30))
                        .with_wait_timeout(wait);
                let jobs = c.reserve(opts).await?;
                if !jobs.is_empty() {
                    return Err("a reserve on a fresh queue name got a job".into());
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

fn rss(pid: u32) -> f64 {
    procfs::proc_status_mib(pid, "VmRSS").unwrap_or(f64::NAN)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let Some(bin) = args.get(1) else {
        eprintln!(
            "usage: long-poll-names SERVER_BIN [RESERVES=200000] [CONNECTIONS=64] [WAIT_MS=1]"
        );
        std::process::exit(2);
    };
    let arg = |i: usize, default: u64| -> u64 {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    let count = arg(2, 200_000) as usize;
    let connections = arg(3, 64) as usize;
    let wait = Duration::from_millis(arg(4, 1));

    let server = ServerProcess::start_default(bin)?;
    let pid = server.pid;

    let result = async {
        let clients = server.clients(connections).await?;
        reserves(&clients, "warmup", WARMUP, wait).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start = rss(pid);
        println!(
            "sepp pid {pid}: {connections} connections, {WARMUP} warm-up reserves; start RSS {start:.1} MiB"
        );
        let t0 = Instant::now();
        let mut peak = start;
        let step = count.div_ceil(10).max(1);
        let mut done = 0;
        while done < count {
            let n = step.min(count - done);
            reserves(&clients, &format!("run{done}"), n, wait).await?;
            done += n;
            let now = rss(pid);
            peak = peak.max(now);
            println!(
                "  {done:>7} reserves on distinct queue names, {:>5.1} s: RSS {now:.1} MiB",
                t0.elapsed().as_secs_f64()
            );
        }
        // Let the server return what it freed (idle connections stay open).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let end = rss(pid);
        println!(
            "{count} long-poll reserves ({} ms wait each) on distinct queue names in {:.1} s: \
             RSS start {start:.1} MiB, peak {peak:.1} MiB, end {end:.1} MiB ({:+.1} MiB)",
            wait.as_millis(),
            t0.elapsed().as_secs_f64(),
            end - start
        );
        Ok::<f64, BoxError>(end - start)
    }
    .await;

    drop(server);
    let grew = result?;
    if grew > LIMIT_MIB {
        eprintln!("long-poll-names: RSS grew {grew:.1} MiB, more than {LIMIT_MIB} MiB");
        std::process::exit(1);
    }
    Ok(())
}
