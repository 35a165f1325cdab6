//! Soak check for the connection layer (issue 11, `make soak-streams`): holds STREAMS stalled
//! HTTP/2 streams against a sepp server it starts, each announcing a 16 MiB gRPC message to the
//! open health service and sending 64 bytes of it, samples the server's RSS each second and
//! the enqueue latency of a normal client meanwhile, and prints both.
//!
//! The server runs with `server.handshake_timeout_ms = 600000`, so that no stream is answered
//! by the receive timeout while held: the figure is the memory of the streams themselves.
//! Exits 1 when the peak RSS reaches 256 MiB or an enqueue fails.
//!
//! ```text
//! soak-streams SEPP_BIN [STREAMS=2000] [HOLD_SECS=60]
//! ```

#[path = "../procfs.rs"]
#[allow(dead_code)]
mod procfs;

use hdrhistogram::Histogram;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const STREAMS_PER_CONNECTION: usize = 200;
const RSS_LIMIT_MIB: f64 = 256.0;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn health_headers() -> Vec<u8> {
    let mut block = Vec::new();
    for (k, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Check"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0);
        block.push(k.len() as u8);
        block.extend_from_slice(k.as_bytes());
        block.push(v.len() as u8);
        block.extend_from_slice(v.as_bytes());
    }
    block
}

/// One attacking connection with `n` stalled streams; drains what the server sends.
async fn attack(addr: std::net::SocketAddr, n: usize) -> std::io::Result<()> {
    let s = TcpStream::connect(addr).await?;
    let (mut rd, mut wr) = s.into_split();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(k) = rd.read(&mut buf).await {
            if k == 0 {
                break;
            }
        }
    });
    wr.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
    wr.write_all(&frame(4, 0, 0, &[])).await?;
    wr.write_all(&frame(4, 1, 0, &[])).await?;
    let mut data = vec![0u8, 0x01, 0, 0, 0]; // announces 16 MiB
    data.extend_from_slice(&[7u8; 59]);
    for i in 0..n {
        let id = 1 + 2 * i as u32;
        wr.write_all(&frame(1, 0x4, id, &health_headers())).await?;
        wr.write_all(&frame(0, 0, id, &data)).await?;
    }
    // Hold the connection open.
    std::future::pending::<()>().await;
    Ok(())
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .expect("usage: soak-streams SEPP_BIN [STREAMS] [HOLD_SECS]");
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
    let mut left = streams;
    let mut attackers = Vec::new();
    while left > 0 {
        let n = left.min(STREAMS_PER_CONNECTION);
        left -= n;
        attackers.push(tokio::spawn(attack(addr, n)));
    }
    println!(
        "opened {streams} stalled streams on {} connections; holding {hold:?}",
        attackers.len()
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
                "t={:>3}s rss={now:.1} MiB enqueues={} p99={:.2} ms",
                t0.elapsed().as_secs(),
                hist.len(),
                hist.value_at_quantile(0.99) as f64 / 1000.0
            );
            next_sample += Duration::from_secs(1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hwm = rss("VmHWM");
    println!(
        "RESULT streams={streams} peak_rss={peak:.1} MiB vm_hwm={hwm:.1} MiB enqueues={} failures={failures} p50={:.2} ms p99={:.2} ms",
        hist.len(),
        hist.value_at_quantile(0.5) as f64 / 1000.0,
        hist.value_at_quantile(0.99) as f64 / 1000.0
    );
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
