//! Memory of replies a client never reads (`make soak-unread-replies`): starts a sepp server at
//! its defaults, enqueues one job of 1,000,000 payload bytes, then on each of CONNECTIONS raw
//! HTTP/2 connections sends CALLS whole GetJob calls for it at once and never reads a reply
//! nor opens the flow-control window for one, so the server can send each only its first
//! 64 KiB. It
//! prints the server's RSS before, while the replies are held and after the connections
//! closed, and what was refused.
//!
//! A second phase feeds waiting Reserves on such connections with jobs whose leases of 1 s
//! keep expiring, so that the same jobs would be leased into unread replies again and again
//! if leases did not take their room first ([`leases_into_unread_replies`]).
//!
//! Before `server.reply_buffer_bytes` (256 MiB by default; a connection's share is an eighth)
//! every such call held its reply (about 2 MB each: 8 x 128 calls took the RSS from 51 MB to
//! 2.05 GB until the idle timeout). Now a GetJob reply that would take its connection past
//! its share (an eighth of the budget) or the server past the budget is dropped and the call
//! refused, as are new calls while the budget is held. Exits 1 when no call was refused, when the RSS
//! while they are held is more than LIMIT_MIB above the start, when an enqueue fails while
//! they are held, or when a GetJob is still refused 10 s after the connections closed.
//!
//! ```text
//! unread-replies SERVER_BIN [CONNECTIONS=8] [CALLS=128]
//! ```

#[path = "../procfs.rs"]
#[allow(dead_code)]
mod procfs;
#[path = "../server.rs"]
#[allow(dead_code)]
mod server;

use sepp_server::testing::stalled;
use server::{BoxError, ServerProcess};
use std::time::{Duration, Instant};

const GET_JOB: &str = "/sepp.admin.v1.AdminService/GetJob";
/// Three times the budget (256 MiB): the held replies, plus what the allocator keeps of the
/// copies made while the refused calls built theirs (each GetJob of this job makes a 1 MB
/// message and a 1 MB encoding; glibc keeps the high-water mark). Measured: +550 to +560 MiB
/// at 8 x 128, 16 x 256 and 32 x 128 calls alike.
const LIMIT_MIB: f64 = 768.0;

fn rss(pid: u32) -> f64 {
    procfs::proc_status_mib(pid, "VmRSS").unwrap_or(f64::NAN)
}

/// What one connection's calls got: replies held unread (kept open) and refusals.
struct Held {
    _conn: h2::client::SendRequest<bytes::Bytes>,
    replies: Vec<http::Response<h2::RecvStream>>,
    refusals: Vec<String>,
}

async fn flood(addr: std::net::SocketAddr, id: String, calls: usize) -> Result<Held, BoxError> {
    let mut conn = stalled::connect(addr).await?;
    let mut held = Held {
        _conn: conn.clone(),
        replies: Vec::new(),
        refusals: Vec::new(),
    };
    // Every call on the wire before the first answer, as a hostile client would send them.
    let mut responses = Vec::with_capacity(calls);
    for _ in 0..calls {
        responses.push(stalled::call(&mut conn, GET_JOB, stalled::get_job_body(&id)).await?);
    }
    for response in responses {
        let response = tokio::time::timeout(Duration::from_secs(30), response).await??;
        match stalled::status_in(response.headers()) {
            Some((8, message)) => held.refusals.push(message),
            Some((code, message)) => {
                return Err(format!("GetJob answered {code}: {message}").into());
            }
            None => held.replies.push(response),
        }
    }
    Ok(held)
}

/// Phase two: `connections` x 256 Reserves wait (60 s, leases of 1 s, up to 256 jobs each) on
/// connections that never read, then 64 jobs of 1 MB (100 attempts each) arrive: each lease
/// that expires makes its job ready for the next waiting Reserve. Prints the highest RSS over
/// 15 s and returns its growth over the RSS before the jobs came; checks that every job is
/// still there once the connections are gone.
async fn leases_into_unread_replies(
    server: &ServerProcess,
    client: &sepp_rs::SeppClient,
    addr: std::net::SocketAddr,
    connections: usize,
) -> Result<f64, BoxError> {
    use prost::Message as _;
    let pid = server.pid;
    let request = sepp_proto::v1::ReserveRequest {
        queues: vec!["leases".into()],
        wait_timeout: Some(sepp_proto::prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        lease_duration: Some(sepp_proto::prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        max_jobs: Some(256),
        ..Default::default()
    }
    .encode_to_vec();
    let body = stalled::grpc_body(&request);
    let mut held = Vec::new();
    for _ in 0..connections {
        let mut conn = stalled::connect(addr).await?;
        let mut calls = Vec::new();
        for _ in 0..256 {
            let reserve = "/sepp.v1.QueueService/Reserve";
            calls.push(stalled::call(&mut conn, reserve, body.clone()).await?);
        }
        held.push((conn, calls));
    }
    // The Reserves reach their wait; nothing here can observe that but time.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss(pid);
    for _ in 0..64 {
        client
            .enqueue(
                sepp_rs::EnqueueRequest::new("leases", "big")?
                    .with_payload(vec![0x2a; 1_000_000], "application/octet-stream")
                    .with_max_attempts(100),
            )
            .await?;
    }
    let mut peak = rss(pid);
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        peak = peak.max(rss(pid));
    }
    println!(
        "{connections} connections x 256 waiting Reserves never read, then 64 jobs of 1 MB with \
         leases of 1 s: RSS {before:.1} MiB before the jobs, highest over 15 s {peak:.1} MiB \
         ({:+.1} MiB)",
        peak - before
    );
    drop(held);
    // Every job is still there: ready, or in flight until its 1 s lease ends.
    let mut admin = sepp_proto::admin::v1::admin_service_client::AdminServiceClient::connect(
        format!("http://{addr}"),
    )
    .await?;
    let t = Instant::now();
    loop {
        let stats = admin
            .get_queue_stats(sepp_proto::admin::v1::GetQueueStatsRequest {
                queue: "leases".into(),
            })
            .await?
            .into_inner();
        if stats.ready == 64 {
            println!("  after the connections closed: all 64 jobs ready again");
            break;
        }
        if t.elapsed() > Duration::from_secs(10) {
            return Err(format!(
                "10 s after the connections closed: {} ready, {} in flight of 64 jobs",
                stats.ready, stats.in_flight
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(peak - before)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let Some(bin) = args.get(1) else {
        eprintln!("usage: unread-replies SERVER_BIN [CONNECTIONS=8] [CALLS=128]");
        std::process::exit(2);
    };
    let arg = |i: usize, default: usize| -> usize {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    let (connections, calls) = (arg(2, 8), arg(3, 128));

    let server = ServerProcess::start_default(bin)?;
    let pid = server.pid;
    let addr: std::net::SocketAddr = server.addr.parse()?;
    let result = async {
        let client = server.clients(1).await?.remove(0);
        let id = client
            .enqueue(
                sepp_rs::EnqueueRequest::new("unread", "big")?
                    .with_payload(vec![0x2a; 1_000_000], "application/octet-stream"),
            )
            .await?
            .job_id;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let start = rss(pid);
        println!("sepp pid {pid}: start RSS {start:.1} MiB; one job of 1,000,000 bytes");
        let t0 = Instant::now();
        let floods: Vec<_> = (0..connections)
            .map(|_| tokio::spawn(flood(addr, id.clone(), calls)))
            .collect();
        let mut held = Vec::new();
        for f in floods {
            held.push(f.await??);
        }
        // Let what was admitted finish encoding before reading the RSS.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let during = rss(pid);
        let replies: usize = held.iter().map(|h| h.replies.len()).sum();
        let refused: usize = held.iter().map(|h| h.refusals.len()).sum();
        println!(
            "{connections} connections x {calls} GetJob calls never read, in {:.1} s: {replies} \
             replies held, {refused} refused with RESOURCE_EXHAUSTED",
            t0.elapsed().as_secs_f64()
        );
        for (i, h) in held.iter().enumerate() {
            println!(
                "  connection {i}: {} held, {} refused",
                h.replies.len(),
                h.refusals.len()
            );
        }
        if let Some(m) = held.iter().find_map(|h| h.refusals.first()) {
            println!("  a refusal: {m}");
        }
        println!(
            "  RSS while held: {during:.1} MiB ({:+.1} MiB over the start)",
            during - start
        );
        client
            .enqueue(sepp_rs::EnqueueRequest::new("unread", "small")?)
            .await
            .map_err(|e| format!("an enqueue while unread replies are held failed: {e}"))?;
        println!("  an enqueue while they are held: accepted");
        let t1 = Instant::now();
        drop(held);
        // Dropping the replies resets their streams and closes the connections; the server
        // returns their budget as it sees that: call until GetJob is served.
        let mut admin = sepp_proto::admin::v1::admin_service_client::AdminServiceClient::connect(
            format!("http://{addr}"),
        )
        .await?;
        loop {
            let r = admin
                .get_job(sepp_proto::admin::v1::GetJobRequest { job_id: id.clone() })
                .await;
            match r {
                Ok(_) => break,
                Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                    if t1.elapsed() > Duration::from_secs(10) {
                        return Err(
                            "GetJob still refused 10 s after the replies were dropped".into()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(s) => return Err(s.into()),
            }
        }
        println!(
            "  a GetJob on a new connection: served {:.1} s after the held replies were dropped",
            t1.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        println!("  RSS after they were dropped: {:.1} MiB", rss(pid));
        let leases = leases_into_unread_replies(&server, &client, addr, connections).await?;
        Ok::<(f64, usize), BoxError>(((during - start).max(leases), refused))
    }
    .await;
    drop(server);
    let (grew, refused) = result?;
    if refused == 0 {
        eprintln!("unread-replies: no call was refused");
        std::process::exit(1);
    }
    if grew > LIMIT_MIB {
        eprintln!("unread-replies: RSS grew {grew:.1} MiB, more than {LIMIT_MIB} MiB");
        std::process::exit(1);
    }
    Ok(())
}
