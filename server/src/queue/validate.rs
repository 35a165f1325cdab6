//! Validation of one enqueued job, in the protocol's documented order, and resolution of its
//! defaults. Pure: no I/O, so every rule is unit-tested here.
//!
//! Order: structure (→ `InvalidRequest`) → strict-mode unknown queue → queue name length →
//! job type length → allowed job types → idempotency key length → payload size → allowed
//! encodings → custom entry count → each custom key length → total custom bytes → schedule
//! horizon. Commit-time checks (dedup hits, `max_queue_depth`) are decided by `queue::enqueue`
//! inside the store's transition.
//! All lengths are UTF-8 bytes.

use super::dedup;
use super::lifecycle;
use super::limits::Limits;
use super::model::{EnqueueInput, Rejection};
use crate::config::{KeyConflict, OnDuplicate};
use crate::domain::{JobId, NewJob, Placement, Replacement, UnixMs, Value};
use crate::error::QueueError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The one queue-name rule and what a call does with the name: written once, in `sepp-rules`,
/// for the server and the client core (`rules/src/lib.rs`). The length limit is checked apart
/// ([`check_queue_name`]), because an enqueue reports it later, in the protocol's order.
pub use sepp_rules::{NameUse, queue_name_shape};

/// [`queue_name_shape`] and the length limit, for the calls that take queue names as request
/// arguments (everything but enqueue, whose jobs report rejections instead).
///
/// # Errors
/// [`QueueError::InvalidArgument`] naming `field`, and the limit when the name is too long.
pub fn check_queue_name(
    field: &str,
    name: &str,
    limits: &Limits,
    use_: NameUse,
) -> Result<(), QueueError> {
    if name.len() > limits.max_queue_name_bytes as usize {
        return Err(QueueError::InvalidArgument(format!(
            "{field} is {} bytes: max_queue_name_bytes is {}",
            name.len(),
            limits.max_queue_name_bytes
        )));
    }
    queue_name_shape(name, use_)
        .map_err(|why| QueueError::InvalidArgument(format!("{field}: {why}")))
}

/// A request-level string's length against its limit, in bytes.
///
/// # Errors
/// [`QueueError::InvalidArgument`] naming `field` and the limit key.
pub fn check_length(field: &str, value: &str, key: &str, limit: u32) -> Result<(), QueueError> {
    if value.len() > limit as usize {
        return Err(QueueError::InvalidArgument(format!(
            "{field} is {} bytes: {key} is {limit}",
            value.len()
        )));
    }
    Ok(())
}

/// `s` cut to at most `max` bytes at a UTF-8 character boundary (a nack reason: it is kept
/// shortened rather than refused, since refusing a nack would strand its job); the client cuts
/// it the same way (`sepp_rules::truncate_utf8`).
pub fn truncate_utf8(s: String, max: u32) -> String {
    sepp_rules::truncate_utf8(s, max as usize)
}

/// Validates `input` and resolves it into a [`NewJob`] with a fresh id.
///
/// # Errors
/// The first [`Rejection`] in the documented order.
pub fn validate_job(
    input: EnqueueInput,
    limits: &Limits,
    now: UnixMs,
) -> Result<NewJob, Rejection> {
    check_structure(&input)?;

    if limits.strict_queues && !limits.is_declared(&input.queue) {
        return Err(Rejection::UnknownQueue { queue: input.queue });
    }
    if input.queue.len() > limits.max_queue_name_bytes as usize {
        return Err(Rejection::QueueNameTooLong {
            limit: limits.max_queue_name_bytes,
            actual: input.queue.len() as u64,
        });
    }
    if input.job_type.len() > limits.max_job_type_bytes as usize {
        return Err(Rejection::JobTypeNameTooLong {
            limit: limits.max_job_type_bytes,
            actual: input.job_type.len() as u64,
        });
    }
    let policy = limits.policy(&input.queue);
    if let Some(allowed) = &policy.allowed_job_types
        && !allowed.contains(&input.job_type)
    {
        return Err(Rejection::JobTypeNotAllowed {
            job_type: input.job_type,
            allowed: allowed.clone(),
        });
    }
    if let Some(key) = &input.idempotency_key {
        dedup::check_key_length(key, limits.max_idempotency_key_bytes)?;
    }
    if let Some(p) = &input.payload {
        if p.data.len() as u64 > policy.max_payload_bytes {
            return Err(Rejection::PayloadTooLarge {
                limit: policy.max_payload_bytes,
                actual: p.data.len() as u64,
            });
        }
        if let Some(allowed) = &policy.allowed_encodings
            && !allowed.contains(&p.encoding)
        {
            return Err(Rejection::EncodingNotAllowed {
                encoding: p.encoding.clone(),
                allowed: allowed.clone(),
            });
        }
    }
    if input.custom.len() > policy.max_custom_entries as usize {
        return Err(Rejection::CustomEntriesTooMany {
            limit: policy.max_custom_entries,
            actual: u32::try_from(input.custom.len()).unwrap_or(u32::MAX),
        });
    }
    let mut total: u64 = 0;
    for (k, v) in &input.custom {
        if k.len() > policy.max_custom_key_bytes as usize {
            return Err(Rejection::CustomKeyTooLong {
                key: k.clone(),
                limit: policy.max_custom_key_bytes,
                actual: k.len() as u64,
            });
        }
        total += k.len() as u64 + v.as_ref().map_or(0, Value::counted_bytes);
    }
    if total > policy.max_custom_total_bytes {
        return Err(Rejection::CustomMapTooLarge {
            limit: policy.max_custom_total_bytes,
            actual: total,
        });
    }
    // Scheduled only when its time is still ahead ([`lifecycle::placement`]): a past or
    // present time means ready at once.
    let sends_schedule = matches!(input.scheduled_at, Some(Ok(_)));
    let scheduled_at = match input.scheduled_at {
        Some(Ok(at)) => match lifecycle::placement(at, now) {
            Placement::Scheduled { due } => {
                let horizon = i64::try_from(policy.max_schedule_horizon_ms).unwrap_or(i64::MAX);
                if due - now > horizon {
                    return Err(Rejection::ScheduledTooFar {
                        horizon_ms: policy.max_schedule_horizon_ms,
                        actual: due,
                    });
                }
                Some(due)
            }
            Placement::Ready => None,
        },
        _ => None,
    };
    check_field_sizes(&input, limits)?;

    let priority = input.priority.unwrap_or(policy.default_priority) as u8;
    let max_attempts = input
        .max_attempts
        .unwrap_or(policy.default_max_attempts)
        .min(policy.max_attempts_ceiling);
    let custom: BTreeMap<String, Value> = input
        .custom
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    let dedup = input.idempotency_key.map(|key| {
        let fingerprint = (policy.key_conflict == KeyConflict::Reject).then(|| {
            dedup::fingerprint(&input.job_type, input.payload.as_ref(), priority, &custom)
        });
        dedup::claim(key, policy.dedup_window_ms, now, fingerprint)
    });
    let mut job = NewJob {
        id: JobId::ordered(now),
        queue: Arc::from(input.queue),
        job_type: input.job_type,
        payload: input.payload,
        priority,
        max_attempts,
        trace_context: input.trace_context,
        custom,
        enqueued_at: now,
        scheduled_at,
        dedup,
        max_queue_depth: policy.max_queue_depth,
        reply_bytes: 0,
    };
    job.reply_bytes = super::reply::new_job_bytes(&job);
    if policy.on_duplicate == OnDuplicate::ReplacePending
        && let Some(claim) = job.dedup.as_mut()
    {
        // A replaced job keeps its own job type: count it at the longest one allowed.
        let kept_type = u64::from(limits.max_job_type_bytes);
        let reply_bytes =
            u64::from(job.reply_bytes).saturating_sub(job.job_type.len() as u64) + kept_type;
        claim.replace = Some(Replacement {
            placement: sends_schedule.then_some(match job.scheduled_at {
                Some(due) => Placement::Scheduled { due },
                None => Placement::Ready,
            }),
            reply_bytes: u32::try_from(reply_bytes).unwrap_or(u32::MAX),
        });
    }
    Ok(job)
}

/// The sizes of the fields without a rejection variant of their own (after the protocol's
/// ordered checks), reported as `InvalidRequest` naming the field and the limit.
fn check_field_sizes(input: &EnqueueInput, limits: &Limits) -> Result<(), Rejection> {
    let over = |field: &str, len: usize, key: &str, limit: u32| {
        (len > limit as usize)
            .then(|| Rejection::invalid(format!("{field} is {len} bytes: {key} is {limit}")))
    };
    let checks = [
        input.payload.as_ref().and_then(|p| {
            over(
                "payload.encoding",
                p.encoding.len(),
                "max_encoding_bytes",
                limits.max_encoding_bytes,
            )
        }),
        input.trace_context.as_ref().and_then(|t| {
            over(
                "trace_context.traceparent",
                t.traceparent.len(),
                "max_trace_context_bytes",
                limits.max_trace_context_bytes,
            )
        }),
        input.trace_context.as_ref().and_then(|t| {
            over(
                "trace_context.tracestate",
                t.tracestate.as_ref().map_or(0, String::len),
                "max_trace_context_bytes",
                limits.max_trace_context_bytes,
            )
        }),
    ];
    match checks.into_iter().flatten().next() {
        Some(r) => Err(r),
        None => Ok(()),
    }
}

/// The structural checks, all reported as `InvalidRequest` naming the field: the rules of
/// `sepp-rules`, which the client core applies before sending, with the same messages.
fn check_structure(input: &EnqueueInput) -> Result<(), Rejection> {
    let shape = sepp_rules::JobShape {
        queue: &input.queue,
        job_type: &input.job_type,
        payload: input.payload.as_ref().map(|p| sepp_rules::PayloadShape {
            data_len: p.data.len(),
            encoding: &p.encoding,
        }),
        idempotency_key: input.idempotency_key.as_deref(),
        priority: input.priority,
        max_attempts: input.max_attempts,
        traceparent: input.trace_context.as_ref().map(|t| t.traceparent.as_str()),
        scheduled_at: input
            .scheduled_at
            .as_ref()
            .map(|t| t.as_ref().map(|_| ()).map_err(String::as_str)),
    };
    let custom = input.custom.iter().map(|(k, v)| (k.as_str(), v.is_some()));
    sepp_rules::check_structure(&shape, custom).map_err(Rejection::invalid)
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;
    use crate::config::{Config, QueueConfig};
    use crate::domain::Payload;

    fn limits(strict: bool) -> Limits {
        let mut c = Config::default();
        c.server.strict_queues = strict;
        c.queues.push(QueueConfig {
            name: "typed".into(),
            allowed_job_types: Some(vec!["a".into()]),
            ..Default::default()
        });
        Limits::from_config(&c).unwrap()
    }

    fn job(queue: &str) -> EnqueueInput {
        EnqueueInput {
            queue: queue.into(),
            job_type: "t".into(),
            ..Default::default()
        }
    }

    #[test]
    fn structure_comes_before_length_checks() {
        let mut j = job("q");
        j.idempotency_key = Some(String::new());
        j.job_type = "x".repeat(1000);
        assert!(matches!(
            validate_job(j, &limits(false), 0),
            Err(Rejection::InvalidRequest { .. })
        ));
    }

    #[test]
    fn strict_unknown_queue_before_queue_name_length() {
        let j = job(&"q".repeat(600));
        assert_eq!(
            validate_job(j, &limits(true), 0),
            Err(Rejection::UnknownQueue {
                queue: "q".repeat(600)
            })
        );
        let j = job(&"q".repeat(600));
        assert_eq!(
            validate_job(j, &limits(false), 0),
            Err(Rejection::QueueNameTooLong {
                limit: 512,
                actual: 600
            })
        );
    }

    #[test]
    fn key_length_is_counted_in_utf8_bytes() {
        let mut j = job("q");
        j.idempotency_key = Some("é".repeat(128));
        assert!(validate_job(j, &limits(false), 0).is_ok());
        let mut j = job("q");
        j.idempotency_key = Some("€".repeat(86));
        assert_eq!(
            validate_job(j, &limits(false), 0),
            Err(Rejection::IdempotencyKeyTooLong {
                limit: 256,
                actual: 258
            })
        );
    }

    #[test]
    fn job_type_allow_list_comes_before_key_length() {
        let mut j = job("typed");
        j.job_type = "b".into();
        j.idempotency_key = Some("k".repeat(300));
        assert!(matches!(
            validate_job(j, &limits(false), 0),
            Err(Rejection::JobTypeNotAllowed { .. })
        ));
    }

    #[test]
    fn custom_bytes_count_keys_and_values() {
        let mut c = Config::default();
        c.limits.max_custom_total_bytes = 10;
        let l = Limits::from_config(&c).unwrap();
        let mut j = job("q");
        j.custom = vec![
            ("ab".into(), Some(Value::Int(1))),
            ("c".into(), Some(Value::Bool(true))),
        ];
        // 2 + 8 + 1 + 1 = 12 bytes
        assert_eq!(
            validate_job(j, &l, 0),
            Err(Rejection::CustomMapTooLarge {
                limit: 10,
                actual: 12
            })
        );
    }

    #[test]
    fn schedule_horizon_is_enforced_and_past_times_are_immediate() {
        let mut j = job("q");
        j.scheduled_at = Some(Ok(1_000 + 2_592_000_001));
        assert!(matches!(
            validate_job(j, &limits(false), 1_000),
            Err(Rejection::ScheduledTooFar { .. })
        ));
        let mut j = job("q");
        j.scheduled_at = Some(Ok(10));
        assert_eq!(
            validate_job(j, &limits(false), 1_000).unwrap().scheduled_at,
            None
        );
    }

    #[test]
    fn empty_allowed_encodings_forbid_every_payload() {
        let mut c = Config::default();
        c.limits.allowed_encodings = Some(vec![]);
        let l = Limits::from_config(&c).unwrap();
        let mut j = job("q");
        j.payload = Some(Payload {
            data: vec![1],
            encoding: "x".into(),
        });
        assert!(matches!(
            validate_job(j, &l, 0),
            Err(Rejection::EncodingNotAllowed { .. })
        ));
    }

    #[test]
    fn max_attempts_is_clamped_to_the_ceiling() {
        let mut j = job("q");
        j.max_attempts = Some(1_000);
        assert_eq!(
            validate_job(j, &limits(false), 0).unwrap().max_attempts,
            100
        );
    }
}
