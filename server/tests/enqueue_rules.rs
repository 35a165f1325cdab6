//! Enqueue validation over real gRPC: every rejection, the documented order, batch limits,
//! strict mode, `max_queue_depth`, and the statuses of whole-call failures.

mod common;

use common::{Clients, TestServer};
use sepp_proto::v1 as pb;
use sepp_proto::v1::job_rejection::Reason;
use sepp_server::config::QueueConfig;
use std::collections::HashMap;
use tonic::Code;

fn job(queue: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: queue.into(),
        job_type: "t".into(),
        ..Default::default()
    }
}

async fn reason_of(server: &TestServer, j: pb::EnqueueRequest) -> Option<Reason> {
    let mut raw = server.raw().await;
    let r = raw
        .enqueue_batch(pb::EnqueueBatchRequest { jobs: vec![j] })
        .await
        .expect("rpc")
        .into_inner()
        .results
        .remove(0)
        .outcome
        .expect("outcome");
    match r {
        pb::job_result::Outcome::Success(_) => None,
        pb::job_result::Outcome::Rejection(rej) => rej.reason,
    }
}

fn payload(n: usize, enc: &str) -> Option<pb::Payload> {
    Some(pb::Payload {
        data: vec![7; n],
        encoding: enc.into(),
    })
}

fn string(s: &str) -> pb::PrimitiveValue {
    pb::PrimitiveValue {
        value: Some(pb::primitive_value::Value::StringValue(s.into())),
    }
}

#[tokio::test]
async fn every_deterministic_rejection_names_its_limit() {
    let server = TestServer::start(|c| {
        c.limits.max_payload_bytes = 100;
        c.limits.allowed_encodings = Some(vec!["application/json".into()]);
        c.limits.max_custom_entries = 2;
        c.limits.max_custom_total_bytes = 20;
        c.limits.max_custom_key_bytes = 4;
        c.limits.max_queue_name_bytes = 8;
        c.limits.max_job_type_bytes = 8;
        c.limits.max_schedule_horizon_ms = 60_000;
        c.queues.push(QueueConfig {
            name: "typed".into(),
            allowed_job_types: Some(vec!["ok".into()]),
            ..Default::default()
        });
    })
    .await;

    let mut j = job("q");
    j.payload = payload(101, "application/json");
    assert!(
        matches!(reason_of(&server, j).await, Some(Reason::PayloadTooLarge(x)) if x.limit == 100 && x.actual == 101)
    );

    let mut j = job("q");
    j.payload = payload(5, "text/plain");
    assert!(
        matches!(reason_of(&server, j).await, Some(Reason::EncodingNotAllowed(x)) if x.encoding == "text/plain" && x.allowed == vec!["application/json".to_string()])
    );

    let mut j = job("typed");
    j.job_type = "bad".into();
    assert!(
        matches!(reason_of(&server, j).await, Some(Reason::JobTypeNotAllowed(x)) if x.job_type == "bad" && x.allowed == vec!["ok".to_string()])
    );

    let mut j = job("q");
    j.custom = HashMap::from([
        ("a".into(), string("1")),
        ("b".into(), string("2")),
        ("c".into(), string("3")),
    ]);
    assert!(
        matches!(reason_of(&server, j).await, Some(Reason::CustomEntriesTooMany(x)) if x.limit == 2 && x.actual == 3)
    );

    let mut j = job("q");
    j.custom = HashMap::from([("long5".into(), string("x"))]);
    assert!(
        matches!(reason_of(&server, j).await, Some(Reason::CustomKeyTooLong(x)) if x.key == "long5" && x.limit == 4 && x.actual == 5)
    );

    let mut j = job("q");
    j.custom = HashMap::from([("k".into(), string(&"v".repeat(20)))]);
    assert!(
        matches!(reason_of(&server, j).await, Some(Reason::CustomMapTooLarge(x)) if x.limit == 20 && x.actual == 21)
    );

    assert!(
        matches!(reason_of(&server, job("queue-too-long")).await, Some(Reason::QueueNameTooLong(x)) if x.limit == 8 && x.actual == 14)
    );

    let mut j = job("q");
    j.job_type = "type-too-long".into();
    assert!(
        matches!(reason_of(&server, j).await, Some(Reason::JobTypeNameTooLong(x)) if x.limit == 8 && x.actual == 13)
    );

    let mut j = job("q");
    let far = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    let secs = far.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    j.scheduled_at = Some(prost_types::Timestamp {
        seconds: secs,
        nanos: 0,
    });
    assert!(
        matches!(reason_of(&server, j).await, Some(Reason::ScheduledTooFar(x)) if x.horizon.as_ref().map(|d| d.seconds) == Some(60))
    );

    for (mutate, field) in [
        (
            Box::new(|j: &mut pb::EnqueueRequest| j.queue = String::new())
                as Box<dyn Fn(&mut pb::EnqueueRequest)>,
            "queue",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| j.queue = "a/b".into()),
            "queue",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| j.queue = "..".into()),
            "queue",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| j.job_type = String::new()),
            "job_type",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| j.priority = Some(10)),
            "priority",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| j.max_attempts = Some(0)),
            "max_attempts",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| j.payload = payload(0, "application/json")),
            "payload.data",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| j.payload = payload(3, "")),
            "payload.encoding",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| {
                j.custom = HashMap::from([(String::new(), string("x"))])
            }),
            "custom",
        ),
        (
            Box::new(|j: &mut pb::EnqueueRequest| {
                j.custom = HashMap::from([("k".into(), pb::PrimitiveValue { value: None })])
            }),
            "custom",
        ),
    ] {
        let mut j = job("q");
        mutate(&mut j);
        match reason_of(&server, j).await {
            Some(Reason::InvalidRequest(m)) => {
                assert!(m.message.contains(field), "{field}: {}", m.message)
            }
            other => panic!("{field}: expected InvalidRequest, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_first_failing_rule_in_the_documented_order_wins() {
    let server = TestServer::start(|c| {
        c.server.strict_queues = true;
        c.limits.max_queue_name_bytes = 4;
        c.limits.max_payload_bytes = 1;
        c.queues.push(QueueConfig {
            name: "q".into(),
            ..Default::default()
        });
    })
    .await;
    // Structure beats everything.
    let mut j = job("undeclared-and-long");
    j.priority = Some(11);
    assert!(matches!(
        reason_of(&server, j).await,
        Some(Reason::InvalidRequest(_))
    ));
    // Strict mode comes before the queue name length.
    assert!(
        matches!(reason_of(&server, job("undeclared-and-long")).await, Some(Reason::UnknownQueue(x)) if x.queue == "undeclared-and-long")
    );
    // The key length comes before the payload size.
    let mut j = job("q");
    j.idempotency_key = Some("k".repeat(257));
    j.payload = payload(10, "x");
    assert!(matches!(
        reason_of(&server, j).await,
        Some(Reason::IdempotencyKeyTooLong(_))
    ));
}

#[tokio::test]
async fn batch_size_limits_fail_the_whole_call_with_invalid_argument() {
    let server = TestServer::start(|c| c.limits.max_enqueue_batch = 3).await;
    let mut raw = server.raw().await;
    for jobs in [vec![], vec![job("q"); 4]] {
        let n = jobs.len();
        let e = raw
            .enqueue_batch(pb::EnqueueBatchRequest { jobs: jobs.clone() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{n} jobs");
        let e = raw
            .enqueue_atomic(pb::EnqueueBatchRequest { jobs })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{n} jobs");
    }
    let e = raw
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![job("q"); 4],
        })
        .await
        .unwrap_err();
    assert!(
        e.message().contains("max_enqueue_batch is 3"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn a_request_over_max_message_bytes_gets_out_of_range() {
    let server = TestServer::start(|c| {
        c.limits.max_message_bytes = 4096;
        c.limits.max_payload_bytes = 4096;
        c.limits.max_custom_total_bytes = 4096;
    })
    .await;
    let mut raw = server.raw().await;
    let mut j = job("q");
    j.payload = payload(8192, "x");
    let e = raw
        .enqueue_batch(pb::EnqueueBatchRequest { jobs: vec![j] })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    // Both sizes and the key that sets the limit, in our words (not the decoder's).
    let m = e.message();
    assert!(m.starts_with("request message is "), "{m}");
    assert!(
        m.contains("limit of 4096 bytes (limits.max_message_bytes)"),
        "{m}"
    );
    // The server is still fine afterwards.
    assert_eq!(reason_of(&server, job("q")).await, None);
}

#[tokio::test]
async fn strict_mode_rejects_undeclared_queues_on_enqueue_and_reserve() {
    let server = TestServer::start(|c| {
        c.server.strict_queues = true;
        c.queues.push(QueueConfig {
            name: "known".into(),
            ..Default::default()
        });
    })
    .await;
    assert_eq!(reason_of(&server, job("known")).await, None);
    assert!(
        matches!(reason_of(&server, job("other")).await, Some(Reason::UnknownQueue(x)) if x.queue == "other")
    );
    let mut raw = server.raw().await;
    let e = raw
        .reserve(pb::ReserveRequest {
            queues: vec!["known".into(), "other".into(), "third".into()],
            lease_duration: Some(prost_types::Duration {
                seconds: 10,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("other") && e.message().contains("third"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn a_full_queue_rejects_new_jobs_but_still_answers_dedup_hits() {
    let server = TestServer::start(|c| {
        c.queues.push(QueueConfig {
            name: "small".into(),
            max_queue_depth: Some(2),
            ..Default::default()
        });
    })
    .await;
    let keyed = |k: &str| {
        let mut j = job("small");
        j.idempotency_key = Some(k.into());
        j
    };
    assert_eq!(reason_of(&server, keyed("a")).await, None);
    assert_eq!(reason_of(&server, keyed("b")).await, None);
    assert!(
        matches!(reason_of(&server, keyed("c")).await, Some(Reason::QueueFull(x)) if x.queue == "small" && x.limit == 2)
    );
    // A hit creates nothing, so a full queue still confirms it.
    assert_eq!(reason_of(&server, keyed("a")).await, None);
    // Other queues are unaffected.
    assert_eq!(reason_of(&server, job("big")).await, None);

    // Atomic: the overflow fails the batch and nothing is written.
    let server = TestServer::start(|c| {
        c.queues.push(QueueConfig {
            name: "small".into(),
            max_queue_depth: Some(2),
            ..Default::default()
        });
    })
    .await;
    let mut raw = server.raw().await;
    let resp = raw
        .enqueue_atomic(pb::EnqueueBatchRequest {
            jobs: vec![keyed("x"), keyed("y"), keyed("z")],
        })
        .await
        .unwrap()
        .into_inner();
    let Some(pb::enqueue_atomic_response::Outcome::Rejection(f)) = resp.outcome else {
        panic!("expected rejection: {resp:?}");
    };
    assert_eq!(f.errors.len(), 1);
    assert_eq!(f.errors[0].index, 2);
    assert!(matches!(
        f.errors[0]
            .rejection
            .as_ref()
            .and_then(|r| r.reason.clone()),
        Some(Reason::QueueFull(_))
    ));
    assert_eq!(reason_of(&server, keyed("x")).await, None);
    assert_eq!(reason_of(&server, keyed("y")).await, None);
}

#[tokio::test]
async fn server_info_reports_limits_and_the_dedup_window() {
    let server = TestServer::start(|c| {
        c.storage.dedup_window_ms = 5_000;
        c.limits.max_idempotency_key_bytes = 64;
    })
    .await;
    let mut raw = server.raw().await;
    let info = raw
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.supported_protocol_versions, vec!["v1".to_string()]);
    assert_eq!(info.max_idempotency_key_bytes, 64);
    assert_eq!(info.max_enqueue_batch, 256);
    assert_eq!(
        info.dedup_window,
        Some(prost_types::Duration {
            seconds: 5,
            nanos: 0
        })
    );
    assert_eq!(
        info.max_lease_duration,
        Some(prost_types::Duration {
            seconds: 300,
            nanos: 0
        })
    );
    assert!(!info.restricts_encodings);
    assert!(info.server_time.is_some());
    // The client picks the limit up and checks keys against it before sending.
    let client = server.client().await;
    assert_eq!(client.max_idempotency_key_bytes(), Some(64));
}
