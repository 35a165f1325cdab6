//! The connection layer against raw sockets on 127.0.0.1: handshake timeout, connection cap,
//! idle GOAWAY, the stream limit and the request receive timeout (docs/security.md).

mod common;

use common::{Clients, TestServer, get, samples};
use sepp_server::testing::stalled;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 4;
const HEADERS: u8 = 1;
const DATA: u8 = 0;
const RST_STREAM: u8 = 3;
const GOAWAY: u8 = 7;

/// A short grace period, so that stopping a server with the test's sockets open is quick.
fn quick(c: &mut sepp_server::config::Config) {
    c.server.shutdown_grace_ms = 100;
}

struct Frame {
    kind: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// The next frame, or `None` when the server closed the connection. Panics after `within`.
async fn next_frame(s: &mut TcpStream, within: Duration) -> Option<Frame> {
    let read = async {
        let mut h = [0u8; 9];
        s.read_exact(&mut h).await.ok()?;
        let len = u32::from_be_bytes([0, h[0], h[1], h[2]]) as usize;
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload).await.ok()?;
        Some(Frame {
            kind: h[3],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
            payload,
        })
    };
    tokio::time::timeout(within, read)
        .await
        .expect("the server neither sent a frame nor closed in time")
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut f = vec![len[1], len[2], len[3], kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Connects and sends the client preface and an empty SETTINGS frame.
async fn handshake(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(PREFACE).await.unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    s
}

/// The request headers of a health check, HPACK literals without indexing.
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

/// Reads until the server closes; panics if it does not within `within`.
async fn wait_closed(s: &mut TcpStream, within: Duration) -> Vec<Frame> {
    let deadline = Instant::now() + within;
    let mut frames = Vec::new();
    while let Some(f) = next_frame(s, deadline.saturating_duration_since(Instant::now())).await {
        frames.push(f);
    }
    frames
}

#[tokio::test]
async fn silent_and_half_preface_sockets_are_closed_within_the_handshake_timeout() {
    let server = TestServer::start(|c| {
        quick(c);
        c.server.handshake_timeout_ms = 300;
    })
    .await;
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut half = TcpStream::connect(server.addr).await.unwrap();
    half.write_all(&PREFACE[..12]).await.unwrap();
    let t0 = Instant::now();
    wait_closed(&mut silent, Duration::from_secs(5)).await;
    wait_closed(&mut half, Duration::from_secs(5)).await;
    assert!(
        t0.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t0.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn the_connection_cap_holds_the_next_connection_until_a_stalled_one_times_out() {
    let server = TestServer::start(|c| {
        quick(c);
        c.server.max_connections = 2;
        c.server.handshake_timeout_ms = 1500;
    })
    .await;
    let _a = TcpStream::connect(server.addr).await.unwrap();
    let _b = TcpStream::connect(server.addr).await.unwrap();
    let mut third = handshake(server.addr).await;
    let t0 = Instant::now();
    // Held in the backlog while both slots are taken: no SETTINGS yet.
    let early = tokio::time::timeout(Duration::from_millis(500), third.read_u8()).await;
    assert!(early.is_err(), "the third connection was served at once");
    // Served once a stalled socket is dropped at its handshake timeout.
    let f = next_frame(&mut third, Duration::from_secs(10))
        .await
        .expect("served");
    assert_eq!(f.kind, SETTINGS);
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn an_idle_connection_gets_goaway_after_the_idle_timeout() {
    let server = TestServer::start(|c| {
        quick(c);
        c.server.idle_timeout_ms = 1000;
    })
    .await;
    let mut s = handshake(server.addr).await;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(10);
    let mut kinds = Vec::new();
    loop {
        let f = next_frame(&mut s, deadline.saturating_duration_since(Instant::now())).await;
        let Some(f) = f else {
            panic!("closed without GOAWAY; frames {kinds:?}")
        };
        if f.kind == GOAWAY {
            break;
        }
        kinds.push(f.kind);
    }
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_call_in_flight_past_the_idle_timeout_keeps_its_connection_and_the_timeout_restarts_when_it_ends()
 {
    let server = TestServer::start(|c| {
        quick(c);
        c.server.idle_timeout_ms = 1000;
        // The call below stays in flight until its message is given up on, after 3 s.
        c.server.handshake_timeout_ms = 3000;
    })
    .await;
    let mut s = handshake(server.addr).await;
    let t0 = Instant::now();
    // A health check that announces an 8-byte message and sends 1 byte of it.
    s.write_all(&frame(HEADERS, 0x4, 1, &health_headers()))
        .await
        .unwrap();
    s.write_all(&frame(DATA, 0, 1, &[0, 0, 0, 0, 8, 8]))
        .await
        .unwrap();
    let deadline = t0 + Duration::from_secs(15);
    let mut answered = None;
    let goaway = loop {
        let f = next_frame(&mut s, deadline.saturating_duration_since(Instant::now())).await;
        let Some(f) = f else {
            panic!("closed without GOAWAY")
        };
        if f.kind == GOAWAY {
            break Instant::now();
        }
        if f.kind == HEADERS && f.stream == 1 && answered.is_none() {
            answered = Some(Instant::now());
        }
    };
    let answered = answered.expect("GOAWAY came while the call was still in flight");
    assert!(
        answered - t0 >= Duration::from_millis(2900),
        "answered after {:?}",
        answered - t0
    );
    // One idle timeout after the call ended, not after the connection's last quiet moment
    // before it, and not two.
    let quiet = goaway - answered;
    assert!(
        quiet >= Duration::from_millis(900) && quiet < Duration::from_millis(2500),
        "GOAWAY {quiet:?} after the answer"
    );
    server.stop().await;
}

#[tokio::test]
async fn max_concurrent_streams_is_advertised_and_enforced_and_stalled_streams_block_no_one() {
    let server = TestServer::start(|c| {
        quick(c);
        c.server.max_concurrent_streams = 3;
        c.server.handshake_timeout_ms = 60_000;
    })
    .await;
    let mut s = handshake(server.addr).await;
    let settings = next_frame(&mut s, Duration::from_secs(5)).await.unwrap();
    assert_eq!(settings.kind, SETTINGS);
    let advertised = settings
        .payload
        .chunks(6)
        .find(|p| p[..2] == [0, 3])
        .map(|p| u32::from_be_bytes([p[2], p[3], p[4], p[5]]));
    assert_eq!(advertised, Some(3));
    s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap();
    // Four streams that announce a 16 MiB message and send two bytes of it.
    for id in [1u32, 3, 5, 7] {
        s.write_all(&frame(HEADERS, 0x4, id, &health_headers()))
            .await
            .unwrap();
        s.write_all(&frame(DATA, 0, id, &[0, 1, 0, 0, 0, 8, 8]))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let f = next_frame(&mut s, deadline.saturating_duration_since(Instant::now()))
            .await
            .expect("connection open");
        if f.kind == RST_STREAM {
            assert_eq!(f.stream, 7, "only the stream over the limit is refused");
            assert_eq!(f.payload, 7u32.to_be_bytes(), "REFUSED_STREAM");
            break;
        }
    }
    // Meanwhile a normal client works.
    let client = server.client().await;
    client
        .enqueue(sepp_rs::EnqueueRequest::new("q", "t").unwrap())
        .await
        .expect("enqueue while streams stall");
    server.stop().await;
}

#[tokio::test]
async fn a_stream_that_stalls_its_message_is_answered_after_the_handshake_timeout() {
    let server = TestServer::start(|c| {
        quick(c);
        c.server.handshake_timeout_ms = 500;
    })
    .await;
    let mut conn = stalled::connect(server.addr).await.unwrap();
    let t0 = Instant::now();
    let call = stalled::open(&mut conn, HEALTH_CHECK, filler(100), 6)
        .await
        .unwrap();
    let (code, message) = within(5, call.status()).await.unwrap();
    assert_eq!(code, DEADLINE_EXCEEDED, "{message}");
    assert!(message.contains("server.handshake_timeout_ms"), "{message}");
    assert!(
        t0.elapsed() >= Duration::from_millis(400),
        "{:?}",
        t0.elapsed()
    );
    server.stop().await;
}

const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";
const SERVER_INFO: &str = "/sepp.v1.QueueService/GetServerInfo";
const OK: i32 = 0;
const DEADLINE_EXCEEDED: i32 = 4;
const RESOURCE_EXHAUSTED: i32 = 8;
const INVALID_ARGUMENT: i32 = 3;
const UNAUTHENTICATED: i32 = 16;

fn filler(len: usize) -> bytes::Bytes {
    stalled::filler_message(len)
}

/// `f`, which must finish within `secs` seconds.
async fn within<T>(secs: u64, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("in time")
}

/// A budget of one largest message (1 MiB) plus its header; receive timeout far beyond the
/// test, so that only the budget can answer a stalled call.
fn one_message_budget(c: &mut sepp_server::config::Config) {
    quick(c);
    c.limits.max_message_bytes = 1 << 20;
    c.server.request_buffer_bytes = (1 << 20) + 5;
    c.server.handshake_timeout_ms = 60_000;
}

/// Opens two calls that each send 600 KiB of a 700 KiB message: together they pass the
/// budget, so at least one is refused at once. Returns the calls not refused.
async fn two_over_the_budget(
    conn: &mut h2::client::SendRequest<bytes::Bytes>,
) -> Vec<stalled::StalledCall> {
    let mut a = stalled::open(conn, SERVER_INFO, filler(700 << 10), 600 << 10)
        .await
        .unwrap();
    let mut b = stalled::open(conn, SERVER_INFO, filler(700 << 10), 600 << 10)
        .await
        .unwrap();
    // The first answer is a refusal; the other call is refused too or still held.
    let (first, other) = within(10, async {
        tokio::select! {
            r = stalled::grpc_status(&mut a.response) => (r, b),
            r = stalled::grpc_status(&mut b.response) => (r, a),
        }
    })
    .await;
    let (code, message) = first.unwrap();
    assert_eq!(code, RESOURCE_EXHAUSTED, "{message}");
    assert!(
        message.contains("server.request_buffer_bytes (1048581 bytes)")
            && message.contains("not processed"),
        "{message}"
    );
    vec![other]
}

/// Finishes `call` and returns its status.
async fn finished(mut call: stalled::StalledCall) -> (i32, String) {
    let _ = call.finish();
    within(10, call.status()).await.unwrap()
}

/// Opens, finishes and awaits calls of 600 KiB until one is not refused by the budget (its
/// return after a reset is not synchronous with the reset); panics after 10 s.
async fn served_once_the_budget_is_back(conn: &mut h2::client::SendRequest<bytes::Bytes>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let call = stalled::open(conn, SERVER_INFO, filler(700 << 10), 600 << 10)
            .await
            .unwrap();
        let (code, message) = finished(call).await;
        if code == OK {
            return;
        }
        assert_eq!(code, RESOURCE_EXHAUSTED, "{message}");
        assert!(Instant::now() < deadline, "the budget did not come back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn partly_received_requests_beyond_the_request_buffer_are_refused_and_small_calls_go_on() {
    let server = TestServer::start(one_message_budget).await;
    let mut conn = stalled::connect(server.addr).await.unwrap();
    let held = two_over_the_budget(&mut conn).await;
    // A whole small request needs no buffering: it is served while the budget is taken.
    let client = server.client().await;
    client
        .enqueue(sepp_rs::EnqueueRequest::new("q", "t").unwrap())
        .await
        .expect("an enqueue while the request buffer is full");
    // A held call completes normally when its client sends the rest.
    for call in held {
        let (code, message) = finished(call).await;
        assert!(code == OK || code == RESOURCE_EXHAUSTED, "{code} {message}");
    }
    server.stop().await;
}

#[tokio::test]
async fn the_request_buffer_is_returned_when_a_call_ends_or_is_reset() {
    let server = TestServer::start(one_message_budget).await;
    let mut conn = stalled::connect(server.addr).await.unwrap();
    // Ended normally: the share is returned before the handler runs.
    for call in two_over_the_budget(&mut conn).await {
        finished(call).await;
    }
    let call = stalled::open(&mut conn, SERVER_INFO, filler(700 << 10), 600 << 10)
        .await
        .unwrap();
    assert_eq!(finished(call).await.0, OK, "served after the others ended");
    // Reset by the client: the share is returned too.
    for mut call in two_over_the_budget(&mut conn).await {
        call.reset();
    }
    served_once_the_budget_is_back(&mut conn).await;
    server.stop().await;
}

const GET_JOB: &str = "/sepp.admin.v1.AdminService/GetJob";

/// A reply budget of one largest message (1 MiB) plus its header, which is then each
/// connection's share too; jobs of up to 512 KiB.
fn one_reply_budget(c: &mut sepp_server::config::Config) {
    quick(c);
    c.metrics.enabled = true;
    c.metrics.listen_addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    c.limits.max_message_bytes = 1 << 20;
    c.limits.max_payload_bytes = 512 << 10;
    c.server.reply_buffer_bytes = (1 << 20) + 5;
}

const RESERVE: &str = "/sepp.v1.QueueService/Reserve";

/// Sends whole calls of `request` to `path` on `conn` one after the other and never reads
/// their replies (nor opens the HTTP/2 window for them), until a call is refused: returns the
/// replies held unread (their streams stay open while they are kept) and the refusal's
/// message. Panics if 64 calls pass.
async fn unread_until_refused(
    conn: &mut h2::client::SendRequest<bytes::Bytes>,
    path: &str,
    request: &bytes::Bytes,
) -> (Vec<http::Response<h2::RecvStream>>, String) {
    let mut held = Vec::new();
    for _ in 0..64 {
        let call = stalled::call(conn, path, request.clone()).await.unwrap();
        let response = within(10, call).await.unwrap();
        if let Some((code, message)) = stalled::status_in(response.headers()) {
            assert_eq!(code, RESOURCE_EXHAUSTED, "{message}");
            return (held, message);
        }
        held.push(response);
    }
    panic!("64 unread replies were not refused");
}

/// Enqueues `n` jobs of 300,000 payload bytes on queue "q"; returns their ids.
async fn big_jobs(client: &sepp_rs::SeppClient, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let request = sepp_rs::EnqueueRequest::new("q", "t")
            .unwrap()
            .with_payload(vec![7u8; 300_000], "application/octet-stream");
        ids.push(client.enqueue(request).await.unwrap().job_id);
    }
    ids
}

#[tokio::test]
async fn unread_replies_past_the_reply_buffer_refuse_large_reply_calls_and_small_calls_go_on() {
    let server = TestServer::start(one_reply_budget).await;
    let client = server.client().await;
    let jobs = big_jobs(&client, 1).await;
    // One connection that reads nothing holds three replies of 300 KB; the fourth is refused.
    let mut stalled_conn = stalled::connect(server.addr).await.unwrap();
    let (held, message) =
        unread_until_refused(&mut stalled_conn, GET_JOB, &stalled::get_job_body(&jobs[0])).await;
    assert_eq!(held.len(), 3, "{message}");
    // Another connection: its reply does not fit in what is left of the whole budget...
    let mut other = stalled::connect(server.addr).await.unwrap();
    let (none, message) =
        unread_until_refused(&mut other, GET_JOB, &stalled::get_job_body(&jobs[0])).await;
    assert!(none.is_empty());
    assert!(
        message.contains("this connection holds 0 of its 1048581 bytes, all connections")
            && message.contains("of 1048581)"),
        "{message}"
    );
    // ...while enqueues and the like go on.
    client
        .enqueue(sepp_rs::EnqueueRequest::new("q", "t").unwrap())
        .await
        .expect("an enqueue while unread replies hold the reply buffer");
    // Operators see the bytes held and the refusals.
    let metrics = server.metrics_addr.expect("metrics are served");
    let scrape = samples(&get(metrics, "/metrics").await.1);
    let bytes: u64 = scrape[r#"sepp_buffer_held_bytes{buffer="reply"}"#]
        .parse()
        .unwrap();
    assert!(bytes >= 3 * 300_000 - 65_535, "{bytes} bytes held");
    assert_eq!(scrape[r#"sepp_buffer_refused_total{buffer="reply"}"#], "2");
    assert_eq!(scrape[r#"sepp_buffer_held_bytes{buffer="request"}"#], "0");
    assert_eq!(
        scrape[r#"sepp_buffer_refused_total{buffer="request"}"#],
        "0"
    );
    // The stalled connection goes: its replies are dropped and the budget comes back.
    drop(held);
    drop(stalled_conn);
    let mut admin = server.admin().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = admin
            .get_job(sepp_proto::admin::v1::GetJobRequest {
                job_id: jobs[0].clone(),
            })
            .await;
        match r {
            Ok(reply) => {
                assert_eq!(reply.into_inner().job.unwrap().job_id, jobs[0]);
                break;
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
                assert!(
                    Instant::now() < deadline,
                    "the reply budget did not come back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    // Every reply is written or dropped: the budget is whole again (nothing leaked).
    loop {
        let scrape = samples(&get(metrics, "/metrics").await.1);
        let bytes = &scrape[r#"sepp_buffer_held_bytes{buffer="reply"}"#];
        if bytes == "0" {
            break;
        }
        assert!(Instant::now() < deadline, "{bytes} reply bytes still held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.stop().await;
}

#[tokio::test]
async fn a_connection_whose_replies_are_not_read_is_dropped_after_the_stall_timeout() {
    let server = TestServer::start(|c| {
        one_reply_budget(c);
        c.server.reply_stall_timeout_ms = 1_000;
    })
    .await;
    let client = server.client().await;
    let jobs = big_jobs(&client, 1).await;
    let mut stalled_conn = stalled::connect(server.addr).await.unwrap();
    let (held, _) =
        unread_until_refused(&mut stalled_conn, GET_JOB, &stalled::get_job_body(&jobs[0])).await;
    assert_eq!(held.len(), 3);
    // A call still open on the connection does not keep it: only its replies' progress counts.
    let mut open_call = stalled::open(&mut stalled_conn, SERVER_INFO, filler(200), 10)
        .await
        .unwrap();
    let metrics = server.metrics_addr.expect("metrics are served");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let scrape = samples(&get(metrics, "/metrics").await.1);
        if scrape[r#"sepp_buffer_held_bytes{buffer="reply"}"#] == "0" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stalled connection still holds its replies"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Dropped: its calls fail, and the budget serves others again.
    assert!(open_call.finish().is_err() || within(5, open_call.status()).await.is_err());
    let reply = server
        .admin()
        .await
        .get_job(sepp_proto::admin::v1::GetJobRequest {
            job_id: jobs[0].clone(),
        })
        .await
        .expect("GetJob once the budget is back");
    assert_eq!(reply.into_inner().job.unwrap().job_id, jobs[0]);
    drop(held);
    server.stop().await;
}

#[tokio::test]
async fn a_read_reply_that_would_pass_the_reply_buffer_is_not_sent() {
    let server = TestServer::start(one_reply_budget).await;
    let client = server.client().await;
    let job = big_jobs(&client, 1).await.remove(0);
    let mut conn = stalled::connect(server.addr).await.unwrap();
    let (held, message) =
        unread_until_refused(&mut conn, GET_JOB, &stalled::get_job_body(&job)).await;
    // Three replies of 300 KB fit in 1 MiB, the fourth would not: it is made, then dropped.
    assert_eq!(held.len(), 3, "{message}");
    assert!(
        message.contains("reply not sent: its 300")
            && message.contains("server.reply_buffer_bytes")
            && message.contains("the call only reads, retry later"),
        "{message}"
    );
    server.stop().await;
}

#[tokio::test]
async fn read_calls_sent_at_once_cannot_pass_the_reply_buffer_together() {
    let server = TestServer::start(one_reply_budget).await;
    let client = server.client().await;
    let job = big_jobs(&client, 1).await.remove(0);
    let mut conn = stalled::connect(server.addr).await.unwrap();
    // 32 calls on the wire before the first is answered: all pass the check before their
    // handler (nothing is held yet); their replies are checked as they are made.
    let mut calls = Vec::new();
    for _ in 0..32 {
        let call = stalled::call(&mut conn, GET_JOB, stalled::get_job_body(&job));
        calls.push(call.await.unwrap());
    }
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for response in calls {
        let response = within(10, response).await.unwrap();
        match stalled::status_in(response.headers()) {
            None => held.push(response),
            Some((code, message)) => {
                assert_eq!(code, RESOURCE_EXHAUSTED, "{message}");
                refused.push(message);
            }
        }
    }

    // 1 MiB holds three replies of 300 KB; the fourth does not fit.
    assert_eq!(
        held.len(),
        3,
        "{} replies held, refusals: {refused:?}",
        held.len()
    );
    assert!(
        refused
            .iter()
            .all(|m| m.contains("server.reply_buffer_bytes")),
        "{refused:?}"
    );
    assert!(
        refused.iter().any(|m| m.contains("reply not sent")),
        "{refused:?}"
    );
    server.stop().await;
}

/// A reply budget of 8 MiB of which one connection may hold one largest message (1 MiB)
/// plus its header; jobs of up to 512 KiB.
fn a_share_of_one_message(c: &mut sepp_server::config::Config) {
    one_reply_budget(c);
    c.server.reply_buffer_bytes = 8 << 20;
}

/// A ReserveRequest for queue "q" with a lease of 60 s, `max_jobs`, and a wait of `wait_s`.
fn reserve_message(max_jobs: u8, wait_s: u8) -> Vec<u8> {
    let mut m = vec![0x0a, 1, b'q', 0x1a, 2, 0x08, 60, 0x28, max_jobs];
    if wait_s > 0 {
        m.extend_from_slice(&[0x12, 2, 0x08, wait_s]);
    }
    m
}

/// Queue "q"'s (ready, in flight) jobs.
async fn ready_and_in_flight(server: &TestServer) -> (u64, u64) {
    let stats = server
        .admin()
        .await
        .get_queue_stats(sepp_proto::admin::v1::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap()
        .into_inner();
    (stats.ready, stats.in_flight)
}

#[tokio::test]
async fn leases_into_unread_replies_stop_at_the_connections_share() {
    let server = TestServer::start(a_share_of_one_message).await;
    let client = server.client().await;
    // Eight Reserves wait on a connection that reads none of its replies: they were all
    // admitted while nothing was held.
    let mut stalled_conn = stalled::connect(server.addr).await.unwrap();
    let mut waiting = Vec::new();
    for _ in 0..8 {
        let body = stalled::grpc_body(&reserve_message(1, 30));
        waiting.push(
            stalled::call(&mut stalled_conn, RESERVE, body)
                .await
                .unwrap(),
        );
    }
    server.reserves_waiting(8).await;
    big_jobs(&client, 6).await;
    // Three jobs of 300 KB fit in the 1 MiB share: three Reserves answer. The other five wait
    // for room that never frees, and the jobs stay ready for connections that read.
    let mut waiting: futures_util::stream::FuturesUnordered<_> = waiting.into_iter().collect();
    let mut answers = Vec::new();
    for _ in 0..3 {
        use futures_util::StreamExt as _;
        answers.push(within(10, waiting.next()).await.unwrap().unwrap());
    }
    assert_eq!(ready_and_in_flight(&server).await, (3, 3));
    let jobs = client
        .reserve(sepp_rs::ReserveOptions::new(
            vec!["q"],
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(ready_and_in_flight(&server).await, (2, 4));
    // An ack whose then_reserve would lease into the full connection acks, and leases nothing.
    let acked = &jobs[0];
    let mut ack = vec![0x0a, acked.id.len() as u8];
    ack.extend_from_slice(acked.id.as_bytes());
    ack.extend_from_slice(&[0x10, acked.attempt as u8, 0xa2, 0x06]);
    let then = reserve_message(2, 0);
    ack.push(then.len() as u8);
    ack.extend_from_slice(&then);
    let ack = stalled::grpc_body(&ack);
    let call = stalled::call(&mut stalled_conn, "/sepp.v1.QueueService/Ack", ack)
        .await
        .unwrap();
    // Its reply cannot come (the connection's window is used up): watch the queue instead.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut now = ready_and_in_flight(&server).await;
    while now == (2, 4) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        now = ready_and_in_flight(&server).await;
    }
    assert_eq!(now, (2, 3), "acked one, leased none");
    drop((call, answers, waiting));
    server.stop().await;
}

#[tokio::test]
async fn a_call_whose_message_comes_after_the_budget_filled_is_refused_before_it_runs() {
    let server = TestServer::start(|c| {
        one_reply_budget(c);
        c.storage.dead_letter_retention_ms = 86_400_000;
    })
    .await;
    let client = server.client().await;
    // Five dead letters of 300 KB.
    for _ in 0..5 {
        let request = sepp_rs::EnqueueRequest::new("q", "t")
            .unwrap()
            .with_payload(vec![7u8; 300_000], "application/octet-stream");
        client.enqueue(request).await.unwrap();
        let job = client
            .reserve(sepp_rs::ReserveOptions::new(["q"], Duration::from_secs(60)))
            .await
            .unwrap()
            .remove(0);
        client
            .nack(&job.id, job.attempt, sepp_rs::NackRetry::DeadLetter, None)
            .await
            .unwrap();
    }
    // Five drains of one record each, on a connection that reads nothing: all their headers
    // first, while nothing is held, then their messages one by one.
    let mut conn = stalled::connect(server.addr).await.unwrap();
    let drain = stalled::grpc_body(&[0x0a, 1, b'q', 0x10, 1]);
    let mut calls = Vec::new();
    for _ in 0..5 {
        calls.push(
            stalled::open(
                &mut conn,
                "/sepp.v1.QueueService/DrainDeadLetters",
                drain.clone(),
                1,
            )
            .await
            .unwrap(),
        );
    }
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for mut call in calls {
        call.finish().unwrap();
        let response = within(10, call.response).await.unwrap();
        match stalled::status_in(response.headers()) {
            None => held.push(response),
            Some((_, message)) => refused.push(message),
        }
    }
    // Four replies pass the 1 MiB share; the fifth call is refused when its message is in.
    assert_eq!(held.len(), 4, "{refused:?}");
    assert!(
        refused.len() == 1 && refused[0].contains("call not processed: this connection has"),
        "{refused:?}"
    );
    let stats = server
        .admin()
        .await
        .get_queue_stats(sepp_proto::admin::v1::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.dead_lettered, 1, "the refused drain removed nothing");
    server.stop().await;
}

#[tokio::test]
async fn a_request_body_that_ends_inside_its_message_is_invalid_argument() {
    let server = TestServer::start(quick).await;
    let mut conn = stalled::connect(server.addr).await.unwrap();
    for (path, sent) in [(SERVER_INFO, 100), (SERVER_INFO, 3), (HEALTH_CHECK, 50)] {
        let mut call = stalled::open(&mut conn, path, filler(200), sent)
            .await
            .unwrap();
        call.end_here().unwrap();
        let (code, message) = within(5, call.status()).await.unwrap();
        assert_eq!(code, INVALID_ARGUMENT, "{path} {sent}: {message}");
        assert!(message.contains("request body ends inside"), "{message}");
    }
    server.stop().await;
}

#[tokio::test]
async fn a_request_body_with_more_than_one_message_or_a_bad_compressed_flag_is_invalid_argument() {
    let server = TestServer::start(quick).await;
    let mut conn = stalled::connect(server.addr).await.unwrap();
    let one = filler(200);
    let cat = |a: &[u8], b: &[u8]| bytes::Bytes::from([a, b].concat());
    let flagged = |flag: u8| {
        let mut m = one.to_vec();
        m[0] = flag;
        bytes::Bytes::from(m)
    };
    let cases = [
        (
            cat(&one, &one[..3]),
            "has 3 bytes after its message of 200 bytes",
        ),
        (
            cat(&one, &one),
            "has 205 bytes after its message of 200 bytes",
        ),
        (
            flagged(1),
            "compressed flag set (1) but the call names no grpc-encoding",
        ),
        (flagged(2), "compressed flag is 2"),
    ];
    for (body, want) in cases {
        let call = stalled::call(&mut conn, SERVER_INFO, body).await.unwrap();
        let (code, message) = within(5, stalled::grpc_status(call)).await.unwrap();
        assert_eq!(code, INVALID_ARGUMENT, "{want}: {message}");
        assert!(message.contains(want), "{want}: {message}");
    }
    // The same message alone is served.
    let call = stalled::call(&mut conn, SERVER_INFO, one).await.unwrap();
    let (code, message) = within(5, stalled::grpc_status(call)).await.unwrap();
    assert_eq!(code, OK, "{message}");
    server.stop().await;
}

#[tokio::test]
async fn without_an_api_key_a_call_is_refused_on_its_headers_before_its_message_is_read() {
    let server = TestServer::start(|c| {
        quick(c);
        c.server.handshake_timeout_ms = 60_000;
        c.auth.api_keys = Some(vec![sepp_server::config::ApiKey::new("p", "s3cret")]);
    })
    .await;
    let mut conn = stalled::connect(server.addr).await.unwrap();
    for path in [
        SERVER_INFO,
        "/sepp.admin.v1.AdminService/GetQueueStats",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    ] {
        // 10 bytes of a 1 MiB message, then nothing: only the headers can be judged.
        let call = stalled::open(&mut conn, path, filler(1 << 20), 10)
            .await
            .unwrap();
        let (code, message) = within(5, call.status()).await.unwrap();
        assert_eq!(code, UNAUTHENTICATED, "{path}: {message}");
        assert!(message.contains("authorization"), "{path}: {message}");
    }
    server.stop().await;
}
