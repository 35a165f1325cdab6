//! Walks a directory tree and enqueues one `sha256-file` job per regular file, keyed by the
//! file's path and modification time: running it twice over an unchanged tree creates no new
//! job, and a file that changed gets a fresh job.
//!
//! ```text
//! cargo run --release -p sepp-rs --example checksum_producer -- /usr/share
//! ```

use clap::Parser;
use sepp_rs::{EnqueueRequest, SeppClient};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::{Instant, UNIX_EPOCH};

/// Enqueue a checksum job per file under a directory.
#[derive(Parser)]
struct Args {
    /// Directory to walk.
    root: PathBuf,
    /// Server address.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    server: String,
    /// Queue to enqueue on.
    #[arg(long, default_value = "checksums")]
    queue: String,
    /// Jobs per EnqueueBatch call.
    #[arg(long, default_value_t = 200)]
    batch: usize,
}

/// Regular files under `root`, depth first; unreadable directories are skipped.
fn walk(root: &Path, out: &mut Vec<(PathBuf, u128)>) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            walk(&entry.path(), out);
        } else if meta.is_file() {
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            out.push((entry.path(), mtime));
        }
    }
}

/// The idempotency key: path and mtime, or their SHA-256 when that would be too long.
fn key_for(path: &Path, mtime: u128, limit: usize) -> String {
    let plain = format!("{mtime}:{}", path.display());
    if plain.len() <= limit {
        return plain;
    }
    let digest = Sha256::digest(plain.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Prints a failure as its text (with the error's code), not as a debug struct.
#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Err(e) = run().await else {
        return std::process::ExitCode::SUCCESS;
    };
    eprintln!("checksum_producer: {e}");
    std::process::ExitCode::FAILURE
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = SeppClient::connect(&args.server).await?;
    let limit = client
        .max_idempotency_key_bytes()
        .unwrap_or(sepp_rs::client::DEFAULT_MAX_IDEMPOTENCY_KEY_BYTES) as usize;
    let t0 = Instant::now();
    let mut files = Vec::new();
    walk(&args.root, &mut files);
    let walked = t0.elapsed();

    let (mut created, mut deduplicated, mut rejected) = (0usize, 0usize, 0usize);
    let t1 = Instant::now();
    for chunk in files.chunks(args.batch.max(1)) {
        let requests = chunk
            .iter()
            .map(|(path, mtime)| {
                Ok(EnqueueRequest::new(&args.queue, "sha256-file")?
                    .with_payload(
                        path.to_string_lossy().as_bytes().to_vec(),
                        "text/plain; charset=utf-8",
                    )
                    .with_idempotency_key(key_for(path, *mtime, limit)))
            })
            .collect::<Result<Vec<_>, sepp_rs::Rejection>>()?;
        for result in client.enqueue_batch(requests).await? {
            match result {
                Ok(ack) if ack.deduplicated => deduplicated += 1,
                Ok(_) => created += 1,
                Err(r) => {
                    rejected += 1;
                    eprintln!("rejected: {r}");
                }
            }
        }
    }
    println!(
        "{} files under {} (walked in {:.2?}); enqueued in {:.2?}: {created} new, {deduplicated} already enqueued, {rejected} rejected",
        files.len(),
        args.root.display(),
        walked,
        t1.elapsed()
    );
    Ok(())
}
