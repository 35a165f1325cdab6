//! What JavaScript gets back: acks and batch results, leased jobs, dead letters, server info.
//! Times are `Date`s, durations numbers of milliseconds, payload data a `Uint8Array`.

use crate::error::Failure;
use crate::value::{self, CustomValue, Date};
use napi::bindgen_prelude::Uint8Array;
use napi_derive::napi;
use std::collections::HashMap;

/// A job's data and the hint for reading it.
#[napi(object, object_from_js = false)]
pub struct Payload {
    /// The bytes; non-empty. A `Buffer` is accepted on input.
    pub data: Uint8Array,
    /// A hint such as a MIME type (`application/json`); non-empty.
    pub encoding: String,
}

impl From<sepp_rs::Payload> for Payload {
    fn from(p: sepp_rs::Payload) -> Self {
        Payload {
            data: Uint8Array::new(p.data),
            encoding: p.encoding,
        }
    }
}

/// W3C trace context.
#[napi(object, object_from_js = false)]
pub struct TraceContext {
    /// The `traceparent` header; non-empty.
    pub traceparent: String,
    /// The `tracestate` header.
    pub tracestate: Option<String>,
}

impl From<sepp_rs::TraceContext> for TraceContext {
    fn from(t: sepp_rs::TraceContext) -> Self {
        TraceContext {
            traceparent: t.traceparent,
            tracestate: t.tracestate,
        }
    }
}

/// The answer to an accepted enqueue.
#[napi(object, object_from_js = false)]
pub struct EnqueueAck {
    /// The job's id (a UUID): the new job's or, on a dedup hit, the original's.
    pub job_id: String,
    /// True when an earlier enqueue with the same idempotency key on the same queue, within
    /// the dedup window, already created `jobId`. That job may since have run or been
    /// dead-lettered: read it as "this enqueue is already accounted for".
    pub deduplicated: bool,
    /// On a dedup hit from a sepp server: where that job is (`'ready'`, `'acked'`, ...).
    pub original_state: Option<crate::admin::JobState>,
    /// On a dedup hit on a queue with `on_duplicate = "replace_pending"` (debounce): true when
    /// this enqueue's payload, encoding, custom map and trace context (and `scheduledAt`, when
    /// set) replaced those of the job, which had not started yet. False otherwise.
    pub replaced: bool,
}

impl From<sepp_rs::EnqueueAck> for EnqueueAck {
    fn from(a: sepp_rs::EnqueueAck) -> Self {
        EnqueueAck {
            job_id: a.job_id,
            deduplicated: a.deduplicated,
            original_state: a.original_state.map(Into::into),
            replaced: a.replaced,
        }
    }
}

/// The outcome of one job of `enqueueBatch`: `status: 'enqueued'` with the ack's fields, or
/// `status: 'rejected'` with the `SeppError` saying why (a `JobRejectedError` subclass such as
/// `IdempotencyKeyTooLongError`).
#[napi(
    discriminant = "status",
    discriminant_case = "lowercase",
    object_from_js = false
)]
pub enum EnqueueResult {
    /// The job was accepted (or was a dedup hit).
    Enqueued {
        /// As `EnqueueAck.jobId`.
        job_id: String,
        /// As `EnqueueAck.deduplicated`.
        deduplicated: bool,
        /// As `EnqueueAck.originalState`.
        original_state: Option<crate::admin::JobState>,
        /// As `EnqueueAck.replaced`.
        replaced: bool,
    },
    /// The job was not accepted; the other jobs of the batch are unaffected.
    Rejected {
        /// Why.
        #[napi(ts_type = "SeppError")]
        error: Failure,
    },
}

impl From<Result<sepp_rs::EnqueueAck, sepp_rs::Rejection>> for EnqueueResult {
    fn from(r: Result<sepp_rs::EnqueueAck, sepp_rs::Rejection>) -> Self {
        match r {
            Ok(a) => EnqueueResult::Enqueued {
                job_id: a.job_id,
                deduplicated: a.deduplicated,
                original_state: a.original_state.map(Into::into),
                replaced: a.replaced,
            },
            Err(rejection) => EnqueueResult::Rejected {
                error: rejection.into(),
            },
        }
    }
}

/// The outcome of `enqueueAtomic`: `status: 'committed'` with one ack per job in order, or
/// `status: 'rejected'` with every failing job; then nothing was written.
#[napi(
    discriminant = "status",
    discriminant_case = "lowercase",
    object_from_js = false
)]
pub enum AtomicResult {
    /// Every job was accepted, together.
    Committed {
        /// One per job, in request order.
        acks: Vec<EnqueueAck>,
    },
    /// At least one job was refused, so none was written.
    Rejected {
        /// Each refused job.
        failures: Vec<AtomicFailure>,
    },
}

/// One refused job of an atomic batch.
#[napi(object, object_from_js = false)]
pub struct AtomicFailure {
    /// Its index in the request list.
    pub index: u32,
    /// Why it was refused.
    #[napi(ts_type = "SeppError")]
    pub error: Failure,
}

/// What the core's `enqueue_atomic` returns.
type CoreAtomic = Result<Vec<sepp_rs::EnqueueAck>, Vec<(u32, sepp_rs::Rejection)>>;

impl From<CoreAtomic> for AtomicResult {
    fn from(r: CoreAtomic) -> Self {
        match r {
            Ok(acks) => AtomicResult::Committed {
                acks: acks.into_iter().map(EnqueueAck::from).collect(),
            },
            Err(failures) => AtomicResult::Rejected {
                failures: failures
                    .into_iter()
                    .map(|(index, r)| AtomicFailure {
                        index,
                        error: r.into(),
                    })
                    .collect(),
            },
        }
    }
}

/// A leased job.
#[napi(object, object_from_js = false)]
pub struct Job {
    /// Its id.
    pub id: String,
    /// Its queue.
    pub queue: String,
    /// Its type.
    pub job_type: String,
    /// Its data.
    pub payload: Option<Payload>,
    /// 0 (lowest) to 9 (highest).
    pub priority: u32,
    /// Its W3C trace context.
    pub trace_context: Option<TraceContext>,
    /// When it was enqueued.
    pub enqueued_at: Option<Date>,
    /// Which delivery this is, starting at 1. Pass it to `ack`, `nack` and `extend`.
    pub attempt: u32,
    /// Deliveries allowed before it is dead-lettered.
    pub max_attempts: u32,
    /// When the lease ends unless extended.
    pub lease_expires_at: Option<Date>,
    /// Custom entries. An int64 beyond ±(2^53 − 1) is a `bigint`, any other number a `number`.
    pub custom: HashMap<String, CustomValue>,
    /// When it was scheduled to become ready, if it was.
    pub scheduled_at: Option<Date>,
}

impl From<sepp_rs::Job> for Job {
    fn from(j: sepp_rs::Job) -> Self {
        Job {
            id: j.id,
            queue: j.queue,
            job_type: j.job_type,
            payload: j.payload.map(Payload::from),
            priority: j.priority,
            trace_context: j.trace_context.map(TraceContext::from),
            enqueued_at: j.enqueued_at.map(Date::from),
            attempt: j.attempt,
            max_attempts: j.max_attempts,
            lease_expires_at: j.lease_expires_at.map(Date::from),
            custom: j
                .custom
                .into_iter()
                .map(|(k, v)| (k, value::custom_from_core(v)))
                .collect(),
            scheduled_at: j.scheduled_at.map(Date::from),
        }
    }
}

/// Why a job was dead-lettered.
#[napi(string_enum = "camelCase")]
pub enum DeadLetterCause {
    /// Not given by the server.
    Unspecified,
    /// Failed on its last attempt.
    AttemptsExhausted,
    /// Nacked with `retry: 'deadLetter'`.
    Rejected,
    /// Its lease expired on its last attempt.
    LeaseExpired,
    /// Moved by an operator.
    Admin,
}

impl From<sepp_rs::DeadLetterCause> for DeadLetterCause {
    fn from(c: sepp_rs::DeadLetterCause) -> Self {
        match c {
            sepp_rs::DeadLetterCause::Unspecified => DeadLetterCause::Unspecified,
            sepp_rs::DeadLetterCause::AttemptsExhausted => DeadLetterCause::AttemptsExhausted,
            sepp_rs::DeadLetterCause::Rejected => DeadLetterCause::Rejected,
            sepp_rs::DeadLetterCause::LeaseExpired => DeadLetterCause::LeaseExpired,
            sepp_rs::DeadLetterCause::Admin => DeadLetterCause::Admin,
        }
    }
}

/// A dead-lettered job.
#[napi(object, object_from_js = false)]
pub struct DeadLetterRecord {
    /// The job as last delivered.
    pub job: Job,
    /// Why it was dead-lettered.
    pub cause: DeadLetterCause,
    /// When.
    pub failed_at: Option<Date>,
    /// The attempt that failed last.
    pub final_attempt: u32,
    /// The reason given by the last nack.
    pub last_reason: Option<String>,
}

impl From<sepp_rs::DeadLetterRecord> for DeadLetterRecord {
    fn from(r: sepp_rs::DeadLetterRecord) -> Self {
        DeadLetterRecord {
            job: r.job.into(),
            cause: r.cause.into(),
            failed_at: r.failed_at.map(Date::from),
            final_attempt: r.final_attempt,
            last_reason: r.last_reason,
        }
    }
}

/// What the server says about itself: its version and server-wide limits (a queue may have
/// lower ones). Sizes are in bytes (UTF-8 bytes for names and keys).
#[napi(object, object_from_js = false)]
pub struct ServerInfo {
    /// Server version.
    pub server_version: String,
    /// Protocol versions, e.g. `['v1']`.
    pub supported_protocol_versions: Vec<String>,
    /// The server's clock.
    pub server_time: Option<Date>,
    /// Whether payload encodings are restricted to `allowedEncodings`.
    pub restricts_encodings: bool,
    /// Allowed encodings when restricted (empty: no payloads at all).
    pub allowed_encodings: Vec<String>,
    /// Largest payload.
    pub max_payload_bytes: f64,
    /// Most custom entries per job.
    pub max_custom_entries: u32,
    /// Largest custom map.
    pub max_custom_total_bytes: f64,
    /// Longest custom key.
    pub max_custom_key_bytes: u32,
    /// Longest queue name.
    pub max_queue_name_bytes: u32,
    /// Longest job type.
    pub max_job_type_bytes: u32,
    /// Longest idempotency key; the client checks keys against it before sending.
    pub max_idempotency_key_bytes: u32,
    /// Furthest a job can be scheduled, in milliseconds from now.
    pub max_schedule_horizon_ms: Option<f64>,
    /// Most jobs per enqueue batch.
    pub max_enqueue_batch: u32,
    /// Most jobs per reserve.
    pub max_reserve_batch: u32,
    /// Most queues per reserve.
    pub max_reserve_queues: u32,
    /// Longest reserve wait, in milliseconds.
    pub max_wait_timeout_ms: Option<f64>,
    /// Longest lease, in milliseconds.
    pub max_lease_duration_ms: Option<f64>,
    /// Whether only declared queues exist.
    pub strict_queues: bool,
    /// Whether dead letters are kept (else dead jobs are deleted).
    pub dead_letter_retention_enabled: bool,
    /// Server-wide default dedup window, in milliseconds (sepp servers only).
    pub dedup_window_ms: Option<f64>,
}

impl From<sepp_rs::ServerInfo> for ServerInfo {
    fn from(i: sepp_rs::ServerInfo) -> Self {
        ServerInfo {
            server_version: i.server_version,
            supported_protocol_versions: i.supported_protocol_versions,
            server_time: i.server_time.map(Date::from),
            restricts_encodings: i.restricts_encodings,
            allowed_encodings: i.allowed_encodings,
            max_payload_bytes: i.max_payload_bytes as f64,
            max_custom_entries: i.max_custom_entries,
            max_custom_total_bytes: i.max_custom_total_bytes as f64,
            max_custom_key_bytes: i.max_custom_key_bytes,
            max_queue_name_bytes: i.max_queue_name_bytes,
            max_job_type_bytes: i.max_job_type_bytes,
            max_idempotency_key_bytes: i.max_idempotency_key_bytes,
            max_schedule_horizon_ms: i.max_schedule_horizon.map(value::millis),
            max_enqueue_batch: i.max_enqueue_batch,
            max_reserve_batch: i.max_reserve_batch,
            max_reserve_queues: i.max_reserve_queues,
            max_wait_timeout_ms: i.max_wait_timeout.map(value::millis),
            max_lease_duration_ms: i.max_lease_duration.map(value::millis),
            strict_queues: i.strict_queues,
            dead_letter_retention_enabled: i.dead_letter_retention_enabled,
            dedup_window_ms: i.dedup_window.map(value::millis),
        }
    }
}
