//! Where a job goes next: the decisions of `docs/lifecycle.md`, as pure functions the store's
//! transitions call with the facts they read.
//!
//! - [`placement`]: ready now or scheduled (enqueue, nack retry).
//! - [`nack`]: retry after the policy's backoff or a delay, or dead-letter.
//! - [`finish`]: what stays of a job that leaves the live set (ack, dead-letter): a dead letter
//!   while retention is on, else a tombstone while its dedup record may still name it, else
//!   nothing. [`leave`] is the same without retention (a dead letter drained, deleted or past
//!   its retention).
//! - [`lease_expired`]: redeliver, or on the last attempt dead-letter with `LEASE_EXPIRED`.
//! - [`requeue`]: a dead letter enqueued anew (same id, attempt 1 next, enqueued now).
//! - [`queue_deletable`]: a queue can be deleted only when it holds no job.

use super::NackStrategy;
use super::backoff;
use super::limits::QueuePolicy;
use crate::domain::{
    DeadLetterCause, Expiry, Finish, JobFacts, Placement, Requeue, Settle, UnixMs, reached,
};

/// Ready when `at` is reached at `now` (a past or present time means at once), else scheduled
/// for `at`.
pub fn placement(at: UnixMs, now: UnixMs) -> Placement {
    if reached(at, now) {
        Placement::Ready
    } else {
        Placement::Scheduled { due: at }
    }
}

/// The plan of a nack of `job` (already fenced) under `policy`: an explicit dead-letter is
/// `REJECTED`; a retry on the last attempt (attempt ≥ max_attempts) dead-letters with
/// `ATTEMPTS_EXHAUSTED`; otherwise the job goes back, after the policy's backoff or the
/// requested delay (clamped to `max_schedule_horizon_ms`).
pub fn nack(
    job: JobFacts<'_>,
    strategy: NackStrategy,
    policy: &QueuePolicy,
    retention_ms: u64,
    now: UnixMs,
) -> Settle {
    let delay_ms = match strategy {
        NackStrategy::DeadLetter => {
            return Settle::Finish(finish(job, Some(nack_cause(strategy)), retention_ms, now));
        }
        _ if job.attempt >= job.max_attempts => {
            return Settle::Finish(finish(job, Some(nack_cause(strategy)), retention_ms, now));
        }
        NackStrategy::Default => backoff::retry_delay_ms(policy, job.id, job.attempt),
        // A negative delay is refused before the plan (`Queue::nack`); none reaches here.
        NackStrategy::Delay(ms) => u64::try_from(ms)
            .unwrap_or(0)
            .min(policy.max_schedule_horizon_ms),
    };
    let at = now.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
    Settle::Retry(placement(at, now))
}

/// Why a nack with `strategy` that finishes its job dead-letters it: `REJECTED` for the
/// `dead_letter` strategy, `ATTEMPTS_EXHAUSTED` for a retry on the last attempt.
pub fn nack_cause(strategy: NackStrategy) -> DeadLetterCause {
    match strategy {
        NackStrategy::DeadLetter => DeadLetterCause::Rejected,
        NackStrategy::Default | NackStrategy::Delay(_) => DeadLetterCause::AttemptsExhausted,
    }
}

/// What stays of `job` as it leaves the live set at `now`: acked (`dead` unset) or
/// dead-lettered with `dead`. A dead letter is kept whole while retention is on
/// (`retention_ms > 0`); otherwise see [`leave`].
pub fn finish(
    job: JobFacts<'_>,
    dead: Option<DeadLetterCause>,
    retention_ms: u64,
    now: UnixMs,
) -> Finish {
    match dead {
        Some(cause) if retention_ms > 0 => Finish::DeadLetter {
            cause,
            failed_at: now,
        },
        _ => leave(job, now, dead, now),
    }
}

/// What stays of `job`, finished at `finished_at` (acked, or dead-lettered with `dead`), once
/// its body goes: a tombstone while the dedup record naming it is live (so that job inspection
/// can still say how a key's job ended; the record outlives the job), nothing otherwise.
pub fn leave(
    job: JobFacts<'_>,
    finished_at: UnixMs,
    dead: Option<DeadLetterCause>,
    now: UnixMs,
) -> Finish {
    match job.dedup_until {
        Some(until) if !reached(until, now) => Finish::Tombstone {
            finished_at,
            until,
            dead,
        },
        _ => Finish::Delete,
    }
}

/// What stays of a dead letter that is drained, deleted or past its retention.
pub fn dead_letter_removed(job: JobFacts<'_>, now: UnixMs) -> Finish {
    let (finished_at, cause) = match job.stage {
        crate::domain::Stage::Dead { cause, failed_at } => (failed_at, Some(cause)),
        _ => (now, None),
    };
    leave(job, finished_at, cause, now)
}

/// The last reason a cancelled job keeps, so that job inspection tells it from an acked one.
pub const CANCELLED_REASON: &str = "cancelled by an operator";

/// What stays of a ready or scheduled job an operator cancels (or purges) at `now`: as an
/// acked job, a tombstone while its dedup record lives (a retried enqueue of its key still
/// answers its id), nothing otherwise.
pub fn cancelled(job: JobFacts<'_>, now: UnixMs) -> Finish {
    leave(job, now, None, now)
}

/// Whether a queue with these counts may be deleted: only when it holds no job in any state
/// (ready, scheduled, in flight, dead-lettered). Its dedup records do not count: they stay
/// after the queue, until their window ends, so that a producer's retry of a key still
/// answers the job the key created; a paused flag goes with the queue.
pub fn queue_deletable(stats: &crate::domain::QueueStats) -> bool {
    stats.ready + stats.scheduled + stats.in_flight + stats.dead_lettered == 0
}

/// What an expired lease does: redeliver with the next attempt, or on the last attempt
/// (attempt ≥ max_attempts) dead-letter with `LEASE_EXPIRED`.
pub fn lease_expired(job: JobFacts<'_>, retention_ms: u64, now: UnixMs) -> Expiry {
    if job.attempt >= job.max_attempts {
        Expiry::Finish(finish(
            job,
            Some(DeadLetterCause::LeaseExpired),
            retention_ms,
            now,
        ))
    } else {
        Expiry::Redeliver
    }
}

/// A requeued dead letter is enqueued anew: enqueue time `now` (and so the back of its
/// priority), no delivery made yet, same id; the dedup index is not consulted or written.
pub fn requeue(now: UnixMs) -> Requeue {
    Requeue {
        enqueued_at: now,
        attempt: 0,
    }
}

/// The time until which dead letters that failed are kept, seen at `now`: those that failed at
/// or before it are past their retention.
pub fn retained_until(retention_ms: u64, now: UnixMs) -> UnixMs {
    now.saturating_sub(i64::try_from(retention_ms).unwrap_or(i64::MAX))
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::domain::{JobId, Stage};

    fn job(attempt: u32, max_attempts: u32, dedup_until: Option<UnixMs>) -> JobFacts<'static> {
        JobFacts {
            id: JobId(42),
            queue: "q",
            stage: Stage::InFlight { expires: 10_000 },
            attempt,
            max_attempts,
            dedup_until,
        }
    }

    fn policy() -> QueuePolicy {
        let mut c = Config::default();
        c.limits.retry_delay_ms = 1_000;
        QueuePolicy::defaults(&c)
    }

    #[test]
    fn a_time_at_or_before_now_is_ready_and_a_later_one_scheduled() {
        assert_eq!(placement(99, 100), Placement::Ready);
        assert_eq!(placement(100, 100), Placement::Ready);
        assert_eq!(placement(101, 100), Placement::Scheduled { due: 101 });
    }

    #[test]
    fn a_nack_on_the_last_attempt_dead_letters_and_an_explicit_one_is_rejected() {
        let p = policy();
        assert_eq!(
            nack(job(3, 3, None), NackStrategy::Default, &p, 1, 5),
            Settle::Finish(Finish::DeadLetter {
                cause: DeadLetterCause::AttemptsExhausted,
                failed_at: 5
            })
        );
        assert_eq!(
            nack(job(1, 3, None), NackStrategy::DeadLetter, &p, 1, 5),
            Settle::Finish(Finish::DeadLetter {
                cause: DeadLetterCause::Rejected,
                failed_at: 5
            })
        );
        assert_eq!(
            nack(job(1, 3, None), NackStrategy::Delay(0), &p, 1, 5),
            Settle::Retry(Placement::Ready)
        );
        assert_eq!(
            nack(job(1, 3, None), NackStrategy::Delay(i64::MAX), &p, 1, 5),
            Settle::Retry(Placement::Scheduled {
                due: 5 + p.max_schedule_horizon_ms as i64
            })
        );
        let Settle::Retry(Placement::Scheduled { due }) =
            nack(job(1, 3, None), NackStrategy::Default, &p, 1, 5)
        else {
            panic!("the policy's backoff schedules the retry");
        };
        assert!((5 + 750..=5 + 1_000).contains(&due), "{due}");
    }

    #[test]
    fn a_finished_job_leaves_a_tombstone_only_while_its_key_is_live() {
        // Retention on: a dead letter is kept whole.
        assert_eq!(
            finish(job(1, 1, Some(50)), Some(DeadLetterCause::Rejected), 10, 20),
            Finish::DeadLetter {
                cause: DeadLetterCause::Rejected,
                failed_at: 20
            }
        );
        // Acked with a live key: a tombstone until the key expires.
        assert_eq!(
            finish(job(1, 1, Some(50)), None, 10, 20),
            Finish::Tombstone {
                finished_at: 20,
                until: 50,
                dead: None
            }
        );
        // The key expires at 50: at 50 nothing stays, nor for an unkeyed job.
        assert_eq!(finish(job(1, 1, Some(50)), None, 10, 50), Finish::Delete);
        assert_eq!(finish(job(1, 1, None), None, 10, 20), Finish::Delete);
        // Without retention a dead letter leaves a tombstone that says so.
        assert_eq!(
            finish(job(1, 1, Some(50)), Some(DeadLetterCause::Rejected), 0, 20),
            Finish::Tombstone {
                finished_at: 20,
                until: 50,
                dead: Some(DeadLetterCause::Rejected)
            }
        );
    }

    #[test]
    fn an_expired_lease_redelivers_until_the_last_attempt() {
        assert_eq!(lease_expired(job(2, 3, None), 0, 9), Expiry::Redeliver);
        assert_eq!(
            lease_expired(job(3, 3, None), 5, 9),
            Expiry::Finish(Finish::DeadLetter {
                cause: DeadLetterCause::LeaseExpired,
                failed_at: 9
            })
        );
    }

    #[test]
    fn retention_counts_back_from_now() {
        assert_eq!(retained_until(0, 100), 100);
        assert_eq!(retained_until(30, 100), 70);
        assert_eq!(retained_until(u64::MAX, 100), 100 - i64::MAX);
    }
}
