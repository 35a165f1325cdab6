//! Requests: [`EnqueueRequest`] (with the client-side validation, written once here for every
//! language), [`ReserveOptions`] and [`NackRetry`].

use crate::error::Rejection;
use crate::job::{Payload, TraceContext, Value};
use sepp_proto::v1 as pb;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// One job to enqueue. Build it with [`EnqueueRequest::new`] and the `with_*` methods.
///
/// Structural checks ([`EnqueueRequest::validate`]) run when the request is sent (and in the
/// bindings, when it is constructed); the idempotency key's length is checked against the
/// server's advertised `max_idempotency_key_bytes` before anything is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueRequest {
    /// Target queue; non-empty.
    pub queue: String,
    /// Job type; non-empty.
    pub job_type: String,
    /// Optional data.
    pub payload: Option<Payload>,
    /// Optional idempotency key: 1 to `max_idempotency_key_bytes` UTF-8 bytes (256 by default),
    /// compared byte for byte, scoped to the queue.
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
    /// [`Rejection::InvalidRequest`] when `queue` or `job_type` is empty.
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
        if r.queue.is_empty() {
            return Err(Rejection::invalid("queue is empty"));
        }
        if r.job_type.is_empty() {
            return Err(Rejection::invalid("job_type is empty"));
        }
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

    /// The structural checks: non-empty names, priority 0–9, max attempts ≥ 1, a non-empty
    /// key, a non-empty payload and encoding, non-empty custom keys, a non-empty traceparent.
    ///
    /// # Errors
    /// [`Rejection::InvalidRequest`] naming the field.
    pub fn validate(&self) -> Result<(), Rejection> {
        if self.queue.is_empty() {
            return Err(Rejection::invalid("queue is empty"));
        }
        if self.job_type.is_empty() {
            return Err(Rejection::invalid("job_type is empty"));
        }
        if let Some(p) = &self.payload {
            if p.data.is_empty() {
                return Err(Rejection::invalid(
                    "payload.data is empty: omit the payload when there is no data",
                ));
            }
            if p.encoding.is_empty() {
                return Err(Rejection::invalid("payload.encoding is empty"));
            }
        }
        if self.idempotency_key.as_deref() == Some("") {
            return Err(Rejection::invalid(
                "idempotency_key is empty: omit it, or send 1 or more bytes",
            ));
        }
        if let Some(p) = self.priority
            && p > 9
        {
            return Err(Rejection::invalid(format!(
                "priority is {p}: allowed 0 (lowest) to 9 (highest)"
            )));
        }
        if self.max_attempts == Some(0) {
            return Err(Rejection::invalid("max_attempts is 0: must be at least 1"));
        }
        if self.custom.keys().any(String::is_empty) {
            return Err(Rejection::invalid("custom has an empty key"));
        }
        if let Some(t) = &self.trace_context
            && t.traceparent.is_empty()
        {
            return Err(Rejection::invalid("trace_context.traceparent is empty"));
        }
        Ok(())
    }

    /// [`EnqueueRequest::validate`], then the key length against `max_key_bytes`.
    ///
    /// # Errors
    /// [`Rejection::InvalidRequest`] or [`Rejection::IdempotencyKeyTooLong`].
    pub fn check(&self, max_key_bytes: u32) -> Result<(), Rejection> {
        self.validate()?;
        if let Some(k) = &self.idempotency_key
            && k.len() > max_key_bytes as usize
        {
            return Err(Rejection::IdempotencyKeyTooLong {
                limit: max_key_bytes,
                actual: k.len() as u64,
            });
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
            trace_context: self.trace_context.as_ref().map(|t| pb::TraceContext {
                traceparent: t.traceparent.clone(),
                tracestate: t.tracestate.clone(),
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
        if self.lease_duration.is_zero() {
            return Err("lease_duration is 0: it must be positive".into());
        }
        if self.max_jobs == Some(0) {
            return Err("max_jobs is 0: ask for at least 1 job".into());
        }
        Ok(())
    }
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
