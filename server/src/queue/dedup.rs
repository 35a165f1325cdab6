//! The idempotency key and the dedup window: the rules of `docs/idempotency.md`.
//!
//! A key is 1..=`max_idempotency_key_bytes` UTF-8 bytes, compared byte for byte (no trimming,
//! case folding or Unicode normalisation), and scoped to its queue. Its record lives from the
//! first accepted enqueue for the queue's `dedup_window_ms`; the expiry is fixed when the record
//! is written, a hit does not extend it, and an expired record counts as absent even before the
//! sweeper removes it. The store reads the record and writes the new job in one transition
//! ([`crate::storage::Store::enqueue`]); whether the record deduplicates is decided here, by
//! the enqueue rule (`queue::enqueue`).

use super::model::Rejection;
use crate::domain::{DedupClaim, UnixMs, reached};

/// Rejects a key longer than `limit` UTF-8 bytes.
///
/// # Errors
/// [`Rejection::IdempotencyKeyTooLong`] with the limit and the actual byte length.
pub fn check_key_length(key: &str, limit: u32) -> Result<(), Rejection> {
    if key.len() > limit as usize {
        return Err(Rejection::IdempotencyKeyTooLong {
            limit,
            actual: key.len() as u64,
        });
    }
    Ok(())
}

/// The claim a keyed job makes: the record expires `window_ms` after `now`.
pub fn claim(key: String, window_ms: u64, now: UnixMs) -> DedupClaim {
    DedupClaim {
        key,
        expires_at: now.saturating_add(i64::try_from(window_ms).unwrap_or(i64::MAX)),
    }
}

/// Whether a record that expires at `expires_at` still deduplicates at `now`: live up to
/// `expires_at - 1`, gone at `expires_at`, whether or not the sweeper has removed it yet.
pub fn is_live(expires_at: UnixMs, now: UnixMs) -> bool {
    !reached(expires_at, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_live_until_its_expiry() {
        let c = claim("k".into(), 2_000, 10_000);
        assert!(is_live(c.expires_at, 11_999));
        assert!(!is_live(c.expires_at, 12_000));
    }
}
