//! `[metrics]`: `GET /metrics` after a known sequence of calls over real gRPC reports exactly
//! the counts of that sequence, and the store-wide gauges read from the store.

mod common;

use common::{Clients, TestServer, get, samples};
use sepp_rs::{EnqueueError, EnqueueRequest, NackRetry, ReserveOptions};
use sepp_server::config::QueueConfig;
use sepp_server::queue::clock::{Clock, ManualClock, SystemClock};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn a_scrape_counts_a_known_sequence_of_calls_and_reads_gauges_from_the_store() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let server = TestServer::start_with_clock(clock.clone(), |c| {
        c.metrics.enabled = true;
        c.metrics.listen_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        c.storage.dead_letter_retention_ms = 86_400_000;
        c.queues = vec![QueueConfig {
            name: "q".into(),
            allowed_job_types: Some(vec!["t".into()]),
            ..Default::default()
        }];
    })
    .await;
    let addr = server.metrics_addr.expect("metrics are served");
    let c = server.client().await;

    // 3 created, 1 deduplicated, 1 rejected.
    for k in ["k1", "k2", "k3", "k1"] {
        let job = EnqueueRequest::new("q", "t")
            .unwrap()
            .with_idempotency_key(k);
        c.enqueue(job).await.expect("enqueue");
    }
    let bad = EnqueueRequest::new("q", "not-allowed").unwrap();
    assert!(matches!(
        c.enqueue(bad).await,
        Err(EnqueueError::Rejected(_))
    ));
    // 3 reserved: one acked, one nacked to the dead letters, one left to expire.
    let jobs = c
        .reserve(ReserveOptions::new(["q"], Duration::from_millis(1000)).with_max_jobs(3))
        .await
        .expect("reserve");
    assert_eq!(jobs.len(), 3);
    c.ack(&jobs[0].id, jobs[0].attempt).await.expect("ack");
    assert!(
        c.nack(&jobs[1].id, jobs[1].attempt, NackRetry::DeadLetter, None)
            .await
            .expect("nack")
    );
    clock.advance(2000);
    server.sweep().await;

    let (status, body) = get(addr, "/metrics").await;
    assert!(status.contains("200"), "{status}");
    let m = samples(&body);
    let at = |k: &str| {
        m.get(k)
            .unwrap_or_else(|| panic!("no sample {k} in:\n{body}"))
            .as_str()
    };
    assert_eq!(at(r#"sepp_jobs_enqueued_total{queue="q"}"#), "3");
    assert_eq!(at(r#"sepp_jobs_deduplicated_total{queue="q"}"#), "1");
    assert_eq!(
        at(r#"sepp_jobs_rejected_total{reason="job_type_not_allowed"}"#),
        "1"
    );
    assert_eq!(at(r#"sepp_jobs_reserved_total{queue="q"}"#), "3");
    assert_eq!(at(r#"sepp_jobs_acked_total{queue="q"}"#), "1");
    assert_eq!(at(r#"sepp_jobs_nacked_total{queue="q"}"#), "1");
    assert_eq!(
        at(r#"sepp_jobs_dead_lettered_total{cause="rejected"}"#),
        "1"
    );
    assert_eq!(at("sepp_jobs_redelivered_total"), "1");
    // One histogram sample per call: 5 enqueues (the client sends each as an EnqueueBatch of
    // one; the rejected one is an OK reply carrying the rejection), one Reserve, one Ack.
    assert_eq!(
        at(r#"sepp_rpc_duration_seconds_count{rpc="EnqueueBatch",code="OK"}"#),
        "5"
    );
    assert_eq!(
        at(r#"sepp_rpc_duration_seconds_count{rpc="Reserve",code="OK"}"#),
        "1"
    );
    assert_eq!(
        at(r#"sepp_rpc_duration_seconds_count{rpc="Ack",code="OK"}"#),
        "1"
    );
    // Store-wide gauges: the expired job is ready again, 2 s after it was enqueued.
    assert_eq!(at(r#"sepp_store_queue_jobs{queue="q",state="ready"}"#), "1");
    assert_eq!(
        at(r#"sepp_store_queue_jobs{queue="q",state="in_flight"}"#),
        "0"
    );
    assert_eq!(
        at(r#"sepp_store_queue_jobs{queue="q",state="dead_lettered"}"#),
        "1"
    );
    assert_eq!(
        at(r#"sepp_store_queue_oldest_ready_age_seconds{queue="q"}"#),
        "2.0"
    );
    assert_eq!(at("sepp_reserves_waiting"), "0");
    assert_eq!(at(r#"sepp_store_dedup_records{queue="q"}"#), "3");
    assert_eq!(at("sepp_store_dedup_records_all"), "3");
    assert_eq!(at("sepp_store_dedup_oldest_age_seconds"), "2.0");
    // Every commit was observed; the writes of the calls above are at least one batch.
    let commits: u64 = at("sepp_storage_commit_writes_count").parse().unwrap();
    assert!(commits >= 1, "{commits}");

    // A failed call is counted under its code; an unknown path is "unknown", not a new label.
    let mut raw = server.raw().await;
    let err = raw
        .ack(sepp_proto::v1::AckRequest {
            job_id: "not-a-job".into(),
            attempt: 1,
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    assert!(
        err.message()
            .contains("\"not-a-job\" (not a UUID, so no job's id)"),
        "{err:?}"
    );
    raw.get_server_info(sepp_proto::v1::GetServerInfoRequest {})
        .await
        .expect("info");
    let (_, body) = get(addr, "/metrics").await;
    let m = samples(&body);
    assert_eq!(
        m.get(r#"sepp_rpc_duration_seconds_count{rpc="Ack",code="NOT_FOUND"}"#)
            .map(String::as_str),
        Some("1"),
        "{body}"
    );

    // A Reserve waiting on an empty queue shows in the gauge while it waits.
    let waiting = tokio::spawn({
        let mut raw = raw.clone();
        async move {
            raw.reserve(sepp_proto::v1::ReserveRequest {
                queues: vec!["idle".into()],
                wait_timeout: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                lease_duration: Some(prost_types::Duration {
                    seconds: 30,
                    nanos: 0,
                }),
                ..Default::default()
            })
            .await
        }
    });
    server.reserves_waiting(1).await;
    let (_, body) = get(addr, "/metrics").await;
    assert_eq!(
        samples(&body)
            .get("sepp_reserves_waiting")
            .map(String::as_str),
        Some("1"),
        "{body}"
    );
    drop(waiting);
    server.stop().await;
}

/// Past `max_queue_labels`, queues share `queue="_other"`; declared queues always keep theirs.
#[tokio::test]
async fn the_queue_label_is_bounded() {
    let server = TestServer::start(|c| {
        c.metrics.enabled = true;
        c.metrics.listen_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        c.metrics.max_queue_labels = 2;
        c.queues = vec![QueueConfig {
            name: "declared".into(),
            ..Default::default()
        }];
    })
    .await;
    let addr = server.metrics_addr.expect("metrics are served");
    let c = server.client().await;
    for q in ["a", "b", "c", "declared"] {
        c.enqueue(EnqueueRequest::new(q, "t").unwrap())
            .await
            .expect("enqueue");
    }
    let (_, body) = get(addr, "/metrics").await;
    let m = samples(&body);
    let at = |k: &str| m.get(k).map(String::as_str);
    assert_eq!(
        at(r#"sepp_jobs_enqueued_total{queue="declared"}"#),
        Some("1")
    );
    assert_eq!(at(r#"sepp_jobs_enqueued_total{queue="a"}"#), Some("1"));
    assert_eq!(at(r#"sepp_jobs_enqueued_total{queue="_other"}"#), Some("2"));
    assert_eq!(at(r#"sepp_jobs_enqueued_total{queue="b"}"#), None);
    // The store's gauges: declared first, then others in name order up to the bound.
    assert_eq!(
        at(r#"sepp_store_queue_jobs{queue="_other",state="ready"}"#),
        Some("2")
    );
    server.stop().await;
}
