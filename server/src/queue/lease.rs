//! Leases: how long a reserved job belongs to its worker, and the attempt fencing of ack, nack
//! and extend (the fencing itself is atomic inside storage).

use super::limits::Limits;

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
