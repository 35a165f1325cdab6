//! What the key-conflict fingerprint costs in memory: RSS per live dedup record on the
//! embedded backend with `key_conflict = "ignore"` (no fingerprint) and `"reject"` (a 64-bit
//! fingerprint kept with each record).
//!
//! For each mode, ROUNDS times: starts the `sepp` binary SERVER_BIN on a fresh data directory
//! (queue `fp` declared with that mode, `persist_mode = "buffer"` to keep the fill short), reads
//! its RSS, enqueues RECORDS keyed jobs (32-byte keys, no payload, batches of 250 on 4
//! connections), waits until the server has been idle long enough to seal its memtables (the
//! flusher does after 5 s without writes) and the RSS has stopped moving, and reads it again.
//! The cost per record is (RSS after − RSS before) / RECORDS; it holds the job (ready, in the
//! in-memory index and fjall's memtables and block cache) as well as its dedup record, the
//! same in both modes, so the difference between the modes is the fingerprint's.
//!
//! ```text
//! dedup_fingerprint SERVER_BIN [RECORDS] [ROUNDS]
//! ```

#[path = "../procfs.rs"]
mod procfs;

use sepp_rs::{EnqueueRequest, SeppClient};
use sepp_server::testing::ServerProcess;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const QUEUE: &str = "fp";

fn key(n: usize) -> String {
    format!("{n:032x}")
}

async fn fill(url: &str, records: usize) -> Result<(), BoxError> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let client = SeppClient::connect(url.to_string()).await?;
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let start = next.fetch_add(250, Ordering::Relaxed);
                if start >= records {
                    return Ok::<(), BoxError>(());
                }
                let requests = (start..(start + 250).min(records))
                    .map(|n| {
                        EnqueueRequest::new(QUEUE, "t").map(|r| r.with_idempotency_key(key(n)))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                for r in client.enqueue_batch(requests).await? {
                    if r?.deduplicated {
                        return Err("a fresh key was answered deduplicated".into());
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// RSS in MiB once it has stopped moving: two readings 2 s apart within 1 MiB, after at least
/// 8 s of idleness (past the flusher's 5 s idle seal).
async fn settled_rss(pid: u32) -> f64 {
    tokio::time::sleep(Duration::from_secs(8)).await;
    let rss = || procfs::proc_status_mib(pid, "VmRSS").unwrap_or(0.0);
    let mut last = rss();
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = rss();
        if (now - last).abs() < 1.0 {
            return now;
        }
        last = now;
    }
    last
}

async fn measure(bin: &std::path::Path, mode: &str, records: usize) -> Result<f64, BoxError> {
    let dir = std::env::temp_dir().join(format!(
        "sepp-dedup-fingerprint-{}-{mode}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let toml = format!(
        "[server]\ndb_path = {:?}\n[storage]\npersist_mode = \"buffer\"\n\
         [[queues]]\nname = \"{QUEUE}\"\nkey_conflict = \"{mode}\"\n",
        dir.join("data")
    );
    let server = ServerProcess::start(bin, &dir, &toml);
    let pid = server.child.id();
    let before = settled_rss(pid).await;
    fill(&server.url(), records).await?;
    let after = settled_rss(pid).await;
    let disk = procfs::dir_size(&dir.join("data")) as f64 / (1024.0 * 1024.0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    let per_record = (after - before) * 1024.0 * 1024.0 / records as f64;
    println!("| {mode} | {records} | {before:.1} | {after:.1} | {per_record:.0} | {disk:.0} |");
    Ok(per_record)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    eprintln!("dedup_fingerprint: {e}");
    std::process::ExitCode::FAILURE
}

async fn run() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let Some(bin) = args.get(1) else {
        eprintln!("usage: dedup_fingerprint SERVER_BIN [RECORDS] [ROUNDS]");
        std::process::exit(2);
    };
    let arg = |i: usize, d: usize| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (records, rounds) = (arg(2, 1_000_000), arg(3, 2));
    let bin = std::path::PathBuf::from(bin);
    println!(
        "| key_conflict | records | RSS before MiB | RSS after MiB | bytes per record | disk MiB |"
    );
    println!("|---|--:|--:|--:|--:|--:|");
    let (mut ignore, mut reject) = (Vec::new(), Vec::new());
    // Alternate the modes, so that a drift of the machine hits both alike.
    for _ in 0..rounds {
        ignore.push(measure(&bin, "ignore", records).await?);
        reject.push(measure(&bin, "reject", records).await?);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (i, r) = (mean(&ignore), mean(&reject));
    println!(
        "mean bytes per record: ignore {i:.0}, reject {r:.0}, difference {:.0} (reject − ignore)",
        r - i
    );
    Ok(())
}
