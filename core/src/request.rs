//! Requests: [`EnqueueRequest`] (with the client-side validation, written once here for every
//! language), [`ReserveOptions`] and [`NackRetry`].

use crate::client::AdvertisedLimits;
use crate::error::Rejection;
use crate::job::{Payload, TraceContext, Value};
use sepp_proto::v1 as pb;
use sepp_rules::{JobShape, PayloadShape};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// One job to enqueue. Build it with [`EnqueueRequest::new`] and the `with_*` methods.
///
/// The structural checks ([`EnqueueRequest::validate`]) run when the request is sent, in every
/// language; once the client knows the server's limits (from `GetServerInfo`, which
/// `SeppClient::connect` calls) it also checks the lengths up to the idempotency key's before
/// anything is sent. A client that does not know them yet leaves the lengths to the server.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueRequest {
    /// Target queue: non-empty, not `.` or `..`, no `/`, no control or invisible characters.
    pub queue: String,
    /// Job type; non-empty.
    pub job_type: String,
    /// Optional data.
    pub payload: Option<Payload>,
    /// Optional idempotency key: 1 to the server's `max_idempotency_key_bytes` UTF-8 bytes
    /// (256 unless configured otherwise), compared byte for byte, scoped to the queue.
    pub idempotency_key: Option<String>,
    /// 0 (lowest) to 9 (highest); unset takes the queue's default.
    pub priority: Option<u32>,
    /// At least 1; unset takes the queue's default; the server clamps it to its ceiling.
    pub max_attempts: Option<u32>,
    /// Custom entries; keys non-empty.
    pub custom: BTreeMap<String, Value>,
    /// W3C trace context.
    pub trace_context: Option<TraceContext>,
    /// Not ready before this time; unset (or past) means at once.
    pub scheduled_at: Option<SystemTime>,
}

impl EnqueueRequest {
    /// A request for a `job_type` job on `queue`.
    ///
    /// # Errors
    /// [`Rejection::InvalidRequest`] when `queue` breaks the queue-name rule (empty, `.` or
    /// `..`, a `/`, a control or invisible character) or `job_type` is empty: the first two
    /// structural rules, with the messages the server gives.
    pub fn new(queue: impl Into<String>, job_type: impl Into<String>) -> Result<Self, Rejection> {
        let r = EnqueueRequest {
            queue: queue.into(),
            job_type: job_type.into(),
            payload: None,
            idempotency_key: None,
            priority: None,
            max_attempts: None,
            custom: BTreeMap::new(),
            trace_context: None,
            scheduled_at: None,
        };
        r.validate()?;
        Ok(r)
    }

    /// Sets the payload: `data` (non-empty) and its `encoding` hint, e.g. `application/json`.
    #[must_use]
    pub fn with_payload(mut self, data: impl Into<Vec<u8>>, encoding: impl Into<String>) -> Self {
        self.payload = Some(Payload {
            data: data.into(),
            encoding: encoding.into(),
        });
        self
    }

    /// Sets the idempotency key. Derive it from what the job is about (an order id, an event
    /// id), so that a retry of the same logical enqueue carries the same key.
    #[must_use]
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets the priority, 0 (lowest) to 9 (highest).
    #[must_use]
    pub fn with_priority(mut self, priority: u32) -> Self {
        self.priority = Some(priority);
        self
    }

    /// Sets how many deliveries the job gets before it is dead-lettered (at least 1).
    #[must_use]
    pub fn with_max_attempts(mut self, max_attempts: u32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Replaces the custom map.
    #[must_use]
    pub fn with_custom(mut self, custom: BTreeMap<String, Value>) -> Self {
        self.custom = custom;
        self
    }

    /// Adds one custom entry.
    #[must_use]
    pub fn with_custom_entry(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.custom.insert(key.into(), value.into());
        self
    }

    /// Sets the W3C trace context.
    #[must_use]
    pub fn with_trace_context(
        mut self,
        traceparent: impl Into<String>,
        tracestate: Option<String>,
    ) -> Self {
        self.trace_context = Some(TraceContext {
            traceparent: traceparent.into(),
            tracestate,
        });
        self
    }

    /// Delays the job until `at`.
    #[must_use]
    pub fn with_scheduled_at(mut self, at: SystemTime) -> Self {
        self.scheduled_at = Some(at);
        self
    }

    /// The structural rules of the protocol, in its order and with the server's messages
    /// (`sepp_rules::check_structure`): the queue-name rule, a non-empty job type, a non-empty
    /// payload and encoding, a non-empty key, priority 0–9, max attempts ≥ 1, a non-empty
    /// traceparent, a `scheduled_at` within the years 1 to 9999, non-empty custom keys.
    ///
    /// # Errors
    /// [`Rejection::InvalidRequest`] naming the field.
    pub fn validate(&self) -> Result<(), Rejection> {
        let scheduled = self.scheduled_at.map(|t| {
            let ts = crate::job::system_time_to_proto(t);
            sepp_rules::timestamp_problem(ts.seconds, ts.nanos)
        });
        let shape = JobShape {
            queue: &self.queue,
            job_type: &self.job_type,
            payload: self.payload.as_ref().map(|p| PayloadShape {
                data_len: p.data.len(),
                encoding: &p.encoding,
            }),
            idempotency_key: self.idempotency_key.as_deref(),
            priority: self.priority,
            max_attempts: self.max_attempts,
            traceparent: self.trace_context.as_ref().map(|t| t.traceparent.as_str()),
            scheduled_at: scheduled.as_ref().map(|p| match p {
                None => Ok(()),
                Some(why) => Err(why.as_str()),
            }),
        };
        // Every custom value of the core holds a value: only the key can be wrong.
        let custom = self.custom.keys().map(|k| (k.as_str(), true));
        sepp_rules::check_structure(&shape, custom).map_err(Rejection::invalid)
    }

    /// [`EnqueueRequest::validate`], then the key length against `max_key_bytes`.
    ///
    /// # Errors
    /// [`Rejection::InvalidRequest`] or [`Rejection::IdempotencyKeyTooLong`].
    pub fn check(&self, max_key_bytes: u32) -> Result<(), Rejection> {
        self.validate()?;
        if let Some(k) = &self.idempotency_key {
            sepp_rules::check_length(k, max_key_bytes).map_err(|t| {
                Rejection::IdempotencyKeyTooLong {
                    limit: t.limit,
                    actual: t.actual,
                }
            })?;
        }
        Ok(())
    }

    /// The checks a client makes before sending: the structural rules, then, once the server
    /// has advertised its limits, the rules up to the key length that need nothing but those
    /// limits, in the protocol's order (queue name length, job type length, key length).
    ///
    /// In strict mode the server checks that the queue is declared before any length, which a
    /// client cannot know, so then the lengths are left to the server: whatever the job, the
    /// rejection is the one the server would give. The one exception is a queue's
    /// `allowed_job_types`, which the server checks between the job type's length and the
    /// key's and does not advertise: a job breaking both gets `IDEMPOTENCY_KEY_TOO_LONG`
    /// from the client and `JOB_TYPE_NOT_ALLOWED` from the server.
    pub(crate) fn check_before_sending(
        &self,
        limits: Option<&AdvertisedLimits>,
    ) -> Result<(), Rejection> {
        self.validate()?;
        let Some(l) = limits.filter(|l| !l.strict_queues) else {
            return Ok(());
        };
        let within = |value: &str, limit: u32| match limit {
            0 => Ok(()), // not advertised
            _ => sepp_rules::check_length(value, limit),
        };
        within(&self.queue, l.max_queue_name_bytes).map_err(|t| Rejection::QueueNameTooLong {
            limit: t.limit,
            actual: t.actual,
        })?;
        within(&self.job_type, l.max_job_type_bytes).map_err(|t| {
            Rejection::JobTypeNameTooLong {
                limit: t.limit,
                actual: t.actual,
            }
        })?;
        if let Some(k) = &self.idempotency_key {
            within(k, l.max_idempotency_key_bytes).map_err(|t| {
                Rejection::IdempotencyKeyTooLong {
                    limit: t.limit,
                    actual: t.actual,
                }
            })?;
        }
        Ok(())
    }

    /// Whether the request carries an idempotency key (so a retry is a dedup hit).
    pub fn is_keyed(&self) -> bool {
        self.idempotency_key.is_some()
    }

    pub(crate) fn to_proto(&self) -> pb::EnqueueRequest {
        pb::EnqueueRequest {
            queue: self.queue.clone(),
            job_type: self.job_type.clone(),
            payload: self.payload.as_ref().map(|p| pb::Payload {
                data: p.data.clone(),
                encoding: p.encoding.clone(),
            }),
            idempotency_key: self.idempotency_key.clone(),
            priority: self.priority,
            max_attempts: self.max_attempts,
            // The request's own context, else the producer's current one (crate::trace).
            trace_context: crate::trace::current_or(
                self.trace_context.as_ref(),
                crate::trace::current_context(),
            )
            .map(|t| pb::TraceContext {
                traceparent: t.traceparent,
                tracestate: t.tracestate,
            }),
            custom: self
                .custom
                .iter()
                .map(|(k, v)| (k.clone(), v.to_proto()))
                .collect(),
            scheduled_at: self.scheduled_at.map(crate::job::system_time_to_proto),
        }
    }
}

/// What a Reserve asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ReserveOptions {
    /// Queues to poll, in order (at least one).
    pub queues: Vec<String>,
    /// How long the jobs are leased (required, positive; the server clamps it to the smallest
    /// `max_lease_duration_ms` of the queues).
    pub lease_duration: Duration,
    /// How long to wait when no job is ready; `None` returns at once.
    pub wait_timeout: Option<Duration>,
    /// At most this many jobs (default 1; the server clamps to `max_reserve_batch`).
    pub max_jobs: Option<u32>,
    /// A label for the lease, shown by job inspection.
    pub worker_id: Option<String>,
}

impl ReserveOptions {
    /// Reserve from `queues` with leases of `lease_duration`, not waiting.
    pub fn new<I, S>(queues: I, lease_duration: Duration) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ReserveOptions {
            queues: queues.into_iter().map(Into::into).collect(),
            lease_duration,
            wait_timeout: None,
            max_jobs: None,
            worker_id: None,
        }
    }

    /// Waits up to `d` for a job.
    #[must_use]
    pub fn with_wait_timeout(mut self, d: Duration) -> Self {
        self.wait_timeout = Some(d);
        self
    }

    /// Takes up to `n` jobs.
    #[must_use]
    pub fn with_max_jobs(mut self, n: u32) -> Self {
        self.max_jobs = Some(n);
        self
    }

    /// Labels the lease.
    #[must_use]
    pub fn with_worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.queues.is_empty() {
            return Err("queues is empty: list at least one queue".into());
        }
        if let Some(q) = self.queues.iter().find(|q| q.is_empty()) {
            return Err(format!("queues contains an empty name ({q:?})"));
        }
        check_lease(self.lease_duration)?;
        if self.max_jobs == Some(0) {
            return Err("max_jobs is 0: ask for at least 1 job".into());
        }
        Ok(())
    }
}

/// The rule of every lease a client asks for (a reserve's, an extension's, a worker's): at
/// least 1 ms, the unit the server counts leases in (it would round a shorter one up), and no
/// longer than the protocol can carry.
pub(crate) fn check_lease(d: Duration) -> Result<(), String> {
    let name = "lease_duration";
    let max = sepp_proto::DURATION_MAX_SECONDS.unsigned_abs();
    if d.is_zero() {
        return Err(format!("{name} is 0: it must be positive"));
    }
    if d < Duration::from_millis(1) {
        return Err(format!(
            "{name} is {d:?}: it must be at least 1 ms (leases are counted in milliseconds)"
        ));
    }
    if d.as_secs() > max {
        return Err(format!(
            "{name} is {} s: it must be at most {max} s (the protocol's \
             Duration; the server clamps a lease to its max_lease_duration_ms anyway)",
            d.as_secs()
        ));
    }
    Ok(())
}

/// What to do with a job after a failed delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NackRetry {
    /// The queue's retry policy (`retry_delay_ms`, `retry_backoff`); dead-lettered on the
    /// last attempt.
    #[default]
    Default,
    /// Retry after this delay (the server clamps it to the schedule horizon); dead-lettered
    /// on the last attempt.
    Delay(Duration),
    /// Dead-letter at once, whatever attempts remain.
    DeadLetter,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_names_are_refused_on_construction() {
        assert!(matches!(
            EnqueueRequest::new("", "t"),
            Err(Rejection::InvalidRequest { .. })
        ));
        assert!(matches!(
            EnqueueRequest::new("q", ""),
            Err(Rejection::InvalidRequest { .. })
        ));
    }

    #[test]
    fn a_lease_under_a_millisecond_is_refused_before_sending() {
        let lease = |d| ReserveOptions::new(["q"], d).validate();
        assert_eq!(
            lease(Duration::ZERO).unwrap_err(),
            "lease_duration is 0: it must be positive"
        );
        assert_eq!(
            lease(Duration::from_micros(500)).unwrap_err(),
            "lease_duration is 500µs: it must be at least 1 ms (leases are counted in milliseconds)"
        );
        assert!(lease(Duration::from_millis(1)).is_ok());
        assert!(lease(Duration::from_secs(315_576_000_000)).is_ok());
        assert_eq!(
            lease(Duration::from_secs(315_576_000_001)).unwrap_err(),
            "lease_duration is 315576000001 s: it must be at most 315576000000 s (the \
             protocol's Duration; the server clamps a lease to its max_lease_duration_ms anyway)"
        );
    }

    #[test]
    fn key_length_is_checked_in_utf8_bytes() {
        let ok = EnqueueRequest::new("q", "t")
            .unwrap()
            .with_idempotency_key("é".repeat(128));
        assert!(ok.check(256).is_ok());
        let long = EnqueueRequest::new("q", "t")
            .unwrap()
            .with_idempotency_key("€".repeat(86));
        assert_eq!(
            long.check(256),
            Err(Rejection::IdempotencyKeyTooLong {
                limit: 256,
                actual: 258
            })
        );
        let empty = EnqueueRequest::new("q", "t")
            .unwrap()
            .with_idempotency_key("");
        assert!(matches!(
            empty.check(256),
            Err(Rejection::InvalidRequest { .. })
        ));
    }

    #[test]
    fn priority_and_attempts_are_range_checked() {
        let r = EnqueueRequest::new("q", "t").unwrap().with_priority(10);
        assert!(matches!(
            r.validate(),
            Err(Rejection::InvalidRequest { .. })
        ));
        let r = EnqueueRequest::new("q", "t").unwrap().with_max_attempts(0);
        assert!(matches!(
            r.validate(),
            Err(Rejection::InvalidRequest { .. })
        ));
    }
}
