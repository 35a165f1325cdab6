//! The delay before the next attempt after a nack with the queue's default policy.
//!
//! For the nack of delivery `n` (1-based): `base = retry_delay_ms` (`none`) or
//! `retry_delay_ms × 2^(n−1)` (`exponential`); `capped = min(base, retry_delay_max_ms,
//! max_schedule_horizon_ms)`; the delay is `capped − j` with `j` in `[0, capped/4]`, derived from
//! a hash of (job id, n) so that the same nack always gets the same delay.

use super::limits::QueuePolicy;
use crate::config::RetryBackoff;
use crate::domain::JobId;

/// The retry delay in milliseconds for the nack of delivery `attempt` of job `id`.
pub fn retry_delay_ms(policy: &QueuePolicy, id: JobId, attempt: u32) -> u64 {
    let base = match policy.retry_backoff {
        RetryBackoff::None => policy.retry_delay_ms,
        RetryBackoff::Exponential => {
            let shift = attempt.saturating_sub(1).min(63);
            policy.retry_delay_ms.saturating_mul(1u64 << shift)
        }
    };
    let capped = base
        .min(policy.retry_delay_max_ms)
        .min(policy.max_schedule_horizon_ms);
    capped - jitter(id, attempt, capped / 4)
}

/// A deterministic value in `[0, max]` from (id, attempt).
fn jitter(id: JobId, attempt: u32, max: u64) -> u64 {
    if max == 0 {
        return 0;
    }
    let mut x = (id.0 as u64)
        ^ ((id.0 >> 64) as u64)
        ^ u64::from(attempt).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // splitmix64 finaliser: spreads every input bit over the output.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    x % (max + 1)
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn policy(delay: u64, backoff: RetryBackoff) -> QueuePolicy {
        let mut c = Config::default();
        c.limits.retry_delay_ms = delay;
        c.limits.retry_backoff = backoff;
        QueuePolicy::defaults(&c)
    }

    #[test]
    fn exponential_delays_stay_within_their_jitter_bounds() {
        let p = policy(1000, RetryBackoff::Exponential);
        for i in 0..200u128 {
            let id = JobId(i * 7919 + 13);
            let d1 = retry_delay_ms(&p, id, 1);
            let d2 = retry_delay_ms(&p, id, 2);
            let d3 = retry_delay_ms(&p, id, 3);
            assert!((750..=1000).contains(&d1), "{d1}");
            assert!((1500..=2000).contains(&d2), "{d2}");
            assert!((3000..=4000).contains(&d3), "{d3}");
        }
    }

    #[test]
    fn the_same_nack_gets_the_same_delay() {
        let p = policy(1000, RetryBackoff::None);
        let id = JobId::new_v4();
        assert_eq!(retry_delay_ms(&p, id, 2), retry_delay_ms(&p, id, 2));
    }

    #[test]
    fn zero_delay_is_immediate_and_the_cap_applies() {
        assert_eq!(
            retry_delay_ms(&policy(0, RetryBackoff::Exponential), JobId(1), 5),
            0
        );
        let mut p = policy(1000, RetryBackoff::Exponential);
        p.retry_delay_max_ms = 5000;
        let d = retry_delay_ms(&p, JobId(3), 30);
        assert!((3750..=5000).contains(&d), "{d}");
    }
}
