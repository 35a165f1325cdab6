//! What the server sends back: acks, jobs, dead letters, server info.

use sepp_proto::prost_types;
use sepp_proto::v1 as pb;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A job's data and the hint for reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// The bytes.
    pub data: Vec<u8>,
    /// A hint such as a MIME type.
    pub encoding: String,
}

impl Payload {
    pub(crate) fn from_proto(p: pb::Payload) -> Self {
        Payload {
            data: p.data,
            encoding: p.encoding,
        }
    }
}

/// W3C trace context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `traceparent`.
    pub traceparent: String,
    /// `tracestate`.
    pub tracestate: Option<String>,
}

impl TraceContext {
    pub(crate) fn from_proto(t: pb::TraceContext) -> Self {
        TraceContext {
            traceparent: t.traceparent,
            tracestate: t.tracestate,
        }
    }
}

/// A custom map from the wire; an entry without a value (none is sent) is left out.
pub(crate) fn custom_from_proto(
    custom: impl IntoIterator<Item = (String, pb::PrimitiveValue)>,
) -> BTreeMap<String, Value> {
    custom
        .into_iter()
        .filter_map(|(k, v)| Value::from_proto(v).map(|v| (k, v)))
        .collect()
}

/// A value of a job's custom map.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Text.
    String(String),
    /// A double.
    Double(f64),
    /// A 64-bit integer.
    Int(i64),
    /// A boolean.
    Bool(bool),
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_string())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::String(v)
    }
}
impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Double(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

impl Value {
    pub(crate) fn to_proto(&self) -> pb::PrimitiveValue {
        use pb::primitive_value::Value as V;
        pb::PrimitiveValue {
            value: Some(match self {
                Value::String(s) => V::StringValue(s.clone()),
                Value::Double(d) => V::DoubleValue(*d),
                Value::Int(i) => V::IntValue(*i),
                Value::Bool(b) => V::BoolValue(*b),
            }),
        }
    }

    pub(crate) fn from_proto(v: pb::PrimitiveValue) -> Option<Self> {
        use pb::primitive_value::Value as V;
        v.value.map(|v| match v {
            V::StringValue(s) => Value::String(s),
            V::DoubleValue(d) => Value::Double(d),
            V::IntValue(i) => Value::Int(i),
            V::BoolValue(b) => Value::Bool(b),
        })
    }
}

/// The answer to an accepted enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueAck {
    /// The job's id (UUID v4): the new job's or, on a dedup hit, the original's.
    pub job_id: String,
    /// True when an earlier enqueue with the same idempotency key, inside the dedup window,
    /// already created `job_id`. That job may since have run or been dead-lettered: read it as
    /// "this enqueue is already accounted for".
    pub deduplicated: bool,
    /// On a hit, from a sepp server: where that job is at the time of the hit (`Ready` or
    /// `Scheduled`: it will run; `InFlight`: it is running; `Acked`: it ran;
    /// `DeadLettered`: it failed and is kept; `Deleted`: it failed and is gone). `None` when
    /// the job was created, or the server does not say (the public sepp).
    pub original_state: Option<crate::admin::JobState>,
    /// On a hit on a queue configured with `on_duplicate = "replace_pending"` (debounce): true
    /// when this enqueue's payload, encoding, custom map and trace context (and its
    /// `scheduled_at`, when set) replaced those of the job, which had not started yet;
    /// `original_state` is then where the job is after it. False otherwise, and from servers
    /// that do not replace (the public sepp).
    pub replaced: bool,
}

/// A leased job.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its type.
    pub job_type: String,
    /// Its data.
    pub payload: Option<Payload>,
    /// 0–9.
    pub priority: u32,
    /// Trace context.
    pub trace_context: Option<TraceContext>,
    /// When it was enqueued.
    pub enqueued_at: Option<SystemTime>,
    /// Which delivery this is, starting at 1. Send it back with ack, nack and extend.
    pub attempt: u32,
    /// Deliveries allowed before it is dead-lettered.
    pub max_attempts: u32,
    /// When the lease ends unless extended.
    pub lease_expires_at: Option<SystemTime>,
    /// Custom entries.
    pub custom: BTreeMap<String, Value>,
    /// When it was scheduled to become ready, if it was.
    pub scheduled_at: Option<SystemTime>,
}

impl Job {
    pub(crate) fn from_proto(j: pb::Job) -> Self {
        Job {
            id: j.id,
            queue: j.queue,
            job_type: j.job_type,
            payload: j.payload.map(Payload::from_proto),
            priority: j.priority,
            trace_context: j.trace_context.map(TraceContext::from_proto),
            enqueued_at: j.enqueued_at.as_ref().map(proto_to_system_time),
            attempt: j.attempt,
            max_attempts: j.max_attempts,
            lease_expires_at: j.lease_expires_at.as_ref().map(proto_to_system_time),
            custom: custom_from_proto(j.custom),
            scheduled_at: j.scheduled_at.as_ref().map(proto_to_system_time),
        }
    }

    /// Whether this is the last delivery the job gets.
    pub fn is_last_attempt(&self) -> bool {
        self.attempt >= self.max_attempts
    }
}

/// Why a job was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadLetterCause {
    /// Not given by the server.
    Unspecified,
    /// Failed on its last attempt.
    AttemptsExhausted,
    /// Nacked with the dead-letter strategy.
    Rejected,
    /// Its lease expired on its last attempt.
    LeaseExpired,
    /// Moved by an operator.
    Admin,
}

impl DeadLetterCause {
    pub(crate) fn from_proto(v: i32) -> Self {
        match pb::DeadLetterCause::try_from(v) {
            Ok(pb::DeadLetterCause::AttemptsExhausted) => DeadLetterCause::AttemptsExhausted,
            Ok(pb::DeadLetterCause::Rejected) => DeadLetterCause::Rejected,
            Ok(pb::DeadLetterCause::LeaseExpired) => DeadLetterCause::LeaseExpired,
            Ok(pb::DeadLetterCause::Admin) => DeadLetterCause::Admin,
            _ => DeadLetterCause::Unspecified,
        }
    }
}

/// A dead-lettered job.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterRecord {
    /// The job as last delivered.
    pub job: Job,
    /// Why it was dead-lettered.
    pub cause: DeadLetterCause,
    /// When.
    pub failed_at: Option<SystemTime>,
    /// The attempt that failed last.
    pub final_attempt: u32,
    /// The reason given by the last nack.
    pub last_reason: Option<String>,
}

impl DeadLetterRecord {
    pub(crate) fn from_proto(r: pb::DeadLetterRecord) -> Self {
        DeadLetterRecord {
            job: Job::from_proto(r.job.unwrap_or_default()),
            cause: DeadLetterCause::from_proto(r.cause),
            failed_at: r.failed_at.as_ref().map(proto_to_system_time),
            final_attempt: r.final_attempt,
            last_reason: r.last_reason,
        }
    }
}

/// What the server says about itself (server-wide defaults; a queue may differ).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerInfo {
    /// Server version.
    pub server_version: String,
    /// Protocol versions, `["v1"]`.
    pub supported_protocol_versions: Vec<String>,
    /// Server clock.
    pub server_time: Option<SystemTime>,
    /// Whether payload encodings are restricted.
    pub restricts_encodings: bool,
    /// Allowed encodings when restricted.
    pub allowed_encodings: Vec<String>,
    /// Largest payload, bytes.
    pub max_payload_bytes: u64,
    /// Most custom entries.
    pub max_custom_entries: u32,
    /// Largest custom map, bytes.
    pub max_custom_total_bytes: u64,
    /// Longest custom key, bytes.
    pub max_custom_key_bytes: u32,
    /// Longest queue name, bytes.
    pub max_queue_name_bytes: u32,
    /// Longest job type, bytes.
    pub max_job_type_bytes: u32,
    /// Longest idempotency key, bytes.
    pub max_idempotency_key_bytes: u32,
    /// Furthest schedule.
    pub max_schedule_horizon: Option<Duration>,
    /// Most jobs per enqueue batch.
    pub max_enqueue_batch: u32,
    /// Most jobs per Reserve.
    pub max_reserve_batch: u32,
    /// Most queues per Reserve.
    pub max_reserve_queues: u32,
    /// Longest Reserve wait.
    pub max_wait_timeout: Option<Duration>,
    /// Longest lease.
    pub max_lease_duration: Option<Duration>,
    /// Strict mode.
    pub strict_queues: bool,
    /// Dead letters are kept.
    pub dead_letter_retention_enabled: bool,
    /// Server-wide default dedup window (sepp servers only; `None` from others).
    pub dedup_window: Option<Duration>,
    /// Longest nack reason kept, bytes; longer reasons are truncated (0: not advertised).
    pub max_reason_bytes: u32,
    /// Largest Reserve reply, bytes (0: not advertised).
    pub max_reserve_reply_bytes: u64,
    /// Longest traceparent and longest tracestate, each, bytes (0: not advertised).
    pub max_trace_context_bytes: u32,
    /// Longest Reserve worker id, bytes (0: not advertised).
    pub max_worker_id_bytes: u32,
    /// Longest payload encoding, bytes (0: not advertised).
    pub max_encoding_bytes: u32,
}

impl ServerInfo {
    pub(crate) fn from_proto(r: pb::GetServerInfoResponse) -> Self {
        ServerInfo {
            server_version: r.server_version,
            supported_protocol_versions: r.supported_protocol_versions,
            server_time: r.server_time.as_ref().map(proto_to_system_time),
            restricts_encodings: r.restricts_encodings,
            allowed_encodings: r.allowed_encodings,
            max_payload_bytes: r.max_payload_bytes,
            max_custom_entries: r.max_custom_entries,
            max_custom_total_bytes: r.max_custom_total_bytes,
            max_custom_key_bytes: r.max_custom_key_bytes,
            max_queue_name_bytes: r.max_queue_name_bytes,
            max_job_type_bytes: r.max_job_type_bytes,
            max_idempotency_key_bytes: r.max_idempotency_key_bytes,
            max_schedule_horizon: r.max_schedule_horizon.as_ref().and_then(proto_to_duration),
            max_enqueue_batch: r.max_enqueue_batch,
            max_reserve_batch: r.max_reserve_batch,
            max_reserve_queues: r.max_reserve_queues,
            max_wait_timeout: r.max_wait_timeout.as_ref().and_then(proto_to_duration),
            max_lease_duration: r.max_lease_duration.as_ref().and_then(proto_to_duration),
            strict_queues: r.strict_queues,
            dead_letter_retention_enabled: r.dead_letter_retention_enabled,
            dedup_window: r.dedup_window.as_ref().and_then(proto_to_duration),
            max_reason_bytes: r.max_reason_bytes,
            max_reserve_reply_bytes: r.max_reserve_reply_bytes,
            max_trace_context_bytes: r.max_trace_context_bytes,
            max_worker_id_bytes: r.max_worker_id_bytes,
            max_encoding_bytes: r.max_encoding_bytes,
        }
    }
}

pub(crate) fn system_time_to_proto(t: SystemTime) -> prost_types::Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => prost_types::Timestamp {
            seconds: d.as_secs() as i64,
            nanos: d.subsec_nanos() as i32,
        },
        Err(e) => {
            let d = e.duration();
            let mut seconds = -(d.as_secs() as i64);
            let mut nanos = -(d.subsec_nanos() as i32);
            if nanos < 0 {
                seconds -= 1;
                nanos += 1_000_000_000;
            }
            prost_types::Timestamp { seconds, nanos }
        }
    }
}

pub(crate) fn proto_to_system_time(t: &prost_types::Timestamp) -> SystemTime {
    let nanos = t.nanos.clamp(0, 999_999_999) as u32;
    if t.seconds >= 0 {
        UNIX_EPOCH + Duration::new(t.seconds as u64, nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.seconds.unsigned_abs())
            + Duration::from_nanos(u64::from(nanos))
    }
}

pub(crate) fn duration_to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

pub(crate) fn proto_to_duration(d: &prost_types::Duration) -> Option<Duration> {
    if d.seconds < 0 || d.nanos < 0 {
        return None;
    }
    Some(Duration::new(d.seconds as u64, d.nanos as u32))
}
