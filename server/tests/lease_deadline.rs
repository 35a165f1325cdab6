//! The lease deadline at the fence: an ack, nack or extend sent after `lease_expires_at` is
//! refused with NOT_FOUND although the sweeper has not reached the job yet, and an extend never
//! revives an expired lease.

mod common;

use common::{Clients, TestServer};
use sepp_rs::{EnqueueRequest, LeaseError, NackRetry, ReserveOptions};
use std::time::{Duration, SystemTime};

const JOBS: usize = 20_000;

fn now() -> SystemTime {
    SystemTime::now()
}

/// 20,000 leases expire together, so the sweeper needs many passes (at most 256 items each)
/// to redeliver them. The job it reaches last is settled right after its deadline: every
/// settlement is refused, the job is then redelivered with the next attempt. Before the fix the
/// late ack succeeded because the job was still "in flight" until the sweeper got to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_after_the_lease_deadline_get_not_found_before_the_sweep() {
    let server = TestServer::start(|c| {
        c.limits.max_enqueue_batch = 1000;
        c.limits.max_reserve_batch = JOBS as u32;
    })
    .await;
    let c = server.client().await;
    for _ in 0..JOBS / 1000 {
        let batch = (0..1000)
            .map(|_| EnqueueRequest::new("q", "t").unwrap().with_max_attempts(5))
            .collect();
        for r in c.enqueue_batch(batch).await.unwrap() {
            r.unwrap();
        }
    }
    // One Reserve leases all of them with the same deadline.
    let jobs = c
        .reserve(ReserveOptions::new(["q"], Duration::from_millis(1500)).with_max_jobs(JOBS as u32))
        .await
        .unwrap();
    assert_eq!(jobs.len(), JOBS);
    // Among equal deadlines the sweeper goes in id order: the largest id comes last.
    let last = jobs.iter().max_by(|a, b| a.id.cmp(&b.id)).unwrap();
    let deadline = last.lease_expires_at.expect("leased");
    // Poll the clock, not a fixed sleep: wait until the deadline has passed.
    while now() <= deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    let late = c.ack(&last.id, last.attempt).await.unwrap_err();
    assert!(
        matches!(late, LeaseError::NotInFlight { .. }),
        "a late ack: {late:?}"
    );
    let late = c
        .extend(&last.id, last.attempt, Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(late, LeaseError::NotInFlight { .. }),
        "a late extend: {late:?}"
    );
    let late = c
        .nack(&last.id, last.attempt, NackRetry::Default, None)
        .await
        .unwrap_err();
    assert!(
        matches!(late, LeaseError::NotInFlight { .. }),
        "a late nack: {late:?}"
    );

    // The refused extend did not revive the lease: once swept, every job is delivered again
    // with attempt 2, the late-settled one included.
    let mut seen = 0;
    let mut found = None;
    while seen < JOBS {
        let again = c
            .reserve(
                ReserveOptions::new(["q"], Duration::from_secs(60))
                    .with_max_jobs(JOBS as u32)
                    .with_wait_timeout(Duration::from_secs(5)),
            )
            .await
            .unwrap();
        assert!(!again.is_empty(), "only {seen} of {JOBS} were redelivered");
        seen += again.len();
        if let Some(j) = again.into_iter().find(|j| j.id == last.id) {
            found = Some(j);
        }
    }
    let j = found.expect("the late-settled job is redelivered");
    assert_eq!(j.attempt, 2);
    c.ack(&j.id, 2).await.unwrap();
}
