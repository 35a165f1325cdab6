//! Automatic retries reuse idempotency keys: a server that loses the first reply still ends
//! with one job, and the retried call reports `deduplicated = true`.

mod common;

use common::Tamper;
use sepp_rs::{EnqueueRequest, ErrorCode, RetryPolicy, SeppClient};
use sepp_server::testing::TestServer;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A proxy that loses the reply of the first `drops` EnqueueBatch calls after the server
/// committed them.
async fn lossy(server: &TestServer, drops: Arc<AtomicU32>) -> String {
    let tamper = Tamper {
        drop_enqueue_replies: drops,
        ..Tamper::default()
    };
    common::proxy(server, tamper).await
}

fn policy() -> RetryPolicy {
    RetryPolicy {
        max_retries: 2,
        first_retry_delay: Duration::from_millis(10),
        ..RetryPolicy::default()
    }
}

#[tokio::test]
async fn a_keyed_enqueue_whose_reply_was_lost_is_retried_into_a_dedup_hit() {
    let server = TestServer::start(|_| {}).await;
    let drops = Arc::new(AtomicU32::new(1));
    let url = lossy(&server, drops.clone()).await;
    let client = SeppClient::builder(url)
        .retry_policy(policy())
        .connect()
        .await
        .unwrap();
    let ack = client
        .enqueue(
            EnqueueRequest::new("q", "t")
                .unwrap()
                .with_idempotency_key("k"),
        )
        .await
        .unwrap();
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "the first reply was dropped"
    );
    assert!(
        ack.deduplicated,
        "the retry should have hit the first attempt's record"
    );
    let direct = SeppClient::connect(server.url()).await.unwrap();
    assert_eq!(
        direct.get_queue_stats("q").await.unwrap().ready,
        1,
        "exactly one job"
    );
}

#[tokio::test]
async fn an_unkeyed_enqueue_is_not_retried_once_it_may_have_committed() {
    let server = TestServer::start(|_| {}).await;
    let drops = Arc::new(AtomicU32::new(1));
    let url = lossy(&server, drops).await;
    let client = SeppClient::builder(url)
        .retry_policy(policy())
        .connect()
        .await
        .unwrap();
    let err = client
        .enqueue(EnqueueRequest::new("q", "t").unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Transport);
    let direct = SeppClient::connect(server.url()).await.unwrap();
    assert_eq!(
        direct.get_queue_stats("q").await.unwrap().ready,
        1,
        "no second job"
    );
}

#[tokio::test]
async fn with_retries_turned_off_nothing_is_retried() {
    let server = TestServer::start(|_| {}).await;
    let drops = Arc::new(AtomicU32::new(1));
    let url = lossy(&server, drops).await;
    let client = SeppClient::builder(url)
        .no_retries()
        .connect()
        .await
        .unwrap();
    let err = client
        .enqueue(
            EnqueueRequest::new("q", "t")
                .unwrap()
                .with_idempotency_key("k"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::Transport);
}
