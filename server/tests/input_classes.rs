//! Classes of bad input at the edge: undecodable bodies, queue names, malformed well-known
//! types. Each is the caller's fault (`INVALID_ARGUMENT` or an `InvalidRequest` rejection
//! naming the field), never `INTERNAL`.

mod common;

use common::{Clients, TestServer};
use sepp_proto::admin::v1 as admin;
use sepp_proto::v1 as pb;
use sepp_server::domain::{EnqueuePlan, InsertOutcome, JobId, NewJob};
use sepp_server::storage::EnqueueFacts;
use std::sync::Arc;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// Sends raw bytes as the request body; replies are not decoded.
#[derive(Default)]
struct RawCodec;

struct RawEncoder;
struct RawDecoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = ();
    type Error = tonic::Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<()>, tonic::Status> {
        bytes::Buf::advance(buf, bytes::Buf::remaining(buf));
        Ok(Some(()))
    }
}

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = ();
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// A generic gRPC client on `server`, ready for a call.
async fn grpc(server: &TestServer) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    grpc
}

async fn send_raw(server: &TestServer, path: &'static str, body: Vec<u8>) -> tonic::Status {
    grpc(server)
        .await
        .unary(
            tonic::Request::new(body),
            http::uri::PathAndQuery::from_static(path),
            RawCodec,
        )
        .await
        .expect_err("an undecodable body is refused")
}

#[tokio::test]
async fn an_undecodable_body_is_invalid_argument_on_every_service() {
    let server = TestServer::start(|_| {}).await;
    // A truncated varint, and field 1 (a string) sent as a varint.
    let bodies: [Vec<u8>; 2] = [vec![0xff, 0xff, 0xff], vec![0x08, 0x01]];
    for path in [
        "/sepp.v1.QueueService/EnqueueBatch",
        "/sepp.v1.QueueService/Reserve",
        "/sepp.v1.QueueService/Ack",
        "/sepp.admin.v1.AdminService/GetQueueStats",
        "/sepp.admin.v1.AdminService/PauseQueue",
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    ] {
        for body in &bodies {
            let s = send_raw(&server, path, body.clone()).await;
            assert_eq!(s.code(), Code::InvalidArgument, "{path}: {s:?}");
            assert!(
                s.message().contains("request body is not a valid"),
                "{path}: {s:?}"
            );
        }
    }
}

#[tokio::test]
async fn a_reflection_stream_answers_its_valid_requests_then_refuses_an_undecodable_one() {
    use prost::Message;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    let server = TestServer::start(|_| {}).await;
    let valid = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    }
    .encode_to_vec();
    let requests = tokio_stream::iter(vec![valid, vec![0xff, 0xff, 0xff]]);
    let mut answers = grpc(&server)
        .await
        .streaming(
            tonic::Request::new(requests),
            http::uri::PathAndQuery::from_static(
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            ),
            RawCodec,
        )
        .await
        .expect("the stream is accepted")
        .into_inner();
    assert_eq!(answers.message().await.unwrap(), Some(()), "first answered");
    let s = answers.message().await.expect_err("the second is refused");
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert!(
        s.message()
            .contains("request body is not a valid ServerReflectionRequest"),
        "{s:?}"
    );
}

fn lease(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

fn reserve_on(queue: &str) -> pb::ReserveRequest {
    pb::ReserveRequest {
        queues: vec![queue.into()],
        lease_duration: lease(30, 0),
        ..Default::default()
    }
}

#[tokio::test]
async fn over_long_queue_names_are_refused_by_every_call_that_takes_one() {
    let server = TestServer::start(|_| {}).await;
    let long = "q".repeat(10_000);
    let mut raw = server.raw().await;
    let mut admin = server.admin().await;
    let mut errors = vec![
        raw.reserve(reserve_on(&long)).await.unwrap_err(),
        raw.drain_dead_letters(pb::DrainDeadLettersRequest {
            queue: Some(long.clone()),
            max: Some(1),
        })
        .await
        .unwrap_err(),
    ];
    errors.push(
        admin
            .pause_queue(admin::PauseQueueRequest {
                queue: long.clone(),
            })
            .await
            .unwrap_err(),
    );
    errors.push(
        admin
            .resume_queue(admin::ResumeQueueRequest {
                queue: long.clone(),
            })
            .await
            .unwrap_err(),
    );
    errors.push(
        admin
            .get_queue_stats(admin::GetQueueStatsRequest {
                queue: long.clone(),
            })
            .await
            .unwrap_err(),
    );
    errors.push(
        admin
            .list_dead_letters(admin::ListDeadLettersRequest {
                queue: Some(long.clone()),
                ..Default::default()
            })
            .await
            .unwrap_err(),
    );
    errors.push(
        admin
            .lookup_idempotency_key(admin::LookupIdempotencyKeyRequest {
                queue: long.clone(),
                idempotency_key: "k".into(),
            })
            .await
            .unwrap_err(),
    );
    for e in errors {
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(
            e.message()
                .contains("10000 bytes: max_queue_name_bytes is 512"),
            "{}",
            e.message()
        );
    }
}

const INVISIBLE: [char; 7] = [
    '\u{200B}', '\u{202A}', '\u{202E}', '\u{2066}', '\u{2069}', '\u{2028}', '\u{2029}',
];

#[tokio::test]
async fn invisible_and_bidi_characters_are_refused_in_new_queue_names() {
    let server = TestServer::start(|_| {}).await;
    let mut raw = server.raw().await;
    let mut admin = server.admin().await;
    for c in INVISIBLE {
        let name = format!("pay{c}ments");
        let r = raw
            .enqueue_batch(pb::EnqueueBatchRequest {
                jobs: vec![pb::EnqueueRequest {
                    queue: name.clone(),
                    job_type: "t".into(),
                    ..Default::default()
                }],
            })
            .await
            .unwrap()
            .into_inner();
        match &r.results[0].outcome {
            Some(pb::job_result::Outcome::Rejection(pb::JobRejection {
                reason: Some(pb::job_rejection::Reason::InvalidRequest(m)),
            })) => {
                let code = format!("U+{:04X}", u32::from(c));
                assert!(
                    m.message.starts_with("queue: ") && m.message.contains(&code),
                    "{}",
                    m.message
                );
            }
            other => panic!("{c:?}: expected InvalidRequest, got {other:?}"),
        }
        let e = admin
            .pause_queue(admin::PauseQueueRequest { queue: name })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
    }
    // Ordinary non-ASCII names are fine.
    let r = raw
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![pb::EnqueueRequest {
                queue: "zahlungen-ä-日本".into(),
                job_type: "t".into(),
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        r.results[0].outcome,
        Some(pb::job_result::Outcome::Success(_))
    ));
}

#[tokio::test]
async fn a_queue_stored_under_a_name_now_refused_stays_readable_and_drainable() {
    let dir = common::TempDir::new();
    let name: Arc<str> = Arc::from("pay\u{200B}ments");
    {
        // Written straight into the store, as a server before the rule would have.
        let store = sepp_server::testing::open_store(&dir, 1).await;
        let job = NewJob {
            id: JobId::new_v4(),
            queue: name.clone(),
            job_type: "t".into(),
            payload: None,
            priority: 0,
            max_attempts: 3,
            trace_context: None,
            custom: Default::default(),
            enqueued_at: 1,
            scheduled_at: None,
            dedup: None,
            max_queue_depth: None,
            reply_bytes: 200,
        };
        // Written as planned: no rule of today's queue layer looks at it.
        let create_all = |jobs: &[NewJob], _: &dyn EnqueueFacts| EnqueuePlan {
            outcomes: jobs.iter().map(|j| InsertOutcome::Created(j.id)).collect(),
            write: true,
        };
        store.enqueue(vec![job], &create_all, 1).await.unwrap();
        store.close().await.unwrap();
    }
    let server = TestServer::start_in(dir, |_| {}).await;
    let mut admin = server.admin().await;
    let s = admin
        .get_queue_stats(admin::GetQueueStatsRequest {
            queue: name.to_string(),
        })
        .await
        .expect("stats of a stored queue")
        .into_inner();
    assert_eq!(s.ready, 1);
    admin
        .resume_queue(admin::ResumeQueueRequest {
            queue: name.to_string(),
        })
        .await
        .expect("resume is not a new write");
    let mut raw = server.raw().await;
    let jobs = raw
        .reserve(reserve_on(&name))
        .await
        .expect("reserve drains a stored queue")
        .into_inner()
        .jobs;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].queue, &*name);
}

#[tokio::test]
async fn malformed_timestamps_and_durations_are_refused_naming_the_field() {
    let server = TestServer::start(|_| {}).await;
    let mut raw = server.raw().await;

    let r = raw
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![pb::EnqueueRequest {
                queue: "q".into(),
                job_type: "t".into(),
                scheduled_at: Some(prost_types::Timestamp {
                    seconds: 1,
                    nanos: 1_000_000_000,
                }),
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    match &r.results[0].outcome {
        Some(pb::job_result::Outcome::Rejection(pb::JobRejection {
            reason: Some(pb::job_rejection::Reason::InvalidRequest(m)),
        })) => assert!(
            m.message
                .starts_with("scheduled_at: not a valid google.protobuf.Timestamp"),
            "{}",
            m.message
        ),
        other => panic!("expected InvalidRequest, got {other:?}"),
    }

    let mut bad_lease = reserve_on("q");
    bad_lease.lease_duration = lease(5, -1);
    let mut bad_wait = reserve_on("q");
    bad_wait.wait_timeout = lease(0, 1_000_000_000);
    for (req, field) in [(bad_lease, "lease_duration"), (bad_wait, "wait_timeout")] {
        let e = raw.reserve(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message()
                .starts_with(&format!("{field} is not a valid google.protobuf.Duration")),
            "{}",
            e.message()
        );
    }
    let e = raw
        .extend(pb::ExtendRequest {
            job_id: JobId::new_v4().to_string(),
            attempt: 1,
            lease_duration: lease(400_000_000_000, 0),
            worker_id: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().starts_with("lease_duration is not a valid"),
        "{}",
        e.message()
    );
    let e = raw
        .nack(pb::NackRequest {
            job_id: JobId::new_v4().to_string(),
            attempt: 1,
            reason: None,
            retry: Some(pb::NackRetry {
                strategy: Some(pb::nack_retry::Strategy::Delay(prost_types::Duration {
                    seconds: 0,
                    nanos: -2_000_000_000,
                })),
            }),
            worker_id: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().starts_with("retry.delay is not a valid"),
        "{}",
        e.message()
    );
}
