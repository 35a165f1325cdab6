//! Field sizes and the Reserve reply budget (docs/security.md): no job is leased that is not
//! sent, every field has a bound, a nack reason is truncated, GetServerInfo advertises it all.

mod common;

use common::{Clients, TestServer};
use sepp_proto::admin::v1 as admin;
use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_client::QueueServiceClient;
use std::collections::HashSet;
use tonic::Code;
use tonic::transport::Channel;

const MIB: usize = 1024 * 1024;

/// A raw client whose receive limit is `limit` bytes, like a client with a small default.
async fn raw_with_limit(server: &TestServer, limit: usize) -> QueueServiceClient<Channel> {
    server.raw().await.max_decoding_message_size(limit)
}

fn job(queue: &str, payload: usize) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: queue.into(),
        job_type: "t".into(),
        payload: (payload > 0).then(|| pb::Payload {
            data: vec![7; payload],
            encoding: "application/octet-stream".into(),
        }),
        ..Default::default()
    }
}

async fn enqueue(raw: &mut QueueServiceClient<Channel>, jobs: Vec<pb::EnqueueRequest>) {
    let n = jobs.len();
    let r = raw
        .enqueue_atomic(pb::EnqueueBatchRequest { jobs })
        .await
        .unwrap()
        .into_inner();
    match r.outcome {
        Some(pb::enqueue_atomic_response::Outcome::Success(s)) => assert_eq!(s.responses.len(), n),
        other => panic!("enqueue refused: {other:?}"),
    }
}

fn reserve(queue: &str, max_jobs: u32) -> pb::ReserveRequest {
    pb::ReserveRequest {
        queues: vec![queue.into()],
        wait_timeout: None,
        lease_duration: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        worker_id: Some("w".into()),
        max_jobs: Some(max_jobs),
    }
}

async fn stats(server: &TestServer, queue: &str) -> admin::GetQueueStatsResponse {
    server
        .admin()
        .await
        .get_queue_stats(admin::GetQueueStatsRequest {
            queue: queue.into(),
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_reserve_over_the_budget_gets_fewer_jobs_and_the_rest_stay_ready_for_the_next() {
    let budget = 65_536;
    let server = TestServer::start(|c| {
        c.limits.max_reserve_reply_bytes = budget as u64;
        c.limits.max_payload_bytes = 20_000;
    })
    .await;
    let mut raw = raw_with_limit(&server, budget).await;
    enqueue(&mut raw, (0..10).map(|_| job("q", 20_000)).collect()).await;

    let first = raw.reserve(reserve("q", 10)).await.unwrap().into_inner();
    assert!(
        (1..10).contains(&first.jobs.len()),
        "{} jobs in one reply",
        first.jobs.len()
    );
    assert!(prost::Message::encoded_len(&first) <= budget);
    let s = stats(&server, "q").await;
    assert_eq!(
        s.in_flight,
        first.jobs.len() as u64,
        "only what was sent is leased"
    );
    assert_eq!(s.ready, 10 - first.jobs.len() as u64);

    let mut seen = HashSet::new();
    let mut replies = vec![first];
    while seen.len() + replies.iter().map(|r| r.jobs.len()).sum::<usize>() < 10 {
        let r = raw.reserve(reserve("q", 10)).await.unwrap().into_inner();
        assert!(!r.jobs.is_empty(), "the remaining jobs are delivered");
        replies.push(r);
    }
    for r in replies {
        for j in r.jobs {
            assert_eq!(
                j.payload.as_ref().unwrap().data.len(),
                20_000,
                "fully delivered"
            );
            assert_eq!(j.attempt, 1, "first delivery: no lease was lost");
            assert!(seen.insert(j.id));
        }
    }
    assert_eq!(seen.len(), 10);
    let s = stats(&server, "q").await;
    assert_eq!((s.ready, s.in_flight, s.dead_lettered), (0, 10, 0));
}

#[tokio::test]
async fn five_1mb_jobs_through_a_4mib_receive_limit_are_all_delivered() {
    let server = TestServer::start(|c| {
        c.limits.default_max_attempts = 1;
        c.storage.dead_letter_retention_ms = 3_600_000;
    })
    .await;
    let mut raw = raw_with_limit(&server, 4 * MIB).await;
    enqueue(&mut raw, (0..5).map(|_| job("q", 1_000_000)).collect()).await;
    let mut delivered = HashSet::new();
    for _ in 0..5 {
        if delivered.len() == 5 {
            break;
        }
        let r = raw
            .reserve(reserve("q", 5))
            .await
            .expect("every reply fits the client's 4 MiB receive limit")
            .into_inner();
        for j in r.jobs {
            assert_eq!(j.payload.unwrap().data.len(), 1_000_000);
            raw.ack(pb::AckRequest {
                job_id: j.id.clone(),
                attempt: j.attempt,
                worker_id: None,
                then_reserve: None,
            })
            .await
            .unwrap();
            delivered.insert(j.id);
        }
    }
    assert_eq!(delivered.len(), 5);
    let s = stats(&server, "q").await;
    assert_eq!((s.ready, s.in_flight, s.dead_lettered), (0, 0, 0));
}

#[tokio::test]
async fn the_default_clients_receive_every_reply_the_server_may_send() {
    let server = TestServer::start(|_| {}).await;
    let info = server.client().await.get_server_info().await.unwrap();
    assert_eq!(info.max_reserve_reply_bytes, 4 * MIB as u64);
    assert!(sepp_rs::client::DEFAULT_MAX_RECEIVE_BYTES as u64 >= info.max_reserve_reply_bytes);
}

fn rejection_message(r: &pb::JobResult) -> String {
    match &r.outcome {
        Some(pb::job_result::Outcome::Rejection(pb::JobRejection {
            reason: Some(pb::job_rejection::Reason::InvalidRequest(m)),
        })) => m.message.clone(),
        other => panic!("expected an InvalidRequest rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn oversized_fields_are_rejected_naming_the_field_and_the_limit() {
    let server = TestServer::start(|_| {}).await;
    let mut raw = server.raw().await;
    let mut tracestate = job("q", 0);
    tracestate.trace_context = Some(pb::TraceContext {
        traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
        tracestate: Some("x".repeat(15_000_000)),
    });
    let mut traceparent = job("q", 0);
    traceparent.trace_context = Some(pb::TraceContext {
        traceparent: "0".repeat(5000),
        tracestate: None,
    });
    let mut encoding = job("q", 10);
    encoding.payload.as_mut().unwrap().encoding = "e".repeat(300);
    let good = job("q", 10);
    let results = raw
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![tracestate, traceparent, encoding, good],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    let m = rejection_message(&results[0]);
    assert!(
        m.contains("trace_context.tracestate is 15000000 bytes")
            && m.contains("max_trace_context_bytes is 4096"),
        "{m}"
    );
    let m = rejection_message(&results[1]);
    assert!(m.contains("trace_context.traceparent is 5000 bytes"), "{m}");
    let m = rejection_message(&results[2]);
    assert!(
        m.contains("payload.encoding is 300 bytes") && m.contains("max_encoding_bytes is 256"),
        "{m}"
    );
    assert!(
        matches!(
            results[3].outcome,
            Some(pb::job_result::Outcome::Success(_))
        ),
        "the good job of the batch is accepted"
    );

    let mut r = reserve("q", 256);
    r.worker_id = Some("w".repeat(8_000_000));
    let e = raw.reserve(r).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("worker_id is 8000000 bytes")
            && e.message().contains("max_worker_id_bytes is 256"),
        "{}",
        e.message()
    );
    let s = stats(&server, "q").await;
    assert_eq!(
        (s.ready, s.in_flight),
        (1, 0),
        "nothing leased by the refused reserve"
    );
}

#[tokio::test]
async fn a_long_nack_reason_is_truncated_at_a_character_boundary_and_stored() {
    let server = TestServer::start(|c| c.limits.max_reason_bytes = 100).await;
    let mut raw = server.raw().await;
    enqueue(&mut raw, vec![job("q", 0)]).await;
    let j = raw
        .reserve(reserve("q", 1))
        .await
        .unwrap()
        .into_inner()
        .jobs
        .remove(0);
    // 1 + 2 × 5000 bytes: the cut at 100 bytes falls inside an "é", so 99 bytes are kept.
    let reason = format!("a{}", "é".repeat(5000));
    raw.nack(pb::NackRequest {
        job_id: j.id.clone(),
        attempt: j.attempt,
        reason: Some(reason.clone()),
        retry: None,
        worker_id: None,
    })
    .await
    .expect("a nack is never refused for its reason's length");
    let info = server
        .admin()
        .await
        .get_job(admin::GetJobRequest { job_id: j.id })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let kept = info.last_reason.unwrap();
    assert_eq!(kept.len(), 99);
    assert!(reason.starts_with(&kept));
}

#[tokio::test]
async fn get_server_info_advertises_the_field_limits_and_the_reply_budget() {
    let server = TestServer::start(|c| {
        c.limits.max_reason_bytes = 111;
        c.limits.max_reserve_reply_bytes = 8 * MIB as u64;
        c.limits.max_trace_context_bytes = 333;
        c.limits.max_worker_id_bytes = 44;
        c.limits.max_encoding_bytes = 55;
    })
    .await;
    let r = server
        .raw()
        .await
        .get_server_info(pb::GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.max_reason_bytes, 111);
    assert_eq!(r.max_reserve_reply_bytes, 8 * MIB as u64);
    assert_eq!(r.max_trace_context_bytes, 333);
    assert_eq!(r.max_worker_id_bytes, 44);
    assert_eq!(r.max_encoding_bytes, 55);
}

/// Six dead letters of about 1 MB each (with long reasons) on queue `q`.
async fn six_1mb_dead_letters(server: &TestServer) -> HashSet<String> {
    let mut raw = raw_with_limit(server, 4 * MIB).await;
    enqueue(&mut raw, (0..6).map(|_| job("q", 1_000_000)).collect()).await;
    let mut ids = HashSet::new();
    while ids.len() < 6 {
        let r = raw.reserve(reserve("q", 6)).await.unwrap().into_inner();
        for j in r.jobs {
            raw.nack(pb::NackRequest {
                job_id: j.id.clone(),
                attempt: j.attempt,
                reason: Some("r".repeat(4096)),
                retry: None,
                worker_id: None,
            })
            .await
            .unwrap();
            ids.insert(j.id);
        }
    }
    assert_eq!(stats(server, "q").await.dead_lettered, 6);
    ids
}

fn dead_letter_server(c: &mut sepp_server::config::Config) {
    c.limits.default_max_attempts = 1;
    c.storage.dead_letter_retention_ms = 3_600_000;
}

#[tokio::test]
async fn a_drain_of_1mb_dead_letters_through_a_4mib_receive_limit_loses_none() {
    let server = TestServer::start(dead_letter_server).await;
    let ids = six_1mb_dead_letters(&server).await;
    let mut raw = raw_with_limit(&server, 4 * MIB).await;
    let mut drained = HashSet::new();
    while drained.len() < 6 {
        let r = raw
            .drain_dead_letters(pb::DrainDeadLettersRequest {
                queue: Some("q".into()),
                max: Some(6),
            })
            .await
            .expect("every drain reply fits the client's 4 MiB receive limit")
            .into_inner();
        assert!(!r.records.is_empty(), "the rest are drained next");
        assert!(r.records.len() < 6, "six 1 MB records do not fit 4 MiB");
        assert!(prost::Message::encoded_len(&r) <= 4 * MIB);
        for d in r.records {
            let job = d.job.unwrap();
            assert_eq!(job.payload.unwrap().data.len(), 1_000_000);
            assert_eq!(d.last_reason.as_deref().map(str::len), Some(4096));
            assert!(drained.insert(job.id), "each record drained once");
        }
        // Every record either came back or is still there.
        let left = stats(&server, "q").await.dead_lettered;
        assert_eq!(
            left,
            6 - drained.len() as u64,
            "a record not sent was deleted"
        );
    }
    assert_eq!(drained, ids);
}

#[tokio::test]
async fn a_list_of_1mb_dead_letters_stops_before_the_budget_and_pages_on() {
    let server = TestServer::start(dead_letter_server).await;
    let ids = six_1mb_dead_letters(&server).await;
    let mut admin = server.admin().await.max_decoding_message_size(4 * MIB);
    let (mut listed, mut token, mut pages) = (HashSet::new(), String::new(), 0);
    loop {
        let page = admin
            .list_dead_letters(admin::ListDeadLettersRequest {
                queue: Some("q".into()),
                page_size: Some(6),
                page_token: token,
            })
            .await
            .expect("every page fits the client's 4 MiB receive limit")
            .into_inner();
        assert!(prost::Message::encoded_len(&page) <= 4 * MIB);
        pages += 1;
        for d in page.records {
            assert!(listed.insert(d.job.unwrap().id), "each record listed once");
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(listed, ids);
    assert!(pages >= 2, "six 1 MB records take more than one page");
    assert_eq!(
        stats(&server, "q").await.dead_lettered,
        6,
        "listing removes nothing"
    );
}

#[tokio::test]
async fn a_dead_letter_larger_than_a_lowered_budget_is_never_drained_but_stays_listable() {
    let server = TestServer::start(dead_letter_server).await;
    let big = six_1mb_dead_letters(&server).await;
    // Then one small dead letter, newer than the big ones.
    let mut raw = raw_with_limit(&server, 4 * MIB).await;
    enqueue(&mut raw, vec![job("q", 10)]).await;
    let small = raw
        .reserve(reserve("q", 1))
        .await
        .unwrap()
        .into_inner()
        .jobs;
    raw.nack(pb::NackRequest {
        job_id: small[0].id.clone(),
        attempt: 1,
        reason: None,
        retry: None,
        worker_id: None,
    })
    .await
    .unwrap();
    // Restarted with limits lowered below the stored records.
    let budget = 256 * 1024;
    let server = TestServer::start_in(server.stop().await, |c| {
        dead_letter_server(c);
        c.limits.max_reserve_reply_bytes = budget as u64;
        c.limits.max_payload_bytes = 100_000;
    })
    .await;
    let mut raw = raw_with_limit(&server, budget).await;
    let r = raw
        .drain_dead_letters(pb::DrainDeadLettersRequest {
            queue: Some("q".into()),
            max: Some(10),
        })
        .await
        .expect("the reply fits the budget")
        .into_inner();
    let drained: Vec<String> = r.records.into_iter().map(|d| d.job.unwrap().id).collect();
    assert_eq!(drained, vec![small[0].id.clone()], "only the small one");
    assert_eq!(
        stats(&server, "q").await.dead_lettered,
        6,
        "the big ones stay"
    );
    // Listing sends each alone; nothing is lost.
    let mut admin = server.admin().await;
    let mut listed = HashSet::new();
    let mut token = String::new();
    loop {
        let page = admin
            .list_dead_letters(admin::ListDeadLettersRequest {
                queue: Some("q".into()),
                page_size: Some(10),
                page_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(page.records.len(), 1, "each over the budget comes alone");
        listed.insert(page.records[0].job.clone().unwrap().id);
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(listed, big);
}

fn waiting_reserve(queue: &str) -> pb::ReserveRequest {
    pb::ReserveRequest {
        wait_timeout: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        ..reserve(queue, 1)
    }
}

/// Waiting Reserves are bounded server-wide (`limits.max_waiting_reserves`): past the limit a
/// Reserve still gets what is ready, and one that finds nothing is answered RESOURCE_EXHAUSTED
/// naming the limit instead of waiting; a place frees as soon as a waiting Reserve ends.
#[tokio::test]
async fn reserves_past_max_waiting_reserves_do_not_wait_but_still_get_ready_jobs() {
    let server = TestServer::start(|c| c.limits.max_waiting_reserves = 2).await;
    let raw = server.raw().await;
    let first = tokio::spawn({
        let mut raw = raw.clone();
        async move { raw.reserve(waiting_reserve("a")).await }
    });
    server.reserves_waiting(1).await;
    let second = tokio::spawn({
        let mut raw = raw.clone();
        async move { raw.reserve(waiting_reserve("b")).await }
    });
    server.reserves_waiting(2).await;

    let refused = raw.clone().reserve(waiting_reserve("c")).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "reserve found no job and did not wait: 2 Reserves wait already \
         (limits.max_waiting_reserves); retry later"
    );
    let short = raw.clone().reserve(reserve("c", 1)).await.unwrap();
    assert!(
        short.into_inner().jobs.is_empty(),
        "a Reserve that does not wait is never refused"
    );
    enqueue(&mut raw.clone(), vec![job("c", 0)]).await;
    let got = raw.clone().reserve(waiting_reserve("c")).await.unwrap();
    assert_eq!(
        got.into_inner().jobs.len(),
        1,
        "a ready job is still leased"
    );

    // The first waiter gets its job and leaves: its place is free again.
    enqueue(&mut raw.clone(), vec![job("a", 0)]).await;
    let jobs = first.await.unwrap().unwrap().into_inner().jobs;
    assert_eq!(jobs.len(), 1);
    let third = tokio::spawn({
        let mut raw = raw.clone();
        async move { raw.reserve(waiting_reserve("c")).await }
    });
    server.reserves_waiting(2).await;
    enqueue(&mut raw.clone(), vec![job("b", 0), job("c", 0)]).await;
    for call in [second, third] {
        let jobs = call.await.unwrap().unwrap().into_inner().jobs;
        assert_eq!(jobs.len(), 1, "each waiting Reserve gets its queue's job");
    }
}
