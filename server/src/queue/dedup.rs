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
use crate::domain::{DedupClaim, Fingerprint, JobState, Payload, Stage, UnixMs, Value, reached};
use std::collections::BTreeMap;

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

/// The claim a keyed job makes: the record expires `window_ms` after `now`; it carries the
/// job's fingerprint on a queue with `key_conflict = "reject"`.
pub fn claim(
    key: String,
    window_ms: u64,
    now: UnixMs,
    fingerprint: Option<Fingerprint>,
) -> DedupClaim {
    DedupClaim {
        key,
        expires_at: now.saturating_add(i64::try_from(window_ms).unwrap_or(i64::MAX)),
        fingerprint,
        replace: None,
    }
}

/// What defines a job, for `key_conflict = "reject"`: the job type, the payload's bytes and
/// encoding, the priority (as resolved, a default applied) and the custom map (ordered by key,
/// each value with its type). Left out, because a retry of the same enqueue may differ in them
/// without being other work: `scheduled_at` (often computed from "now"), `max_attempts` (a
/// retry policy, clamped by the queue), the trace context (each attempt of a producer carries
/// its own span). A 64-bit XXH3 of an unambiguous encoding (every field length-prefixed or
/// tagged), stable across versions and restarts since it is stored with the record; never zero.
pub fn fingerprint(
    job_type: &str,
    payload: Option<&Payload>,
    priority: u8,
    custom: &BTreeMap<String, Value>,
) -> Fingerprint {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let field = |h: &mut xxhash_rust::xxh3::Xxh3, b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(&mut h, job_type.as_bytes());
    match payload {
        None => h.update(&[0]),
        Some(p) => {
            h.update(&[1]);
            field(&mut h, &p.data);
            field(&mut h, p.encoding.as_bytes());
        }
    }
    h.update(&[priority]);
    h.update(&(custom.len() as u64).to_le_bytes());
    for (k, v) in custom {
        field(&mut h, k.as_bytes());
        match v {
            Value::String(s) => {
                h.update(&[1]);
                field(&mut h, s.as_bytes());
            }
            Value::Double(d) => {
                h.update(&[2]);
                h.update(&d.to_bits().to_le_bytes());
            }
            Value::Int(i) => {
                h.update(&[3]);
                h.update(&i.to_le_bytes());
            }
            Value::Bool(b) => h.update(&[4, u8::from(*b)]),
        }
    }
    Fingerprint::new(h.digest()).unwrap_or(Fingerprint::MIN)
}

/// Where the job a hit names is, as the hit reports it (`original_state`), from what the store
/// holds of it: ready, scheduled, in flight; dead-lettered while the dead letter is kept (it
/// can be requeued); acked; deleted when nothing but a tombstone of a dead letter (drained,
/// deleted, past its retention) or nothing at all is left while the key's record lives.
pub fn original_state(stage: Option<Stage>) -> JobState {
    match stage {
        Some(Stage::Ready) => JobState::Ready,
        Some(Stage::Scheduled { .. }) => JobState::Scheduled,
        Some(Stage::InFlight { .. }) => JobState::InFlight,
        Some(Stage::Dead { .. }) => JobState::DeadLettered,
        Some(Stage::Tombstone { dead: None, .. }) => JobState::Acked,
        Some(Stage::Tombstone { dead: Some(_), .. }) | None => JobState::Deleted,
    }
}

/// Whether a job with fingerprint `new` conflicts with a record holding `held`: only when both
/// are known and differ (a record written while the queue ignored conflicts has none, and
/// matches anything).
pub fn conflicts(held: Option<Fingerprint>, new: Option<Fingerprint>) -> bool {
    matches!((held, new), (Some(a), Some(b)) if a != b)
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
        let c = claim("k".into(), 2_000, 10_000, None);
        assert!(is_live(c.expires_at, 11_999));
        assert!(!is_live(c.expires_at, 12_000));
    }

    #[test]
    fn the_fingerprint_covers_what_defines_the_job() {
        let payload = |d: &[u8], e: &str| Payload {
            data: d.to_vec(),
            encoding: e.into(),
        };
        let mut custom = BTreeMap::new();
        custom.insert("a".to_string(), Value::Int(1));
        let p = payload(b"x", "text/plain");
        let base = fingerprint("t", Some(&p), 0, &custom);
        assert_eq!(
            base,
            fingerprint("t", Some(&p), 0, &custom),
            "deterministic"
        );
        assert_ne!(base, fingerprint("u", Some(&p), 0, &custom));
        assert_ne!(
            base,
            fingerprint("t", Some(&payload(b"y", "text/plain")), 0, &custom)
        );
        assert_ne!(
            base,
            fingerprint("t", Some(&payload(b"x", "application/json")), 0, &custom)
        );
        assert_ne!(base, fingerprint("t", None, 0, &custom));
        assert_ne!(base, fingerprint("t", Some(&p), 1, &custom));
        assert_ne!(base, fingerprint("t", Some(&p), 0, &BTreeMap::new()));
        let mut other = BTreeMap::new();
        other.insert("a".to_string(), Value::String("1".into()));
        assert_ne!(
            base,
            fingerprint("t", Some(&p), 0, &other),
            "the value's type counts"
        );
        // Length prefixes: moving bytes between fields changes the digest.
        assert_ne!(
            fingerprint("ab", Some(&payload(b"c", "e")), 0, &BTreeMap::new()),
            fingerprint("a", Some(&payload(b"bc", "e")), 0, &BTreeMap::new())
        );
    }

    #[test]
    fn only_two_known_and_different_fingerprints_conflict() {
        let a = Fingerprint::new(1);
        let b = Fingerprint::new(2);
        assert!(conflicts(a, b));
        assert!(!conflicts(a, a));
        assert!(!conflicts(None, b));
        assert!(!conflicts(a, None));
    }
}
