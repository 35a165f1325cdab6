//! `sepp.admin.v1.AdminService` over real gRPC: job inspection through every state, key
//! lookup, non-destructive dead-letter repair, pause/resume, stats.

mod common;

use common::{Clients, TestServer};
use sepp_proto::admin::v1 as apb;
use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use sepp_rs::{EnqueueRequest, NackRetry, ReserveOptions, SeppClient};
use sepp_server::config::QueueConfig;
use sepp_server::queue::clock::{Clock, ManualClock, SystemClock};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tonic::transport::Channel;

async fn state(admin: &mut AdminServiceClient<Channel>, id: &str) -> apb::JobInfo {
    admin
        .get_job(apb::GetJobRequest { job_id: id.into() })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap()
}

fn st(s: apb::JobState) -> i32 {
    s as i32
}

async fn reserve(c: &SeppClient, q: &str, lease_ms: u64) -> sepp_rs::Job {
    c.reserve(ReserveOptions::new([q], Duration::from_millis(lease_ms)))
        .await
        .unwrap()
        .remove(0)
}

#[tokio::test]
async fn get_job_follows_a_job_through_every_state() {
    let server = TestServer::start(|c| c.storage.dead_letter_retention_ms = 60_000).await;
    let c = server.client().await;
    let mut admin = server.admin().await;

    let unknown = state(&mut admin, "00000000-0000-4000-8000-000000000000").await;
    assert_eq!(unknown.state, st(apb::JobState::Unknown));

    let later = SystemTime::now() + Duration::from_secs(600);
    let sched = c
        .enqueue(
            EnqueueRequest::new("q", "report")
                .unwrap()
                .with_scheduled_at(later),
        )
        .await
        .unwrap();
    let s = state(&mut admin, &sched.job_id).await;
    assert_eq!(s.state, st(apb::JobState::Scheduled));
    assert!(s.scheduled_at.is_some());

    let ack = c
        .enqueue(
            EnqueueRequest::new("q", "email")
                .unwrap()
                .with_idempotency_key("k1")
                .with_max_attempts(2),
        )
        .await
        .unwrap();
    let s = state(&mut admin, &ack.job_id).await;
    assert_eq!(s.state, st(apb::JobState::Ready));
    assert_eq!((s.queue.as_str(), s.job_type.as_str()), ("q", "email"));
    assert_eq!(s.idempotency_key.as_deref(), Some("k1"));

    let j = c
        .reserve(ReserveOptions::new(["q"], Duration::from_secs(30)).with_worker_id("w-1"))
        .await
        .unwrap()
        .remove(0);
    let s = state(&mut admin, &j.id).await;
    assert_eq!(s.state, st(apb::JobState::InFlight));
    assert_eq!(s.attempt, 1);
    assert_eq!(s.worker_id.as_deref(), Some("w-1"));
    assert!(s.lease_expires_at.is_some());

    c.nack(
        &j.id,
        1,
        NackRetry::Delay(Duration::from_secs(60)),
        Some("flaky".into()),
    )
    .await
    .unwrap();
    let s = state(&mut admin, &j.id).await;
    assert_eq!(s.state, st(apb::JobState::Scheduled));
    assert_eq!(s.last_reason.as_deref(), Some("flaky"));

    // Acked: a keyed job leaves a tombstone, so the id a dedup hit returns can be looked up.
    let k2 = c
        .enqueue(
            EnqueueRequest::new("done", "t")
                .unwrap()
                .with_idempotency_key("k2"),
        )
        .await
        .unwrap();
    let j2 = reserve(&c, "done", 30_000).await;
    c.ack(&j2.id, 1).await.unwrap();
    let s = state(&mut admin, &k2.job_id).await;
    assert_eq!(s.state, st(apb::JobState::Completed));
    assert_eq!(s.job_type, "t");
    assert!(s.finished_at.is_some());
    // An unkeyed job leaves nothing behind.
    let plain = c
        .enqueue(EnqueueRequest::new("done", "t").unwrap())
        .await
        .unwrap();
    let j3 = reserve(&c, "done", 30_000).await;
    assert_eq!(j3.id, plain.job_id);
    c.ack(&j3.id, 1).await.unwrap();
    assert_eq!(
        state(&mut admin, &plain.job_id).await.state,
        st(apb::JobState::Unknown)
    );

    let dl = c
        .enqueue(EnqueueRequest::new("dead", "t").unwrap())
        .await
        .unwrap();
    let j4 = reserve(&c, "dead", 30_000).await;
    c.nack(&j4.id, 1, NackRetry::DeadLetter, Some("nope".into()))
        .await
        .unwrap();
    let s = state(&mut admin, &dl.job_id).await;
    assert_eq!(s.state, st(apb::JobState::DeadLettered));
    assert_eq!(
        s.dead_letter_cause,
        sepp_proto::v1::DeadLetterCause::Rejected as i32
    );
    assert_eq!(s.last_reason.as_deref(), Some("nope"));
}

#[tokio::test]
async fn key_lookup_names_the_job_and_expiry() {
    let server = TestServer::start(|c| c.storage.dedup_window_ms = 60_000).await;
    let c = server.client().await;
    let mut admin = server.admin().await;
    let ack = c
        .enqueue(
            EnqueueRequest::new("q", "t")
                .unwrap()
                .with_idempotency_key("order-1"),
        )
        .await
        .unwrap();
    let found = admin
        .lookup_idempotency_key(apb::LookupIdempotencyKeyRequest {
            queue: "q".into(),
            idempotency_key: "order-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(found.found);
    assert_eq!(found.job_id, ack.job_id);
    let (c_at, e_at) = (found.created_at.unwrap(), found.expires_at.unwrap());
    assert_eq!(e_at.seconds - c_at.seconds, 60);
    let missing = admin
        .lookup_idempotency_key(apb::LookupIdempotencyKeyRequest {
            queue: "other".into(),
            idempotency_key: "order-1".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!missing.found);
}

/// Dead-letters `n` new jobs of `queue`, each at its own time on the server's manual clock.
async fn make_dead(server: &TestServer, c: &SeppClient, queue: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        c.enqueue(
            EnqueueRequest::new(queue, "t")
                .unwrap()
                .with_idempotency_key(format!("{queue}-{i}")),
        )
        .await
        .unwrap();
        let j = reserve(c, queue, 30_000).await;
        c.nack(&j.id, 1, NackRetry::DeadLetter, None).await.unwrap();
        ids.push(j.id);
        server.clock().advance(3);
    }
    ids
}

#[tokio::test]
async fn dead_letters_can_be_listed_in_pages_requeued_and_deleted() {
    let server = TestServer::start_with_clock(Arc::new(ManualClock::new(SystemClock.now())), |c| {
        c.storage.dead_letter_retention_ms = 60_000
    })
    .await;
    let c = server.client().await;
    let mut admin = server.admin().await;
    let ids = make_dead(&server, &c, "q", 5).await;

    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = admin
            .list_dead_letters(apb::ListDeadLettersRequest {
                queue: Some("q".into()),
                page_size: Some(2),
                page_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.records.len() <= 2);
        seen.extend(page.records.into_iter().map(|r| r.job.unwrap().id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, ids);
    // Listing removed nothing.
    let stats = admin
        .get_queue_stats(apb::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.dead_lettered, 5);

    // An id named several times is deleted once and named once in the reply.
    let deleted = admin
        .delete_dead_letters(apb::DeleteDeadLettersRequest {
            selector: Some(apb::DeadLetterSelector {
                job_ids: vec![ids[0].clone(); 3],
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .job_ids;
    assert_eq!(deleted, vec![ids[0].clone()]);
    let requeued = admin
        .requeue_dead_letters(apb::RequeueDeadLettersRequest {
            selector: Some(apb::DeadLetterSelector {
                queue: Some("q".into()),
                max: Some(2),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .job_ids;
    assert_eq!(requeued, ids[1..3].to_vec());
    let stats = admin
        .get_queue_stats(apb::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.ready, stats.dead_lettered), (2, 2));
    // So is one requeued by a list that repeats it among ids of nothing.
    let twice = admin
        .requeue_dead_letters(apb::RequeueDeadLettersRequest {
            selector: Some(apb::DeadLetterSelector {
                job_ids: vec![
                    ids[3].clone(),
                    "00000000-0000-4000-8000-000000000000".into(),
                    ids[3].clone(),
                ],
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .job_ids;
    assert_eq!(twice, vec![ids[3].clone()]);
    let stats = admin
        .get_queue_stats(apb::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.ready, stats.dead_lettered), (3, 1));
    let j = reserve(&c, "q", 30_000).await;
    assert_eq!(j.id, ids[1]);
    assert_eq!(j.attempt, 1);
    // A bad selector is refused.
    let e = admin
        .requeue_dead_letters(apb::RequeueDeadLettersRequest {
            selector: Some(apb::DeadLetterSelector {
                max: Some(0),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn a_paused_queue_accepts_enqueues_but_hands_out_nothing_until_resumed() {
    let dir = common::TempDir::new();
    let server = TestServer::start_in(dir, |_| {}).await;
    let c = server.client().await;
    let mut admin = server.admin().await;
    admin
        .pause_queue(apb::PauseQueueRequest { queue: "q".into() })
        .await
        .unwrap();
    c.enqueue(EnqueueRequest::new("q", "t").unwrap())
        .await
        .unwrap();
    let none = c
        .reserve(ReserveOptions::new(["q"], Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(none.is_empty());
    // The pause survives a restart.
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, |_| {}).await;
    let c = server.client().await;
    let mut admin = server.admin().await;
    let stats = admin
        .get_queue_stats(apb::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(stats.paused);
    assert_eq!(stats.ready, 1);
    // A waiting reserve is woken by the resume.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            c.reserve(
                ReserveOptions::new(["q"], Duration::from_secs(30))
                    .with_wait_timeout(Duration::from_secs(10)),
            )
            .await
            .unwrap()
        })
    };
    server.reserves_waiting(1).await;
    admin
        .resume_queue(apb::ResumeQueueRequest { queue: "q".into() })
        .await
        .unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn expired_dedup_records_are_swept_and_their_count_returns_to_zero() {
    let server = TestServer::start(|c| {
        c.queues.push(QueueConfig {
            name: "brief".into(),
            dedup_window_ms: Some(500),
            ..Default::default()
        });
    })
    .await;
    let c = server.client().await;
    let mut admin = server.admin().await;
    for i in 0..300 {
        c.enqueue(
            EnqueueRequest::new("brief", "t")
                .unwrap()
                .with_idempotency_key(format!("k{i}")),
        )
        .await
        .unwrap();
    }
    let count = |admin: &mut AdminServiceClient<Channel>| {
        let mut admin = admin.clone();
        async move {
            admin
                .get_queue_stats(apb::GetQueueStatsRequest {
                    queue: "brief".into(),
                })
                .await
                .unwrap()
                .into_inner()
                .dedup_records
        }
    };
    assert!(count(&mut admin).await > 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if count(&mut admin).await == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "records were not swept"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And a key whose record expired starts a fresh job.
    let fresh = c
        .enqueue(
            EnqueueRequest::new("brief", "t")
                .unwrap()
                .with_idempotency_key("k1"),
        )
        .await
        .unwrap();
    assert!(!fresh.deduplicated);
}

#[tokio::test]
async fn the_admin_service_honours_api_keys() {
    let server = TestServer::start(|c| {
        c.auth.api_keys = Some(vec![sepp_server::config::ApiKey::new("ops", "k")]);
    })
    .await;
    let mut admin = server.admin().await;
    let e = admin
        .get_queue_stats(apb::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
}

#[tokio::test]
async fn forgetting_a_key_lets_the_next_enqueue_create_a_new_job() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    let keyed = || {
        EnqueueRequest::new("emails", "receipt")
            .unwrap()
            .with_idempotency_key("order-77")
    };
    let first = c.enqueue(keyed()).await.unwrap();
    assert_eq!(
        c.forget_idempotency_key("emails", "order-77")
            .await
            .unwrap(),
        Some(first.job_id.clone())
    );
    assert_eq!(
        c.forget_idempotency_key("emails", "order-77")
            .await
            .unwrap(),
        None,
        "nothing left to forget"
    );
    assert!(
        c.lookup_idempotency_key("emails", "order-77")
            .await
            .unwrap()
            .is_none()
    );
    let second = c.enqueue(keyed()).await.unwrap();
    assert!(!second.deduplicated);
    assert_ne!(second.job_id, first.job_id);
    // The first job is untouched: both run.
    assert_eq!(c.get_queue_stats("emails").await.unwrap().ready, 2);
    // Bad input names the field.
    let err = c.forget_idempotency_key("emails", "").await.unwrap_err();
    assert_eq!(err.code().as_str(), "INVALID_ARGUMENT");
    assert!(err.to_string().contains("idempotency_key"), "{err}");
}

#[tokio::test]
async fn releasing_a_dead_workers_leases_redelivers_its_jobs_at_once() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    let id = c
        .enqueue(EnqueueRequest::new("emails", "receipt").unwrap())
        .await
        .unwrap()
        .job_id;
    let mut opts = ReserveOptions::new(["emails"], Duration::from_secs(300));
    opts.worker_id = Some("worker-7".into());
    let leased = c.reserve(opts).await.unwrap().remove(0);
    assert_eq!(leased.id, id);
    assert_eq!(
        c.release_leases("worker-7").await.unwrap(),
        vec![id.clone()]
    );
    // Ready again long before the 5-minute lease would end; the dead worker is fenced.
    let again = reserve(&c, "emails", 30_000).await;
    assert_eq!((again.id.as_str(), again.attempt), (id.as_str(), 2));
    let late = c.ack(&leased.id, leased.attempt).await.unwrap_err();
    assert_eq!(late.code().as_str(), "ATTEMPT_MISMATCH");
    assert!(c.release_leases("worker-7").await.unwrap().is_empty());
    let err = c.release_leases("").await.unwrap_err();
    assert_eq!(err.code().as_str(), "INVALID_ARGUMENT");
}

#[tokio::test]
async fn list_queues_list_jobs_cancel_and_purge_over_grpc() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    let mut admin = server.admin().await;
    const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            c.enqueue(
                EnqueueRequest::new("jobs", "email")
                    .unwrap()
                    .with_idempotency_key(format!("k{i}"))
                    .with_payload(format!("{{\"n\": {i}}}"), "application/json")
                    .with_custom_entry("tenant", "acme")
                    .with_trace_context(TRACEPARENT, Some("v=1".into())),
            )
            .await
            .unwrap()
            .job_id,
        );
    }
    c.enqueue(
        EnqueueRequest::new("another", "t")
            .unwrap()
            .with_payload("x", "text/plain"),
    )
    .await
    .unwrap();

    let queues = admin
        .list_queues(apb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let names: Vec<(&str, u64)> = queues
        .queues
        .iter()
        .map(|q| (q.queue.as_str(), q.ready))
        .collect();
    assert_eq!(names, [("another", 1), ("jobs", 3)]);
    assert!(queues.next_page_token.is_empty());

    // Two pages of ready jobs, in enqueue order.
    let p1 = admin
        .list_jobs(apb::ListJobsRequest {
            queue: "jobs".into(),
            state: st(apb::JobState::Ready),
            page_size: Some(2),
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        p1.jobs.iter().map(|j| j.job_id.clone()).collect::<Vec<_>>(),
        ids[..2]
    );
    assert_eq!(p1.jobs[0].idempotency_key.as_deref(), Some("k0"));
    // A listing leaves out what the jobs carry; GetJob has it.
    assert!(
        p1.jobs
            .iter()
            .all(|j| j.payload.is_none() && j.custom.is_empty() && j.trace_context.is_none()),
        "{p1:?}"
    );
    let got = state(&mut admin, &ids[0]).await;
    let payload = got.payload.expect("GetJob carries the payload");
    assert_eq!(payload.data, b"{\"n\": 0}");
    assert_eq!(payload.encoding, "application/json");
    assert_eq!(
        got.custom.get("tenant").and_then(|v| v.value.clone()),
        Some(sepp_proto::v1::primitive_value::Value::StringValue(
            "acme".into()
        ))
    );
    let trace = got.trace_context.expect("GetJob carries the trace context");
    assert_eq!(trace.traceparent, TRACEPARENT);
    assert_eq!(trace.tracestate.as_deref(), Some("v=1"));
    let p2 = admin
        .list_jobs(apb::ListJobsRequest {
            queue: "jobs".into(),
            state: st(apb::JobState::Ready),
            page_size: Some(2),
            page_token: p1.next_page_token,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(p2.jobs.len(), 1);
    assert!(p2.next_page_token.is_empty());
    // A state that cannot be listed is refused, naming the field.
    let err = admin
        .list_jobs(apb::ListJobsRequest {
            queue: "jobs".into(),
            state: st(apb::JobState::Completed),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("state"), "{}", err.message());

    // Cancel by key: the key still answers the same id.
    let cancel = admin
        .cancel_job(apb::CancelJobRequest {
            queue: "jobs".into(),
            idempotency_key: "k1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(cancel.cancelled);
    let job = cancel.job.unwrap();
    assert_eq!(job.job_id, ids[1]);
    assert_eq!(job.state, st(apb::JobState::Completed));
    assert_eq!(job.last_reason.as_deref(), Some("cancelled by an operator"));
    let again = c
        .enqueue(
            EnqueueRequest::new("jobs", "email")
                .unwrap()
                .with_idempotency_key("k1"),
        )
        .await
        .unwrap();
    assert_eq!(again.job_id, ids[1]);
    assert!(again.deduplicated);
    // Cancelling it again answers "not cancelled", with its state.
    let twice = admin
        .cancel_job(apb::CancelJobRequest {
            job_id: ids[1].clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!twice.cancelled);
    // A refused cancel answers the job as it is, without what it carries.
    let busy = reserve(&c, "another", 30_000).await;
    let refused = admin
        .cancel_job(apb::CancelJobRequest {
            job_id: busy.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!refused.cancelled);
    let job = refused.job.unwrap();
    assert_eq!(job.state, st(apb::JobState::InFlight));
    assert!(job.payload.is_none(), "{job:?}");
    assert!(state(&mut admin, &busy.id).await.payload.is_some());
    // Neither id nor key.
    let err = admin
        .cancel_job(apb::CancelJobRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // Purge the rest.
    let purged = admin
        .purge_queue(apb::PurgeQueueRequest {
            queue: "jobs".into(),
            max: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((purged.purged, purged.more), (2, false));
    let stats = admin
        .get_queue_stats(apb::GetQueueStatsRequest {
            queue: "jobs".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.ready, stats.scheduled), (0, 0));
}
