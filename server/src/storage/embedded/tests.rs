//! Store-level tests of the embedded backend with explicit times.

use super::*;
use crate::domain::{DeadLetterCause, NewJob};

fn open(dir: &std::path::Path) -> EmbeddedStore {
    EmbeddedStore::open(
        EmbeddedOptions {
            path: dir.join("data"),
            persist_mode: PersistMode::Buffer,
            dead_letter_retention_ms: 0,
            min_free_bytes: 0,
        },
        Arc::new(ReadySignals::default()),
        0,
    )
    .expect("open")
}

fn job(now: UnixMs, max_attempts: u32) -> NewJob {
    NewJob {
        id: JobId::new_v4(),
        queue: Arc::from("q"),
        job_type: "t".into(),
        payload: None,
        priority: 0,
        max_attempts,
        trace_context: None,
        custom: Default::default(),
        enqueued_at: now,
        scheduled_at: None,
        dedup: None,
        max_queue_depth: None,
        reply_bytes: 200,
    }
}

fn spec(lease_ms: u64) -> ReserveSpec {
    ReserveSpec {
        queues: vec!["q".into()],
        max_jobs: 1,
        lease_ms,
        worker_id: None,
        max_reply_bytes: u64::MAX,
    }
}

/// The fence compares the lease deadline with the transition's `now`: at or after
/// `lease_expires_at`, ack, nack and extend are refused as not in flight although the sweeper
/// has not run, an extend does not revive the lease, and the next sweep redelivers the job
/// with the next attempt. Just before the deadline they still succeed.
#[tokio::test]
async fn settlements_at_or_after_the_lease_deadline_are_refused_without_a_sweep() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(dir.path());
    let t0: UnixMs = 1_000_000;
    let j = job(t0, 3);
    let id = j.id;
    store.enqueue(vec![j], false, t0).await.expect("enqueue");

    let leased = store.reserve(&spec(1_000), t0).await.expect("reserve");
    assert_eq!(leased.len(), 1);
    let deadline = leased[0].lease_expires_at.expect("leased");
    assert_eq!(deadline, t0 + 1_000);

    // One millisecond before the deadline the lease holds: extend works.
    let extended = store
        .extend(id, 1, 1_000, deadline - 1)
        .await
        .expect("extend")
        .expect("in flight just before the deadline");
    assert_eq!(extended, deadline - 1 + 1_000);
    let deadline = extended;

    // At the deadline, and after it, every settlement is refused.
    for now in [deadline, deadline + 1, deadline + 60_000] {
        assert_eq!(
            store.ack(id, 1, now).await.expect("ack"),
            Err(SettleRefusal::NotInFlight),
            "ack at deadline{:+} ms",
            now - deadline
        );
        assert_eq!(
            store.extend(id, 1, 60_000, now).await.expect("extend"),
            Err(SettleRefusal::NotInFlight),
            "extend at deadline{:+} ms",
            now - deadline
        );
        for plan in [
            NackPlan::Retry { ready_at: now },
            NackPlan::DeadLetter(DeadLetterCause::Rejected),
        ] {
            assert_eq!(
                store.nack(id, 1, plan, None, now).await.expect("nack"),
                Err(SettleRefusal::NotInFlight),
                "nack {plan:?} at deadline{:+} ms",
                now - deadline
            );
        }
    }
    // The refused extend did not move the deadline: the sweep at the deadline redelivers.
    let swept = store.maintain(deadline, 100).await.expect("maintain");
    assert_eq!(swept.redelivered, 1);
    let again = store
        .reserve(&spec(1_000), deadline)
        .await
        .expect("reserve");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].id, id);
    assert_eq!(again[0].attempt, 2, "redelivered with the next attempt");
    // The new delivery settles normally within its lease.
    store
        .ack(id, 2, deadline + 999)
        .await
        .expect("ack")
        .expect("attempt 2 is in flight");
    store.close().await.expect("close");
}
