//! A server killed (SIGKILL) and restarted under keyed producers: the client reports the cut-off
//! calls as transport errors, retries them with the same keys, and every job exists exactly once.

mod common;

use common::sepp_bin;
use sepp_rs::{EnqueueRequest, ErrorCode, RetryPolicy, SeppClient};
use sepp_server::testing::ServerProcess;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const PRODUCERS: usize = 8;
const PER_PRODUCER: usize = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_producers_survive_a_killed_and_restarted_server_with_every_job_once() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n",
        dir.path().join("data").display()
    );
    let mut server = ServerProcess::start(&sepp_bin(), dir.path(), &toml);
    let addr = server.addr.to_string();
    // Enough tries to span a restart; the default policy (3 tries) is for short blips.
    let policy = RetryPolicy {
        max_retries: 59,
        first_retry_delay: Duration::from_millis(20),
        max_retry_delay: Duration::from_millis(250),
        ..RetryPolicy::default()
    };
    let client = SeppClient::builder(server.url())
        .retry_policy(policy)
        .connect()
        .await
        .unwrap();
    let acked = Arc::new(AtomicUsize::new(0));
    let mut producers = Vec::new();
    for p in 0..PRODUCERS {
        let client = client.clone();
        let acked = acked.clone();
        producers.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..PER_PRODUCER {
                let req = EnqueueRequest::new("killed", "t")
                    .unwrap()
                    .with_payload(vec![7u8; 512], "application/octet-stream")
                    .with_idempotency_key(format!("p{p}-{i}"));
                let ack = client
                    .enqueue(req)
                    .await
                    .unwrap_or_else(|e| panic!("p{p}-{i}: {e}"));
                acked.fetch_add(1, Ordering::SeqCst);
                ids.push(ack.job_id);
            }
            ids
        }));
    }
    // Kill while calls are in flight, then bring the server back on the same port and data.
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.load(Ordering::SeqCst) < PRODUCERS * PER_PRODUCER / 4 {
        assert!(Instant::now() < deadline, "producers made no progress");
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill9();
    let at_kill = acked.load(Ordering::SeqCst);
    assert!(
        at_kill < PRODUCERS * PER_PRODUCER,
        "killed too late to matter"
    );
    let server = ServerProcess::start_on(&sepp_bin(), dir.path(), &toml, &addr);

    let mut ids = HashSet::new();
    for p in producers {
        for id in tokio::time::timeout(Duration::from_secs(60), p)
            .await
            .expect("producers finish")
            .expect("a producer failed")
        {
            assert!(ids.insert(id), "one job id acknowledged for two keys");
        }
    }
    assert_eq!(ids.len(), PRODUCERS * PER_PRODUCER);
    let fresh = SeppClient::connect(server.url()).await.unwrap();
    let stats = fresh.get_queue_stats("killed").await.unwrap();
    assert_eq!(
        stats.ready as usize,
        PRODUCERS * PER_PRODUCER,
        "every key became exactly one job"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_cut_off_by_a_killed_server_are_transport_errors_not_server_faults() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[server]\ndb_path = \"{}\"\n",
        dir.path().join("data").display()
    );
    let mut server = ServerProcess::start(&sepp_bin(), dir.path(), &toml);
    let client = SeppClient::builder(server.url())
        .no_retries()
        .connect()
        .await
        .unwrap();
    let acked = Arc::new(AtomicUsize::new(0));
    let mut producers = Vec::new();
    for p in 0..16 {
        let client = client.clone();
        let acked = acked.clone();
        producers.push(tokio::spawn(async move {
            for i in 0.. {
                let req = EnqueueRequest::new("cut", "t")
                    .unwrap()
                    .with_payload(vec![1u8; 4096], "application/octet-stream")
                    .with_idempotency_key(format!("p{p}-{i}"));
                if let Err(e) = client.enqueue(req).await {
                    return e;
                }
                acked.fetch_add(1, Ordering::SeqCst);
            }
            unreachable!()
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while acked.load(Ordering::SeqCst) < 300 {
        assert!(Instant::now() < deadline, "producers made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // 16 calls are on the wire at any moment: most of them are cut off mid-call.
    server.kill9();
    for p in producers {
        let err = tokio::time::timeout(Duration::from_secs(30), p)
            .await
            .expect("the producer stops")
            .unwrap();
        assert_eq!(err.code(), ErrorCode::Transport, "{err}");
    }
}
