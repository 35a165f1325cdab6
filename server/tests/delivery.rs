//! Delivery over real gRPC: reserve order, long polls, leases, ack/nack/extend fencing,
//! redelivery, retries with backoff, dead letters, scheduled jobs.

mod common;

use common::{Clients, TestServer};
use sepp_proto::v1 as pb;
use sepp_rs::{EnqueueRequest, Job, LeaseError, NackRetry, ReserveOptions, SeppClient};
use sepp_server::config::{Config, QueueConfig, RetryBackoff};
use sepp_server::queue::clock::{Clock, ManualClock, SystemClock};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tonic::Code;

/// A server whose clock moves only when the test advances it (from the wall clock's now).
async fn manual_server(tweak: impl FnOnce(&mut Config)) -> TestServer {
    TestServer::start_with_clock(Arc::new(ManualClock::new(SystemClock.now())), tweak).await
}

fn job(queue: &str) -> EnqueueRequest {
    EnqueueRequest::new(queue, "t").unwrap()
}

fn opts(queues: &[&str], lease_ms: u64) -> ReserveOptions {
    ReserveOptions::new(queues.iter().copied(), Duration::from_millis(lease_ms))
}

async fn reserve_one(c: &SeppClient, queue: &str, lease_ms: u64) -> Option<Job> {
    c.reserve(opts(&[queue], lease_ms))
        .await
        .unwrap()
        .into_iter()
        .next()
}

/// Reserves with a wait, for jobs that become ready through the sweeper.
async fn reserve_wait(c: &SeppClient, queue: &str, lease_ms: u64, wait_ms: u64) -> Option<Job> {
    c.reserve(opts(&[queue], lease_ms).with_wait_timeout(Duration::from_millis(wait_ms)))
        .await
        .unwrap()
        .into_iter()
        .next()
}

#[tokio::test]
async fn reserve_takes_highest_priority_first_then_oldest() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    let mut ids = Vec::new();
    for (i, p) in [0u32, 5, 9, 5, 0].iter().enumerate() {
        let ack = c
            .enqueue(job("q").with_priority(*p).with_custom_entry("n", i as i64))
            .await
            .unwrap();
        ids.push(ack.job_id);
    }
    let jobs = c
        .reserve(opts(&["q"], 30_000).with_max_jobs(10))
        .await
        .unwrap();
    let order: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
    assert_eq!(order, vec![&ids[2], &ids[1], &ids[3], &ids[0], &ids[4]]);
    for j in &jobs {
        assert_eq!(j.attempt, 1);
        assert_eq!(j.queue, "q");
        assert!(j.lease_expires_at.is_some());
    }
}

#[tokio::test]
async fn queues_are_polled_in_list_order_and_max_jobs_is_respected() {
    let server = TestServer::start(|c| c.limits.max_reserve_batch = 3).await;
    let c = server.client().await;
    for q in ["a", "b", "b"] {
        c.enqueue(job(q)).await.unwrap();
    }
    let first = c
        .reserve(opts(&["b", "a"], 30_000).with_max_jobs(2))
        .await
        .unwrap();
    assert_eq!(
        first.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>(),
        vec!["b", "b"]
    );
    for _ in 0..5 {
        c.enqueue(job("a")).await.unwrap();
    }
    // max_jobs above max_reserve_batch is clamped to it.
    let next = c
        .reserve(opts(&["b", "a"], 30_000).with_max_jobs(50))
        .await
        .unwrap();
    assert_eq!(next.len(), 3);
}

#[tokio::test]
async fn a_waiting_reserve_gets_a_job_enqueued_later_at_once() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            let t0 = Instant::now();
            let jobs = c
                .reserve(opts(&["idle", "q"], 30_000).with_wait_timeout(Duration::from_secs(20)))
                .await
                .unwrap();
            (jobs, t0.elapsed())
        })
    };
    // Registered on both queues: the job enqueued now must wake it.
    server.reserves_waiting(2).await;
    let t_enqueue = Instant::now();
    c.enqueue(job("q")).await.unwrap();
    let (jobs, _) = waiter.await.unwrap();
    assert_eq!(jobs.len(), 1);
    let latency = t_enqueue.elapsed();
    assert!(latency < Duration::from_secs(2), "woke after {latency:?}");
    // An empty wait returns empty at its timeout.
    let t0 = Instant::now();
    let none = c
        .reserve(opts(&["idle"], 1_000).with_wait_timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(none.is_empty());
    assert!(t0.elapsed() >= Duration::from_millis(290));
}

#[tokio::test]
async fn a_cancelled_waiting_reserve_leases_nothing() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move {
            c.reserve(opts(&["q"], 60_000).with_wait_timeout(Duration::from_secs(30)))
                .await
        })
    };
    server.reserves_waiting(1).await;
    waiter.abort();
    let _ = waiter.await;
    // The server dropped the cancelled Reserve before the job arrives.
    server.no_reserve_waiting().await;
    c.enqueue(job("q")).await.unwrap();
    let got = reserve_wait(&c, "q", 30_000, 2_000).await;
    assert!(got.is_some(), "the job went to the cancelled reserve");
}

/// A gRPC request body: the 5-byte header, then `m` encoded.
fn grpc_body(m: &impl prost::Message) -> bytes::Bytes {
    let encoded = m.encode_to_vec();
    let mut out = Vec::with_capacity(encoded.len() + 5);
    out.push(0);
    out.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
    out.extend_from_slice(&encoded);
    out.into()
}

/// A worker that stops cancels its long poll and at once gives back (nacks) the job in its
/// hand on the same connection. The server reads the cancel (`RST_STREAM`) first; the job it
/// then makes ready must not be leased into the cancelled Reserve's reply, which nobody reads
/// (the job would be stranded until that lease expired). Raw HTTP/2, so that the cancel
/// surely goes out before the next call, on a server with two worker threads; 100 rounds
/// (before the fix, about a third of them lost their job).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_made_ready_right_after_a_reserve_is_cancelled_does_not_go_to_it() {
    use sepp_server::testing::stalled;
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    let mut conn = stalled::connect(server.addr).await.unwrap();
    let mut lost = Vec::new();
    for round in 0..100 {
        let queue = format!("q{round}");
        let reserve = grpc_body(&pb::ReserveRequest {
            queues: vec![queue.clone()],
            wait_timeout: Some(prost_types::Duration {
                seconds: 30,
                nanos: 0,
            }),
            lease_duration: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            ..Default::default()
        });
        let len = reserve.len();
        let mut waiting = stalled::open(&mut conn, "/sepp.v1.QueueService/Reserve", reserve, len)
            .await
            .unwrap();
        waiting.end_here().unwrap();
        server.reserves_waiting(1).await;
        waiting.reset();
        let enqueue = grpc_body(&pb::EnqueueBatchRequest {
            jobs: vec![pb::EnqueueRequest {
                queue: queue.clone(),
                job_type: "t".into(),
                ..Default::default()
            }],
        });
        let len = enqueue.len();
        let call = stalled::open(
            &mut conn,
            "/sepp.v1.QueueService/EnqueueBatch",
            enqueue,
            len,
        )
        .await
        .unwrap();
        let (code, message) = call.status().await.unwrap();
        assert_eq!(code, 0, "enqueue: {message}");
        server.no_reserve_waiting().await;
        if reserve_one(&c, &queue, 30_000).await.is_none() {
            lost.push(round);
        }
    }
    assert!(
        lost.is_empty(),
        "leased by a cancelled Reserve in rounds {lost:?}"
    );
}

#[tokio::test]
async fn the_lease_is_clamped_to_the_smallest_queue_maximum() {
    let server = TestServer::start(|c| {
        c.queues.push(QueueConfig {
            name: "short".into(),
            max_lease_duration_ms: Some(2_000),
            ..Default::default()
        });
    })
    .await;
    let c = server.client().await;
    c.enqueue(job("long")).await.unwrap();
    let before = SystemTime::now();
    let jobs = c.reserve(opts(&["long", "short"], 600_000)).await.unwrap();
    let expires = jobs[0].lease_expires_at.unwrap();
    let lease = expires.duration_since(before).unwrap();
    assert!(lease <= Duration::from_millis(2_100), "lease {lease:?}");
    assert!(lease >= Duration::from_millis(1_500), "lease {lease:?}");
}

#[tokio::test]
async fn ack_is_fenced_by_attempt_and_a_second_ack_finds_nothing() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    c.enqueue(job("q").with_max_attempts(5)).await.unwrap();
    let first = reserve_one(&c, "q", 300).await.unwrap();
    // The lease expires; the job is redelivered as attempt 2 to another worker.
    let other = server.client().await;
    let second = reserve_wait(&other, "q", 30_000, 5_000).await.unwrap();
    assert_eq!(second.id, first.id);
    assert_eq!(second.attempt, 2);
    // The stale worker cannot ack, nack or extend the new delivery.
    let stale = c.ack(&first.id, first.attempt).await.unwrap_err();
    assert!(
        matches!(stale, LeaseError::AttemptMismatch { .. }),
        "{stale:?}"
    );
    let stale = c
        .extend(&first.id, 1, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(stale, LeaseError::AttemptMismatch { .. }),
        "{stale:?}"
    );
    let stale = c
        .nack(&first.id, 1, NackRetry::Default, None)
        .await
        .unwrap_err();
    assert!(
        matches!(stale, LeaseError::AttemptMismatch { .. }),
        "{stale:?}"
    );
    other.ack(&second.id, 2).await.unwrap();
    let again = other.ack(&second.id, 2).await.unwrap_err();
    assert!(matches!(again, LeaseError::NotInFlight { .. }), "{again:?}");
    let unknown = other
        .ack("00000000-0000-4000-8000-000000000000", 1)
        .await
        .unwrap_err();
    assert!(matches!(unknown, LeaseError::NotInFlight { .. }));
}

#[tokio::test]
async fn extend_keeps_a_job_past_its_first_lease() {
    let server = manual_server(|_| {}).await;
    let c = server.client().await;
    c.enqueue(job("q")).await.unwrap();
    let j = reserve_one(&c, "q", 500).await.unwrap();
    for _ in 0..4 {
        server.clock().advance(250);
        c.extend(&j.id, j.attempt, Duration::from_millis(500))
            .await
            .unwrap();
    }
    // 500 ms after the first lease would have ended, a sweep leaves it leased: nobody else
    // gets it.
    server.sweep().await;
    assert!(reserve_one(&c, "q", 500).await.is_none());
    c.ack(&j.id, j.attempt).await.unwrap();
}

#[tokio::test]
async fn nack_default_delay_and_dead_letter_do_what_they_say() {
    let server = TestServer::start(|c| c.storage.dead_letter_retention_ms = 60_000).await;
    let c = server.client().await;
    c.enqueue(job("q").with_max_attempts(5)).await.unwrap();
    // Default policy (retry_delay_ms = 0): ready at once, attempt 2.
    let j = reserve_one(&c, "q", 30_000).await.unwrap();
    assert!(
        !c.nack(&j.id, 1, NackRetry::Default, Some("boom".into()))
            .await
            .unwrap()
    );
    let j = reserve_one(&c, "q", 30_000).await.unwrap();
    assert_eq!(j.attempt, 2);
    // A delay: not ready before it.
    let t0 = Instant::now();
    c.nack(&j.id, 2, NackRetry::Delay(Duration::from_millis(700)), None)
        .await
        .unwrap();
    assert!(reserve_one(&c, "q", 30_000).await.is_none());
    let j = reserve_wait(&c, "q", 30_000, 5_000).await.unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(650),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(j.attempt, 3);
    // Dead-letter: at once, whatever attempts remain, cause REJECTED.
    assert!(
        c.nack(&j.id, 3, NackRetry::DeadLetter, Some("bad input".into()))
            .await
            .unwrap()
    );
    let dead = c.drain_dead_letters(Some("q"), 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].cause, sepp_rs::DeadLetterCause::Rejected);
    assert_eq!(dead[0].final_attempt, 3);
    assert_eq!(dead[0].last_reason.as_deref(), Some("bad input"));
    assert_eq!(dead[0].job.id, j.id);
}

#[tokio::test]
async fn exponential_backoff_delays_stay_within_their_jitter_bounds() {
    let server = TestServer::start(|c| {
        c.limits.retry_delay_ms = 400;
        c.limits.retry_backoff = RetryBackoff::Exponential;
    })
    .await;
    let c = server.client().await;
    c.enqueue(job("q").with_max_attempts(4)).await.unwrap();
    let mut j = reserve_one(&c, "q", 30_000).await.unwrap();
    // Nack of attempt n waits 400 × 2^(n−1) minus up to a quarter.
    for (n, lo, hi) in [(1u32, 300u64, 400u64), (2, 600, 800), (3, 1_200, 1_600)] {
        let t0 = Instant::now();
        c.nack(&j.id, n, NackRetry::Default, None).await.unwrap();
        j = reserve_wait(&c, "q", 30_000, 5_000).await.unwrap();
        let waited = t0.elapsed().as_millis() as u64;
        assert!(
            waited + 20 >= lo,
            "attempt {n}: ready after {waited} ms, lower bound {lo}"
        );
        // Upper bound plus the time the wake-up and the RPCs take on a loaded machine.
        assert!(
            waited <= hi + 400,
            "attempt {n}: ready after {waited} ms, upper bound {hi}"
        );
        assert_eq!(j.attempt, n + 1);
    }
}

#[tokio::test]
async fn the_last_attempt_dead_letters_with_its_cause_and_reason() {
    let server = manual_server(|c| c.storage.dead_letter_retention_ms = 60_000).await;
    let c = server.client().await;
    c.enqueue(job("q").with_max_attempts(2)).await.unwrap();
    let j = reserve_one(&c, "q", 30_000).await.unwrap();
    assert!(
        !c.nack(&j.id, 1, NackRetry::Default, Some("first".into()))
            .await
            .unwrap()
    );
    let j = reserve_one(&c, "q", 30_000).await.unwrap();
    assert!(
        c.nack(
            &j.id,
            2,
            NackRetry::Delay(Duration::from_secs(5)),
            Some("second".into())
        )
        .await
        .unwrap()
    );
    // Lease expiry on the last attempt: LEASE_EXPIRED.
    c.enqueue(job("q").with_max_attempts(1)).await.unwrap();
    let k = reserve_one(&c, "q", 200).await.unwrap();
    server.clock().advance(200);
    server.sweep().await;
    let dead = c.drain_dead_letters(Some("q"), 10).await.unwrap();
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert_eq!(dead[0].job.id, j.id);
    assert_eq!(dead[0].cause, sepp_rs::DeadLetterCause::AttemptsExhausted);
    assert_eq!(dead[0].last_reason.as_deref(), Some("second"));
    assert_eq!(dead[0].final_attempt, 2);
    assert_eq!(dead[1].job.id, k.id);
    assert_eq!(dead[1].cause, sepp_rs::DeadLetterCause::LeaseExpired);
}

#[tokio::test]
async fn without_retention_dead_jobs_are_deleted() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    c.enqueue(job("q")).await.unwrap();
    let j = reserve_one(&c, "q", 30_000).await.unwrap();
    assert!(c.nack(&j.id, 1, NackRetry::DeadLetter, None).await.unwrap());
    assert!(c.drain_dead_letters(None, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn drain_returns_the_oldest_first_up_to_max_and_removes_them() {
    let server = manual_server(|c| c.storage.dead_letter_retention_ms = 60_000).await;
    let c = server.client().await;
    let mut dead_ids = Vec::new();
    for q in ["a", "b", "a", "b"] {
        c.enqueue(job(q)).await.unwrap();
        let j = reserve_one(&c, q, 30_000).await.unwrap();
        c.nack(&j.id, 1, NackRetry::DeadLetter, None).await.unwrap();
        dead_ids.push(j.id);
        // Each dead letter fails at its own time.
        server.clock().advance(5);
    }
    let first = c.drain_dead_letters(None, 3).await.unwrap();
    assert_eq!(
        first.iter().map(|d| d.job.id.clone()).collect::<Vec<_>>(),
        dead_ids[..3].to_vec()
    );
    let rest = c.drain_dead_letters(Some("a"), 10).await.unwrap();
    assert!(rest.is_empty());
    let rest = c.drain_dead_letters(Some("b"), 10).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].job.id, dead_ids[3]);
    assert!(c.drain_dead_letters(None, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn scheduled_jobs_are_not_delivered_early() {
    let server = TestServer::start(|_| {}).await;
    let c = server.client().await;
    let due = SystemTime::now() + Duration::from_millis(800);
    c.enqueue(job("q").with_scheduled_at(due)).await.unwrap();
    assert!(reserve_one(&c, "q", 30_000).await.is_none());
    let j = reserve_wait(&c, "q", 30_000, 5_000).await.unwrap();
    assert!(SystemTime::now() >= due);
    assert!(j.scheduled_at.is_some());
    // A time in the past means at once.
    c.enqueue(job("q").with_scheduled_at(SystemTime::now() - Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(reserve_one(&c, "q", 30_000).await.is_some());
}

#[tokio::test]
async fn malformed_requests_get_the_statuses_of_the_protocol() {
    let server = TestServer::start(|c| {
        c.limits.max_reserve_queues = 2;
    })
    .await;
    let mut raw = server.raw().await;
    let lease = Some(prost_types::Duration {
        seconds: 10,
        nanos: 0,
    });
    let cases = [
        pb::ReserveRequest {
            queues: vec![],
            lease_duration: lease,
            ..Default::default()
        },
        pb::ReserveRequest {
            queues: vec!["q".into()],
            lease_duration: None,
            ..Default::default()
        },
        pb::ReserveRequest {
            queues: vec!["q".into()],
            lease_duration: Some(prost_types::Duration {
                seconds: 0,
                nanos: 0,
            }),
            ..Default::default()
        },
        pb::ReserveRequest {
            queues: vec!["q".into()],
            lease_duration: Some(prost_types::Duration {
                seconds: -5,
                nanos: 0,
            }),
            ..Default::default()
        },
        pb::ReserveRequest {
            queues: vec!["a".into(), "b".into(), "c".into()],
            lease_duration: lease,
            ..Default::default()
        },
        pb::ReserveRequest {
            queues: vec!["q".into()],
            lease_duration: lease,
            max_jobs: Some(0),
            ..Default::default()
        },
    ];
    for (i, r) in cases.into_iter().enumerate() {
        let e = raw.reserve(r).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "case {i}: {e:?}");
    }
    let e = raw
        .drain_dead_letters(pb::DrainDeadLettersRequest {
            queue: None,
            max: Some(0),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    for id in ["00000000-0000-4000-8000-000000000000", "not-a-uuid"] {
        let e = raw
            .ack(pb::AckRequest {
                job_id: id.into(),
                attempt: 1,
                worker_id: None,
                then_reserve: None,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{id}");
        let e = raw
            .extend(pb::ExtendRequest {
                job_id: id.into(),
                attempt: 1,
                lease_duration: lease,
                worker_id: None,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{id}");
        let e = raw
            .nack(pb::NackRequest {
                job_id: id.into(),
                attempt: 1,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound, "{id}");
    }
}

#[tokio::test]
async fn a_keyed_job_that_is_retried_and_redelivered_stays_one_job() {
    let server = manual_server(|c| c.storage.dead_letter_retention_ms = 60_000).await;
    let c = server.client().await;
    let keyed = || job("q").with_idempotency_key("K").with_max_attempts(3);
    let original = c.enqueue(keyed()).await.unwrap();
    // A producer keeps enqueueing K, from before the first delivery until after the
    // redelivery, while the job fails, is retried and redelivered.
    let done = Arc::new(tokio::sync::Notify::new());
    let producer = {
        let (c, done) = (c.clone(), done.clone());
        tokio::spawn(async move {
            let mut ids = Vec::new();
            let stop = done.notified();
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    biased;
                    _ = &mut stop => break,
                    ack = c.enqueue(keyed()) => ids.push(ack.unwrap()),
                }
            }
            ids
        })
    };
    let j = reserve_one(&c, "q", 30_000).await.unwrap();
    c.nack(&j.id, 1, NackRetry::Default, None).await.unwrap();
    let _redelivered = reserve_one(&c, "q", 200).await.unwrap();
    // Its lease runs out.
    server.clock().advance(200);
    server.sweep().await;
    let j = reserve_one(&c, "q", 30_000).await.unwrap();
    assert_eq!(j.attempt, 3);
    // One more enqueue of K after the redelivery, then stop.
    assert!(c.enqueue(keyed()).await.unwrap().deduplicated);
    done.notify_one();
    let acks = producer.await.unwrap();
    assert!(!acks.is_empty());
    for ack in acks {
        assert!(ack.deduplicated);
        assert_eq!(ack.job_id, original.job_id);
    }
    // Only one job ever existed in the queue.
    assert!(reserve_one(&c, "q", 30_000).await.is_none());
    // Dead-letter it and requeue it: same id, attempt 1, and K still names it.
    c.nack(&j.id, 3, NackRetry::DeadLetter, None).await.unwrap();
    let mut admin = server.admin().await;
    use sepp_proto::admin::v1 as apb;
    let requeued = admin
        .requeue_dead_letters(apb::RequeueDeadLettersRequest {
            selector: Some(apb::DeadLetterSelector {
                job_ids: vec![j.id.clone()],
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .job_ids;
    assert_eq!(requeued, vec![j.id.clone()]);
    let again = reserve_one(&c, "q", 30_000).await.unwrap();
    assert_eq!(again.id, original.job_id);
    assert_eq!(again.attempt, 1);
    let hit = c.enqueue(keyed()).await.unwrap();
    assert!(hit.deduplicated);
    assert_eq!(hit.job_id, original.job_id);
}
