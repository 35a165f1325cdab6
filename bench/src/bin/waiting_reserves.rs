//! Memory of waiting Reserves at `limits.max_waiting_reserves` (`make soak-waiting-reserves`):
//! starts a sepp server at its defaults, opens RESERVES long-poll Reserves of the largest shape
//! the defaults allow (32 queue names of 512 bytes each, all empty queues, 60 s waits) on
//! CONNECTIONS connections, and prints the server's RSS before, with every place taken, and
//! after they ended, twice (the second round shows the first one's memory reused).
//!
//! The server must seat exactly `max_waiting_reserves` (10 000 by default) and answer every
//! Reserve past them at once with RESOURCE_EXHAUSTED (`OVERLOADED` in the client); its RSS with
//! every place taken is the worst case a client can cause this way. Exits 1 when the count of
//! refusals is not RESERVES − 10 000, a Reserve fails otherwise, or the RSS with every place
//! taken is more than LIMIT_MIB above the start.
//!
//! ```text
//! waiting-reserves SERVER_BIN [RESERVES=12000] [CONNECTIONS=64] [NAMES=32] [NAME_BYTES=512]
//! ```

#[path = "../procfs.rs"]
#[allow(dead_code)]
mod procfs;
#[path = "../server.rs"]
#[allow(dead_code)]
mod server;

use sepp_rs::{ErrorCode, ReserveOptions, SeppClient};
use std::time::{Duration, Instant};

/// The server's default `limits.max_waiting_reserves`.
const SEATS: usize = 10_000;
/// The default `limits.max_reserve_queues` and `limits.max_queue_name_bytes`: the largest
/// Reserve the defaults allow, unless the arguments ask for smaller ones.
const NAMES: usize = 32;
const NAME_BYTES: usize = 512;

/// The shape of each Reserve: how many queue names, of how many bytes each.
#[derive(Clone, Copy)]
struct Shape {
    names: usize,
    bytes: usize,
}
/// What 10 000 of the largest waiting Reserves may cost together.
const LIMIT_MIB: f64 = 1024.0;

use server::{BoxError, ServerProcess};

/// Opens `count` waiting Reserves; checks that exactly `count - SEATS` are refused at once;
/// returns the server's RSS with every place taken, then ends the waiting ones (their
/// connections stay open).
async fn round_of(
    clients: &[SeppClient],
    count: usize,
    shape: Shape,
    pid: u32,
) -> Result<f64, BoxError> {
    let t0 = Instant::now();
    let (refused_tx, mut refused_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiting = Vec::with_capacity(count);
    for i in 0..count {
        let c = clients[i % clients.len()].clone();
        let refused = refused_tx.clone();
        waiting.push(tokio::spawn(async move {
            let opts = ReserveOptions::new(names(i, shape), Duration::from_secs(30))
                .with_wait_timeout(Duration::from_secs(60));
            match c.reserve(opts).await {
                Ok(jobs) if jobs.is_empty() => Ok(()),
                Ok(_) => Err::<(), BoxError>("a Reserve on empty queues got a job".into()),
                Err(e) if e.code() == ErrorCode::Overloaded => {
                    let _ = refused.send(e.to_string());
                    Ok(())
                }
                Err(e) => Err(e.into()),
            }
        }));
    }
    drop(refused_tx);
    // Every Reserve past the places is answered at once; the others wait for 60 s.
    let want = count - SEATS;
    let mut refusals = Vec::with_capacity(want);
    while refusals.len() < want {
        match tokio::time::timeout(Duration::from_secs(30), refused_rx.recv()).await {
            Ok(Some(m)) => refusals.push(m),
            _ => break,
        }
    }
    // The places are all taken once the last refusal arrived; let the rest settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let full = rss(pid);
    let late = refused_rx.try_recv().is_ok();
    println!(
        "{count} Reserves of {} x {}-byte queue names in {:.1} s: {} refused with \
         RESOURCE_EXHAUSTED, {} waiting",
        shape.names,
        shape.bytes,
        t0.elapsed().as_secs_f64(),
        refusals.len(),
        count - refusals.len(),
    );
    if let Some(m) = refusals.first() {
        println!("  the refusal: {m}");
    }
    for t in &waiting {
        t.abort();
    }
    for t in waiting {
        if let Ok(r) = t.await {
            r?;
        }
    }
    if refusals.len() != want || late {
        return Err(format!(
            "{} Reserves refused (and more after), expected {want}",
            refusals.len()
        )
        .into());
    }
    Ok(full)
}

fn rss(pid: u32) -> f64 {
    procfs::proc_status_mib(pid, "VmRSS").unwrap_or(f64::NAN)
}

/// The `i`th Reserve's queue names, none shared with another Reserve (at least as long as
/// their distinct part).
fn names(i: usize, shape: Shape) -> Vec<String> {
    (0..shape.names)
        .map(|n| {
            let head = format!("wr-{i}-{n}-");
            format!(
                "{head}{}",
                "x".repeat(shape.bytes.saturating_sub(head.len()))
            )
        })
        .collect()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let Some(bin) = args.get(1) else {
        eprintln!(
            "usage: waiting-reserves SERVER_BIN [RESERVES=12000] [CONNECTIONS=64] [NAMES=32] \
             [NAME_BYTES=512]"
        );
        std::process::exit(2);
    };
    let arg = |i: usize, default: usize| -> usize {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    let count = arg(2, 12_000);
    let connections = arg(3, 64);
    let shape = Shape {
        names: arg(4, NAMES),
        bytes: arg(5, NAME_BYTES),
    };
    if count < SEATS {
        eprintln!("waiting-reserves: RESERVES must be at least {SEATS}");
        std::process::exit(2);
    }

    let server = ServerProcess::start_default(bin)?;
    let pid = server.pid;

    let result = async {
        let clients = server.clients(connections).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start = rss(pid);
        println!("sepp pid {pid}: {connections} connections; start RSS {start:.1} MiB");
        // Two rounds: the second shows that what the first took is reused, not added to.
        let mut peak = start;
        for round in 1..=2 {
            let full = round_of(&clients, count, shape, pid).await?;
            println!(
                "  round {round}: RSS with every place taken {full:.1} MiB ({:+.1} MiB over the \
                 start, {:.1} KiB per waiting Reserve)",
                full - start,
                (full - start) * 1024.0 / SEATS as f64
            );
            peak = peak.max(full);
            tokio::time::sleep(Duration::from_secs(2)).await;
            println!("  after its Reserves ended: RSS {:.1} MiB", rss(pid));
        }
        Ok::<f64, BoxError>(peak - start)
    }
    .await;

    drop(server);
    let grew = result?;
    if grew > LIMIT_MIB {
        eprintln!("waiting-reserves: RSS grew {grew:.1} MiB, more than {LIMIT_MIB} MiB");
        std::process::exit(1);
    }
    Ok(())
}
