//! Processes `sha256-file` jobs: reads each file, computes its SHA-256 and appends
//! `<hex digest>  <path>` to an output file (the `sha256sum` format). Stops on Ctrl-C, or with
//! `--exit-when-idle` once the queue has been empty for two seconds.
//!
//! ```text
//! cargo run --release -p sepp-rs --example checksum_worker -- --out sums.txt --exit-when-idle
//! ```

use clap::Parser;
use sepp_rs::{HandlerError, SeppClient, Worker};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Compute file checksums from a sepp queue.
#[derive(Parser)]
struct Args {
    /// Where to append the results.
    #[arg(long, default_value = "checksums.txt")]
    out: PathBuf,
    /// Server address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    /// Queue to work on.
    #[arg(long, default_value = "checksums")]
    queue: String,
    /// Jobs processed at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Stop once the queue has had no ready, scheduled or leased job for 2 s.
    #[arg(long)]
    exit_when_idle: bool,
}

fn sha256_file(path: &str) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Prints a failure as its text (with the error's code), not as a debug struct.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    eprintln!("checksum_worker: {e}");
    std::process::ExitCode::FAILURE
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = SeppClient::connect(&args.server).await?;
    let out = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&args.out)?,
    ));
    let bytes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let worker = {
        let (out, bytes) = (out.clone(), bytes.clone());
        Worker::builder(client.clone(), [args.queue.clone()])
            .max_in_flight(args.concurrency)
            .wait_timeout(Duration::from_secs(1))
            .handle("sha256-file", move |ctx| {
                let (out, bytes) = (out.clone(), bytes.clone());
                async move {
                    let Some(payload) = &ctx.job().payload else {
                        return Err(HandlerError::permanent().with_reason("no path in payload"));
                    };
                    let path = String::from_utf8_lossy(&payload.data).into_owned();
                    // Hashing is blocking file I/O: keep it off the async threads.
                    let hashed = tokio::task::spawn_blocking({
                        let path = path.clone();
                        move || {
                            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                            sha256_file(&path).map(|h| (h, size))
                        }
                    })
                    .await
                    .map_err(|e| HandlerError::retry().with_reason(e.to_string()))?;
                    match hashed {
                        Ok((hex, size)) => {
                            bytes.fetch_add(size, std::sync::atomic::Ordering::Relaxed);
                            writeln!(out.lock().unwrap(), "{hex}  {path}")?;
                            Ok(())
                        }
                        // A file that vanished or cannot be read will not get better.
                        Err(e) => {
                            Err(HandlerError::permanent().with_reason(format!("{path}: {e}")))
                        }
                    }
                }
            })
            .build()
    };
    let t0 = Instant::now();
    let queue = args.queue.clone();
    let idle_watch = {
        let client = client.clone();
        async move {
            let mut idle_since: Option<Instant> = None;
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let s = client.get_queue_stats(&queue).await;
                let empty = matches!(s, Ok(s) if s.ready + s.scheduled + s.in_flight == 0);
                match (empty, idle_since) {
                    (true, None) => idle_since = Some(Instant::now()),
                    (true, Some(t)) if t.elapsed() >= Duration::from_secs(2) => return,
                    (false, _) => idle_since = None,
                    _ => {}
                }
            }
        }
    };
    let report = if args.exit_when_idle {
        worker
            .run_until(async {
                tokio::select! {
                    _ = idle_watch => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            })
            .await?
    } else {
        worker.run().await?
    };
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{} files hashed ({} failed) in {secs:.1} s: {:.0} files/s, {:.1} MiB hashed; results in {}",
        report.acked,
        report.nacked,
        report.acked as f64 / secs,
        bytes.load(std::sync::atomic::Ordering::Relaxed) as f64 / (1024.0 * 1024.0),
        args.out.display()
    );
    Ok(())
}
