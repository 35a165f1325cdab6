//! Soak check for the connection layer (issue 11, `make soak-streams`): holds STREAMS stalled
//! gRPC calls against a sepp server it starts, samples the server's RSS each second and the
//! enqueue latency of a normal client meanwhile, and prints both.
//!
//! Each stalled call (opened with `sepp_server::testing::stalled`, 200 to a connection)
//! announces a 1 MiB request message to `sepp.v1.QueueService/GetServerInfo` (no API keys are
//! set, and a call is only authenticated once its message is in) and sends its first 256 KiB,
//! so that what the server buffers for partly received messages is what is measured: 2,000
//! such calls offer 500 MiB. The server bounds it with `server.request_buffer_bytes` (64 MiB
//! by default), refusing the calls past it with `RESOURCE_EXHAUSTED`; the report counts the
//! calls answered that way and the calls still held. The server runs with
//! `server.handshake_timeout_ms = 600000`, so that no call is answered by the receive timeout
//! while held.
//!
//! Exits 1 when the server's peak RSS reaches 256 MiB or an enqueue fails.
//!
//! ```text
//! soak-streams SERVER_BIN [STREAMS=2000] [HOLD_SECS=60]
//! ```

#[path = "../procfs.rs"]
#[allow(dead_code)]
mod procfs;

use hdrhistogram::Histogram;
use sepp_server::testing::stalled;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const STREAMS_PER_CONNECTION: usize = 200;
const PATH: &str = "/sepp.v1.QueueService/GetServerInfo";
const ANNOUNCED_BYTES: usize = 1 << 20;
const SENT_BYTES: usize = 256 << 10;
const RSS_LIMIT_MIB: f64 = 256.0;
const RESOURCE_EXHAUSTED: i32 = 8;

/// How the stalled calls ended so far.
#[derive(Default)]
struct Answers {
    refused: AtomicU64,
    other: AtomicU64,
    broken: AtomicU64,
}

/// One attacking connection with `n` stalled calls; each call's answer is counted as it comes.
async fn attack(
    addr: std::net::SocketAddr,
    n: usize,
    answers: Arc<Answers>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut conn = stalled::connect(addr).await?;
    let message = stalled::filler_message(ANNOUNCED_BYTES);
    for _ in 0..n {
        let call = stalled::open(&mut conn, PATH, message.clone(), SENT_BYTES).await?;
        let answers = answers.clone();
        tokio::spawn(async move {
            let counter = match call.status().await {
                Ok((RESOURCE_EXHAUSTED, _)) => &answers.refused,
                Ok((code, message)) => {
                    eprintln!("a stalled call was answered {code}: {message}");
                    &answers.other
                }
                Err(_) => &answers.broken,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        });
    }
    // Hold the connection (and its calls) open: the connection is driven by its own task.
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .expect("usage: soak-streams SERVER_BIN [STREAMS] [HOLD_SECS]");
    let streams: usize = args.get(2).map_or(2000, |s| s.parse().expect("STREAMS"));
    let hold = Duration::from_secs(args.get(3).map_or(60, |s| s.parse().expect("HOLD_SECS")));
    let dir = std::env::temp_dir().join(format!("soak-streams-{}", std::process::id()));
    let mut child = Command::new(bin)
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .env("SEPP_SERVER__DB_PATH", dir.join("data"))
        .env("SEPP_SERVER__HANDSHAKE_TIMEOUT_MS", "600000")
        .env("SEPP_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start sepp");
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("readiness line");
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("sepp listening on ")
        .expect("readiness line")
        .parse()
        .expect("address");
    let rss = |f| procfs::proc_status_mib(pid, f).unwrap_or(f64::NAN);
    println!(
        "server pid {pid} on {addr}; RSS at start {:.1} MiB",
        rss("VmRSS")
    );

    let client = sepp_rs::SeppClient::connect(format!("http://{addr}"))
        .await
        .expect("client connects");
    let answers = Arc::new(Answers::default());
    let mut left = streams;
    let mut attackers = Vec::new();
    while left > 0 {
        let n = left.min(STREAMS_PER_CONNECTION);
        left -= n;
        attackers.push(tokio::spawn(attack(addr, n, answers.clone())));
    }
    println!(
        "opening {streams} stalled calls on {} connections, each sending {} KiB of a {} KiB \
         message ({} MiB offered); holding {hold:?}",
        attackers.len(),
        SENT_BYTES >> 10,
        ANNOUNCED_BYTES >> 10,
        (streams * SENT_BYTES) >> 20,
    );
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let (mut failures, mut peak) = (0u64, 0f64);
    let t0 = Instant::now();
    let mut next_sample = t0;
    while t0.elapsed() < hold {
        let started = Instant::now();
        match client
            .enqueue(sepp_rs::EnqueueRequest::new("soak", "t").expect("request"))
            .await
        {
            Ok(_) => {
                let _ = hist.record(started.elapsed().as_micros() as u64);
            }
            Err(e) => {
                failures += 1;
                eprintln!("enqueue failed: {e}");
            }
        }
        if Instant::now() >= next_sample {
            let now = rss("VmRSS");
            peak = peak.max(now);
            println!(
                "t={:>3}s rss={now:.1} MiB refused={} enqueues={} p99={:.2} ms",
                t0.elapsed().as_secs(),
                answers.refused.load(Ordering::Relaxed),
                hist.len(),
                hist.value_at_quantile(0.99) as f64 / 1000.0
            );
            next_sample += Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hwm = rss("VmHWM");
    let refused = answers.refused.load(Ordering::Relaxed);
    let other = answers.other.load(Ordering::Relaxed);
    let broken = answers.broken.load(Ordering::Relaxed);
    let attacker_errors = attackers.iter().filter(|a| a.is_finished()).count();
    println!(
        "RESULT streams={streams} held={} refused_resource_exhausted={refused} \
         other_answers={other} broken={broken} peak_rss={peak:.1} MiB vm_hwm={hwm:.1} MiB \
         enqueues={} failures={failures} p50={:.2} ms p99={:.2} ms",
        streams as u64 - refused - other - broken,
        hist.len(),
        hist.value_at_quantile(0.5) as f64 / 1000.0,
        hist.value_at_quantile(0.99) as f64 / 1000.0
    );
    if attacker_errors > 0 {
        println!("note: {attacker_errors} attacking connections ended early");
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let ok = hwm.max(peak) < RSS_LIMIT_MIB && failures == 0 && !hist.is_empty();
    if !ok {
        println!("FAIL: RSS must stay under {RSS_LIMIT_MIB} MiB and every enqueue succeed");
        std::process::exit(1);
    }
    println!("OK");
}
