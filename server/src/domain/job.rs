//! Jobs as the queue and every storage backend see them: ids, contents, a validated new job
//! and a delivered job.

use super::UnixMs;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A job id: a UUID with the version 4 bits, assigned by the server ([`JobId::ordered`]), kept as
/// its 128-bit value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u128);

impl JobId {
    /// A fresh random (v4) id.
    pub fn new_v4() -> Self {
        JobId(uuid::Uuid::new_v4().as_u128())
    }

    /// A fresh id for a job enqueued at `now`: a UUID with the version 4 and variant bits, whose
    /// 60 bits in front of the variant are an ordering stamp and whose last 62 bits are random.
    ///
    /// The stamp is `now`'s 48 low bits (milliseconds since the epoch, as in a UUID v7) then a
    /// 12-bit counter, with the version nibble between the two; it only grows within a process:
    /// an id taken in the same millisecond as the last, or on a clock that went back, gets the
    /// last stamp plus one. So new ids sort in creation order, byte for byte: the embedded store
    /// keys a job's state by its id, and ids that arrive in key order land at the end of fjall's
    /// memtables and tables instead of all over them (and PostgreSQL's primary key index grows
    /// at one edge). The 62 random bits keep ids unguessable and unique across processes and
    /// restarts. Nothing reads the stamp back: an id's meaning is only its identity.
    pub fn ordered(now: UnixMs) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        static LAST: AtomicU64 = AtomicU64::new(0);
        let floor = ((now.max(0) as u64) & ((1 << 48) - 1)) << 12;
        let mut last = LAST.load(Ordering::Relaxed);
        let stamp = loop {
            let next = floor.max(last.wrapping_add(1) & ((1 << 60) - 1));
            match LAST.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break next,
                Err(seen) => last = seen,
            }
        };
        let hi = ((stamp >> 12) << 16) | (0x4 << 12) | (stamp & 0xfff);
        // The low half of a v4 UUID: the variant bits (10) and 62 random bits.
        let lo = uuid::Uuid::new_v4().as_u128() as u64;
        JobId((u128::from(hi) << 64) | u128::from(lo))
    }

    /// Parses the hyphenated (or simple) UUID text form. Returns `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        uuid::Uuid::try_parse(s).ok().map(|u| JobId(u.as_u128()))
    }

    /// The 16 big-endian bytes, used as a storage key.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// The inverse of [`JobId::to_bytes`].
    pub fn from_bytes(b: [u8; 16]) -> Self {
        JobId(u128::from_be_bytes(b))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        uuid::Uuid::from_u128(self.0).hyphenated().fmt(f)
    }
}

/// A value in a job's custom map.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// UTF-8 text; counts its length in bytes toward `max_custom_total_bytes`.
    String(String),
    /// A double; counts 8 bytes.
    Double(f64),
    /// A signed 64-bit integer; counts 8 bytes.
    Int(i64),
    /// A boolean; counts 1 byte.
    Bool(bool),
}

impl Value {
    /// The bytes this value counts toward `max_custom_total_bytes`.
    pub fn counted_bytes(&self) -> u64 {
        match self {
            Value::String(s) => s.len() as u64,
            Value::Double(_) | Value::Int(_) => 8,
            Value::Bool(_) => 1,
        }
    }
}

/// A job's data and the hint for reading it.
#[derive(Debug, Clone, PartialEq)]
pub struct Payload {
    /// The bytes; never empty in a stored job.
    pub data: Vec<u8>,
    /// A non-empty hint such as a MIME type.
    pub encoding: String,
}

/// W3C trace context carried with a job.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceContext {
    /// The `traceparent` header value; non-empty.
    pub traceparent: String,
    /// The `tracestate` header value.
    pub tracestate: Option<String>,
}

/// What defines a job for `key_conflict = "reject"` (`queue::dedup::fingerprint`): a 64-bit
/// digest, never zero, so that `Option<Fingerprint>` costs 8 bytes.
pub type Fingerprint = std::num::NonZeroU64;

/// The claim a keyed job makes on the dedup index.
#[derive(Debug, Clone, PartialEq)]
pub struct DedupClaim {
    /// The idempotency key, exactly as sent.
    pub key: String,
    /// When the record stops deduplicating (first accepted enqueue + the queue's window).
    pub expires_at: UnixMs,
    /// Set on a queue with `key_conflict = "reject"`: kept with the record, and compared with
    /// the fingerprint of a later enqueue that hits it.
    pub fingerprint: Option<Fingerprint>,
    /// Set on a queue with `on_duplicate = "replace_pending"`: what a hit on a job that is
    /// still ready or scheduled replaces (`queue::enqueue::decide` decides whether it does).
    pub replace: Option<Replacement>,
}

/// What a hit on a pending job takes from the enqueue that hits it
/// (`on_duplicate = "replace_pending"`): the payload, encoding, custom map and trace context of
/// that [`NewJob`], and where the job goes. The job keeps its id, job type, priority, attempt,
/// enqueue time and place in line, and the dedup record is untouched (the window does not
/// restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replacement {
    /// Where the job goes when the hit sent a `scheduled_at` (ready when that time has come,
    /// scheduled otherwise); `None` keeps it where it is.
    pub placement: Option<super::Placement>,
    /// The job's size in a Reserve reply after the replacement, at most (its own job type
    /// counted at `max_job_type_bytes`, since it keeps it).
    pub reply_bytes: u32,
}

/// A validated job, with every default resolved, ready to be written.
#[derive(Debug, Clone, PartialEq)]
pub struct NewJob {
    /// The id it gets if it is created (not used on a dedup hit).
    pub id: JobId,
    /// Queue name.
    pub queue: Arc<str>,
    /// Job type.
    pub job_type: String,
    /// Optional data.
    pub payload: Option<Payload>,
    /// 0–9.
    pub priority: u8,
    /// At least 1.
    pub max_attempts: u32,
    /// Optional trace context.
    pub trace_context: Option<TraceContext>,
    /// Custom entries.
    pub custom: BTreeMap<String, Value>,
    /// The enqueue time.
    pub enqueued_at: UnixMs,
    /// Set when the job is not ready before this time (strictly in the future at enqueue).
    pub scheduled_at: Option<UnixMs>,
    /// Set for a keyed enqueue.
    pub dedup: Option<DedupClaim>,
    /// The queue's `max_queue_depth`, checked when the job is committed.
    pub max_queue_depth: Option<u64>,
    /// The bytes the job takes in a Reserve reply, at most (computed by the queue layer,
    /// `queue::reply`), so that a store can fill a reply up to its budget without encoding.
    pub reply_bytes: u32,
}

/// A job as delivered to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its id.
    pub id: JobId,
    /// Its queue.
    pub queue: String,
    /// Its type.
    pub job_type: String,
    /// Its data.
    pub payload: Option<Payload>,
    /// 0–9.
    pub priority: u8,
    /// Trace context.
    pub trace_context: Option<TraceContext>,
    /// First enqueue time (a requeued dead letter: its requeue time).
    pub enqueued_at: UnixMs,
    /// Which delivery this is, 1-based.
    pub attempt: u32,
    /// Deliveries allowed.
    pub max_attempts: u32,
    /// When the current lease ends (unset outside a delivery).
    pub lease_expires_at: Option<UnixMs>,
    /// Custom entries.
    pub custom: BTreeMap<String, Value>,
    /// When the job was scheduled to become ready, if it was scheduled.
    pub scheduled_at: Option<UnixMs>,
}

#[cfg(test)]
mod tests {
    use super::JobId;

    #[test]
    fn ordered_ids_are_v4_uuids_that_sort_in_creation_order() {
        let now = 1_796_000_000_000;
        let mut ids: Vec<JobId> = (0..10_000).map(|_| JobId::ordered(now)).collect();
        // Later calls, one on a clock that went back a second.
        ids.push(JobId::ordered(now + 1));
        ids.push(JobId::ordered(now - 1000));
        for w in ids.windows(2) {
            assert!(w[0].to_bytes() < w[1].to_bytes(), "{} !< {}", w[0], w[1]);
        }
        for id in &ids {
            let u = uuid::Uuid::from_u128(id.0);
            assert_eq!(u.get_version_num(), 4, "{u}");
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122, "{u}");
            assert_eq!(JobId::parse(&u.to_string()), Some(*id));
        }
        // The first 48 bits are the millisecond (other tests may have moved the counter on,
        // never back).
        let first = uuid::Uuid::from_u128(ids[0].0);
        assert!(
            u64::from_be_bytes([
                0,
                0,
                first.as_bytes()[0],
                first.as_bytes()[1],
                first.as_bytes()[2],
                first.as_bytes()[3],
                first.as_bytes()[4],
                first.as_bytes()[5]
            ]) >= now as u64
        );
        // The random halves differ.
        let lows: std::collections::HashSet<u64> = ids.iter().map(|i| i.0 as u64).collect();
        assert_eq!(lows.len(), ids.len());
    }
}
