//! Leases: how long a reserved job belongs to its worker, and the fencing of ack, nack and
//! extend. The fence is evaluated inside the store's transition ([`crate::storage::SettleRule`]),
//! so the check and the change are one atomic step.

use super::limits::Limits;
use crate::domain::{JobFacts, SettleRefusal, Stage, UnixMs, reached};

/// The fence of an ack, nack or extend of delivery `attempt`, at `now`: the job must be in
/// flight under that attempt with its lease still in force. A lease is over at its
/// `lease_expires_at` whether or not the sweeper has redelivered the job yet, so a late
/// settlement is refused as not in flight (`NOT_FOUND`) and an extend never revives a lease.
/// Returns the job's facts for the plan.
///
/// # Errors
/// [`SettleRefusal::NotInFlight`] when there is no such job, it is not leased or its lease is
/// over; [`SettleRefusal::AttemptMismatch`] when it is in flight under another attempt.
pub fn fence(
    job: Option<JobFacts<'_>>,
    attempt: u32,
    now: UnixMs,
) -> Result<JobFacts<'_>, SettleRefusal> {
    match job {
        Some(j) if matches!(j.stage, Stage::InFlight { expires } if !reached(expires, now)) => {
            if j.attempt == attempt {
                Ok(j)
            } else {
                Err(SettleRefusal::AttemptMismatch { current: j.attempt })
            }
        }
        _ => Err(SettleRefusal::NotInFlight),
    }
}

/// The lease for a Reserve over `queues`: the requested length clamped to the smallest
/// `max_lease_duration_ms` of the listed queues.
pub fn clamp_lease_ms<'a>(
    limits: &Limits,
    queues: impl IntoIterator<Item = &'a str>,
    requested_ms: u64,
) -> u64 {
    queues
        .into_iter()
        .map(|q| limits.policy(q).max_lease_duration_ms)
        .fold(requested_ms, u64::min)
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::config::{Config, QueueConfig};

    fn in_flight(attempt: u32, expires: UnixMs) -> JobFacts<'static> {
        JobFacts {
            id: crate::domain::JobId(7),
            queue: "q",
            stage: Stage::InFlight { expires },
            attempt,
            max_attempts: 3,
            dedup_until: None,
        }
    }

    #[test]
    fn the_lease_is_in_force_until_its_deadline_and_not_at_it() {
        let j = in_flight(2, 1_000);
        assert!(fence(Some(j), 2, 999).is_ok());
        assert_eq!(fence(Some(j), 2, 1_000), Err(SettleRefusal::NotInFlight));
        assert_eq!(fence(Some(j), 2, 5_000), Err(SettleRefusal::NotInFlight));
        assert_eq!(
            fence(Some(j), 1, 999),
            Err(SettleRefusal::AttemptMismatch { current: 2 })
        );
        assert_eq!(fence(None, 1, 0), Err(SettleRefusal::NotInFlight));
        let ready = JobFacts {
            stage: Stage::Ready,
            ..j
        };
        assert_eq!(fence(Some(ready), 2, 0), Err(SettleRefusal::NotInFlight));
    }

    #[test]
    fn the_smallest_queue_maximum_wins() {
        let mut c = Config::default();
        c.queues.push(QueueConfig {
            name: "short".into(),
            max_lease_duration_ms: Some(1_000),
            ..Default::default()
        });
        let l = Limits::from_config(&c).unwrap();
        assert_eq!(clamp_lease_ms(&l, ["a", "short"], 60_000), 1_000);
        assert_eq!(clamp_lease_ms(&l, ["a"], 600_000), 300_000);
        assert_eq!(clamp_lease_ms(&l, ["a"], 5), 5);
    }
}
