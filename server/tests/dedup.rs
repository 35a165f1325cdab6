//! The idempotency key and the dedup window, end to end over real gRPC.

mod common;

use common::{Clients, TestServer};
use sepp_proto::v1 as pb;
use sepp_rs::{EnqueueError, EnqueueRequest, Rejection};
use sepp_server::config::QueueConfig;
use std::collections::HashSet;
use std::time::Duration;

fn keyed(queue: &str, key: &str) -> EnqueueRequest {
    EnqueueRequest::new(queue, "receipt")
        .unwrap()
        .with_idempotency_key(key)
}

fn raw_job(queue: &str, key: Option<&str>) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: queue.into(),
        job_type: "receipt".into(),
        idempotency_key: key.map(str::to_string),
        ..Default::default()
    }
}

async fn raw_enqueue(server: &TestServer, job: pb::EnqueueRequest) -> pb::job_result::Outcome {
    let mut raw = server.raw().await;
    raw.enqueue_batch(pb::EnqueueBatchRequest { jobs: vec![job] })
        .await
        .expect("rpc")
        .into_inner()
        .results
        .remove(0)
        .outcome
        .expect("outcome")
}

#[tokio::test]
async fn a_repeated_key_returns_the_original_job_marked_deduplicated() {
    let server = TestServer::start(|_| {}).await;
    let client = server.client().await;
    let first = client.enqueue(keyed("emails", "order-77")).await.unwrap();
    let second = client.enqueue(keyed("emails", "order-77")).await.unwrap();
    assert!(!first.deduplicated);
    assert!(second.deduplicated);
    assert_eq!(first.job_id, second.job_id);
    assert!(uuid_v4(&first.job_id), "{}", first.job_id);
}

fn uuid_v4(s: &str) -> bool {
    s.len() == 36 && s.as_bytes()[14] == b'4'
}

#[tokio::test]
async fn the_same_key_on_two_queues_creates_two_jobs() {
    let server = TestServer::start(|_| {}).await;
    let client = server.client().await;
    let a = client.enqueue(keyed("emails", "k")).await.unwrap();
    let b = client.enqueue(keyed("sms", "k")).await.unwrap();
    assert_ne!(a.job_id, b.job_id);
    assert!(!a.deduplicated && !b.deduplicated);
}

#[tokio::test]
async fn the_server_counts_key_length_in_utf8_bytes() {
    let server = TestServer::start(|_| {}).await;
    let ok = |o: &pb::job_result::Outcome| matches!(o, pb::job_result::Outcome::Success(_));
    assert!(ok(&raw_enqueue(
        &server,
        raw_job("q", Some(&"a".repeat(256)))
    )
    .await));
    assert!(ok(&raw_enqueue(
        &server,
        raw_job("q", Some(&"é".repeat(128)))
    )
    .await));
    let too_long = |o: pb::job_result::Outcome| match o {
        pb::job_result::Outcome::Rejection(pb::JobRejection {
            reason: Some(pb::job_rejection::Reason::IdempotencyKeyTooLong(x)),
        }) => (x.limit, x.actual),
        other => panic!("expected IdempotencyKeyTooLong, got {other:?}"),
    };
    assert_eq!(
        too_long(raw_enqueue(&server, raw_job("q", Some(&"a".repeat(257)))).await),
        (256, 257)
    );
    assert_eq!(
        too_long(raw_enqueue(&server, raw_job("q", Some(&"€".repeat(86)))).await),
        (256, 258)
    );
    match raw_enqueue(&server, raw_job("q", Some(""))).await {
        pb::job_result::Outcome::Rejection(pb::JobRejection {
            reason: Some(pb::job_rejection::Reason::InvalidRequest(m)),
        }) => assert!(m.message.contains("idempotency_key"), "{}", m.message),
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
}

#[tokio::test]
async fn the_client_rejects_an_over_long_key_with_the_same_value_as_the_server() {
    let server = TestServer::start(|_| {}).await;
    let client = server.client().await;
    let err = client
        .enqueue(keyed("q", &"a".repeat(257)))
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        EnqueueError::Rejected(Rejection::IdempotencyKeyTooLong {
            limit: 256,
            actual: 257
        })
    ));
    // A client that has not heard the server's limit does not assume one: it leaves the key
    // to the server (here unreachable), which may allow longer keys (docs/errors.md).
    let offline = sepp_rs::SeppClient::builder("http://127.0.0.1:9")
        .connect_lazy()
        .unwrap();
    let err = offline
        .enqueue(keyed("q", &"a".repeat(257)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), sepp_rs::ErrorCode::Transport);
}

#[tokio::test]
async fn keys_are_compared_byte_for_byte_without_normalisation() {
    let server = TestServer::start(|_| {}).await;
    let client = server.client().await;
    let keys = ["abc", "ABC", " abc", "\u{e9}", "e\u{301}"];
    let mut ids = HashSet::new();
    for k in keys {
        let ack = client.enqueue(keyed("q", k)).await.unwrap();
        assert!(!ack.deduplicated, "key {k:?} was taken as a duplicate");
        ids.insert(ack.job_id);
    }
    assert_eq!(ids.len(), 5);
}

#[tokio::test]
async fn the_window_runs_from_the_first_enqueue_and_a_hit_does_not_extend_it() {
    let server = TestServer::start(|c| {
        c.queues.push(QueueConfig {
            name: "short".into(),
            dedup_window_ms: Some(2_000),
            ..Default::default()
        });
    })
    .await;
    let client = server.client().await;
    let start = tokio::time::Instant::now();
    let first = client.enqueue(keyed("short", "k")).await.unwrap();
    let other = client.enqueue(keyed("long", "k")).await.unwrap();

    tokio::time::sleep_until(start + Duration::from_millis(500)).await;
    let at_half = client.enqueue(keyed("short", "k")).await.unwrap();
    assert!(at_half.deduplicated);
    assert_eq!(at_half.job_id, first.job_id);

    tokio::time::sleep_until(start + Duration::from_millis(1_500)).await;
    let at_one_and_half = client.enqueue(keyed("short", "k")).await.unwrap();
    assert!(at_one_and_half.deduplicated);

    tokio::time::sleep_until(start + Duration::from_millis(3_000)).await;
    let at_three = client.enqueue(keyed("short", "k")).await.unwrap();
    assert!(
        !at_three.deduplicated,
        "the 2 s window was extended by a hit"
    );
    assert_ne!(at_three.job_id, first.job_id);

    let default_window = client.enqueue(keyed("long", "k")).await.unwrap();
    assert!(default_window.deduplicated);
    assert_eq!(default_window.job_id, other.job_id);
}

#[tokio::test]
async fn a_batch_with_a_repeated_key_dedups_within_itself() {
    let server = TestServer::start(|_| {}).await;
    let client = server.client().await;
    let results = client
        .enqueue_batch(vec![keyed("q", "K"), keyed("q", "K"), keyed("q", "L")])
        .await
        .unwrap();
    let acks: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert!(!acks[0].deduplicated);
    assert!(acks[1].deduplicated);
    assert_eq!(acks[1].job_id, acks[0].job_id);
    assert!(!acks[2].deduplicated);
    assert_ne!(acks[2].job_id, acks[0].job_id);

    let atomic = client
        .enqueue_atomic(vec![keyed("q", "M"), keyed("q", "M")])
        .await
        .unwrap()
        .unwrap();
    assert!(!atomic[0].deduplicated && atomic[1].deduplicated);
    assert_eq!(atomic[0].job_id, atomic[1].job_id);
}

#[tokio::test]
async fn an_atomic_batch_with_two_invalid_jobs_lists_both_and_writes_nothing() {
    let server = TestServer::start(|_| {}).await;
    let mut raw = server.raw().await;
    let mut bad_priority = raw_job("q", Some("valid-2"));
    bad_priority.priority = Some(10);
    let jobs = vec![
        raw_job("q", Some("valid-1")),
        raw_job("q", Some(&"x".repeat(300))),
        raw_job("q", Some("valid-3")),
        bad_priority,
    ];
    let resp = raw
        .enqueue_atomic(pb::EnqueueBatchRequest { jobs })
        .await
        .unwrap()
        .into_inner();
    let Some(pb::enqueue_atomic_response::Outcome::Rejection(f)) = resp.outcome else {
        panic!("expected a rejection, got {resp:?}");
    };
    let indexes: Vec<u32> = f.errors.iter().map(|e| e.index).collect();
    assert_eq!(indexes, vec![1, 3]);
    // Nothing was written: the valid jobs' keys are still free.
    let client = server.client().await;
    for k in ["valid-1", "valid-3", "valid-2"] {
        assert!(
            !client.enqueue(keyed("q", k)).await.unwrap().deduplicated,
            "{k} was taken"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_of_one_key_create_exactly_one_job() {
    let server = TestServer::start(|_| {}).await;
    let mut clients = Vec::new();
    for _ in 0..64 {
        // One connection each.
        clients.push(server.client().await);
    }
    for round in 0..20 {
        let key = format!("race-{round}");
        let mut tasks = Vec::new();
        for c in &clients {
            let c = c.clone();
            let key = key.clone();
            tasks.push(tokio::spawn(
                async move { c.enqueue(keyed("race", &key)).await },
            ));
        }
        let mut ids = HashSet::new();
        let mut fresh = 0;
        for t in tasks {
            let ack = t.await.unwrap().unwrap();
            ids.insert(ack.job_id);
            fresh += usize::from(!ack.deduplicated);
        }
        assert_eq!(ids.len(), 1, "round {round}: {ids:?}");
        assert_eq!(
            fresh, 1,
            "round {round}: {fresh} callers saw deduplicated = false"
        );
    }
}

fn strict_queue(c: &mut sepp_server::config::Config) {
    c.queues.push(QueueConfig {
        name: "strict".into(),
        key_conflict: Some(sepp_server::config::KeyConflict::Reject),
        ..Default::default()
    });
}

fn with_payload(queue: &str, key: &str, data: &[u8]) -> EnqueueRequest {
    keyed(queue, key).with_payload(data.to_vec(), "text/plain")
}

#[tokio::test]
async fn a_key_reused_for_other_work_is_rejected_naming_the_original_in_every_mode() {
    let server = TestServer::start(strict_queue).await;
    let client = server.client().await;
    let original = client
        .enqueue(with_payload("strict", "k", b"a"))
        .await
        .unwrap();
    // Same contents: a hit.
    let again = client
        .enqueue(with_payload("strict", "k", b"a"))
        .await
        .unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.job_id, original.job_id);
    let is_conflict = |r: &Rejection| match r {
        Rejection::IdempotencyKeyConflict { original_job_id } => {
            assert_eq!(original_job_id, &original.job_id);
            assert_eq!(r.code().as_str(), "IDEMPOTENCY_KEY_CONFLICT");
            assert_eq!(r.code().class_name(), "IdempotencyKeyConflictError");
            assert!(!r.is_transient());
        }
        other => panic!("expected a key conflict, got {other:?}"),
    };
    // Unary, twice (deterministic).
    for _ in 0..2 {
        match client.enqueue(with_payload("strict", "k", b"b")).await {
            Err(EnqueueError::Rejected(r)) => is_conflict(&r),
            other => panic!("expected a rejection, got {other:?}"),
        }
    }
    // Batch: only the conflicting job is rejected.
    let out = client
        .enqueue_batch(vec![
            with_payload("strict", "k", b"b"),
            with_payload("strict", "other", b"b"),
        ])
        .await
        .unwrap();
    is_conflict(out[0].as_ref().unwrap_err());
    assert!(!out[1].as_ref().unwrap().deduplicated);
    // Atomic: nothing written, the failing index reported.
    let failures = client
        .enqueue_atomic(vec![
            with_payload("strict", "fresh", b"x"),
            with_payload("strict", "k", b"b"),
        ])
        .await
        .unwrap()
        .expect_err("refused");
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, 1);
    is_conflict(&failures[0].1);
    let fresh = client
        .enqueue(with_payload("strict", "fresh", b"y"))
        .await
        .unwrap();
    assert!(!fresh.deduplicated, "the atomic batch wrote nothing");
    // Other priority or custom map: a conflict too; another queue keeps the founding rule.
    match client
        .enqueue(with_payload("strict", "k", b"a").with_priority(5))
        .await
    {
        Err(EnqueueError::Rejected(r)) => is_conflict(&r),
        other => panic!("expected a rejection, got {other:?}"),
    }
    let plain = client
        .enqueue(with_payload("plain", "k", b"a"))
        .await
        .unwrap();
    let hit = client
        .enqueue(with_payload("plain", "k", b"b"))
        .await
        .unwrap();
    assert!(hit.deduplicated);
    assert_eq!(hit.job_id, plain.job_id);
    // On the wire: the sepp addition (field 101) names the original.
    match raw_enqueue(&server, raw_job("strict", Some("k"))).await {
        pb::job_result::Outcome::Rejection(pb::JobRejection {
            reason: Some(pb::job_rejection::Reason::IdempotencyKeyConflict(c)),
        }) => assert_eq!(c.original_job_id, original.job_id),
        other => panic!("expected a key conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn a_hit_says_where_the_original_job_is() {
    use sepp_rs::admin::JobState;
    let server = TestServer::start(|_| {}).await;
    let client = server.client().await;
    let first = client.enqueue(keyed("emails", "k")).await.unwrap();
    assert_eq!(
        first.original_state, None,
        "a created job has no original state"
    );
    let hit = client.enqueue(keyed("emails", "k")).await.unwrap();
    assert_eq!(hit.original_state, Some(JobState::Ready));
    let jobs = client
        .reserve(sepp_rs::ReserveOptions::new(
            ["emails"],
            Duration::from_secs(30),
        ))
        .await
        .unwrap();
    let hit = client.enqueue(keyed("emails", "k")).await.unwrap();
    assert_eq!(hit.original_state, Some(JobState::InFlight));
    client.ack(&jobs[0].id, jobs[0].attempt).await.unwrap();
    let out = client
        .enqueue_batch(vec![keyed("emails", "k")])
        .await
        .unwrap();
    assert_eq!(
        out[0].as_ref().unwrap().original_state,
        Some(JobState::Acked)
    );
    // On the wire: field 101 of EnqueueResponse.
    match raw_enqueue(&server, raw_job("emails", Some("k"))).await {
        pb::job_result::Outcome::Success(s) => {
            assert_eq!(s.original_state, Some(pb::JobState::Acked as i32));
        }
        other => panic!("expected a hit, got {other:?}"),
    }
}
