//! `sepp-rules`: the rules about a job's shape that both ends of sepp apply, written once.
//!
//! The server checks every enqueued job (`server/src/queue/validate.rs`) and the client core
//! checks a job before sending it (`core/src/request.rs`); both call these functions, so a bad
//! job gets the same rejection, with the same message, whichever side finds it. The functions
//! work on plain values (strings, numbers, booleans), not on protocol or storage types, so that
//! neither side has to know the other's.
//!
//! # The protocol's rejection order
//!
//! A job is checked in this order and the first failing rule is reported:
//!
//! 1. structure ([`check_structure`], reported as `INVALID_REQUEST` with the message it
//!    returns): the queue name's shape ([`queue_name_shape`]), a non-empty job type, a non-empty
//!    payload and encoding, a non-empty idempotency key, priority 0 to 9, `max_attempts` at
//!    least 1, a non-empty traceparent, a valid `scheduled_at` ([`timestamp_problem`]), custom
//!    entries with non-empty keys and a value set;
//! 2. strict mode: the queue is declared (server only);
//! 3. the queue name's length ([`check_length`] with `max_queue_name_bytes`);
//! 4. the job type's length (`max_job_type_bytes`);
//! 5. the queue's `allowed_job_types` (server only);
//! 6. the idempotency key's length (`max_idempotency_key_bytes`);
//! 7. and on, per queue, on the server: payload size, encodings, custom entries, schedule
//!    horizon, field sizes, then the queue's depth at commit.
//!
//! All lengths are UTF-8 bytes.

use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};

/// What a call does with a queue name, for [`queue_name_shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameUse {
    /// Creates jobs or queue records under the name (enqueue, pause, `[[queues]]`): the whole
    /// rule applies.
    Write,
    /// Reads or drains what is stored under the name (Reserve, stats, dead letters, key
    /// lookup, resume): invisible and bidirectional characters are let through, so that a
    /// queue stored under such a name before the rule existed stays reachable.
    Read,
}

/// The one queue-name rule: not empty, not `.` or `..`, no `/`, no control characters, and for
/// writes no character of the Unicode general categories Cf (format: zero-width and
/// bidirectional controls such as U+200B, U+202A–202E, U+2066–2069), Zl or Zp (line and
/// paragraph separators). The length limit is a separate rule ([`check_length`]), checked later
/// in the protocol's order.
///
/// # Errors
/// Why the name is not allowed, starting with "queue name".
pub fn queue_name_shape(name: &str, use_: NameUse) -> Result<(), String> {
    if name.is_empty() {
        return Err("queue name is empty".into());
    }
    if name == "." || name == ".." {
        return Err("queue name must not be \".\" or \"..\"".into());
    }
    if name.contains('/') {
        return Err("queue name must not contain '/'".into());
    }
    if name.chars().any(char::is_control) {
        return Err("queue name must not contain control characters".into());
    }
    // No ASCII character is in Cf, Zl or Zp, so an ASCII name (the usual case) skips the
    // per-character category lookup.
    if use_ == NameUse::Write
        && !name.is_ascii()
        && let Some((i, c)) = name.char_indices().find(|(_, c)| {
            matches!(
                c.general_category(),
                GeneralCategory::Format
                    | GeneralCategory::LineSeparator
                    | GeneralCategory::ParagraphSeparator
            )
        })
    {
        return Err(format!(
            "queue name has U+{:04X} at byte {i}: invisible, bidirectional-control and separator \
             characters (Unicode categories Cf, Zl, Zp) are not allowed",
            u32::from(c)
        ));
    }
    Ok(())
}

/// The payload of a job as the structural rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayloadShape<'a> {
    /// Length of the data, in bytes.
    pub data_len: usize,
    /// The encoding hint.
    pub encoding: &'a str,
}

/// The fields of one job that the structural rules look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobShape<'a> {
    /// The queue name.
    pub queue: &'a str,
    /// The job type.
    pub job_type: &'a str,
    /// The payload, when one is sent.
    pub payload: Option<PayloadShape<'a>>,
    /// The idempotency key, when one is sent.
    pub idempotency_key: Option<&'a str>,
    /// The priority, when one is sent.
    pub priority: Option<u32>,
    /// The attempts allowed, when sent.
    pub max_attempts: Option<u32>,
    /// The trace context's `traceparent`, when a trace context is sent.
    pub traceparent: Option<&'a str>,
    /// The scheduled time when one is sent: `Ok` when it is a valid timestamp, else why not
    /// (see [`timestamp_problem`]).
    pub scheduled_at: Option<Result<(), &'a str>>,
}

/// The structural rules of one job, in the protocol's order (see the crate docs); `custom`
/// lists the custom entries as (key, whether a value is set), in key order.
///
/// # Errors
/// The message of the `INVALID_REQUEST` rejection, naming the field.
pub fn check_structure<'a>(
    job: &JobShape<'a>,
    custom: impl IntoIterator<Item = (&'a str, bool)>,
) -> Result<(), String> {
    if let Err(why) = queue_name_shape(job.queue, NameUse::Write) {
        return Err(format!("queue: {why}"));
    }
    if job.job_type.is_empty() {
        return Err("job_type is empty".into());
    }
    if let Some(p) = &job.payload {
        if p.data_len == 0 {
            return Err("payload.data is empty: omit the payload when there is no data".into());
        }
        if p.encoding.is_empty() {
            return Err("payload.encoding is empty".into());
        }
    }
    if job.idempotency_key == Some("") {
        return Err("idempotency_key is empty: omit it, or send 1 or more bytes".into());
    }
    if let Some(p) = job.priority
        && p > 9
    {
        return Err(format!(
            "priority is {p}: allowed 0 (lowest) to 9 (highest)"
        ));
    }
    if job.max_attempts == Some(0) {
        return Err("max_attempts is 0: must be at least 1".into());
    }
    if job.traceparent == Some("") {
        return Err("trace_context.traceparent is empty".into());
    }
    if let Some(Err(why)) = job.scheduled_at {
        return Err(format!("scheduled_at: {why}"));
    }
    for (key, has_value) in custom {
        if key.is_empty() {
            return Err("custom has an empty key".into());
        }
        if !has_value {
            return Err(format!("custom[{key:?}] has no value set"));
        }
    }
    Ok(())
}

/// A value longer than its limit, in UTF-8 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLong {
    /// Bytes allowed.
    pub limit: u32,
    /// Bytes of the value.
    pub actual: u64,
}

/// A length rule: `value` is at most `limit` UTF-8 bytes (the queue name against
/// `max_queue_name_bytes`, the job type against `max_job_type_bytes`, the idempotency key
/// against `max_idempotency_key_bytes`).
///
/// # Errors
/// [`TooLong`] with the limit and the value's length.
pub fn check_length(value: &str, limit: u32) -> Result<(), TooLong> {
    if value.len() > limit as usize {
        return Err(TooLong {
            limit,
            actual: value.len() as u64,
        });
    }
    Ok(())
}

/// The smallest `seconds` of a valid `google.protobuf.Timestamp` (0001-01-01T00:00:00Z).
pub const TIMESTAMP_MIN_SECONDS: i64 = -62_135_596_800;
/// The largest `seconds` of a valid `google.protobuf.Timestamp` (9999-12-31T23:59:59Z).
pub const TIMESTAMP_MAX_SECONDS: i64 = 253_402_300_799;

/// Why `seconds` and `nanos` are not a valid `google.protobuf.Timestamp` (years 1 to 9999,
/// nanos 0 to 999 999 999), or `None` when they are.
pub fn timestamp_problem(seconds: i64, nanos: i32) -> Option<String> {
    if !(TIMESTAMP_MIN_SECONDS..=TIMESTAMP_MAX_SECONDS).contains(&seconds) {
        return Some(format!(
            "not a valid google.protobuf.Timestamp: seconds is {seconds}: allowed \
             {TIMESTAMP_MIN_SECONDS} to {TIMESTAMP_MAX_SECONDS}"
        ));
    }
    if !(0..=999_999_999).contains(&nanos) {
        return Some(format!(
            "not a valid google.protobuf.Timestamp: nanos is {nanos}: allowed 0 to 999999999"
        ));
    }
    None
}

/// `s` cut to at most `max` bytes at a UTF-8 character boundary. A nack reason longer than the
/// server's `max_reason_bytes` is kept shortened rather than refused (refusing the nack would
/// strand its job); the client cuts it the same way before sending.
pub fn truncate_utf8(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(queue: &str) -> JobShape<'_> {
        JobShape {
            queue,
            job_type: "t",
            payload: None,
            idempotency_key: None,
            priority: None,
            max_attempts: None,
            traceparent: None,
            scheduled_at: None,
        }
    }

    fn structure(j: &JobShape<'_>) -> Result<(), String> {
        check_structure(j, [])
    }

    #[test]
    fn queue_names_follow_the_one_rule() {
        for (name, why) in [
            ("", "queue name is empty"),
            ("..", "queue name must not be \".\" or \"..\""),
            ("a/b", "queue name must not contain '/'"),
            ("a\nb", "queue name must not contain control characters"),
        ] {
            assert_eq!(queue_name_shape(name, NameUse::Read), Err(why.to_string()));
        }
        let hidden = "pay\u{200B}ments";
        assert!(queue_name_shape(hidden, NameUse::Read).is_ok());
        assert_eq!(
            queue_name_shape(hidden, NameUse::Write).unwrap_err(),
            "queue name has U+200B at byte 3: invisible, bidirectional-control and separator \
             characters (Unicode categories Cf, Zl, Zp) are not allowed"
        );
        assert!(queue_name_shape("émails.v2-ok_1", NameUse::Write).is_ok());
    }

    #[test]
    fn no_ascii_character_is_in_the_refused_categories() {
        // queue_name_shape skips the category lookup for ASCII names on this premise.
        for c in (0u8..=127).map(char::from) {
            assert!(
                !matches!(
                    c.general_category(),
                    GeneralCategory::Format
                        | GeneralCategory::LineSeparator
                        | GeneralCategory::ParagraphSeparator
                ),
                "{c:?}"
            );
        }
    }

    #[test]
    fn structure_is_checked_in_the_protocol_order() {
        // Two faults: the first in the order is reported.
        let mut j = job("a/b");
        j.job_type = "";
        assert_eq!(
            structure(&j).unwrap_err(),
            "queue: queue name must not contain '/'"
        );
        let mut j = job("q");
        j.priority = Some(10);
        j.traceparent = Some("");
        assert_eq!(
            structure(&j).unwrap_err(),
            "priority is 10: allowed 0 (lowest) to 9 (highest)"
        );
        let mut j = job("q");
        j.traceparent = Some("");
        assert_eq!(
            check_structure(&j, [("", true)]).unwrap_err(),
            "trace_context.traceparent is empty"
        );
        assert_eq!(
            check_structure(&job("q"), [("k", false)]).unwrap_err(),
            "custom[\"k\"] has no value set"
        );
        let mut j = job("q");
        j.scheduled_at = Some(Err("not a valid google.protobuf.Timestamp: x"));
        assert_eq!(
            structure(&j).unwrap_err(),
            "scheduled_at: not a valid google.protobuf.Timestamp: x"
        );
        assert!(structure(&job("q")).is_ok());
    }

    #[test]
    fn lengths_are_utf8_bytes() {
        assert_eq!(check_length(&"é".repeat(128), 256), Ok(()));
        assert_eq!(
            check_length(&"€".repeat(86), 256),
            Err(TooLong {
                limit: 256,
                actual: 258
            })
        );
    }

    #[test]
    fn timestamps_outside_years_1_to_9999_are_refused() {
        assert_eq!(timestamp_problem(0, 0), None);
        assert_eq!(timestamp_problem(TIMESTAMP_MAX_SECONDS, 999_999_999), None);
        assert!(
            timestamp_problem(TIMESTAMP_MAX_SECONDS + 1, 0)
                .unwrap()
                .contains("seconds is 253402300800")
        );
        assert!(timestamp_problem(0, -1).unwrap().contains("nanos is -1"));
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_utf8("abc".into(), 5), "abc");
        assert_eq!(truncate_utf8("abcdef".into(), 3), "abc");
        assert_eq!(truncate_utf8("aéé".into(), 2), "a");
        assert_eq!(truncate_utf8("é".into(), 0), "");
    }
}
