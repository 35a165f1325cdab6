//! Every client call against a real in-process server, and request validation without one.

use sepp_rs::admin::{DeadLetterSelector, JobState};
use sepp_rs::{
    BatchError, EnqueueError, EnqueueRequest, ErrorCode, LeaseError, NackRetry, Rejection,
    ReserveError, ReserveOptions, SeppClient,
};
use sepp_server::testing::TestServer;
use std::time::{Duration, SystemTime};

async fn setup() -> (TestServer, SeppClient) {
    let server = TestServer::start(|c| c.storage.dead_letter_retention_ms = 60_000).await;
    let client = SeppClient::connect(server.url()).await.expect("connect");
    (server, client)
}

#[tokio::test]
async fn a_client_connected_to_nothing_still_validates_requests() {
    let client = SeppClient::builder("127.0.0.1:9").connect_lazy().unwrap();
    assert_eq!(client.max_idempotency_key_bytes(), None);
    // The structural rules need no server, and give the server's messages.
    let bad_queue = EnqueueRequest {
        queue: "a/b".into(),
        ..EnqueueRequest::new("q", "t").unwrap()
    };
    match client.enqueue(bad_queue).await {
        Err(EnqueueError::Rejected(Rejection::InvalidRequest { message })) => {
            assert_eq!(message, "queue: queue name must not contain '/'");
        }
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
    let empty = EnqueueRequest::new("q", "t")
        .unwrap()
        .with_idempotency_key("");
    assert!(matches!(
        client.enqueue(empty).await,
        Err(EnqueueError::Rejected(Rejection::InvalidRequest { .. }))
    ));
    let prio = EnqueueRequest::new("q", "t").unwrap().with_priority(10);
    assert_eq!(
        client.enqueue(prio).await.unwrap_err().code(),
        ErrorCode::InvalidRequest
    );
    assert!(matches!(
        client
            .reserve(ReserveOptions::new(
                Vec::<String>::new(),
                Duration::from_secs(1)
            ))
            .await,
        Err(ReserveError::Invalid(_))
    ));
    assert!(matches!(
        client
            .reserve(ReserveOptions::new(["q"], Duration::ZERO))
            .await,
        Err(ReserveError::Invalid(_))
    ));
    assert!(matches!(
        client.enqueue_batch(vec![]).await,
        Err(BatchError::Invalid(_))
    ));
    assert!(matches!(
        client.extend("x", 1, Duration::ZERO).await,
        Err(LeaseError::Invalid(_))
    ));
    // A long key is not refused before the server's limit is known: the call goes out (and
    // here reports the transport).
    let long_key = EnqueueRequest::new("q", "t")
        .unwrap()
        .with_idempotency_key("a".repeat(300));
    let err = client.enqueue(long_key).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::Transport);
}

/// A server whose key limit is 1,024 bytes: a client that has not asked for the limit yet
/// must not refuse a 300-byte key (it used to assume 256), and once it knows the limit it
/// refuses exactly what the server refuses, with the same rejection.
#[tokio::test]
async fn key_lengths_follow_the_limit_the_server_advertises() {
    let server = TestServer::start(|c| c.limits.max_idempotency_key_bytes = 1024).await;
    let keyed = |n: usize| {
        EnqueueRequest::new("keys", "t")
            .unwrap()
            .with_idempotency_key("k".repeat(n))
    };
    let lazy = SeppClient::builder(server.url()).connect_lazy().unwrap();
    assert_eq!(lazy.max_idempotency_key_bytes(), None);
    lazy.enqueue(keyed(300))
        .await
        .expect("a 300-byte key is accepted");
    let from_server = lazy.enqueue(keyed(1025)).await.unwrap_err();

    let connected = SeppClient::connect(server.url()).await.unwrap();
    assert_eq!(connected.max_idempotency_key_bytes(), Some(1024));
    connected
        .enqueue(keyed(1024))
        .await
        .expect("1,024 bytes is the limit");
    let from_client = connected.enqueue(keyed(1025)).await.unwrap_err();
    let expected = Rejection::IdempotencyKeyTooLong {
        limit: 1024,
        actual: 1025,
    };
    for e in [from_server, from_client] {
        assert!(
            matches!(&e, EnqueueError::Rejected(r) if *r == expected),
            "{e:?}"
        );
    }
    // The lazy client learns the limit when it asks.
    lazy.get_server_info().await.unwrap();
    assert_eq!(lazy.max_idempotency_key_bytes(), Some(1024));
}

/// A job with two faults gets the same rejection from the client (checking before sending) as
/// from the server (sent the same job over raw gRPC): the first in the protocol's order.
#[tokio::test]
async fn a_job_with_two_faults_gets_the_servers_rejection_from_the_client() {
    use sepp_proto::v1 as pb;
    use sepp_proto::v1::job_rejection::Reason;
    let server = TestServer::start(|_| {}).await;
    let client = SeppClient::connect(server.url()).await.unwrap();
    let mut raw = pb::queue_service_client::QueueServiceClient::connect(server.url())
        .await
        .unwrap();
    let long_key = "k".repeat(300);
    let cases = [
        // A queue name with a '/' and a key too long: the name's shape comes first.
        ("a/b".to_string(), Some(long_key.clone()), None, None),
        // A queue name and a key both too long: the name's length comes first.
        ("q".repeat(600), Some(long_key.clone()), None, None),
        // A priority over 9 and an empty traceparent: the priority comes first.
        ("q".to_string(), None, Some(10), Some(String::new())),
    ];
    for (queue, key, priority, traceparent) in cases {
        let wire = pb::EnqueueRequest {
            queue: queue.clone(),
            job_type: "t".into(),
            idempotency_key: key.clone(),
            priority,
            trace_context: traceparent.clone().map(|t| pb::TraceContext {
                traceparent: t,
                tracestate: None,
            }),
            ..Default::default()
        };
        let reply = raw
            .enqueue_batch(pb::EnqueueBatchRequest { jobs: vec![wire] })
            .await
            .unwrap()
            .into_inner();
        let by_server = match reply.results[0].outcome.clone() {
            Some(pb::job_result::Outcome::Rejection(r)) => match r.reason {
                Some(Reason::InvalidRequest(x)) => format!("INVALID_REQUEST {}", x.message),
                Some(Reason::QueueNameTooLong(x)) => {
                    format!("QUEUE_NAME_TOO_LONG {} {}", x.limit, x.actual)
                }
                other => format!("{other:?}"),
            },
            other => panic!("the server accepted it: {other:?}"),
        };
        let mut job = EnqueueRequest {
            queue,
            ..EnqueueRequest::new("q", "t").unwrap()
        };
        job.idempotency_key = key;
        job.priority = priority;
        if let Some(t) = traceparent {
            job = job.with_trace_context(t, None);
        }
        let by_client = match client.enqueue(job).await {
            Err(EnqueueError::Rejected(Rejection::InvalidRequest { message })) => {
                format!("INVALID_REQUEST {message}")
            }
            Err(EnqueueError::Rejected(Rejection::QueueNameTooLong { limit, actual })) => {
                format!("QUEUE_NAME_TOO_LONG {limit} {actual}")
            }
            other => format!("{other:?}"),
        };
        assert_eq!(by_client, by_server);
    }
}

#[tokio::test]
async fn every_queue_call_round_trips() {
    let (_server, c) = setup().await;
    let info = c.get_server_info().await.unwrap();
    assert_eq!(info.supported_protocol_versions, vec!["v1"]);
    assert_eq!(info.dedup_window, Some(Duration::from_secs(86_400)));

    let req = EnqueueRequest::new("q", "email")
        .unwrap()
        .with_payload(b"{\"to\":\"a@b\"}".to_vec(), "application/json")
        .with_priority(7)
        .with_max_attempts(4)
        .with_custom_entry("tenant", "acme")
        .with_custom_entry("big", i64::MAX)
        .with_custom_entry("ratio", 0.5)
        .with_custom_entry("vip", true)
        .with_trace_context(
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            None,
        )
        .with_idempotency_key("order-1");
    let ack = c.enqueue(req.clone()).await.unwrap();
    assert!(!ack.deduplicated);
    assert!(c.enqueue(req).await.unwrap().deduplicated);

    let batch = c
        .enqueue_batch(vec![
            EnqueueRequest::new("q", "t").unwrap(),
            EnqueueRequest::new("q", "t")
                .unwrap()
                .with_idempotency_key(""),
        ])
        .await
        .unwrap();
    assert!(batch[0].is_ok());
    assert!(matches!(batch[1], Err(Rejection::InvalidRequest { .. })));
    let atomic = c
        .enqueue_atomic(vec![
            EnqueueRequest::new("q", "t").unwrap(),
            EnqueueRequest::new("q", "t").unwrap().with_priority(12),
        ])
        .await
        .unwrap();
    assert_eq!(atomic.unwrap_err()[0].0, 1);

    let jobs = c
        .reserve(ReserveOptions::new(["q"], Duration::from_secs(30)).with_max_jobs(10))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 2);
    let j = &jobs[0];
    assert_eq!(j.id, ack.job_id);
    assert_eq!(j.priority, 7);
    assert_eq!(j.max_attempts, 4);
    assert_eq!(j.payload.as_ref().unwrap().encoding, "application/json");
    assert_eq!(j.custom["big"], sepp_rs::Value::Int(i64::MAX));
    assert_eq!(j.custom["vip"], sepp_rs::Value::Bool(true));
    assert!(j.trace_context.is_some());
    let before = j.lease_expires_at.unwrap();
    let after = c
        .extend(&j.id, j.attempt, Duration::from_secs(120))
        .await
        .unwrap();
    assert!(after > before);
    c.ack(&j.id, j.attempt).await.unwrap();
    let k = &jobs[1];
    assert!(
        c.nack(&k.id, 1, NackRetry::DeadLetter, Some("nope".into()))
            .await
            .unwrap()
    );

    // Admin calls.
    assert_eq!(c.get_job(&ack.job_id).await.unwrap().state, JobState::Acked);
    assert_eq!(
        c.get_job(&k.id).await.unwrap().state,
        JobState::DeadLettered
    );
    let rec = c
        .lookup_idempotency_key("q", "order-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.job_id, ack.job_id);
    let page = c
        .list_dead_letters(Some("q"), Some(10), None)
        .await
        .unwrap();
    assert_eq!(page.records.len(), 1);
    assert!(page.next_page_token.is_none());
    let stats = c.get_queue_stats("q").await.unwrap();
    assert_eq!(stats.dead_lettered, 1);
    c.pause_queue("q").await.unwrap();
    assert!(c.get_queue_stats("q").await.unwrap().paused);
    c.resume_queue("q").await.unwrap();
    let requeued = c
        .requeue_dead_letters(&DeadLetterSelector::Ids(vec![k.id.clone()]))
        .await
        .unwrap();
    assert_eq!(requeued, vec![k.id.clone()]);
    let again = c
        .reserve(ReserveOptions::new(["q"], Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(again[0].id, k.id);
    c.nack(&k.id, 1, NackRetry::DeadLetter, None).await.unwrap();
    let deleted = c
        .delete_dead_letters(&DeadLetterSelector::Oldest {
            queue: None,
            max: 5,
        })
        .await
        .unwrap();
    assert_eq!(deleted, vec![k.id.clone()]);
    assert!(c.drain_dead_letters(None, 5).await.unwrap().is_empty());

    // Scheduling round-trips.
    let at = SystemTime::now() + Duration::from_secs(3600);
    c.enqueue(
        EnqueueRequest::new("later", "t")
            .unwrap()
            .with_scheduled_at(at),
    )
    .await
    .unwrap();
    assert_eq!(c.get_queue_stats("later").await.unwrap().scheduled, 1);
}

#[tokio::test]
async fn lease_errors_say_the_lease_is_lost() {
    let (_server, c) = setup().await;
    c.enqueue(EnqueueRequest::new("q", "t").unwrap())
        .await
        .unwrap();
    let j = c
        .reserve(ReserveOptions::new(["q"], Duration::from_secs(30)))
        .await
        .unwrap()
        .remove(0);
    c.ack(&j.id, 1).await.unwrap();
    let e = c.ack(&j.id, 1).await.unwrap_err();
    assert!(e.is_lease_lost());
    assert_eq!(e.code(), ErrorCode::JobNotInFlight);
}

#[tokio::test]
async fn ack_then_reserve_acks_and_brings_the_next_jobs_in_one_call() {
    use sepp_proto::v1 as pb;
    let (server, c) = setup().await;
    for _ in 0..3 {
        c.enqueue(EnqueueRequest::new("q", "t").unwrap())
            .await
            .unwrap();
    }
    let lease = Duration::from_secs(30);
    let j = c
        .reserve(ReserveOptions::new(["q"], lease))
        .await
        .unwrap()
        .remove(0);
    // Checked before sending: nothing is acked.
    let e = c
        .ack_then_reserve(
            &j.id,
            1,
            ReserveOptions::new(["q"], lease).with_wait_timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::InvalidArgument);
    // The server's own check names the field inside the ack (a client that sends it anyway).
    let mut raw = pb::queue_service_client::QueueServiceClient::connect(server.url())
        .await
        .unwrap();
    let status = raw
        .ack(pb::AckRequest {
            job_id: j.id.clone(),
            attempt: 1,
            worker_id: None,
            then_reserve: Some(pb::ReserveRequest {
                queues: vec!["q".into()],
                lease_duration: None,
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("then_reserve.lease_duration"),
        "{}",
        status.message()
    );
    // A stale attempt: refused as an ack is, and nothing is leased.
    let e = c
        .ack_then_reserve(&j.id, 2, ReserveOptions::new(["q"], lease).with_max_jobs(2))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::AttemptMismatch);
    assert_eq!(c.get_job(&j.id).await.unwrap().state, JobState::InFlight);

    let next = c
        .ack_then_reserve(&j.id, 1, ReserveOptions::new(["q"], lease).with_max_jobs(2))
        .await
        .unwrap()
        .expect("our server leases after the ack");
    assert_eq!(next.len(), 2);
    assert!(next.iter().all(|n| n.attempt == 1 && n.id != j.id));
    assert!(c.ack(&j.id, 1).await.unwrap_err().is_lease_lost());
    c.ack(&next[0].id, 1).await.unwrap();
    let none = c
        .ack_then_reserve(&next[1].id, 1, ReserveOptions::new(["q"], lease))
        .await
        .unwrap();
    assert_eq!(
        none.map(|n| n.len()),
        Some(0),
        "acked, nothing left to lease"
    );
    assert!(c.ack(&next[1].id, 1).await.unwrap_err().is_lease_lost());
}

#[tokio::test]
async fn nack_reasons_are_cut_to_the_length_the_server_advertises() {
    let server = TestServer::start(|c| c.limits.max_reason_bytes = 10).await;
    let c = SeppClient::connect(server.url()).await.unwrap();
    assert_eq!(c.max_reason_bytes(), 10);
    c.enqueue(EnqueueRequest::new("q", "t").unwrap())
        .await
        .unwrap();
    let j = c
        .reserve(ReserveOptions::new(["q"], Duration::from_secs(30)))
        .await
        .unwrap()
        .remove(0);
    c.nack(&j.id, 1, NackRetry::Default, Some("abcdefghi€€".into()))
        .await
        .unwrap();
    let info = c.get_job(&j.id).await.unwrap();
    assert_eq!(info.last_reason.as_deref(), Some("abcdefghi"));
}

#[tokio::test]
async fn strict_mode_reserve_failures_are_failed_precondition() {
    let server = TestServer::start(|c| c.server.strict_queues = true).await;
    let c = SeppClient::connect(server.url()).await.unwrap();
    let e = c
        .reserve(ReserveOptions::new(["nope"], Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::FailedPrecondition);
    let e = c
        .enqueue(EnqueueRequest::new("nope", "t").unwrap())
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::UnknownQueue);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_concurrent_calls_share_one_connection() {
    let (_server, c) = setup().await;
    let mut tasks = Vec::new();
    for i in 0..2_000 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.enqueue(
                EnqueueRequest::new("many", "t")
                    .unwrap()
                    .with_idempotency_key(format!("k{i}")),
            )
            .await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        t.await.unwrap().expect("every call succeeds");
        ok += 1;
    }
    assert_eq!(ok, 2_000);
    assert_eq!(c.get_queue_stats("many").await.unwrap().ready, 2_000);
}
