//! The reply budget: how many bytes a job takes in a Reserve reply, and a dead letter in a
//! DrainDeadLetters or ListDeadLetters reply, as an upper bound of its protobuf encoding
//! computed from the domain record, so that the store can fill a reply up to
//! `max_reserve_reply_bytes` without encoding anything and never lease a job, or drain a dead
//! letter, that it does not send.
//!
//! The bound counts every field at its worst: each length-delimited field as a 1-byte tag plus
//! a 5-byte length (every job is far below 2^35 bytes), each integer as a tag plus a 10-byte
//! varint, and every timestamp as present. `api/convert.rs` tests it against prost's
//! `encoded_len` for extreme jobs, and the Reserve handler checks each reply against it.

use crate::domain::{DeadLetter, Fit, Job, JobInfo, NewJob, Payload, TraceContext, Value};

/// A length-delimited field's header: tag (field numbers below 16 take 1 byte) + length.
const FIELD: u64 = 1 + 5;
/// An integer field: tag + the longest varint.
const SCALAR: u64 = 1 + 10;
/// A `google.protobuf.Timestamp` field: header + seconds + nanos.
const TIMESTAMP: u64 = FIELD + 2 * SCALAR;
/// What a custom entry adds to its counted bytes (key bytes + value bytes): the headers of the
/// map entry, its key, its value and the value's variant. An int counts 8 bytes and encodes
/// in up to 11 (tag + varint), a bool 1 and 2, a double 8 and 9, a string its length plus a
/// header: the variant's `FIELD` covers each difference.
const CUSTOM_ENTRY: u64 = 4 * FIELD;
/// Everything a job carries whatever its content: its own header in the reply, the id (36
/// characters), the headers of `job_type` and `queue`, priority, attempt, max_attempts, and
/// the three timestamps (enqueued, lease expiry, scheduled).
const JOB_FIXED: u64 = FIELD + (FIELD + 36) + 2 * FIELD + 3 * SCALAR + 3 * TIMESTAMP;

fn payload_bytes(p: Option<&Payload>) -> u64 {
    p.map_or(0, |p| {
        3 * FIELD + p.data.len() as u64 + p.encoding.len() as u64
    })
}

fn trace_bytes(t: Option<&TraceContext>) -> u64 {
    t.map_or(0, |t| {
        3 * FIELD + t.traceparent.len() as u64 + t.tracestate.as_ref().map_or(0, |s| s.len() as u64)
    })
}

fn custom_bytes<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>) -> u64 {
    entries
        .map(|(k, v)| CUSTOM_ENTRY + k.len() as u64 + v.counted_bytes())
        .sum()
}

/// The bytes `job` takes in a Reserve reply, at most.
pub fn job_bytes(job: &Job) -> u64 {
    JOB_FIXED
        + job.queue.len() as u64
        + job.job_type.len() as u64
        + payload_bytes(job.payload.as_ref())
        + trace_bytes(job.trace_context.as_ref())
        + custom_bytes(job.custom.iter())
}

/// What a dead letter adds to its job (counted by [`job_bytes`], whose own header is the
/// record's `job` field header): the record's header in the reply, the cause, `failed_at`,
/// `final_attempt` and the header of `last_reason` (whose bytes are counted apart).
const DEAD_LETTER_FIXED: u64 = FIELD + SCALAR + TIMESTAMP + SCALAR + FIELD;

/// What a ListDeadLetters reply adds to its records: `next_page_token` (48 characters).
pub const PAGE_TOKEN_BYTES: u64 = FIELD + 48;

/// The bytes `d` takes in a DrainDeadLetters or ListDeadLetters reply, at most.
pub fn dead_letter_bytes(d: &DeadLetter) -> u64 {
    DEAD_LETTER_FIXED + job_bytes(&d.job) + d.last_reason.as_ref().map_or(0, |r| r.len() as u64)
}

/// Whether dead letter `d` goes into a DrainDeadLetters reply that already holds `used` bytes
/// of records, under the budget `max`: a record is drained only if it is sent, so the drain
/// stops before the reply would pass the budget; a record larger than the whole budget (stored
/// before the limits were lowered) is never drained, since a client may be unable to read it:
/// it is skipped and stays for listing (alone), requeue or delete.
pub fn drain_fit(d: &DeadLetter, used: u64, max: u64) -> Fit {
    let size = dead_letter_bytes(d);
    if size > max {
        Fit::Skip
    } else if used + size > max {
        Fit::Stop
    } else {
        Fit::Take(size)
    }
}

/// Whether dead letter `d` goes into a ListDeadLetters page that already holds `taken` records
/// of `used` bytes, under the budget `max` (which also holds the page token): the first record
/// always goes (a page is never empty while records remain); a later one only within the
/// budget, else the page ends and its token names the rest.
pub fn list_fit(d: &DeadLetter, used: u64, taken: usize, max: u64) -> Fit {
    let size = dead_letter_bytes(d);
    if taken > 0 && PAGE_TOKEN_BYTES + used + size > max {
        Fit::Stop
    } else {
        Fit::Take(size)
    }
}

/// Whether a ready job of `size` reply bytes (as [`new_job_bytes`] gave it at enqueue) goes into
/// a Reserve reply that already holds `taken` jobs of `used` bytes, under the budget `max`: a
/// job is leased only if it is sent, so the reply stops before it would pass the budget. The
/// first job is always taken, whatever its size (a job larger than the budget exists only if
/// the limits were lowered after it was stored). A job stored before sizes were kept (`size`
/// 0, unknown) is only ever sent alone, as the first job of a reply: it counts as filling it.
pub fn reserve_fit(size: u32, used: u64, taken: usize, max: u64) -> Fit {
    if taken > 0 && (size == 0 || used.saturating_add(u64::from(size)) > max) {
        Fit::Stop
    } else if size == 0 {
        Fit::Take(u64::MAX)
    } else {
        Fit::Take(u64::from(size))
    }
}

/// What a `sepp.admin.v1.JobInfo` carries whatever its content: its own header in the reply,
/// the id, the headers of queue, job type, reason, key and worker id, state, attempt,
/// max_attempts, priority, cause, and four timestamps.
const JOB_INFO_FIXED: u64 = FIELD + (FIELD + 36) + 5 * FIELD + 5 * SCALAR + 4 * TIMESTAMP;

/// What a ListQueues reply's entry carries besides its name: its header, the name's header,
/// five counts and the paused flag.
pub const QUEUE_SUMMARY_FIXED: u64 = 2 * FIELD + 6 * SCALAR;

/// The bytes one queue's entry takes in a GetQueueRates reply besides its name, at most: its
/// header, the name's header and four packed series of `minutes` counts (each a header and a
/// varint per count).
pub fn queue_rates_fixed(minutes: u64) -> u64 {
    2 * FIELD + 4 * (FIELD + minutes * 10)
}

/// The bytes `j` takes in a ListJobs reply, at most.
pub fn job_info_bytes(j: &JobInfo) -> u64 {
    JOB_INFO_FIXED
        + j.queue.len() as u64
        + j.job_type.len() as u64
        + j.last_reason.as_ref().map_or(0, |r| r.len() as u64)
        + j.idempotency_key.as_ref().map_or(0, |k| k.len() as u64)
        + j.worker_id.as_ref().map_or(0, |w| w.len() as u64)
}

/// How many of `sizes` (in page order) go into a ListJobs or ListQueues page under the budget
/// `max`, its page token taking `token_bytes`: the first always goes (a page is never empty
/// while records remain), later ones while the page and its token fit.
pub fn listing_fit(sizes: impl IntoIterator<Item = u64>, token_bytes: u64, max: u64) -> usize {
    let mut used = FIELD + token_bytes;
    let mut taken = 0;
    for size in sizes {
        if taken > 0 && used + size > max {
            break;
        }
        used += size;
        taken += 1;
    }
    taken
}

/// The bytes a validated job will take in a Reserve reply, at most: [`job_bytes`] of the job
/// it becomes. Saturates at `u32::MAX` (far above any accepted job).
pub fn new_job_bytes(job: &NewJob) -> u32 {
    let n = JOB_FIXED
        + job.queue.len() as u64
        + job.job_type.len() as u64
        + payload_bytes(job.payload.as_ref())
        + trace_bytes(job.trace_context.as_ref())
        + custom_bytes(job.custom.iter());
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The largest sizes a queue accepts, field by field, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobBounds {
    /// `max_queue_name_bytes`.
    pub queue_name: u64,
    /// `max_job_type_bytes`.
    pub job_type: u64,
    /// `max_payload_bytes`.
    pub payload: u64,
    /// `max_encoding_bytes`.
    pub encoding: u64,
    /// `max_trace_context_bytes` (traceparent and tracestate each).
    pub trace_context: u64,
    /// `max_custom_entries`.
    pub custom_entries: u64,
    /// `max_custom_total_bytes`.
    pub custom_total: u64,
}

impl JobBounds {
    /// The bytes the largest job these bounds accept takes in a Reserve reply, at most. Every
    /// custom key has at least one byte, so there are no more entries than counted bytes.
    pub fn reply_bytes(&self) -> u64 {
        let entries = self.custom_entries.min(self.custom_total);
        JOB_FIXED
            + self.queue_name
            + self.job_type
            + (3 * FIELD + self.payload + self.encoding)
            + (3 * FIELD + 2 * self.trace_context)
            + entries * CUSTOM_ENTRY
            + self.custom_total
    }

    /// The bytes the largest dead letter of these bounds takes in a ListDeadLetters reply (the
    /// larger of the two dead-letter replies), at most: the largest job, a reason of
    /// `max_reason` bytes, the record's other fields and the page token.
    pub fn dead_letter_reply_bytes(&self, max_reason: u64) -> u64 {
        self.reply_bytes() + DEAD_LETTER_FIXED + max_reason + PAGE_TOKEN_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_job_of_the_defaults_fits_the_default_budget_with_room() {
        let b = JobBounds {
            queue_name: 512,
            job_type: 256,
            payload: 1_048_576,
            encoding: 256,
            trace_context: 4096,
            custom_entries: 64,
            custom_total: 16_384,
        };
        let n = b.reply_bytes();
        assert!(n > 1_048_576 + 16_384 + 8192, "{n}");
        assert!(
            n < 4_194_304 / 3,
            "{n}: three max-size jobs fit one default reply"
        );
    }
}
