//! The behavioural suite every [`Store`] backend must pass: the queue's rules (`queue/`) over
//! the backend, driven by a [`ManualClock`] (time advances; nothing sleeps).
//!
//! A backend runs it with one line in its own tests:
//!
//! ```ignore
//! crate::storage::conformance::conformance_suite!(my_backend());
//! ```
//!
//! where `my_backend()` returns a [`Backend`]: something that opens the store under test, and
//! opens it again on the same data after a close (recovery). Each case is a `#[tokio::test]`
//! named after the rule it checks; between them they call every method of the trait. Cases
//! reach the store through [`Queue`] (the rules live there, and the store must apply their
//! plans) and call the store directly where the queue layer offers no path (`close`,
//! `health`).

use crate::config::{Config, KeyConflict, OnDuplicate, QueueConfig, RetryBackoff};
use crate::domain::{
    DeadLetterCause, Job, JobContent, JobId, JobState, ListState, Payload, TraceContext, UnixMs,
    Value,
};
use crate::error::QueueError;
use crate::queue::admin::SelectorInput;
use crate::queue::clock::{Clock, ManualClock};
use crate::queue::limits::Limits;
use crate::queue::model::{EnqueueInput, JobOutcome, Rejection};
use crate::queue::sweeper::SweepReport;
use crate::queue::{NackStrategy, Queue, ReserveInput};
use crate::storage::{StorageError, StorageHealth, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The time every case starts at (2024-01-01T00:00:00Z).
pub(crate) const T0: UnixMs = 1_704_067_200_000;

/// A backend under test.
#[async_trait::async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    /// Opens the store: empty on the first call, the same data on later calls (after the
    /// previous store was closed). `now` is the time of the open.
    async fn open(&self, now: UnixMs) -> Arc<dyn Store>;

    /// Opens a store on the copy [`Store::backup`] wrote into `dir`, as a server started on
    /// it would; or, for a backend whose backups are made with other tools, `Err` with their
    /// names, which its `backup` must refuse naming.
    async fn open_backup(
        &self,
        dir: &std::path::Path,
        now: UnixMs,
    ) -> Result<Arc<dyn Store>, &'static [&'static str]>;

    /// Overwrites the stored body of job `id` in `store` (opened by this backend) with bytes
    /// that do not decode, as a damaged record would read.
    async fn corrupt_body(&self, store: &Arc<dyn Store>, id: JobId);
}

/// Runs every case of the suite as its own `#[tokio::test]` against the backend `$backend`
/// (an expression giving a fresh [`Backend`] for each case).
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::storage::conformance::conformance_suite!(@cases $backend;
            a_job_is_enqueued_ready_and_reserved_under_a_lease,
            reserve_order_is_priority_then_enqueue_order_then_list_order,
            a_reserve_stops_before_its_reply_budget_but_always_takes_one_job,
            a_repeated_key_in_one_batch_is_a_hit_of_the_first_in_both_modes,
            a_key_deduplicates_until_its_window_ends_and_not_at_its_end,
            a_hit_names_the_job_after_it_was_acked_dead_lettered_or_requeued,
            a_key_conflict_is_rejected_naming_the_original_also_after_a_restart,
            a_hit_reports_where_the_job_it_names_is,
            a_hit_on_a_pending_job_replaces_its_contents_and_on_a_running_one_keeps_it,
            a_forgotten_key_creates_a_new_job_and_stays_forgotten_after_a_restart,
            schedule_ticks_are_enqueued_once_by_two_servers_and_once_after_a_restart,
            released_leases_end_as_if_expired_and_fence_the_worker,
            depth_limits_count_ready_scheduled_and_in_flight_jobs_but_not_hits,
            an_atomic_batch_with_a_refused_job_writes_nothing,
            paused_queues_are_skipped_until_resumed,
            fencing_refuses_a_wrong_attempt_an_old_attempt_and_a_finished_job,
            an_ack_then_reserve_leases_in_the_same_step_and_a_refused_ack_leases_nothing,
            a_corrupt_body_leaves_only_its_own_job_out_of_a_lease,
            a_late_ack_nack_or_extend_before_any_sweep_is_refused,
            nack_plans_retry_at_once_after_a_delay_or_dead_letter,
            lease_expiry_redelivers_and_on_the_last_attempt_dead_letters,
            scheduled_jobs_are_promoted_when_due_keeping_their_order,
            dead_letters_are_kept_for_their_retention_then_purged,
            a_finished_keyed_job_leaves_a_tombstone_until_its_key_expires,
            drain_returns_the_oldest_dead_letters_and_removes_them,
            drain_and_list_stop_before_their_reply_budget,
            admin_lists_pages_requeues_and_deletes_dead_letters,
            queue_stats_count_each_state,
            gauges_report_every_queue_its_oldest_ready_job_and_the_dedup_records,
            list_queues_pages_by_name_with_counts,
            max_queues_refuses_a_new_undeclared_queue_and_counts_the_declared_ones,
            a_pause_creates_a_queue_only_under_max_queues_and_a_resume_creates_none,
            only_an_empty_queue_is_deleted_and_its_keys_outlive_it,
            strict_mode_still_deletes_an_undeclared_queue_left_from_before,
            rates_count_each_minute_sum_over_servers_and_keep_an_hour,
            list_jobs_pages_each_state_in_its_order,
            get_job_reads_what_a_job_carries_and_listings_leave_it_out,
            cancel_and_purge_take_ready_and_scheduled_jobs_and_keep_the_key,
            a_waiting_reserve_gets_a_job_enqueued_later,
            a_woken_reserve_dropped_before_it_looks_passes_its_wake_up_on,
            recovery_brings_back_everything_durable_and_nothing_settled,
            a_closed_store_refuses_writes_and_a_serving_one_says_so,
            a_backup_restores_every_acknowledged_job_and_key_or_is_refused_naming_the_tools,
        );
    };
    (@cases $backend:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let backend = $backend;
                tokio::time::timeout(
                    std::time::Duration::from_secs(60),
                    $crate::storage::conformance::cases::$case(Box::new(backend)),
                )
                .await
                .expect("the case finished within 60 s");
            }
        )*
    };
}
pub(crate) use conformance_suite;

/// A queue over the backend under test, with a manual clock.
pub(crate) struct Harness {
    backend: Box<dyn Backend>,
    config: Config,
    /// The clock of every transition.
    pub(crate) clock: Arc<ManualClock>,
    /// The store under test.
    pub(crate) store: Arc<dyn Store>,
    /// The queue layer over it.
    pub(crate) queue: Arc<Queue>,
}

impl Harness {
    async fn new(backend: Box<dyn Backend>, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = Config::default();
        tweak(&mut config);
        let clock = Arc::new(ManualClock::new(T0));
        let store = backend.open(T0).await;
        let queue = Self::queue_over(&store, &config, &clock);
        Harness {
            backend,
            config,
            clock,
            store,
            queue,
        }
    }

    fn queue_over(store: &Arc<dyn Store>, config: &Config, clock: &Arc<ManualClock>) -> Arc<Queue> {
        Arc::new(Queue::new(
            store.clone(),
            Arc::new(Limits::from_config(config).expect("valid limits")),
            clock.clone(),
            CancellationToken::new(),
        ))
    }

    /// Closes the store and opens it again on the same data, as a restart does. The old
    /// store is dropped first (a backend may hold a lock on its data).
    async fn reopen(self) -> Self {
        self.store.close().await.expect("close");
        let Harness {
            backend,
            config,
            clock,
            store,
            queue,
        } = self;
        drop(queue);
        drop(store);
        let store = backend.open(clock.now()).await;
        let queue = Self::queue_over(&store, &config, &clock);
        Harness {
            backend,
            config,
            clock,
            store,
            queue,
        }
    }

    fn now(&self) -> UnixMs {
        self.clock.now()
    }

    fn advance(&self, ms: i64) -> UnixMs {
        self.clock.advance(ms)
    }

    async fn sweep(&self) -> SweepReport {
        self.queue.sweep(10_000).await.expect("sweep")
    }

    async fn enqueue(&self, jobs: Vec<EnqueueInput>) -> Vec<JobOutcome> {
        self.queue.enqueue_batch(jobs).await.expect("enqueue")
    }

    /// Enqueues one job and returns its id.
    async fn put(&self, job: EnqueueInput) -> JobId {
        let out = self.enqueue(vec![job]).await;
        out[0].as_ref().expect("accepted").job_id
    }

    async fn reserve(&self, queues: &[&str], max_jobs: u32, lease_ms: i64) -> Vec<Job> {
        self.queue
            .reserve(ReserveInput {
                queues: queues.iter().map(|q| q.to_string()).collect(),
                wait_timeout_ms: None,
                lease_ms: Some(lease_ms),
                worker_id: Some("w".into()),
                max_jobs: Some(max_jobs),
            })
            .await
            .expect("reserve")
    }

    async fn reserve_one(&self, queue: &str, lease_ms: i64) -> Option<Job> {
        self.reserve(&[queue], 1, lease_ms).await.into_iter().next()
    }

    async fn state(&self, id: JobId) -> Option<JobState> {
        self.queue
            .get_job(&id.to_string())
            .await
            .expect("get_job")
            .map(|j| j.state)
    }

    /// What `GetJob` reads of job `id`'s content (`None`: unknown, or no body left).
    async fn content(&self, id: JobId) -> Option<JobContent> {
        self.queue
            .get_job(&id.to_string())
            .await
            .expect("get_job")
            .and_then(|j| j.content)
    }

    async fn stats(&self, queue: &str) -> crate::domain::QueueStats {
        self.queue.queue_stats(queue).await.expect("stats")
    }
}

/// An unkeyed job of type `t` on `queue`.
fn job(queue: &str) -> EnqueueInput {
    EnqueueInput {
        queue: queue.into(),
        job_type: "t".into(),
        ..Default::default()
    }
}

fn keyed(queue: &str, key: &str) -> EnqueueInput {
    EnqueueInput {
        idempotency_key: Some(key.into()),
        ..job(queue)
    }
}

fn accepted(o: &JobOutcome) -> (JobId, bool) {
    let a = o.as_ref().expect("accepted");
    (a.job_id, a.deduplicated)
}

fn not_in_flight(r: Result<impl std::fmt::Debug, QueueError>) {
    match r {
        Err(QueueError::JobNotInFlight(_)) => {}
        other => panic!("expected JobNotInFlight, got {other:?}"),
    }
}

fn mismatch(r: Result<impl std::fmt::Debug, QueueError>, current: u32) {
    match r {
        Err(QueueError::AttemptMismatch { current: c, .. }) if c == current => {}
        other => panic!("expected AttemptMismatch (current {current}), got {other:?}"),
    }
}

/// The cases, one function per rule.
pub(crate) mod cases {
    use super::*;

    pub(crate) async fn a_job_is_enqueued_ready_and_reserved_under_a_lease(b: Box<dyn Backend>) {
        let h = Harness::new(b, |_| {}).await;
        let input = EnqueueInput {
            payload: Some(Payload {
                data: b"hello".to_vec(),
                encoding: "text/plain".into(),
            }),
            priority: Some(4),
            max_attempts: Some(5),
            custom: vec![("n".into(), Some(Value::Int(7)))],
            ..job("q")
        };
        let id = h.put(input).await;
        assert_eq!(h.state(id).await, Some(JobState::Ready));
        let j = h.reserve_one("q", 30_000).await.expect("a ready job");
        assert_eq!(j.id, id);
        assert_eq!(j.attempt, 1, "the first delivery is attempt 1");
        assert_eq!(j.max_attempts, 5);
        assert_eq!(j.priority, 4);
        assert_eq!(j.enqueued_at, T0);
        assert_eq!(j.lease_expires_at, Some(T0 + 30_000));
        assert_eq!(j.payload.as_ref().map(|p| &p.data[..]), Some(&b"hello"[..]));
        assert_eq!(j.custom.get("n"), Some(&Value::Int(7)));
        let info = h.queue.get_job(&id.to_string()).await.unwrap().unwrap();
        assert_eq!(info.state, JobState::InFlight);
        assert_eq!(info.lease_expires_at, Some(T0 + 30_000));
        assert_eq!(info.worker_id.as_deref(), Some("w"));
        assert!(h.reserve_one("q", 30_000).await.is_none(), "leased once");
        h.queue.ack(&id.to_string(), 1).await.expect("ack");
        assert_eq!(h.state(id).await, None, "an acked unkeyed job is gone");
        assert!(h.queue.get_job("not-a-job").await.unwrap().is_none());
    }

    pub(crate) async fn reserve_order_is_priority_then_enqueue_order_then_list_order(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |_| {}).await;
        let p = |q: &str, prio| EnqueueInput {
            priority: Some(prio),
            ..job(q)
        };
        let low1 = h.put(p("a", 1)).await;
        h.advance(1);
        let high = h.put(p("a", 9)).await;
        h.advance(1);
        let low2 = h.put(p("a", 1)).await;
        let other = h.put(p("b", 9)).await;
        // List order: every ready job of "b" before any of "a", whatever the priorities.
        let got: Vec<JobId> = h
            .reserve(&["b", "a"], 10, 30_000)
            .await
            .iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(got, vec![other, high, low1, low2]);
    }

    pub(crate) async fn a_reserve_stops_before_its_reply_budget_but_always_takes_one_job(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.limits.max_reserve_reply_bytes = 65_536;
            c.limits.max_payload_bytes = 40_000;
            c.limits.max_custom_total_bytes = 1_000;
        })
        .await;
        let big = |n: u8| EnqueueInput {
            payload: Some(Payload {
                data: vec![n; 30_000],
                encoding: "bin".into(),
            }),
            ..job("q")
        };
        for n in 0..3 {
            h.put(big(n)).await;
        }
        // Two 30 kB jobs fit 64 KiB, a third does not: it stays ready, never leased.
        let first = h.reserve(&["q"], 10, 30_000).await;
        assert_eq!(first.len(), 2);
        let s = h.stats("q").await;
        assert_eq!((s.ready, s.in_flight), (1, 2));
        let rest = h.reserve(&["q"], 10, 30_000).await;
        assert_eq!(rest.len(), 1);
    }

    pub(crate) async fn a_repeated_key_in_one_batch_is_a_hit_of_the_first_in_both_modes(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |_| {}).await;
        let out = h
            .enqueue(vec![
                keyed("q", "k"),
                job("q"),
                keyed("q", "k"),
                keyed("r", "k"),
            ])
            .await;
        let (first, dup0) = accepted(&out[0]);
        assert!(!dup0);
        assert_eq!(accepted(&out[2]), (first, true));
        let (other_queue, dup3) = accepted(&out[3]);
        assert!(!dup3, "keys are scoped per queue");
        assert_ne!(other_queue, first);
        let atomic = h
            .queue
            .enqueue_atomic(vec![keyed("q", "a"), keyed("q", "a")])
            .await
            .unwrap()
            .expect("committed");
        assert!(!atomic[0].deduplicated);
        assert_eq!(atomic[1].job_id, atomic[0].job_id);
        assert!(atomic[1].deduplicated);
        assert_eq!(h.stats("q").await.ready, 3, "k, the unkeyed job, a");
    }

    pub(crate) async fn a_key_deduplicates_until_its_window_ends_and_not_at_its_end(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dedup_window_ms = 10_000).await;
        let id = h.put(keyed("q", "k")).await;
        let until = T0 + 10_000;
        let rec = h
            .queue
            .lookup_idempotency_key("q", "k")
            .await
            .unwrap()
            .expect("a live record");
        assert_eq!(
            (rec.job_id, rec.created_at, rec.expires_at),
            (id, T0, until)
        );
        // A hit does not extend the window.
        h.clock.set(until - 5_000);
        assert_eq!(
            accepted(&h.enqueue(vec![keyed("q", "k")]).await[0]),
            (id, true)
        );
        // Live at until - 1, even after a sweep.
        h.clock.set(until - 1);
        h.sweep().await;
        assert_eq!(
            accepted(&h.enqueue(vec![keyed("q", "k")]).await[0]),
            (id, true)
        );
        assert!(
            h.queue
                .lookup_idempotency_key("q", "k")
                .await
                .unwrap()
                .is_some()
        );
        // Gone at until, before any sweep: the next enqueue creates a fresh job.
        h.clock.set(until);
        assert!(
            h.queue
                .lookup_idempotency_key("q", "k")
                .await
                .unwrap()
                .is_none()
        );
        let (fresh, dup) = accepted(&h.enqueue(vec![keyed("q", "k")]).await[0]);
        assert!(!dup);
        assert_ne!(fresh, id);
        // The fresh record has its own window, from now.
        let rec = h
            .queue
            .lookup_idempotency_key("q", "k")
            .await
            .unwrap()
            .unwrap();
        assert_eq!((rec.job_id, rec.expires_at), (fresh, until + 10_000));
        assert_eq!(h.stats("q").await.dedup_records, 1);
        // Swept after its window.
        h.clock.set(until + 10_000);
        let r = h.sweep().await;
        assert_eq!(r.done.dedup_purged, 1);
        assert_eq!(h.stats("q").await.dedup_records, 0);
    }

    pub(crate) async fn a_hit_names_the_job_after_it_was_acked_dead_lettered_or_requeued(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 60_000).await;
        let acked = h.put(keyed("q", "acked")).await;
        let j = h.reserve_one("q", 30_000).await.unwrap();
        h.queue.ack(&j.id.to_string(), 1).await.unwrap();
        assert_eq!(
            accepted(&h.enqueue(vec![keyed("q", "acked")]).await[0]),
            (acked, true)
        );
        assert_eq!(h.state(acked).await, Some(JobState::Acked));

        let dead = h.put(keyed("q", "dead")).await;
        let j = h.reserve_one("q", 30_000).await.unwrap();
        assert!(
            h.queue
                .nack(&j.id.to_string(), 1, NackStrategy::DeadLetter, None)
                .await
                .unwrap()
        );
        assert_eq!(
            accepted(&h.enqueue(vec![keyed("q", "dead")]).await[0]),
            (dead, true)
        );
        // Requeue: same id, and the dedup index is neither consulted nor written.
        let requeued = h
            .queue
            .requeue_dead_letters(SelectorInput {
                job_ids: vec![dead.to_string()],
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(requeued, vec![dead]);
        assert_eq!(
            accepted(&h.enqueue(vec![keyed("q", "dead")]).await[0]),
            (dead, true)
        );
        let rec = h
            .queue
            .lookup_idempotency_key("q", "dead")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.created_at, T0, "the record was not rewritten");
        assert_eq!(h.stats("q").await.ready, 1, "one job for the key, requeued");
    }

    pub(crate) async fn a_key_conflict_is_rejected_naming_the_original_also_after_a_restart(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.queues.push(QueueConfig {
                name: "strict".into(),
                key_conflict: Some(KeyConflict::Reject),
                ..Default::default()
            });
        })
        .await;
        let with = |queue: &str, data: &[u8]| EnqueueInput {
            payload: Some(Payload {
                data: data.to_vec(),
                encoding: "text/plain".into(),
            }),
            ..keyed(queue, "k")
        };
        let original = h.put(with("strict", b"a")).await;
        let conflict = |o: &JobOutcome| match o {
            Err(Rejection::IdempotencyKeyConflict { original_job_id }) => *original_job_id,
            other => panic!("expected IdempotencyKeyConflict, got {other:?}"),
        };
        // The same contents: a hit. Other contents: a conflict naming the original, every time.
        assert_eq!(
            accepted(&h.enqueue(vec![with("strict", b"a")]).await[0]),
            (original, true)
        );
        for _ in 0..2 {
            assert_eq!(
                conflict(&h.enqueue(vec![with("strict", b"b")]).await[0]),
                original
            );
        }
        // An atomic batch with a conflict writes nothing and reports its index.
        let failures = h
            .queue
            .enqueue_atomic(vec![job("strict"), with("strict", b"b")])
            .await
            .unwrap()
            .expect_err("refused");
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].0, 1);
        assert_eq!(h.stats("strict").await.ready, 1, "only the original");
        // A queue without the setting keeps the founding rule: a hit, whatever the contents.
        let plain = h.put(with("plain", b"a")).await;
        assert_eq!(
            accepted(&h.enqueue(vec![with("plain", b"b")]).await[0]),
            (plain, true)
        );
        // The fingerprint is kept with the record across a restart.
        let h = h.reopen().await;
        assert_eq!(
            conflict(&h.enqueue(vec![with("strict", b"b")]).await[0]),
            original
        );
        assert_eq!(
            accepted(&h.enqueue(vec![with("strict", b"a")]).await[0]),
            (original, true)
        );
    }

    pub(crate) async fn a_hit_on_a_pending_job_replaces_its_contents_and_on_a_running_one_keeps_it(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.queues.push(QueueConfig {
                name: "deb".into(),
                on_duplicate: Some(OnDuplicate::ReplacePending),
                ..Default::default()
            });
        })
        .await;
        let with = |queue: &str, key: &str, data: &[u8], n: i64| EnqueueInput {
            payload: Some(Payload {
                data: data.to_vec(),
                encoding: "text/plain".into(),
            }),
            custom: vec![("n".into(), Some(Value::Int(n)))],
            priority: Some(5),
            ..keyed(queue, key)
        };
        let replaced = |o: &JobOutcome| {
            let a = o.as_ref().expect("accepted");
            assert!(a.deduplicated, "a replacement is a hit");
            (a.job_id, a.replaced, a.original_state)
        };
        let same_priority = EnqueueInput {
            priority: Some(5),
            ..job("deb")
        };
        let before = h.put(same_priority.clone()).await;
        let first = h.put(with("deb", "k", b"v1", 1)).await;
        let after = h.put(same_priority).await;
        h.advance(10);
        // A hit on the ready job: its payload, encoding and custom map are the hit's; its id,
        // job type, priority and place in line stay.
        let hit = EnqueueInput {
            job_type: "other".into(),
            priority: Some(1),
            payload: Some(Payload {
                data: b"{\"v\":2}".to_vec(),
                encoding: "application/json".into(),
            }),
            ..with("deb", "k", b"", 2)
        };
        assert_eq!(
            replaced(&h.enqueue(vec![hit]).await[0]),
            (first, true, Some(JobState::Ready))
        );
        // The window does not restart: the record is the first enqueue's.
        let rec = h
            .queue
            .lookup_idempotency_key("deb", "k")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.created_at, T0);
        // In one batch only the first job with the key replaces; a repeat is a plain hit.
        let out = h
            .enqueue(vec![with("deb", "k", b"v3", 3), with("deb", "k", b"v4", 4)])
            .await;
        assert_eq!(replaced(&out[0]), (first, true, Some(JobState::Ready)));
        assert_eq!(replaced(&out[1]), (first, false, Some(JobState::Ready)));
        // A hit that sends a scheduled_at moves the job; one that sends none leaves it there.
        let later = EnqueueInput {
            scheduled_at: Some(Ok(T0 + 5_000)),
            ..with("deb", "k", b"v5", 5)
        };
        assert_eq!(
            replaced(&h.enqueue(vec![later]).await[0]),
            (first, true, Some(JobState::Scheduled))
        );
        assert_eq!(h.stats("deb").await.scheduled, 1);
        assert_eq!(
            replaced(&h.enqueue(vec![with("deb", "k", b"v6", 6)]).await[0]),
            (first, true, Some(JobState::Scheduled))
        );
        let info = h.queue.get_job(&first.to_string()).await.unwrap().unwrap();
        assert_eq!(info.scheduled_at, Some(T0 + 5_000));
        let now = EnqueueInput {
            scheduled_at: Some(Ok(T0)),
            ..with("deb", "k", b"v7", 7)
        };
        assert_eq!(
            replaced(&h.enqueue(vec![now]).await[0]),
            (first, true, Some(JobState::Ready))
        );
        // Survives a restart; the job keeps its place between the jobs enqueued around it.
        let h = h.reopen().await;
        let got = h.reserve(&["deb"], 10, 30_000).await;
        let ids: Vec<JobId> = got.iter().map(|j| j.id).collect();
        assert_eq!(ids, vec![before, first, after]);
        let j = &got[1];
        assert_eq!(j.job_type, "t", "the job type stays");
        assert_eq!(j.priority, 5, "the priority stays");
        assert_eq!(j.attempt, 1);
        assert_eq!(j.payload.as_ref().map(|p| &p.data[..]), Some(&b"v7"[..]));
        assert_eq!(j.custom.get("n"), Some(&Value::Int(7)));
        // In flight: a hit keeps it, whatever it carries.
        assert_eq!(
            replaced(&h.enqueue(vec![with("deb", "k", b"v8", 8)]).await[0]),
            (first, false, Some(JobState::InFlight))
        );
        h.queue.ack(&first.to_string(), 1).await.unwrap();
        assert_eq!(
            replaced(&h.enqueue(vec![with("deb", "k", b"v9", 9)]).await[0]),
            (first, false, Some(JobState::Acked))
        );
        // A queue without the setting keeps the founding rule.
        let plain = h.put(with("plain", "k", b"a", 1)).await;
        assert_eq!(
            replaced(&h.enqueue(vec![with("plain", "k", b"b", 2)]).await[0]),
            (plain, false, Some(JobState::Ready))
        );
        let j = h.reserve_one("plain", 30_000).await.unwrap();
        assert_eq!(j.payload.as_ref().map(|p| &p.data[..]), Some(&b"a"[..]));
    }

    pub(crate) async fn a_hit_reports_where_the_job_it_names_is(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 60_000).await;
        let state_of_hit = |o: &JobOutcome| {
            let a = o.as_ref().expect("accepted");
            assert!(a.deduplicated);
            a.original_state.expect("a hit says where the job is")
        };
        let hit = async |key: &str| state_of_hit(&h.enqueue(vec![keyed("q", key)]).await[0]);
        // Created: no state. A repeat in the same batch: where the new job goes.
        let out = h.enqueue(vec![keyed("q", "a"), keyed("q", "a")]).await;
        assert_eq!(out[0].as_ref().unwrap().original_state, None);
        assert_eq!(state_of_hit(&out[1]), JobState::Ready);
        assert_eq!(hit("a").await, JobState::Ready);
        let later = EnqueueInput {
            scheduled_at: Some(Ok(T0 + 5_000)),
            ..keyed("q", "later")
        };
        let out = h.enqueue(vec![later.clone(), later.clone()]).await;
        assert_eq!(state_of_hit(&out[1]), JobState::Scheduled);
        assert_eq!(hit("later").await, JobState::Scheduled);
        let j = h.reserve_one("q", 30_000).await.unwrap();
        assert_eq!(hit("a").await, JobState::InFlight);
        h.queue.ack(&j.id.to_string(), 1).await.unwrap();
        assert_eq!(hit("a").await, JobState::Acked);
        let dead = h.put(keyed("q", "dead")).await;
        let j = h.reserve_one("q", 30_000).await.unwrap();
        assert_eq!(j.id, dead);
        h.queue
            .nack(&j.id.to_string(), 1, NackStrategy::DeadLetter, None)
            .await
            .unwrap();
        assert_eq!(hit("dead").await, JobState::DeadLettered);
        h.queue
            .delete_dead_letters(SelectorInput {
                job_ids: vec![dead.to_string()],
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(hit("dead").await, JobState::Deleted);
    }

    /// `[[schedules]]` over the backend: two queue layers (two servers) running a scheduler
    /// each enqueue every tick once, concurrently, through the store's dedup; after a restart,
    /// `catch_up` enqueues the latest missed tick once, and the last tick is read back from the
    /// tick key's record.
    pub(crate) async fn schedule_ticks_are_enqueued_once_by_two_servers_and_once_after_a_restart(
        b: Box<dyn Backend>,
    ) {
        use crate::queue::schedule::{FiredOutcome, Scheduler, Schedules, tick_key};
        const MIN: i64 = 60_000;
        let h = Harness::new(b, |c| {
            c.storage.dedup_window_ms = 600_000;
            c.schedules.push(crate::config::ScheduleConfig {
                name: "m".into(),
                queue: "q".into(),
                job_type: "t".into(),
                every_ms: Some(60_000),
                catch_up: true,
                ..Default::default()
            });
        })
        .await;
        let server = |h: &Harness| {
            let limits = Arc::new(Limits::from_config(&h.config).expect("valid limits"));
            let schedules = Schedules::from_config(&h.config, &limits, h.now()).expect("valid");
            Arc::new(
                Queue::new(
                    h.store.clone(),
                    limits,
                    h.clock.clone(),
                    CancellationToken::new(),
                )
                .with_schedules(Arc::new(schedules)),
            )
        };
        let enqueued = |f: &[crate::queue::schedule::Fired]| match f {
            [one] => match &one.outcome {
                FiredOutcome::Enqueued(a) => (one.tick, a.job_id, a.deduplicated),
                other => panic!("{other:?}"),
            },
            other => panic!("one tick due, got {other:?}"),
        };
        // T0 is a tick: with catch_up both first passes take it.
        let (mut a, mut b) = (Scheduler::new(server(&h)), Scheduler::new(server(&h)));
        for i in 0..3 {
            h.clock.set(T0 + i * MIN);
            let (fa, fb) = tokio::join!(a.run_due(), b.run_due());
            let (ta, ida, hit_a) = enqueued(&fa);
            let (tb, idb, hit_b) = enqueued(&fb);
            assert_eq!((ta, tb), (T0 + i * MIN, T0 + i * MIN));
            assert_eq!(ida, idb, "both name one job");
            assert!(hit_a != hit_b, "one created it, the other was a hit");
        }
        assert_eq!(h.queue.queue_stats("q").await.unwrap().ready, 3);
        drop((a, b));

        // Down from just after the third tick to after the sixth: one job on restart.
        h.clock.set(T0 + 5 * MIN + 30_000);
        let h = h.reopen().await;
        let (t, id, hit) = enqueued(&Scheduler::new(server(&h)).run_due().await);
        assert_eq!((t, hit), (T0 + 5 * MIN, false));
        let (_, again, hit) = enqueued(&Scheduler::new(server(&h)).run_due().await);
        assert_eq!(
            (again, hit),
            (id, true),
            "a second server's catch-up is a hit"
        );
        assert_eq!(h.queue.queue_stats("q").await.unwrap().ready, 4);
        for missed in [3, 4] {
            assert!(
                h.store
                    .lookup_key("q", &tick_key("m", T0 + missed * MIN))
                    .await
                    .unwrap()
                    .is_none(),
                "missed ticks are not enqueued one by one"
            );
        }
        let views = server(&h).list_schedules().await.unwrap();
        let last = views[0].last.expect("the last tick is known");
        assert_eq!((last.tick, last.job_id), (T0 + 5 * MIN, id));
        assert_eq!(views[0].next_tick, Some(T0 + 6 * MIN));
    }

    pub(crate) async fn a_forgotten_key_creates_a_new_job_and_stays_forgotten_after_a_restart(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dedup_window_ms = 10_000).await;
        let first = h.put(keyed("q", "k")).await;
        let other = h.put(keyed("q", "other")).await;
        let rec = h
            .queue
            .forget_idempotency_key("q", "k")
            .await
            .unwrap()
            .expect("a live record was forgotten");
        assert_eq!(rec.job_id, first);
        assert!(
            h.queue
                .forget_idempotency_key("q", "k")
                .await
                .unwrap()
                .is_none(),
            "nothing left to forget"
        );
        assert!(
            h.queue
                .lookup_idempotency_key("q", "k")
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            h.state(first).await,
            Some(JobState::Ready),
            "the job is untouched"
        );
        let h = h.reopen().await;
        assert!(
            h.queue
                .lookup_idempotency_key("q", "k")
                .await
                .unwrap()
                .is_none()
        );
        let (second, dup) = accepted(&h.enqueue(vec![keyed("q", "k")]).await[0]);
        assert!(!dup);
        assert_ne!(second, first);
        assert_eq!(
            accepted(&h.enqueue(vec![keyed("q", "other")]).await[0]),
            (other, true),
            "other keys are untouched"
        );
        // An expired record not yet swept is deleted, but was not live.
        h.clock.set(T0 + 10_000);
        assert!(
            h.queue
                .forget_idempotency_key("q", "other")
                .await
                .unwrap()
                .is_none()
        );
        assert_eq!(
            h.stats("q").await.dedup_records,
            1,
            "only the new record of k"
        );
    }

    pub(crate) async fn released_leases_end_as_if_expired_and_fence_the_worker(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 60_000).await;
        let reserve_as = async |worker: &str| {
            h.queue
                .reserve(ReserveInput {
                    queues: vec!["q".into()],
                    wait_timeout_ms: None,
                    lease_ms: Some(30_000),
                    worker_id: Some(worker.into()),
                    max_jobs: Some(1),
                })
                .await
                .expect("reserve")
                .remove(0)
        };
        let retry = h.put(job("q")).await;
        let last = h
            .put(EnqueueInput {
                max_attempts: Some(1),
                ..job("q")
            })
            .await;
        let other = h.put(job("q")).await;
        assert_eq!(reserve_as("dead").await.id, retry);
        assert_eq!(reserve_as("dead").await.id, last);
        assert_eq!(reserve_as("alive").await.id, other);
        let mut released = h.queue.release_leases("dead").await.unwrap();
        released.sort();
        let mut expected = vec![retry, last];
        expected.sort();
        assert_eq!(released, expected);
        // Attempts left: ready again at once, before its lease's end. Last attempt:
        // dead-lettered with LEASE_EXPIRED. Another worker's lease is untouched.
        assert_eq!(h.state(retry).await, Some(JobState::Ready));
        let info = h.queue.get_job(&last.to_string()).await.unwrap().unwrap();
        assert_eq!(info.state, JobState::DeadLettered);
        assert_eq!(info.dead_letter_cause, Some(DeadLetterCause::LeaseExpired));
        assert_eq!(h.state(other).await, Some(JobState::InFlight));
        // The dead worker's late ack is refused; the redelivery is attempt 2.
        not_in_flight(h.queue.ack(&retry.to_string(), 1).await);
        let again = reserve_as("alive").await;
        assert_eq!((again.id, again.attempt), (retry, 2));
        mismatch(h.queue.ack(&retry.to_string(), 1).await, 2);
        assert!(h.queue.release_leases("dead").await.unwrap().is_empty());
        assert!(matches!(
            h.queue.release_leases("").await,
            Err(QueueError::InvalidArgument(_))
        ));
        // Durable: after a restart the dead letter is kept and the redelivery still in flight.
        let h = h.reopen().await;
        assert_eq!(h.state(last).await, Some(JobState::DeadLettered));
        assert_eq!(h.state(retry).await, Some(JobState::InFlight));
    }

    pub(crate) async fn depth_limits_count_ready_scheduled_and_in_flight_jobs_but_not_hits(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.queues.push(QueueConfig {
                name: "small".into(),
                max_queue_depth: Some(3),
                ..Default::default()
            });
        })
        .await;
        h.put(keyed("small", "k")).await; // ready
        h.put(EnqueueInput {
            scheduled_at: Some(Ok(T0 + 60_000)),
            ..job("small")
        })
        .await; // scheduled
        h.put(job("small")).await;
        h.reserve_one("small", 30_000).await.unwrap(); // in flight
        let s = h.stats("small").await;
        assert_eq!((s.ready, s.scheduled, s.in_flight), (1, 1, 1));
        // Full: a new job is refused, a hit on a stored key is not.
        let out = h.enqueue(vec![job("small"), keyed("small", "k")]).await;
        assert_eq!(
            out[0],
            Err(Rejection::QueueFull {
                queue: "small".into(),
                limit: 3
            })
        );
        assert!(accepted(&out[1]).1);
        // Other queues are unlimited by default.
        assert!(
            h.enqueue(vec![job("big"); 5])
                .await
                .iter()
                .all(Result::is_ok)
        );
        // A job that leaves frees a place.
        let j = h.reserve_one("small", 30_000).await.unwrap();
        h.queue.ack(&j.id.to_string(), j.attempt).await.unwrap();
        let out = h.enqueue(vec![job("small"), job("small")]).await;
        assert!(out[0].is_ok());
        assert!(matches!(out[1], Err(Rejection::QueueFull { limit: 3, .. })));
    }

    pub(crate) async fn an_atomic_batch_with_a_refused_job_writes_nothing(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| {
            c.queues.push(QueueConfig {
                name: "small".into(),
                max_queue_depth: Some(2),
                ..Default::default()
            });
        })
        .await;
        let failures = h
            .queue
            .enqueue_atomic(vec![
                keyed("other", "x"),
                job("small"),
                job("small"),
                job("small"),
            ])
            .await
            .unwrap()
            .expect_err("refused");
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].0, 3);
        assert_eq!(h.stats("small").await.ready, 0);
        assert_eq!(h.stats("other").await.ready, 0);
        assert!(
            h.queue
                .lookup_idempotency_key("other", "x")
                .await
                .unwrap()
                .is_none(),
            "no dedup record either"
        );
        let ok = h
            .queue
            .enqueue_atomic(vec![keyed("other", "x"), job("small"), job("small")])
            .await
            .unwrap()
            .expect("fits");
        assert_eq!(ok.len(), 3);
        assert_eq!(h.stats("small").await.ready, 2);
    }

    pub(crate) async fn paused_queues_are_skipped_until_resumed(b: Box<dyn Backend>) {
        let h = Harness::new(b, |_| {}).await;
        let a = h.put(job("a")).await;
        let b2 = h.put(job("b")).await;
        h.queue.set_paused("a", true).await.unwrap();
        assert!(h.stats("a").await.paused);
        assert!(h.reserve_one("a", 1_000).await.is_none());
        let got = h.reserve(&["a", "b"], 5, 1_000).await;
        assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![b2]);
        // Pausing a queue that never held a job.
        h.queue.set_paused("empty", true).await.unwrap();
        assert!(h.stats("empty").await.paused);
        h.queue.set_paused("a", false).await.unwrap();
        assert!(!h.stats("a").await.paused);
        assert_eq!(h.reserve_one("a", 1_000).await.map(|j| j.id), Some(a));
    }

    pub(crate) async fn fencing_refuses_a_wrong_attempt_an_old_attempt_and_a_finished_job(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 60_000).await;
        let id = h.put(job("q")).await;
        let s = id.to_string();
        let j = h.reserve_one("q", 1_000).await.unwrap();
        mismatch(h.queue.ack(&s, 2).await, 1);
        mismatch(h.queue.extend(&s, 7, Some(1_000)).await, 1);
        mismatch(h.queue.nack(&s, 0, NackStrategy::Default, None).await, 1);
        // After redelivery, the old attempt is someone else's delivery now.
        h.advance(1_000);
        h.sweep().await;
        let again = h.reserve_one("q", 1_000).await.unwrap();
        assert_eq!(again.attempt, j.attempt + 1);
        mismatch(h.queue.ack(&s, 1).await, 2);
        // Dead-lettered: nothing is in flight any more.
        assert!(
            h.queue
                .nack(&s, 2, NackStrategy::DeadLetter, None)
                .await
                .unwrap()
        );
        not_in_flight(h.queue.ack(&s, 2).await);
        not_in_flight(h.queue.extend(&s, 2, Some(1_000)).await);
        // Never existed, or not a job id at all.
        not_in_flight(h.queue.ack(&JobId(5).to_string(), 1).await);
        not_in_flight(h.queue.ack("nope", 1).await);
        // A job that is ready (not leased) is not in flight either.
        let r = h.put(job("q")).await;
        not_in_flight(h.queue.ack(&r.to_string(), 0).await);
    }

    /// A leased job whose body does not decode is left out of the reply, not the whole
    /// reply (a Reserve's and an ack's lease alike): the others are handed out on their first
    /// attempt, and it stays leased to nobody until its lease expires.
    pub(crate) async fn a_corrupt_body_leaves_only_its_own_job_out_of_a_lease(b: Box<dyn Backend>) {
        let h = Harness::new(b, |_| {}).await;
        let mut ids = Vec::new();
        for k in ["a", "b", "c", "d", "e", "f"] {
            ids.push(h.put(keyed("q", k)).await);
        }
        h.backend.corrupt_body(&h.store, ids[1]).await;
        h.backend.corrupt_body(&h.store, ids[4]).await;
        let take = |max_jobs: u32| ReserveInput {
            queues: vec!["q".into()],
            wait_timeout_ms: None,
            lease_ms: Some(5_000),
            worker_id: None,
            max_jobs: Some(max_jobs),
        };
        let a = h.reserve_one("q", 1_000).await.unwrap();
        assert_eq!(a.id, ids[0]);
        // The ack's lease takes b and c, and hands out c.
        let next = h
            .queue
            .ack_then_reserve(&a.id.to_string(), 1, take(2))
            .await
            .unwrap()
            .expect("the ack took and leased");
        assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[2]]);
        // A Reserve takes d, e and f, and hands out d and f.
        let got = h.queue.reserve(take(3)).await.unwrap();
        assert_eq!(
            got.iter().map(|j| j.id).collect::<Vec<_>>(),
            [ids[3], ids[5]]
        );
        assert!(next.iter().chain(&got).all(|j| j.attempt == 1));
        let st = h.stats("q").await;
        assert_eq!((st.ready, st.in_flight), (0, 5));
    }

    pub(crate) async fn an_ack_then_reserve_leases_in_the_same_step_and_a_refused_ack_leases_nothing(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |_| {}).await;
        let a = h.put(keyed("q", "a")).await;
        let b = h.put(keyed("q", "b")).await;
        let c = h.put(keyed("q", "c")).await;
        let next = |max_jobs: u32, wait_timeout_ms: Option<i64>| ReserveInput {
            queues: vec!["q".into()],
            wait_timeout_ms,
            lease_ms: Some(5_000),
            worker_id: Some("w2".into()),
            max_jobs: Some(max_jobs),
        };
        let got = h.reserve_one("q", 1_000).await.unwrap();
        assert_eq!(got.id, a);
        let s = a.to_string();
        // A refused ack leases nothing; bad input is refused before the ack.
        mismatch(h.queue.ack_then_reserve(&s, 2, next(2, None)).await, 1);
        not_in_flight(
            h.queue
                .ack_then_reserve(&b.to_string(), 1, next(2, None))
                .await,
        );
        for bad in [
            next(2, Some(1)),
            next(0, None),
            ReserveInput {
                queues: Vec::new(),
                ..next(1, None)
            },
        ] {
            match h.queue.ack_then_reserve(&s, 1, bad).await {
                Err(QueueError::InvalidArgument(m)) => {
                    assert!(m.starts_with("then_reserve."), "{m}")
                }
                other => panic!("expected InvalidArgument, got {other:?}"),
            }
        }
        let st = h.stats("q").await;
        assert_eq!((st.ready, st.in_flight), (2, 1));
        assert_eq!(h.state(a).await, Some(JobState::InFlight));

        // The ack takes, and the next two jobs are leased under the new lease.
        h.advance(10);
        let leased = h
            .queue
            .ack_then_reserve(&s, 1, next(2, None))
            .await
            .unwrap();
        let leased = leased.expect("this backend leases after the ack");
        assert_eq!(leased.iter().map(|j| j.id).collect::<Vec<_>>(), vec![b, c]);
        for j in &leased {
            assert_eq!(j.attempt, 1);
            assert_eq!(j.lease_expires_at, Some(T0 + 10 + 5_000));
        }
        assert_eq!(h.state(a).await, Some(JobState::Acked));
        // Nothing ready: acked, and an empty lease.
        let none = h
            .queue
            .ack_then_reserve(&b.to_string(), 1, next(1, None))
            .await
            .unwrap();
        assert_eq!(none.map(|j| j.len()), Some(0));

        // Both halves are durable.
        let h = h.reopen().await;
        assert_eq!(h.state(a).await, Some(JobState::Acked));
        assert_eq!(h.state(b).await, Some(JobState::Acked));
        assert_eq!(h.state(c).await, Some(JobState::InFlight));
        mismatch(h.queue.ack(&c.to_string(), 2).await, 1);
        h.queue.ack(&c.to_string(), 1).await.unwrap();
    }

    pub(crate) async fn a_late_ack_nack_or_extend_before_any_sweep_is_refused(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 60_000).await;
        let id = h
            .put(EnqueueInput {
                max_attempts: Some(3),
                ..job("q")
            })
            .await;
        let s = id.to_string();
        let j = h.reserve_one("q", 1_000).await.unwrap();
        let deadline = j.lease_expires_at.unwrap();
        assert_eq!(deadline, T0 + 1_000);
        // One millisecond before the deadline the lease holds: extend works.
        h.clock.set(deadline - 1);
        let deadline = h.queue.extend(&s, 1, Some(1_000)).await.expect("in force");
        assert_eq!(deadline, T0 + 999 + 1_000);
        // At the deadline and after it, with no sweep in between, everything is refused.
        for at in [deadline, deadline + 1, deadline + 60_000] {
            h.clock.set(at);
            not_in_flight(h.queue.ack(&s, 1).await);
            not_in_flight(h.queue.extend(&s, 1, Some(60_000)).await);
            not_in_flight(h.queue.nack(&s, 1, NackStrategy::Default, None).await);
            not_in_flight(h.queue.nack(&s, 1, NackStrategy::DeadLetter, None).await);
        }
        // Nothing was applied: the job is still leased under attempt 1 until the sweep, the
        // refused extend did not move the deadline, and the sweep redelivers it.
        let info = h.queue.get_job(&s).await.unwrap().unwrap();
        assert_eq!(info.state, JobState::InFlight);
        assert_eq!(info.lease_expires_at, Some(deadline));
        assert_eq!(h.sweep().await.done.redelivered, 1);
        let again = h.reserve_one("q", 1_000).await.unwrap();
        assert_eq!((again.id, again.attempt), (id, 2));
        h.advance(999);
        h.queue.ack(&s, 2).await.expect("attempt 2 is in force");
        assert_eq!(h.stats("q").await.dead_lettered, 0);
    }

    pub(crate) async fn nack_plans_retry_at_once_after_a_delay_or_dead_letter(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| {
            c.storage.dead_letter_retention_ms = 60_000;
            c.limits.retry_delay_ms = 1_000;
            c.limits.retry_backoff = RetryBackoff::Exponential;
        })
        .await;
        let id = h
            .put(EnqueueInput {
                max_attempts: Some(4),
                ..job("q")
            })
            .await;
        let s = id.to_string();
        // Delay 0: ready at once, attempt + 1 on the next delivery, reason kept.
        h.reserve_one("q", 30_000).await.unwrap();
        assert!(
            !h.queue
                .nack(&s, 1, NackStrategy::Delay(0), Some("first".into()))
                .await
                .unwrap()
        );
        let info = h.queue.get_job(&s).await.unwrap().unwrap();
        assert_eq!(info.state, JobState::Ready);
        assert_eq!(info.last_reason.as_deref(), Some("first"));
        // The default policy: exponential backoff of attempt 2, 1500..2000 ms.
        let j = h.reserve_one("q", 30_000).await.unwrap();
        assert_eq!(j.attempt, 2);
        assert_eq!(j.enqueued_at, T0, "a retried job keeps its enqueue time");
        h.queue
            .nack(&s, 2, NackStrategy::Default, None)
            .await
            .unwrap();
        let info = h.queue.get_job(&s).await.unwrap().unwrap();
        assert_eq!(info.state, JobState::Scheduled);
        let due = info.scheduled_at.unwrap();
        assert!((T0 + 1_500..=T0 + 2_000).contains(&due), "{due}");
        assert_eq!(info.last_reason, None, "a nack without a reason clears it");
        h.clock.set(due - 1);
        h.sweep().await;
        assert!(
            h.reserve_one("q", 30_000).await.is_none(),
            "not before it is due"
        );
        h.clock.set(due);
        assert_eq!(h.sweep().await.done.promoted, 1);
        let j = h.reserve_one("q", 30_000).await.unwrap();
        assert_eq!(j.attempt, 3);
        // An explicit delay, clamped to the horizon.
        h.queue
            .nack(&s, 3, NackStrategy::Delay(i64::MAX), None)
            .await
            .unwrap();
        let horizon = h.queue.limits().defaults.max_schedule_horizon_ms as i64;
        let info = h.queue.get_job(&s).await.unwrap().unwrap();
        assert_eq!(info.scheduled_at, Some(due + horizon));
        h.clock.set(due + horizon);
        h.sweep().await;
        // The last attempt: a retry dead-letters with ATTEMPTS_EXHAUSTED.
        let j = h.reserve_one("q", 30_000).await.unwrap();
        assert_eq!(j.attempt, 4);
        assert!(
            h.queue
                .nack(&s, 4, NackStrategy::Default, Some("last".into()))
                .await
                .unwrap()
        );
        let dead = h.queue.drain_dead_letters(None, Some(10)).await.unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].cause, DeadLetterCause::AttemptsExhausted);
        assert_eq!(dead[0].final_attempt, 4);
        assert_eq!(dead[0].last_reason.as_deref(), Some("last"));
        assert_eq!(dead[0].failed_at, due + horizon);
        // An explicit dead-letter on attempt 1: REJECTED.
        let r = h.put(job("q")).await;
        h.reserve_one("q", 30_000).await.unwrap();
        assert!(
            h.queue
                .nack(&r.to_string(), 1, NackStrategy::DeadLetter, None)
                .await
                .unwrap()
        );
        let dead = h.queue.drain_dead_letters(None, Some(10)).await.unwrap();
        assert_eq!(dead[0].cause, DeadLetterCause::Rejected);
    }

    pub(crate) async fn lease_expiry_redelivers_and_on_the_last_attempt_dead_letters(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 60_000).await;
        let id = h
            .put(EnqueueInput {
                max_attempts: Some(2),
                ..job("q")
            })
            .await;
        h.reserve_one("q", 1_000).await.unwrap();
        h.advance(999);
        assert_eq!(
            h.sweep().await.done.redelivered,
            0,
            "in force until the deadline"
        );
        h.advance(1);
        let r = h.sweep().await;
        assert_eq!((r.done.redelivered, r.done.dead_lettered), (1, 0));
        let j = h.reserve_one("q", 1_000).await.unwrap();
        assert_eq!((j.id, j.attempt), (id, 2));
        h.advance(1_000);
        let r = h.sweep().await;
        assert_eq!((r.done.redelivered, r.done.dead_lettered), (0, 1));
        let dead = h
            .queue
            .drain_dead_letters(Some("q".into()), Some(5))
            .await
            .unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].job.id, id);
        assert_eq!(dead[0].cause, DeadLetterCause::LeaseExpired);
        assert_eq!(dead[0].final_attempt, 2);
        assert_eq!(dead[0].failed_at, h.now());
    }

    pub(crate) async fn scheduled_jobs_are_promoted_when_due_keeping_their_order(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |_| {}).await;
        let later = h
            .put(EnqueueInput {
                scheduled_at: Some(Ok(T0 + 100)),
                ..job("q")
            })
            .await;
        // A time in the past (or now) means ready at once.
        let past = h
            .put(EnqueueInput {
                scheduled_at: Some(Ok(T0 - 5)),
                ..job("q")
            })
            .await;
        assert_eq!(h.state(later).await, Some(JobState::Scheduled));
        assert_eq!(h.state(past).await, Some(JobState::Ready));
        h.advance(99);
        let r = h.sweep().await;
        assert_eq!(r.done.promoted, 0);
        assert_eq!(r.next_deadline, Some(T0 + 100));
        h.advance(1);
        assert_eq!(h.sweep().await.done.promoted, 1);
        // Promoted, it keeps its enqueue order: it was enqueued first.
        let got: Vec<JobId> = h
            .reserve(&["q"], 5, 1_000)
            .await
            .iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(got, vec![later, past]);
    }

    pub(crate) async fn dead_letters_are_kept_for_their_retention_then_purged(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 10_000).await;
        let id = h.put(job("q")).await;
        h.reserve_one("q", 30_000).await.unwrap();
        h.queue
            .nack(&id.to_string(), 1, NackStrategy::DeadLetter, None)
            .await
            .unwrap();
        assert_eq!(h.stats("q").await.dead_lettered, 1);
        h.advance(9_999);
        let r = h.sweep().await;
        assert_eq!(r.done.records_purged, 0);
        assert_eq!(r.next_deadline, Some(T0 + 10_000));
        h.advance(1);
        assert_eq!(h.sweep().await.done.records_purged, 1);
        assert_eq!(h.stats("q").await.dead_lettered, 0);
        assert_eq!(h.state(id).await, None, "unkeyed: nothing stays");
    }

    pub(crate) async fn a_finished_keyed_job_leaves_a_tombstone_until_its_key_expires(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dedup_window_ms = 50_000).await;
        let acked = h.put(keyed("q", "a")).await;
        let dead = h.put(keyed("q", "d")).await;
        for _ in 0..2 {
            let j = h.reserve_one("q", 30_000).await.unwrap();
            if j.id == acked {
                h.queue.ack(&j.id.to_string(), 1).await.unwrap();
            } else {
                h.queue
                    .nack(&j.id.to_string(), 1, NackStrategy::DeadLetter, None)
                    .await
                    .unwrap();
            }
        }
        let a = h.queue.get_job(&acked.to_string()).await.unwrap().unwrap();
        assert_eq!(a.state, JobState::Acked);
        assert_eq!(a.finished_at, Some(T0));
        let d = h.queue.get_job(&dead.to_string()).await.unwrap().unwrap();
        assert_eq!(d.state, JobState::DeadLettered);
        assert_eq!(d.dead_letter_cause, Some(DeadLetterCause::Rejected));
        assert_eq!(h.stats("q").await.dead_lettered, 0, "retention is off");
        assert!(
            h.queue
                .drain_dead_letters(None, Some(5))
                .await
                .unwrap()
                .is_empty()
        );
        h.clock.set(T0 + 49_999);
        h.sweep().await;
        assert_eq!(h.state(acked).await, Some(JobState::Acked));
        h.clock.set(T0 + 50_000);
        let r = h.sweep().await;
        assert_eq!(r.done.records_purged, 2, "both tombstones");
        assert_eq!(r.done.dedup_purged, 2, "and both records");
        assert_eq!(h.state(acked).await, None);
        assert_eq!(h.state(dead).await, None);
    }

    pub(crate) async fn drain_returns_the_oldest_dead_letters_and_removes_them(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 600_000).await;
        let mut dead = Vec::new();
        for q in ["a", "b", "a", "b"] {
            let id = h.put(job(q)).await;
            h.reserve_one(q, 30_000).await.unwrap();
            h.queue
                .nack(&id.to_string(), 1, NackStrategy::DeadLetter, None)
                .await
                .unwrap();
            dead.push(id);
            h.advance(10);
        }
        let first = h.queue.drain_dead_letters(None, Some(3)).await.unwrap();
        assert_eq!(
            first.iter().map(|d| d.job.id).collect::<Vec<_>>(),
            dead[..3].to_vec()
        );
        assert_eq!(first[0].job.queue, "a");
        assert!(
            h.queue
                .drain_dead_letters(Some("a".into()), Some(5))
                .await
                .unwrap()
                .is_empty()
        );
        let rest = h
            .queue
            .drain_dead_letters(Some("b".into()), None)
            .await
            .unwrap();
        assert_eq!(
            rest.iter().map(|d| d.job.id).collect::<Vec<_>>(),
            vec![dead[3]]
        );
        assert_eq!(h.stats("b").await.dead_lettered, 0);
    }

    pub(crate) async fn drain_and_list_stop_before_their_reply_budget(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| {
            c.storage.dead_letter_retention_ms = 600_000;
            c.limits.max_reserve_reply_bytes = 65_536;
            c.limits.max_payload_bytes = 30_000;
            c.limits.max_custom_total_bytes = 1_000;
        })
        .await;
        let mut dead = Vec::new();
        for n in 0..3u8 {
            let id = h
                .put(EnqueueInput {
                    payload: Some(Payload {
                        data: vec![n; 30_000],
                        encoding: "bin".into(),
                    }),
                    ..job("q")
                })
                .await;
            h.reserve_one("q", 30_000).await.unwrap();
            h.queue
                .nack(&id.to_string(), 1, NackStrategy::DeadLetter, None)
                .await
                .unwrap();
            dead.push(id);
            h.advance(10);
        }
        // Two 30 kB records fit 64 KiB, three do not: a page of two and a token for the rest.
        let page = h.queue.list_dead_letters(None, Some(10), "").await.unwrap();
        assert_eq!(
            page.records.iter().map(|d| d.job.id).collect::<Vec<_>>(),
            dead[..2].to_vec()
        );
        let rest = h
            .queue
            .list_dead_letters(None, Some(10), &page.next_page_token)
            .await
            .unwrap();
        assert_eq!(
            rest.records.iter().map(|d| d.job.id).collect::<Vec<_>>(),
            vec![dead[2]]
        );
        assert!(rest.next_page_token.is_empty());
        // A drain removes only what it returns.
        let drained = h.queue.drain_dead_letters(None, Some(10)).await.unwrap();
        assert_eq!(
            drained.iter().map(|d| d.job.id).collect::<Vec<_>>(),
            dead[..2].to_vec()
        );
        assert_eq!(h.stats("q").await.dead_lettered, 1);
        let last = h.queue.drain_dead_letters(None, Some(10)).await.unwrap();
        assert_eq!(
            last.iter().map(|d| d.job.id).collect::<Vec<_>>(),
            vec![dead[2]]
        );
    }

    pub(crate) async fn admin_lists_pages_requeues_and_deletes_dead_letters(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 600_000).await;
        let mut dead = Vec::new();
        for _ in 0..5 {
            let id = h.put(job("q")).await;
            h.reserve_one("q", 30_000).await.unwrap();
            h.queue
                .nack(
                    &id.to_string(),
                    1,
                    NackStrategy::DeadLetter,
                    Some("r".into()),
                )
                .await
                .unwrap();
            dead.push(id);
            h.advance(10);
        }
        // Pages of two, oldest first, nothing removed.
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let page = h
                .queue
                .list_dead_letters(Some("q".into()), Some(2), &token)
                .await
                .unwrap();
            assert!(page.records.len() <= 2);
            seen.extend(page.records.iter().map(|d| d.job.id));
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        assert_eq!(seen, dead);
        assert_eq!(h.stats("q").await.dead_lettered, 5);
        // Requeue the oldest two: same ids, attempt 1 next, enqueued now, after the jobs
        // already ready.
        let waiting = h.put(job("q")).await;
        let requeued = h
            .queue
            .requeue_dead_letters(SelectorInput {
                queue: Some("q".into()),
                max: Some(2),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(requeued, dead[..2].to_vec());
        let got = h.reserve(&["q"], 5, 30_000).await;
        assert_eq!(
            got.iter().map(|j| j.id).collect::<Vec<_>>(),
            vec![waiting, dead[0], dead[1]]
        );
        assert!(
            got[1..]
                .iter()
                .all(|j| j.attempt == 1 && j.enqueued_at == h.now())
        );
        let info = h
            .queue
            .get_job(&dead[0].to_string())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.last_reason, None);
        // Delete by id; ids that are not dead letters are skipped.
        let deleted = h
            .queue
            .delete_dead_letters(SelectorInput {
                job_ids: vec![dead[2].to_string(), dead[0].to_string(), "zz".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(deleted, vec![dead[2]]);
        let left: Vec<JobId> = h
            .queue
            .list_dead_letters(None, None, "")
            .await
            .unwrap()
            .records
            .iter()
            .map(|d| d.job.id)
            .collect();
        assert_eq!(left, dead[3..].to_vec());
    }

    pub(crate) async fn queue_stats_count_each_state(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| {
            c.storage.dead_letter_retention_ms = 60_000;
            c.storage.dedup_window_ms = 1_000;
        })
        .await;
        h.enqueue(vec![keyed("q", "1"), keyed("q", "2"), job("q"), job("q")])
            .await;
        h.put(EnqueueInput {
            scheduled_at: Some(Ok(T0 + 500)),
            ..job("q")
        })
        .await;
        let j = h.reserve_one("q", 30_000).await.unwrap();
        h.queue
            .nack(&j.id.to_string(), 1, NackStrategy::DeadLetter, None)
            .await
            .unwrap();
        h.reserve_one("q", 30_000).await.unwrap();
        let s = h.stats("q").await;
        assert_eq!(
            (
                s.ready,
                s.scheduled,
                s.in_flight,
                s.dead_lettered,
                s.dedup_records,
                s.paused
            ),
            (2, 1, 1, 1, 2, false)
        );
        assert_eq!(h.stats("elsewhere").await, Default::default());
        // Expired records count until they are swept.
        h.clock.set(T0 + 1_000);
        assert_eq!(h.stats("q").await.dedup_records, 2);
        h.sweep().await;
        let s = h.stats("q").await;
        assert_eq!((s.ready, s.scheduled, s.dedup_records), (3, 0, 0));
    }

    /// The store-wide gauges of a metrics scrape: every queue by name with its counts (as
    /// `queue_stats`), the `enqueued_at` of its oldest ready job across priorities, and the
    /// dedup records with the creation time of the one that expires next.
    pub(crate) async fn gauges_report_every_queue_its_oldest_ready_job_and_the_dedup_records(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.storage.dead_letter_retention_ms = 60_000;
            c.storage.dedup_window_ms = 10_000;
        })
        .await;
        let g = h.store.gauges().await.expect("gauges");
        assert_eq!(g, crate::storage::StoreGauges::default());
        // b: a low-priority job first, then a high-priority one 100 ms later: the oldest
        // ready job is the low-priority one, though Reserve would take the other first.
        h.put(EnqueueInput {
            priority: Some(1),
            ..keyed("b", "k1")
        })
        .await;
        h.advance(100);
        h.put(EnqueueInput {
            priority: Some(9),
            ..job("b")
        })
        .await;
        h.put(keyed("a", "k2")).await;
        // z: only a dead letter.
        h.put(job("z")).await;
        let j = h.reserve_one("z", 30_000).await.unwrap();
        h.queue
            .nack(&j.id.to_string(), 1, NackStrategy::DeadLetter, None)
            .await
            .unwrap();
        let g = h.store.gauges().await.expect("gauges");
        let names: Vec<&str> = g.queues.iter().map(|q| q.queue.as_str()).collect();
        assert_eq!(names, vec!["a", "b", "z"]);
        for q in &g.queues {
            assert_eq!(q.stats, h.stats(&q.queue).await, "{}", q.queue);
        }
        assert_eq!(g.queues[1].oldest_ready_at, Some(T0));
        assert_eq!(g.queues[0].oldest_ready_at, Some(T0 + 100));
        assert_eq!(g.queues[2].oldest_ready_at, None);
        assert_eq!(g.queues[2].stats.dead_lettered, 1);
        assert_eq!(g.dedup_records, 2);
        assert_eq!(g.next_expiring_dedup_created_at, Some(T0));
        // The oldest ready job of b is reserved: the next one counts.
        let first = h.reserve_one("b", 30_000).await.unwrap();
        assert_eq!(first.priority, 9);
        let g = h.store.gauges().await.expect("gauges");
        assert_eq!(g.queues[1].oldest_ready_at, Some(T0));
        h.reserve_one("b", 30_000).await.unwrap();
        let g = h.store.gauges().await.expect("gauges");
        assert_eq!(g.queues[1].oldest_ready_at, None);
    }

    pub(crate) async fn list_queues_pages_by_name_with_counts(b: Box<dyn Backend>) {
        let h = Harness::new(b, |_| {}).await;
        for q in ["c", "a", "b", "d"] {
            h.put(job(q)).await;
        }
        h.put(job("a")).await;
        h.queue.set_paused("e", true).await.unwrap();
        let mut seen = Vec::new();
        let mut token = String::new();
        loop {
            let page = h.queue.list_queues(Some(2), &token).await.unwrap();
            assert!(page.queues.len() <= 2);
            seen.extend(page.queues);
            if page.next_page_token.is_empty() {
                break;
            }
            token = page.next_page_token;
        }
        let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d", "e"]);
        assert_eq!(seen[0].1.ready, 2);
        assert!(seen[4].1.paused);
        assert_eq!(seen[4].1.ready, 0);
        // The counts are queue_stats' counts.
        assert_eq!(seen[2].1, h.stats("c").await);
        assert!(h.queue.list_queues(Some(0), "").await.is_err());
        // Survives a restart.
        let h = h.reopen().await;
        let page = h.queue.list_queues(None, "").await.unwrap();
        assert_eq!(page.queues.len(), 5);
        assert!(page.next_page_token.is_empty());
    }

    pub(crate) async fn max_queues_refuses_a_new_undeclared_queue_and_counts_the_declared_ones(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.limits.max_queues = 3;
            c.queues.push(QueueConfig {
                name: "d".into(),
                ..Default::default()
            });
        })
        .await;
        h.queue.create_declared_queues().await.expect("declared");
        h.queue.create_declared_queues().await.expect("twice");
        let names = |h: &Harness| {
            let q = h.queue.clone();
            async move {
                let page = q.list_queues(None, "").await.unwrap();
                page.queues.into_iter().map(|(n, _)| n).collect::<Vec<_>>()
            }
        };
        assert_eq!(
            names(&h).await,
            ["d"],
            "a declared queue exists from the start"
        );
        let a = h.put(job("a")).await;
        h.put(job("b")).await;
        let too_many = |o: &JobOutcome, queue: &str| match o {
            Err(Rejection::TooManyQueues { queue: q, limit: 3 }) if q == queue => {}
            other => panic!("expected TooManyQueues for {queue}, got {other:?}"),
        };
        let out = h.enqueue(vec![job("c"), job("a"), job("c")]).await;
        too_many(&out[0], "c");
        assert!(out[1].is_ok(), "an existing queue keeps taking jobs");
        too_many(&out[2], "c");
        let atomic = h
            .queue
            .enqueue_atomic(vec![job("b"), job("c")])
            .await
            .unwrap();
        match atomic {
            Err(f) => {
                assert_eq!(f.len(), 1);
                assert_eq!(f[0].0, 1);
                too_many(&Err(f[0].1.clone()), "c");
            }
            Ok(_) => panic!("an atomic batch that would create a queue past the cap is refused"),
        }
        assert_eq!(
            h.stats("b").await.ready,
            1,
            "the refused atomic batch wrote nothing"
        );
        assert_eq!(names(&h).await, ["a", "b", "d"]);
        // An emptied queue still counts until it is deleted; then its place is free.
        let j = h.reserve_one("a", 30_000).await.expect("a's first job");
        assert_eq!(j.id, a);
        h.queue.ack(&a.to_string(), 1).await.unwrap();
        let j = h.reserve_one("a", 30_000).await.expect("a's second job");
        h.queue.ack(&j.id.to_string(), 1).await.unwrap();
        too_many(&h.enqueue(vec![job("c")]).await[0], "c");
        h.queue.delete_queue("a").await.expect("a is empty");
        let c = h.put(job("c")).await;
        h.queue
            .ack(&h.reserve_one("c", 30_000).await.unwrap().id.to_string(), 1)
            .await
            .unwrap();
        assert_eq!(h.state(c).await, None);
        // Queues are kept, empty ones too, across a restart, and counted after it.
        let h = h.reopen().await;
        assert_eq!(names(&h).await, ["b", "c", "d"]);
        too_many(&h.enqueue(vec![job("e")]).await[0], "e");
        assert!(
            h.enqueue(vec![job("d")]).await[0].is_ok(),
            "a declared queue is never refused"
        );
    }

    pub(crate) async fn a_pause_creates_a_queue_only_under_max_queues_and_a_resume_creates_none(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.limits.max_queues = 2;
            c.queues.push(QueueConfig {
                name: "d".into(),
                ..Default::default()
            });
        })
        .await;
        h.queue.create_declared_queues().await.expect("declared");
        let names = |h: &Harness| {
            let q = h.queue.clone();
            async move {
                let page = q.list_queues(None, "").await.unwrap();
                page.queues
                    .into_iter()
                    .map(|(n, s)| (n, s.paused))
                    .collect::<Vec<_>>()
            }
        };
        h.queue
            .set_paused("x", false)
            .await
            .expect("resume of nothing");
        assert_eq!(
            names(&h).await,
            [("d".to_string(), false)],
            "a resume creates no queue"
        );
        h.queue
            .set_paused("a", true)
            .await
            .expect("a pause under the cap");
        match h.queue.set_paused("b", true).await {
            Err(e @ QueueError::TooManyQueues { .. }) => assert_eq!(
                e.to_string(),
                "pausing queue \"b\" would create a new queue past limits.max_queues (2): \
                 delete empty queues or raise the limit first"
            ),
            other => panic!("a pause past max_queues is refused, got {other:?}"),
        }
        assert_eq!(
            names(&h).await,
            [("a".to_string(), true), ("d".to_string(), false)],
            "the refused pause created nothing"
        );
        // Existing queues are paused and resumed at the cap; the paused one counts for enqueues.
        h.queue
            .set_paused("d", true)
            .await
            .expect("an existing queue");
        h.queue.set_paused("a", true).await.expect("paused twice");
        h.queue.set_paused("d", false).await.expect("resume");
        assert!(matches!(
            &h.enqueue(vec![job("b")]).await[0],
            Err(Rejection::TooManyQueues { limit: 2, .. })
        ));
        // Kept across a restart, and counted after it; deleting frees the place.
        let h = h.reopen().await;
        assert_eq!(
            names(&h).await,
            [("a".to_string(), true), ("d".to_string(), false)]
        );
        assert!(matches!(
            h.queue.set_paused("b", true).await,
            Err(QueueError::TooManyQueues { limit: 2, .. })
        ));
        h.queue.delete_queue("a").await.expect("a is empty");
        h.queue
            .set_paused("b", true)
            .await
            .expect("a place is free");
        assert_eq!(
            names(&h).await,
            [("b".to_string(), true), ("d".to_string(), false)]
        );
    }

    pub(crate) async fn only_an_empty_queue_is_deleted_and_its_keys_outlive_it(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 600_000).await;
        let not_empty = |r: Result<crate::domain::QueueStats, QueueError>, want: [u64; 4]| match r {
            Err(
                e @ QueueError::QueueNotEmpty {
                    ready,
                    scheduled,
                    in_flight,
                    dead_lettered,
                    ..
                },
            ) => {
                assert_eq!([ready, scheduled, in_flight, dead_lettered], want);
                assert_eq!(e.code(), crate::error::ErrorCode::FailedPrecondition);
            }
            other => panic!("expected QueueNotEmpty {want:?}, got {other:?}"),
        };
        let keyed_id = h.put(keyed("q", "k")).await;
        h.put(EnqueueInput {
            scheduled_at: Some(Ok(T0 + 60_000)),
            ..job("q")
        })
        .await;
        not_empty(h.queue.delete_queue("q").await, [1, 1, 0, 0]);
        h.queue.purge_queue("q", None).await.unwrap();
        let id = h.put(job("q")).await;
        h.reserve_one("q", 30_000).await.expect("the job");
        not_empty(h.queue.delete_queue("q").await, [0, 0, 1, 0]);
        h.queue
            .nack(&id.to_string(), 1, NackStrategy::DeadLetter, None)
            .await
            .unwrap();
        not_empty(h.queue.delete_queue("q").await, [0, 0, 0, 1]);
        h.queue
            .delete_dead_letters(SelectorInput {
                job_ids: vec![id.to_string()],
                ..Default::default()
            })
            .await
            .unwrap();
        h.queue.set_paused("q", true).await.unwrap();
        // Empty: deleted with its paused flag; its key's record stays.
        let was = h.queue.delete_queue("q").await.expect("empty");
        assert!(was.paused);
        assert_eq!(was.dedup_records, 1);
        let page = h.queue.list_queues(None, "").await.unwrap();
        assert!(page.queues.is_empty(), "{page:?}");
        match h.queue.delete_queue("q").await {
            Err(e @ QueueError::QueueNotFound(_)) => {
                assert_eq!(e.code(), crate::error::ErrorCode::NotFound);
            }
            other => panic!("expected QueueNotFound, got {other:?}"),
        }
        // A retry of the producer's enqueue still answers the job the key created, and
        // creates nothing (not even the queue).
        let out = h.enqueue(vec![keyed("q", "k")]).await;
        assert_eq!(accepted(&out[0]), (keyed_id, true), "a dedup hit");
        assert!(
            h.queue
                .list_queues(None, "")
                .await
                .unwrap()
                .queues
                .is_empty()
        );
        // A new job creates the queue anew, unpaused.
        let fresh = h.put(job("q")).await;
        assert!(!h.stats("q").await.paused);
        assert_eq!(h.reserve_one("q", 30_000).await.map(|j| j.id), Some(fresh));
        assert!(matches!(
            h.queue.delete_queue("no-such-queue").await,
            Err(QueueError::QueueNotFound(_))
        ));
        assert!(matches!(
            h.queue.delete_queue("").await,
            Err(QueueError::InvalidArgument(_))
        ));
    }

    pub(crate) async fn rates_count_each_minute_sum_over_servers_and_keep_an_hour(
        b: Box<dyn Backend>,
    ) {
        use crate::storage::RateCounts;
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 600_000).await;
        assert_eq!(T0 % 60_000, 0, "the cases start on a minute");
        // Minute 0: 3 enqueued on q, 1 on r; one acked, one nacked into the dead letters.
        for _ in 0..3 {
            h.put(job("q")).await;
        }
        h.put(job("r")).await;
        let got = h.reserve(&["q"], 2, 30_000).await;
        h.queue.ack(&got[0].id.to_string(), 1).await.unwrap();
        h.queue
            .nack(&got[1].id.to_string(), 1, NackStrategy::DeadLetter, None)
            .await
            .unwrap();
        // Minute 1: one enqueued, then dead-lettered by the sweeper when its lease runs out.
        h.advance(60_000);
        h.put(EnqueueInput {
            max_attempts: Some(1),
            ..job("s")
        })
        .await;
        h.reserve_one("s", 1_000).await.expect("s's job");
        h.advance(2_000);
        assert_eq!(h.sweep().await.done.dead_lettered, 1);

        let report = h.queue.queue_rates(None, None, "").await.unwrap();
        assert_eq!(report.first_minute, T0 / 60_000 + 1 - 59);
        let names: Vec<&str> = report.queues.iter().map(|q| q.queue.as_str()).collect();
        assert_eq!(names, ["q", "r", "s"]);
        let c = |enqueued, acked, nacked, dead_lettered| RateCounts {
            enqueued,
            acked,
            nacked,
            dead_lettered,
        };
        let q = &report.queues[0];
        assert_eq!(q.minutes.len(), 60);
        assert_eq!(q.minutes[58], c(3, 1, 1, 1));
        assert_eq!(q.minutes[59], c(0, 0, 0, 0));
        assert_eq!(q.last_minute(), c(3, 1, 1, 1), "the last complete minute");
        assert!(q.minutes[..58].iter().all(RateCounts::is_zero));
        assert_eq!(report.queues[1].minutes[58], c(1, 0, 0, 0));
        assert_eq!(report.queues[2].minutes[59], c(1, 0, 0, 1));
        let only_r = h.queue.queue_rates(Some("r"), None, "").await.unwrap();
        assert_eq!(only_r.queues.len(), 1);
        assert_eq!(only_r.queues[0].queue, "r");
        // Paged by name.
        let p1 = h.queue.queue_rates(None, Some(2), "").await.unwrap();
        let names: Vec<&str> = p1.queues.iter().map(|q| q.queue.as_str()).collect();
        assert_eq!((names, p1.next_page_token.as_str()), (vec!["q", "r"], "r"));
        let p2 = h.queue.queue_rates(None, Some(2), "r").await.unwrap();
        assert_eq!(p2.queues.len(), 1);
        assert_eq!(
            (p2.queues[0].queue.as_str(), p2.next_page_token.as_str()),
            ("s", "")
        );
        assert!(h.queue.queue_rates(None, Some(0), "").await.is_err());

        // Another server on the same store adds to the same buckets.
        let other = Harness::queue_over(&h.store, &h.config, &h.clock);
        other.enqueue_batch(vec![job("q"), job("q")]).await.unwrap();
        other.flush_rates().await.unwrap();
        let report = h.queue.queue_rates(Some("q"), None, "").await.unwrap();
        assert_eq!(report.queues[0].minutes[59], c(2, 0, 0, 0));
        assert_eq!(report.queues[0].minutes[58], c(3, 1, 1, 1));

        // An hour on, every bucket has left the window and the store.
        h.advance(60 * 60_000);
        assert!(
            h.queue
                .queue_rates(None, None, "")
                .await
                .unwrap()
                .queues
                .is_empty()
        );
        assert!(
            h.store.rates(0).await.unwrap().is_empty(),
            "old buckets are deleted"
        );
    }

    pub(crate) async fn strict_mode_still_deletes_an_undeclared_queue_left_from_before(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.server.strict_queues = true;
            c.queues.push(QueueConfig {
                name: "d".into(),
                ..Default::default()
            });
        })
        .await;
        // A queue created before strict mode was set.
        h.store
            .create_queues(&["legacy".to_string()])
            .await
            .unwrap();
        assert!(matches!(
            h.queue.queue_stats("legacy").await,
            Err(QueueError::UnknownQueues(_))
        ));
        h.queue.delete_queue("legacy").await.expect("deleted");
        let page = h.queue.list_queues(None, "").await.unwrap();
        assert!(page.queues.is_empty(), "{page:?}");
    }

    pub(crate) async fn list_jobs_pages_each_state_in_its_order(b: Box<dyn Backend>) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 600_000).await;
        let low = h.put(job("q")).await;
        let high = h
            .put(EnqueueInput {
                priority: Some(7),
                ..keyed("q", "k-high")
            })
            .await;
        let low2 = h.put(job("q")).await;
        let late = h
            .put(EnqueueInput {
                scheduled_at: Some(Ok(T0 + 9_000)),
                ..job("q")
            })
            .await;
        let soon = h
            .put(EnqueueInput {
                scheduled_at: Some(Ok(T0 + 5_000)),
                ..job("q")
            })
            .await;
        h.put(job("other")).await;
        let list = |state, size, token: String| {
            let q = h.queue.clone();
            async move { q.list_jobs("q", state, size, &token).await.unwrap() }
        };
        // Ready: reserve order, in pages of two.
        let p1 = list(ListState::Ready, Some(2), String::new()).await;
        assert_eq!(
            p1.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
            vec![high, low]
        );
        assert_eq!(p1.jobs[0].idempotency_key.as_deref(), Some("k-high"));
        assert_eq!(p1.jobs[0].state, JobState::Ready);
        let p2 = list(ListState::Ready, Some(2), p1.next_page_token.clone()).await;
        assert_eq!(p2.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![low2]);
        assert!(p2.next_page_token.is_empty());
        // A token belongs to its state.
        assert!(
            h.queue
                .list_jobs("q", ListState::Scheduled, None, &p1.next_page_token)
                .await
                .is_err()
        );
        let sched = list(ListState::Scheduled, None, String::new()).await;
        assert_eq!(
            sched.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
            vec![soon, late]
        );
        assert_eq!(sched.jobs[0].scheduled_at, Some(T0 + 5_000));
        // In flight, and a dead letter.
        let j = h.reserve_one("q", 30_000).await.unwrap();
        assert_eq!(j.id, high);
        let inflight = list(ListState::InFlight, None, String::new()).await;
        assert_eq!(inflight.jobs.len(), 1);
        assert_eq!(inflight.jobs[0].worker_id.as_deref(), Some("w"));
        h.queue
            .nack(
                &high.to_string(),
                1,
                NackStrategy::DeadLetter,
                Some("bad".into()),
            )
            .await
            .unwrap();
        let dead = list(ListState::DeadLettered, None, String::new()).await;
        assert_eq!(dead.jobs.len(), 1);
        assert_eq!(dead.jobs[0].id, high);
        assert_eq!(dead.jobs[0].last_reason.as_deref(), Some("bad"));
        assert!(
            list(ListState::InFlight, None, String::new())
                .await
                .jobs
                .is_empty()
        );
        // An unknown queue lists nothing.
        assert!(
            h.queue
                .list_jobs("nope", ListState::Ready, None, "")
                .await
                .unwrap()
                .jobs
                .is_empty()
        );
        // Survives a restart, in the same order.
        let h = h.reopen().await;
        let again = h
            .queue
            .list_jobs("q", ListState::Ready, None, "")
            .await
            .unwrap();
        assert_eq!(
            again.jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
            vec![low, low2]
        );
    }

    /// Job inspection by id reads the job's body: payload, custom entries and trace context,
    /// as enqueued or as a dedup hit replaced them, in every state that keeps the body (ready,
    /// in flight, dead-lettered, after a restart); a tombstone has none. Listings carry none.
    pub(crate) async fn get_job_reads_what_a_job_carries_and_listings_leave_it_out(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| {
            c.storage.dead_letter_retention_ms = 600_000;
            c.storage.dedup_window_ms = 600_000;
            c.queues.push(QueueConfig {
                name: "deb".into(),
                on_duplicate: Some(OnDuplicate::ReplacePending),
                ..Default::default()
            });
        })
        .await;
        // Not UTF-8, with a zero byte: stored and read back byte for byte.
        let payload = Payload {
            data: vec![0x00, 0x9f, 0x92, 0x96, 0xff, b'a'],
            encoding: "application/octet-stream".into(),
        };
        let trace = TraceContext {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: Some("vendor=1".into()),
        };
        let carrying = h
            .put(EnqueueInput {
                payload: Some(payload.clone()),
                custom: vec![
                    ("n".into(), Some(Value::Int(7))),
                    ("s".into(), Some(Value::String("acme".into()))),
                ],
                trace_context: Some(trace.clone()),
                ..keyed("q", "k")
            })
            .await;
        let want = JobContent {
            payload: Some(payload),
            custom: [
                ("n".to_string(), Value::Int(7)),
                ("s".to_string(), Value::String("acme".into())),
            ]
            .into_iter()
            .collect(),
            trace_context: Some(trace),
        };
        let bare = h.put(job("q")).await;
        assert_eq!(h.content(carrying).await, Some(want.clone()), "ready");
        assert_eq!(
            h.content(bare).await,
            Some(JobContent::default()),
            "a job that carries nothing"
        );
        let listed = h.queue.list_jobs("q", ListState::Ready, None, "").await;
        let listed = listed.unwrap().jobs;
        assert_eq!(listed.len(), 2);
        assert!(listed.iter().all(|j| j.content.is_none()), "{listed:?}");

        // In flight, then dead-lettered: the same content.
        let j = h.reserve_one("q", 30_000).await.unwrap();
        assert_eq!(j.id, carrying);
        assert_eq!(h.content(carrying).await, Some(want.clone()), "in flight");
        h.queue
            .nack(&j.id.to_string(), 1, NackStrategy::DeadLetter, None)
            .await
            .unwrap();
        assert_eq!(h.content(carrying).await, Some(want.clone()), "dead letter");
        let dead = h
            .queue
            .list_jobs("q", ListState::DeadLettered, None, "")
            .await
            .unwrap()
            .jobs;
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].content, None);

        // A dedup hit that replaces a pending job's contents: GetJob reads the new ones.
        let with = |data: &[u8]| EnqueueInput {
            payload: Some(Payload {
                data: data.to_vec(),
                encoding: "text/plain".into(),
            }),
            ..keyed("deb", "r")
        };
        let pending = h.put(with(b"first")).await;
        let out = h.enqueue(vec![with(b"second")]).await;
        assert_eq!(accepted(&out[0]), (pending, true));
        let replaced = h.content(pending).await.and_then(|c| c.payload);
        assert_eq!(replaced.map(|p| p.data), Some(b"second".to_vec()));

        // After a restart, read from what is durable.
        let h = h.reopen().await;
        assert_eq!(h.content(carrying).await, Some(want), "after a restart");
        assert_eq!(
            h.content(pending)
                .await
                .and_then(|c| c.payload)
                .map(|p| p.data),
            Some(b"second".to_vec())
        );

        // Acked with its key live: a tombstone, known without a body.
        let j = h.reserve_one("deb", 30_000).await.unwrap();
        assert_eq!(j.id, pending);
        h.queue.ack(&j.id.to_string(), 1).await.unwrap();
        assert_eq!(h.state(pending).await, Some(JobState::Acked));
        assert_eq!(
            h.content(pending).await,
            None,
            "a tombstone carries nothing"
        );
    }

    pub(crate) async fn cancel_and_purge_take_ready_and_scheduled_jobs_and_keep_the_key(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dedup_window_ms = 60_000).await;
        let busy = h.put(job("q")).await;
        assert_eq!(h.reserve_one("q", 30_000).await.unwrap().id, busy);
        let keyed_id = h
            .put(EnqueueInput {
                scheduled_at: Some(Ok(T0 + 10_000)),
                ..keyed("q", "k")
            })
            .await;
        // An in-flight job is not cancelled.
        let (done, info) = h
            .queue
            .cancel_job(Some(&busy.to_string()), None)
            .await
            .unwrap();
        assert!(!done);
        assert_eq!(info.unwrap().state, JobState::InFlight);
        // By key: cancelled, a tombstone that says so, the key still answers its id.
        let (done, info) = h.queue.cancel_job(None, Some(("q", "k"))).await.unwrap();
        assert!(done);
        let info = info.unwrap();
        assert_eq!(info.id, keyed_id);
        assert_eq!(info.state, JobState::Acked);
        assert_eq!(
            info.last_reason.as_deref(),
            Some(crate::queue::lifecycle::CANCELLED_REASON)
        );
        let again = h.enqueue(vec![keyed("q", "k")]).await;
        assert_eq!(accepted(&again[0]), (keyed_id, true));
        assert_eq!(h.stats("q").await.ready, 0);
        // Unknown ids and both-or-neither are answered plainly.
        let (done, info) = h
            .queue
            .cancel_job(Some("00000000-0000-4000-8000-000000000000"), None)
            .await
            .unwrap();
        assert!(!done && info.is_none());
        assert!(h.queue.cancel_job(None, None).await.is_err());
        // Purge: ready first, then scheduled, up to max per call; in flight stays.
        for _ in 0..3 {
            h.put(job("q")).await;
        }
        h.put(EnqueueInput {
            scheduled_at: Some(Ok(h.now() + 10_000)),
            ..job("q")
        })
        .await;
        let (ids, more) = h.queue.purge_queue("q", Some(2)).await.unwrap();
        assert_eq!((ids.len(), more), (2, true));
        let (ids, more) = h.queue.purge_queue("q", None).await.unwrap();
        assert_eq!((ids.len(), more), (2, false));
        let s = h.stats("q").await;
        assert_eq!((s.ready, s.scheduled, s.in_flight), (0, 0, 1));
        assert!(h.queue.purge_queue("q", Some(0)).await.is_err());
        // Durable: after a restart the purged jobs stay gone and the key still answers.
        let h = h.reopen().await;
        let s = h.stats("q").await;
        assert_eq!((s.ready, s.scheduled, s.in_flight), (0, 0, 1));
        let again = h.enqueue(vec![keyed("q", "k")]).await;
        assert_eq!(accepted(&again[0]), (keyed_id, true));
    }

    pub(crate) async fn a_waiting_reserve_gets_a_job_enqueued_later(b: Box<dyn Backend>) {
        let h = Harness::new(b, |_| {}).await;
        let queue = h.queue.clone();
        let waiter = tokio::spawn(async move {
            queue
                .reserve(ReserveInput {
                    queues: vec!["idle".into(), "q".into()],
                    wait_timeout_ms: Some(60_000),
                    lease_ms: Some(1_000),
                    worker_id: None,
                    max_jobs: Some(1),
                })
                .await
        });
        // Registered on both queues, after its first (empty) look.
        h.queue.ready_signals().waiting(2).await;
        let id = h.put(job("q")).await;
        let got = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("woken by the enqueue")
            .unwrap()
            .unwrap();
        assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);
        assert_eq!(h.queue.ready_signals().queues_waited_on(), 0);
    }

    /// A long poll woken by a ready job and then dropped by the transport before it looks (its
    /// client cancelled it just then) hands the wake-up to the queue's next waiter, which gets
    /// the job at once instead of sleeping through it.
    pub(crate) async fn a_woken_reserve_dropped_before_it_looks_passes_its_wake_up_on(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |_| {}).await;
        let wait = |ms| ReserveInput {
            queues: vec!["q".into()],
            wait_timeout_ms: Some(ms),
            lease_ms: Some(30_000),
            worker_id: None,
            max_jobs: Some(1),
        };
        let signals = h.queue.ready_signals();
        // The first waiter, driven by this task, asleep after its first (empty) look.
        let mut first = Box::pin(h.queue.reserve(wait(60_000)));
        tokio::select! {
            r = &mut first => panic!("the first reserve ended: {r:?}"),
            () = signals.waiting(1) => {}
        }
        // The second waiter, on a task of its own, asleep behind it.
        let queue = h.queue.clone();
        let second = tokio::spawn(async move { queue.reserve(wait(5_000)).await });
        signals.waiting(2).await;
        // The job wakes the first waiter (the oldest); its next poll gives the transport a turn
        // (`Pending`) and the transport drops it there, as for a client's cancel.
        let id = h.put(job("q")).await;
        assert!(futures_util::poll!(first.as_mut()).is_pending());
        drop(first);
        let got = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the second reserve ended")
            .unwrap()
            .unwrap();
        assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![id]);
    }

    pub(crate) async fn recovery_brings_back_everything_durable_and_nothing_settled(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 600_000).await;
        let ready = h.put(keyed("q", "ready")).await;
        let acked = h.put(job("q")).await;
        let flying = h.put(job("q")).await;
        let dead = h.put(job("q")).await;
        let scheduled = h
            .put(EnqueueInput {
                scheduled_at: Some(Ok(T0 + 5_000)),
                ..job("q")
            })
            .await;
        let got = h.reserve(&["q"], 4, 30_000).await;
        assert_eq!(got.len(), 4);
        h.queue.ack(&acked.to_string(), 1).await.unwrap();
        h.queue
            .nack(
                &dead.to_string(),
                1,
                NackStrategy::DeadLetter,
                Some("x".into()),
            )
            .await
            .unwrap();
        h.queue
            .nack(&ready.to_string(), 1, NackStrategy::Delay(0), None)
            .await
            .unwrap();
        h.queue.set_paused("p", true).await.unwrap();
        h.advance(100);

        let h = h.reopen().await;
        let s = h.stats("q").await;
        assert_eq!(
            (
                s.ready,
                s.scheduled,
                s.in_flight,
                s.dead_lettered,
                s.dedup_records
            ),
            (1, 1, 1, 1, 1)
        );
        assert!(h.stats("p").await.paused, "a pause survives a restart");
        assert_eq!(h.state(acked).await, None, "an acked job stays acked");
        assert_eq!(h.state(ready).await, Some(JobState::Ready));
        assert_eq!(h.state(scheduled).await, Some(JobState::Scheduled));
        let f = h.queue.get_job(&flying.to_string()).await.unwrap().unwrap();
        assert_eq!((f.state, f.attempt), (JobState::InFlight, 1));
        assert_eq!(f.lease_expires_at, Some(T0 + 30_000));
        let d = h
            .queue
            .list_dead_letters(None, None, "")
            .await
            .unwrap()
            .records;
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].job.id, d[0].last_reason.as_deref()),
            (dead, Some("x"))
        );
        // The key still deduplicates; the in-flight job comes back when its lease expires.
        assert_eq!(
            accepted(&h.enqueue(vec![keyed("q", "ready")]).await[0]),
            (ready, true)
        );
        let again = h.reserve_one("q", 30_000).await.unwrap();
        assert_eq!((again.id, again.attempt), (ready, 2));
        h.clock.set(T0 + 30_000);
        h.sweep().await;
        let back: Vec<(JobId, u32)> = h
            .reserve(&["q"], 5, 30_000)
            .await
            .iter()
            .map(|j| (j.id, j.attempt))
            .collect();
        assert_eq!(back, vec![(flying, 2), (scheduled, 1)]);
    }

    pub(crate) async fn a_closed_store_refuses_writes_and_a_serving_one_says_so(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |_| {}).await;
        assert_eq!(*h.store.health().borrow(), StorageHealth::Serving);
        h.put(job("q")).await;
        h.store.close().await.expect("close");
        match h.queue.enqueue_batch(vec![job("q")]).await {
            Err(QueueError::Storage(StorageError::Unavailable(_))) => {}
            other => panic!("expected Unavailable after close, got {other:?}"),
        }
    }

    pub(crate) async fn a_backup_restores_every_acknowledged_job_and_key_or_is_refused_naming_the_tools(
        b: Box<dyn Backend>,
    ) {
        let h = Harness::new(b, |c| c.storage.dead_letter_retention_ms = 600_000).await;
        let ids = vec![
            h.put(keyed("q", "ready")).await,
            h.put(keyed("q", "acked")).await,
            h.put(job("q")).await,
            h.put(keyed("q", "dead")).await,
            h.put(EnqueueInput {
                scheduled_at: Some(Ok(T0 + 5_000)),
                ..keyed("q", "scheduled")
            })
            .await,
            h.put(job("p")).await,
        ];
        let got = h.reserve(&["q"], 4, 30_000).await;
        assert_eq!(
            got.iter().map(|j| j.id).collect::<Vec<_>>(),
            ids[..4].to_vec()
        );
        h.queue.ack(&ids[1].to_string(), 1).await.unwrap();
        h.queue
            .nack(
                &ids[3].to_string(),
                1,
                NackStrategy::DeadLetter,
                Some("x".into()),
            )
            .await
            .unwrap();
        h.queue
            .nack(&ids[0].to_string(), 1, NackStrategy::Delay(0), None)
            .await
            .unwrap();
        // ids[2] stays in flight, ids[4] scheduled, ids[5] on a paused queue.
        h.queue.set_paused("p", true).await.unwrap();
        h.advance(100);

        let dir = tempfile::tempdir().expect("temp dir");
        let copy = dir.path().join("backup");
        let written = h.queue.backup(copy.to_str().expect("UTF-8")).await;
        // Written after the backup: not in it.
        let later = h.put(keyed("q", "later")).await;
        let restored = match h.backend.open_backup(&copy, h.now()).await {
            Err(tools) => {
                let e = written.expect_err("a backend backed up by other tools refuses");
                for tool in tools {
                    assert!(e.to_string().contains(tool), "{e} names {tool}");
                }
                return;
            }
            Ok(restored) => restored,
        };
        let report = written.expect("the backup is written");
        assert!(report.records > 0 && report.bytes > 0, "{report:?}");
        for id in &ids {
            let original = h.store.get_job(*id).await.unwrap();
            assert!(original.is_some(), "job {id} is stored");
            assert_eq!(restored.get_job(*id).await.unwrap(), original, "job {id}");
        }
        assert_eq!(restored.get_job(later).await.unwrap(), None);
        for key in ["ready", "acked", "dead", "scheduled"] {
            let original = h.store.lookup_key("q", key).await.unwrap();
            assert!(original.is_some(), "key {key} is stored");
            assert_eq!(
                restored.lookup_key("q", key).await.unwrap(),
                original,
                "key {key}"
            );
        }
        assert_eq!(restored.lookup_key("q", "later").await.unwrap(), None);
        let r = Harness::queue_over(&restored, &h.config, &h.clock);
        let mut want = h.stats("q").await;
        want.ready -= 1;
        want.dedup_records -= 1;
        assert_eq!(r.queue_stats("q").await.unwrap(), want);
        assert!(
            r.queue_stats("p").await.unwrap().paused,
            "a pause is in the backup"
        );
        // The restored store serves: the key deduplicates, the dead letter is listed, the
        // in-flight job comes back when its lease expires.
        let again = r.enqueue_batch(vec![keyed("q", "ready")]).await.unwrap();
        assert_eq!(accepted(&again[0]), (ids[0], true));
        let d = r.list_dead_letters(None, None, "").await.unwrap().records;
        assert_eq!(d.iter().map(|d| d.job.id).collect::<Vec<_>>(), vec![ids[3]]);
        h.clock.set(T0 + 30_000);
        r.sweep(10_000).await.unwrap();
        let mut back = r
            .reserve(ReserveInput {
                queues: vec!["q".into()],
                wait_timeout_ms: None,
                lease_ms: Some(30_000),
                worker_id: Some("w".into()),
                max_jobs: Some(5),
            })
            .await
            .unwrap();
        back.sort_by_key(|j| j.id);
        let mut want = vec![(ids[0], 2), (ids[2], 2), (ids[4], 1)];
        want.sort();
        assert_eq!(
            back.iter().map(|j| (j.id, j.attempt)).collect::<Vec<_>>(),
            want
        );
        restored.close().await.expect("close the restored store");
    }
}
