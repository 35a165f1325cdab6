//! Conversions between the `sepp.v1` messages and the domain types. No policy here.

use crate::domain::{DeadLetter, DeadLetterCause, Job, Payload, TraceContext, UnixMs, Value};
use crate::queue::model::{EnqueueInput, Rejection};
use prost_types::{Duration, Timestamp};
use sepp_proto::DURATION_MAX_SECONDS;
use sepp_proto::v1 as pb;
use sepp_proto::v1::job_rejection::Reason;
use tonic::Status;

/// A protobuf duration in whole milliseconds, rounded away from zero: a positive duration
/// shorter than 1 ms counts as 1 ms and a negative one as -1 ms, so that the sign survives.
pub(crate) fn duration_ms(d: &Duration) -> i64 {
    let nanos = i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos);
    // Away from zero: a duration that is not zero never reads as 0 ms (a lease of 1 ns is
    // 1 ms; a wait of -5 ns is -1 ms, refused as negative rather than taken as "no wait").
    let ms = if nanos > 0 {
        (nanos + 999_999) / 1_000_000
    } else {
        (nanos - 999_999) / 1_000_000
    };
    ms.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// Why `d` is not a valid `google.protobuf.Duration` (seconds within ±315 576 000 000, nanos
/// within ±999 999 999 and of the sign of seconds), if it is not.
fn duration_problem(d: &Duration) -> Option<String> {
    if !(-DURATION_MAX_SECONDS..=DURATION_MAX_SECONDS).contains(&d.seconds) {
        return Some(format!(
            "seconds is {}: allowed -{DURATION_MAX_SECONDS} to {DURATION_MAX_SECONDS}",
            d.seconds
        ));
    }
    if !(-999_999_999..=999_999_999).contains(&d.nanos) {
        return Some(format!(
            "nanos is {}: allowed -999999999 to 999999999",
            d.nanos
        ));
    }
    if (d.seconds > 0 && d.nanos < 0) || (d.seconds < 0 && d.nanos > 0) {
        return Some(format!(
            "nanos is {} and seconds {}: they must have the same sign",
            d.nanos, d.seconds
        ));
    }
    None
}

/// A request's duration field in milliseconds ([`duration_ms`]), refused with
/// `INVALID_ARGUMENT` naming `field` when its encoding is not a valid Duration.
pub(crate) fn duration_arg(field: &str, d: Option<&Duration>) -> Result<Option<i64>, Status> {
    d.map(|d| match duration_problem(d) {
        Some(why) => Err(Status::invalid_argument(format!(
            "{field} is not a valid google.protobuf.Duration: {why}"
        ))),
        None => Ok(duration_ms(d)),
    })
    .transpose()
}

/// A Reserve's fields as the queue layer takes them; `prefix` goes before each field's name in
/// an error (`"then_reserve."` inside an Ack).
pub(crate) fn reserve_input(
    prefix: &str,
    r: sepp_proto::v1::ReserveRequest,
) -> Result<crate::queue::ReserveInput, Status> {
    Ok(crate::queue::ReserveInput {
        queues: r.queues,
        wait_timeout_ms: duration_arg(&format!("{prefix}wait_timeout"), r.wait_timeout.as_ref())?,
        lease_ms: duration_arg(
            &format!("{prefix}lease_duration"),
            r.lease_duration.as_ref(),
        )?,
        worker_id: r.worker_id,
        max_jobs: r.max_jobs,
    })
}

/// A timestamp in milliseconds, or why its encoding is not a valid `google.protobuf.Timestamp`
/// (seconds from year 1 to year 9999, nanos 0 to 999 999 999).
pub(crate) fn timestamp_checked(t: &Timestamp) -> Result<UnixMs, String> {
    // The rule the client core applies to `scheduled_at` too (`sepp-rules`).
    match sepp_rules::timestamp_problem(t.seconds, t.nanos) {
        Some(why) => Err(why),
        None => Ok(timestamp_ms(t)),
    }
}

pub(crate) fn ms_duration(ms: u64) -> Duration {
    Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

pub(crate) fn timestamp_ms(t: &Timestamp) -> UnixMs {
    let ms = i128::from(t.seconds) * 1000 + i128::from(t.nanos) / 1_000_000;
    ms.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

pub(crate) fn ms_timestamp(ms: UnixMs) -> Timestamp {
    Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

fn value_in(v: pb::PrimitiveValue) -> Option<Value> {
    use pb::primitive_value::Value as V;
    v.value.map(|v| match v {
        V::StringValue(s) => Value::String(s),
        V::DoubleValue(d) => Value::Double(d),
        V::IntValue(i) => Value::Int(i),
        V::BoolValue(b) => Value::Bool(b),
    })
}

pub(crate) fn value_out(v: Value) -> pb::PrimitiveValue {
    use pb::primitive_value::Value as V;
    pb::PrimitiveValue {
        value: Some(match v {
            Value::String(s) => V::StringValue(s),
            Value::Double(d) => V::DoubleValue(d),
            Value::Int(i) => V::IntValue(i),
            Value::Bool(b) => V::BoolValue(b),
        }),
    }
}

pub(crate) fn enqueue_in(r: pb::EnqueueRequest) -> EnqueueInput {
    let mut custom: Vec<(String, Option<Value>)> = r
        .custom
        .into_iter()
        .map(|(k, v)| (k, value_in(v)))
        .collect();
    // A protobuf map has no order; sort so that errors name the same key every time.
    custom.sort_by(|a, b| a.0.cmp(&b.0));
    EnqueueInput {
        queue: r.queue,
        job_type: r.job_type,
        payload: r.payload.map(|p| Payload {
            data: p.data,
            encoding: p.encoding,
        }),
        idempotency_key: r.idempotency_key,
        priority: r.priority,
        max_attempts: r.max_attempts,
        trace_context: r.trace_context.map(|t| TraceContext {
            traceparent: t.traceparent,
            tracestate: t.tracestate,
        }),
        custom,
        scheduled_at: r.scheduled_at.as_ref().map(timestamp_checked),
    }
}

pub(crate) fn rejection_out(r: Rejection) -> pb::JobRejection {
    let reason = match r {
        Rejection::UnknownQueue { queue } => Reason::UnknownQueue(pb::UnknownQueue { queue }),
        Rejection::PayloadTooLarge { limit, actual } => {
            Reason::PayloadTooLarge(pb::PayloadTooLarge { limit, actual })
        }
        Rejection::EncodingNotAllowed { encoding, allowed } => {
            Reason::EncodingNotAllowed(pb::EncodingNotAllowed { encoding, allowed })
        }
        Rejection::JobTypeNotAllowed { job_type, allowed } => {
            Reason::JobTypeNotAllowed(pb::JobTypeNotAllowed { job_type, allowed })
        }
        Rejection::CustomEntriesTooMany { limit, actual } => {
            Reason::CustomEntriesTooMany(pb::CustomEntriesTooMany { limit, actual })
        }
        Rejection::CustomMapTooLarge { limit, actual } => {
            Reason::CustomMapTooLarge(pb::CustomMapTooLarge { limit, actual })
        }
        Rejection::CustomKeyTooLong { key, limit, actual } => {
            Reason::CustomKeyTooLong(pb::CustomKeyTooLong { key, limit, actual })
        }
        Rejection::QueueNameTooLong { limit, actual } => {
            Reason::QueueNameTooLong(pb::QueueNameTooLong { limit, actual })
        }
        Rejection::JobTypeNameTooLong { limit, actual } => {
            Reason::JobTypeNameTooLong(pb::JobTypeNameTooLong { limit, actual })
        }
        Rejection::IdempotencyKeyTooLong { limit, actual } => {
            Reason::IdempotencyKeyTooLong(pb::IdempotencyKeyTooLong { limit, actual })
        }
        Rejection::ScheduledTooFar { horizon_ms, actual } => {
            Reason::ScheduledTooFar(pb::ScheduledTooFar {
                horizon: Some(ms_duration(horizon_ms)),
                actual: Some(ms_timestamp(actual)),
            })
        }
        Rejection::InvalidRequest { message } => {
            Reason::InvalidRequest(pb::InvalidRequest { message })
        }
        Rejection::QueueFull { queue, limit } => Reason::QueueFull(pb::QueueFull { queue, limit }),
        Rejection::QueueClosing { queue } => Reason::QueueClosing(pb::QueueClosing { queue }),
        Rejection::TooManyQueues { queue, limit } => {
            Reason::TooManyQueues(pb::TooManyQueues { queue, limit })
        }
        Rejection::IdempotencyKeyConflict { original_job_id } => {
            Reason::IdempotencyKeyConflict(pb::IdempotencyKeyConflict {
                original_job_id: original_job_id.to_string(),
            })
        }
    };
    pb::JobRejection {
        reason: Some(reason),
    }
}

pub(crate) fn payload_out(p: Payload) -> pb::Payload {
    pb::Payload {
        data: p.data,
        encoding: p.encoding,
    }
}

pub(crate) fn trace_context_out(t: TraceContext) -> pb::TraceContext {
    pb::TraceContext {
        traceparent: t.traceparent,
        tracestate: t.tracestate,
    }
}

pub(crate) fn job_out(j: Job) -> pb::Job {
    pb::Job {
        id: j.id.to_string(),
        job_type: j.job_type,
        payload: j.payload.map(payload_out),
        priority: u32::from(j.priority),
        trace_context: j.trace_context.map(trace_context_out),
        enqueued_at: Some(ms_timestamp(j.enqueued_at)),
        attempt: j.attempt,
        max_attempts: j.max_attempts,
        lease_expires_at: j.lease_expires_at.map(ms_timestamp),
        custom: j
            .custom
            .into_iter()
            .map(|(k, v)| (k, value_out(v)))
            .collect(),
        scheduled_at: j.scheduled_at.map(ms_timestamp),
        queue: j.queue,
    }
}

pub(crate) fn cause_out(c: DeadLetterCause) -> pb::DeadLetterCause {
    match c {
        DeadLetterCause::AttemptsExhausted => pb::DeadLetterCause::AttemptsExhausted,
        DeadLetterCause::Rejected => pb::DeadLetterCause::Rejected,
        DeadLetterCause::LeaseExpired => pb::DeadLetterCause::LeaseExpired,
        DeadLetterCause::Admin => pb::DeadLetterCause::Admin,
    }
}

pub(crate) fn dead_letter_out(d: DeadLetter) -> pb::DeadLetterRecord {
    pb::DeadLetterRecord {
        job: Some(job_out(d.job)),
        cause: cause_out(d.cause) as i32,
        failed_at: Some(ms_timestamp(d.failed_at)),
        final_attempt: d.final_attempt,
        last_reason: d.last_reason,
    }
}

/// A job's state on the wire (`sepp.v1.JobState`, which `sepp.admin.v1.JobInfo.state` uses
/// too, with the numbers of the older `sepp.admin.v1.JobState`).
pub(crate) fn job_state_out(s: crate::domain::JobState) -> pb::JobState {
    use crate::domain::JobState as S;
    match s {
        S::Scheduled => pb::JobState::Scheduled,
        S::Ready => pb::JobState::Ready,
        S::InFlight => pb::JobState::InFlight,
        S::DeadLettered => pb::JobState::DeadLettered,
        S::Acked => pb::JobState::Acked,
        S::Deleted => pb::JobState::Deleted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_millisecond_negative_durations_stay_negative() {
        // -5 ns: a negative wait is refused, never read as "no wait".
        assert_eq!(
            duration_ms(&Duration {
                seconds: 0,
                nanos: -5
            }),
            -1
        );
        assert_eq!(
            duration_ms(&Duration {
                seconds: -1,
                nanos: -500_000_000
            }),
            -1500
        );
    }

    #[test]
    fn sub_millisecond_positive_durations_stay_positive() {
        assert_eq!(
            duration_ms(&Duration {
                seconds: 0,
                nanos: 1
            }),
            1
        );
        assert_eq!(
            duration_ms(&Duration {
                seconds: 0,
                nanos: 0
            }),
            0
        );
        assert_eq!(
            duration_ms(&Duration {
                seconds: -1,
                nanos: 0
            }),
            -1000
        );
        assert_eq!(
            duration_ms(&Duration {
                seconds: 2,
                nanos: 500_000_000
            }),
            2500
        );
    }

    fn extreme_job(len: usize, custom: usize, value: fn(usize) -> Value) -> Job {
        use crate::domain::JobId;
        Job {
            id: JobId(u128::MAX),
            queue: "q".repeat(len),
            job_type: "t".repeat(len),
            payload: Some(Payload {
                data: vec![0xff; len],
                encoding: "e".repeat(len),
            }),
            priority: 9,
            trace_context: Some(TraceContext {
                traceparent: "p".repeat(len),
                tracestate: Some("s".repeat(len)),
            }),
            enqueued_at: i64::MIN,
            attempt: u32::MAX,
            max_attempts: u32::MAX,
            lease_expires_at: Some(i64::MAX),
            custom: (0..custom).map(|i| (format!("k{i}"), value(i))).collect(),
            scheduled_at: Some(-1),
        }
    }

    /// A job at every 4096-byte bound with 64 custom entries, and those bounds.
    fn largest_job_of_its_bounds() -> (Job, crate::queue::reply::JobBounds) {
        let job = extreme_job(4096, 64, |_| Value::Int(-1));
        let custom_total = job
            .custom
            .iter()
            .map(|(k, v)| k.len() as u64 + v.counted_bytes())
            .sum();
        let b = crate::queue::reply::JobBounds {
            queue_name: 4096,
            job_type: 4096,
            payload: 4096,
            encoding: 4096,
            trace_context: 4096,
            custom_entries: 64,
            custom_total,
        };
        (job, b)
    }

    #[test]
    fn the_reply_bound_is_at_least_the_real_encoding_of_extreme_jobs() {
        use crate::queue::reply::job_bytes;
        use prost::Message;
        let values: [fn(usize) -> Value; 5] = [
            |_| Value::Int(i64::MIN),
            |_| Value::Bool(true),
            |_| Value::Double(f64::MAX),
            |_| Value::String(String::new()),
            |i| Value::String("v".repeat(i * 37)),
        ];
        // Lengths around the varint steps (127/128, 16 383/16 384, 2 097 151/2 097 152).
        for len in [0, 1, 127, 128, 16_383, 16_384, 2_097_152] {
            for (v, value) in values.iter().enumerate() {
                for custom in [0, 1, 64, 300] {
                    let job = extreme_job(len, custom, *value);
                    let bound = job_bytes(&job);
                    let reply = pb::ReserveResponse {
                        jobs: vec![job_out(job)],
                    };
                    let real = reply.encoded_len() as u64;
                    assert!(
                        bound >= real,
                        "len {len}, value kind {v}, {custom} entries: bound {bound} < {real}"
                    );
                }
            }
        }
        // And the bound of the largest job the limits accept covers such a job.
        let (job, b) = largest_job_of_its_bounds();
        let reply = pb::ReserveResponse {
            jobs: vec![job_out(job)],
        };
        assert!(b.reply_bytes() >= reply.encoded_len() as u64);
    }

    #[test]
    fn the_dead_letter_bound_is_at_least_the_real_encoding_in_drain_and_list_replies() {
        use crate::queue::reply::dead_letter_bytes;
        use prost::Message;
        let dead = |job: Job, reason: Option<String>| DeadLetter {
            job,
            cause: DeadLetterCause::AttemptsExhausted,
            failed_at: i64::MIN,
            final_attempt: u32::MAX,
            last_reason: reason,
        };
        for len in [0, 1, 127, 128, 16_383, 16_384, 2_097_152] {
            for reason in [None, Some(String::new()), Some("r".repeat(len))] {
                let d = dead(extreme_job(len, 64, |_| Value::Int(i64::MIN)), reason);
                let bound = dead_letter_bytes(&d) + crate::queue::reply::PAGE_TOKEN_BYTES;
                let drain = pb::DrainDeadLettersResponse {
                    records: vec![dead_letter_out(d.clone())],
                };
                let list = sepp_proto::admin::v1::ListDeadLettersResponse {
                    records: vec![dead_letter_out(d)],
                    next_page_token: "f".repeat(48),
                };
                for real in [drain.encoded_len(), list.encoded_len()] {
                    assert!(bound >= real as u64, "len {len}: bound {bound} < {real}");
                }
            }
        }
        // The bound of the largest dead letter the limits accept covers such a record.
        let (job, b) = largest_job_of_its_bounds();
        let list = sepp_proto::admin::v1::ListDeadLettersResponse {
            records: vec![dead_letter_out(dead(job, Some("r".repeat(4096))))],
            next_page_token: "f".repeat(48),
        };
        assert!(b.dead_letter_reply_bytes(4096) >= list.encoded_len() as u64);
    }

    #[test]
    fn invalid_well_known_type_encodings_name_what_is_wrong() {
        let bad = [
            (1, 1_000_000_000, "nanos is 1000000000"),
            (1, -1, "same sign"),
            (-1, 1, "same sign"),
            (315_576_000_001, 0, "seconds is 315576000001"),
        ];
        for (seconds, nanos, says) in bad {
            let e = duration_arg("lease_duration", Some(&Duration { seconds, nanos })).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(
                e.message().starts_with("lease_duration is not a valid"),
                "{}",
                e.message()
            );
            assert!(e.message().contains(says), "{}", e.message());
        }
        assert_eq!(
            duration_arg(
                "d",
                Some(&Duration {
                    seconds: -2,
                    nanos: -5
                })
            )
            .unwrap(),
            // Rounded away from zero, as a positive one is (`duration_ms`).
            Some(-2001)
        );
        assert!(
            timestamp_checked(&Timestamp {
                seconds: 0,
                nanos: -1
            })
            .is_err()
        );
        assert!(
            timestamp_checked(&Timestamp {
                seconds: 253_402_300_800,
                nanos: 0
            })
            .is_err()
        );
        assert_eq!(
            timestamp_checked(&Timestamp {
                seconds: 1,
                nanos: 5_000_000
            }),
            Ok(1005)
        );
    }

    #[test]
    fn timestamps_round_trip_at_millisecond_precision() {
        for ms in [0, 1, 999, 1_700_000_000_123, -1] {
            assert_eq!(timestamp_ms(&ms_timestamp(ms)), ms);
        }
    }
}
