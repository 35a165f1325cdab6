//! Automatic retries: what is retried, and only when it is safe (the per-RPC table of the
//! protocol). On by default ([`RetryPolicy::default`]: 2 retries, 3 tries in all); a client built with
//! `SeppClientBuilder::no_retries` makes every call once.
//!
//! | call | retried on | why it is safe |
//! |---|---|---|
//! | enqueue, every job keyed | transport errors (a connection that failed mid-call included), UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, RESOURCE_EXHAUSTED | the repeat is a dedup hit |
//! | enqueue, any job unkeyed | RESOURCE_EXHAUSTED, or a failure to connect (the request never left) | nothing can have committed |
//! | ack, nack, extend | as a keyed enqueue | a repeat that finds the job gone reports "not in flight" |
//! | get_server_info | as a keyed enqueue | read-only |
//! | reserve, drain_dead_letters | never | a lost reply would lease or remove jobs twice |
//!
//! A transport error is told by its source, not its code: tonic reports a connection that was
//! reset, closed or broke its HTTP/2 framing mid-call as UNKNOWN or INTERNAL, which are
//! server faults (never retried) only when the server sent them.

use crate::error::is_connection_failure;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tonic::Code;

/// How a call that failed in a retryable way is repeated: up to `max_retries` more times, with
/// growing random pauses (exponential, full jitter) between them.
///
/// The names are the client's own: `attempt`, `max_attempts` and `backoff` belong to jobs
/// (docs/glossary.md), so a call is *retried*, `max_retries` times, after a *retry delay*.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first try (0: the call is made once). Default 2 (3 tries in all).
    pub max_retries: u32,
    /// Upper bound of the pause before the first retry. Default 50 ms.
    pub first_retry_delay: Duration,
    /// Upper bound of any pause. Default 2 s.
    pub max_retry_delay: Duration,
    /// Growth of the bound per retry. Default 2.0.
    pub multiplier: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 2,
            first_retry_delay: Duration::from_millis(50),
            max_retry_delay: Duration::from_secs(2),
            multiplier: 2.0,
        }
    }
}

impl RetryPolicy {
    /// The pause before retry number `n` (1-based): a random duration in `[0, bound]`, where
    /// the bound starts at `first_retry_delay` and grows by `multiplier` per retry up to
    /// `max_retry_delay`.
    pub fn retry_delay(&self, n: u32) -> Duration {
        let bound = self.first_retry_delay.as_secs_f64()
            * self
                .multiplier
                .max(1.0)
                .powi(n.saturating_sub(1).min(64) as i32);
        let bound = bound.min(self.max_retry_delay.as_secs_f64());
        Duration::from_secs_f64(bound * random_unit())
    }

    /// The former name of [`RetryPolicy::retry_delay`].
    #[deprecated(note = "renamed `retry_delay`")]
    pub fn backoff(&self, n: u32) -> Duration {
        self.retry_delay(n)
    }
}

/// A number in [0, 1) from a cheap generator; jitter needs spread, not cryptographic quality.
fn random_unit() -> f64 {
    static STATE: AtomicU64 = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    let mut x = STATE.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed) ^ seed;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Which retry rule applies to a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RetryClass {
    /// Enqueue with every job keyed.
    KeyedEnqueue,
    /// Enqueue with at least one unkeyed job.
    UnkeyedEnqueue,
    /// Ack, Nack, Extend.
    Settle,
    /// GetServerInfo and other reads.
    Read,
    /// Reserve, DrainDeadLetters.
    Never,
}

/// Whether `status` may be retried under `class`.
pub(crate) fn is_retryable(class: RetryClass, status: &tonic::Status) -> bool {
    let code = status.code();
    match class {
        RetryClass::Never => false,
        RetryClass::KeyedEnqueue | RetryClass::Settle | RetryClass::Read => {
            matches!(
                code,
                Code::Unavailable
                    | Code::DeadlineExceeded
                    | Code::Aborted
                    | Code::ResourceExhausted
            ) || is_connection_failure(status)
        }
        RetryClass::UnkeyedEnqueue => {
            code == Code::ResourceExhausted
                || ((code == Code::Unavailable || is_connection_failure(status))
                    && never_sent(status))
        }
    }
}

/// True when the status says the connection could not be made, so the request never left.
fn never_sent(status: &tonic::Status) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = src {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NotFound
            )
        {
            return true;
        }
        let text = e.to_string();
        if text.contains("error trying to connect") || text.contains("tcp connect error") {
            return true;
        }
        src = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_is_never_retried_and_keyed_enqueue_is() {
        let unavailable = tonic::Status::unavailable("down");
        assert!(!is_retryable(RetryClass::Never, &unavailable));
        assert!(is_retryable(RetryClass::KeyedEnqueue, &unavailable));
        assert!(is_retryable(
            RetryClass::KeyedEnqueue,
            &tonic::Status::deadline_exceeded("slow")
        ));
        // An unkeyed enqueue that may have reached the server is not retried.
        assert!(!is_retryable(
            RetryClass::UnkeyedEnqueue,
            &tonic::Status::deadline_exceeded("slow")
        ));
        assert!(!is_retryable(RetryClass::UnkeyedEnqueue, &unavailable));
        assert!(is_retryable(
            RetryClass::UnkeyedEnqueue,
            &tonic::Status::resource_exhausted("busy")
        ));
        assert!(!is_retryable(
            RetryClass::KeyedEnqueue,
            &tonic::Status::invalid_argument("bad")
        ));
    }

    #[test]
    fn retry_delays_stay_under_their_bound() {
        let p = RetryPolicy::default();
        for n in 1..20 {
            assert!(p.retry_delay(n) <= p.max_retry_delay);
        }
        assert!(p.retry_delay(1) <= p.first_retry_delay);
    }
}
