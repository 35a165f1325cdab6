//! Limits and per-queue policies: the global `[limits]` / `[storage]` defaults merged with each
//! `[[queues]]` entry. An undeclared queue uses the defaults.

use super::reply::JobBounds;
use crate::config::{Config, LimitsConfig, QueueConfig, RetryBackoff};
use std::collections::HashMap;
use std::sync::Arc;

/// The effective settings of one queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuePolicy {
    /// Only these job types may be enqueued (unset: any).
    pub allowed_job_types: Option<Vec<String>>,
    /// How long an idempotency key deduplicates, in milliseconds.
    pub dedup_window_ms: u64,
    /// Longest lease, in milliseconds.
    pub max_lease_duration_ms: u64,
    /// `max_attempts` of a job that sets none.
    pub default_max_attempts: u32,
    /// Largest `max_attempts`.
    pub max_attempts_ceiling: u32,
    /// Priority of a job that sets none.
    pub default_priority: u32,
    /// Base retry delay, in milliseconds.
    pub retry_delay_ms: u64,
    /// Retry delay curve.
    pub retry_backoff: RetryBackoff,
    /// Retry delay cap, in milliseconds.
    pub retry_delay_max_ms: u64,
    /// Largest payload, in bytes.
    pub max_payload_bytes: u64,
    /// Allowed encodings (unset: any; empty: no payloads).
    pub allowed_encodings: Option<Vec<String>>,
    /// Furthest schedule, in milliseconds from now; also caps nack delays.
    pub max_schedule_horizon_ms: u64,
    /// Most custom entries.
    pub max_custom_entries: u32,
    /// Largest custom map, in bytes.
    pub max_custom_total_bytes: u64,
    /// Longest custom key, in bytes.
    pub max_custom_key_bytes: u32,
    /// Most jobs held (ready + scheduled + in flight); unset: unlimited.
    pub max_queue_depth: Option<u64>,
}

impl QueuePolicy {
    /// The defaults of `[limits]` and `[storage]`.
    pub fn defaults(config: &Config) -> Self {
        let l = &config.limits;
        QueuePolicy {
            allowed_job_types: None,
            dedup_window_ms: config.storage.dedup_window_ms,
            max_lease_duration_ms: l.max_lease_duration_ms,
            default_max_attempts: l.default_max_attempts,
            max_attempts_ceiling: l.max_attempts_ceiling,
            default_priority: l.default_priority,
            retry_delay_ms: l.retry_delay_ms,
            retry_backoff: l.retry_backoff,
            retry_delay_max_ms: l.retry_delay_max_ms,
            max_payload_bytes: l.max_payload_bytes,
            allowed_encodings: l.allowed_encodings.clone(),
            max_schedule_horizon_ms: l.max_schedule_horizon_ms,
            max_custom_entries: l.max_custom_entries,
            max_custom_total_bytes: l.max_custom_total_bytes,
            max_custom_key_bytes: l.max_custom_key_bytes,
            max_queue_depth: l.max_queue_depth,
        }
    }

    /// The largest job this policy and the global `[limits]` accept, field by field.
    pub fn job_bounds(&self, l: &LimitsConfig) -> JobBounds {
        JobBounds {
            queue_name: u64::from(l.max_queue_name_bytes),
            job_type: u64::from(l.max_job_type_bytes),
            payload: self.max_payload_bytes,
            encoding: u64::from(l.max_encoding_bytes),
            trace_context: u64::from(l.max_trace_context_bytes),
            custom_entries: u64::from(self.max_custom_entries),
            custom_total: self.max_custom_total_bytes,
        }
    }

    /// These defaults with a `[[queues]]` entry's overrides applied.
    pub fn with_overrides(&self, q: &QueueConfig) -> Self {
        QueuePolicy {
            allowed_job_types: q.allowed_job_types.clone(),
            dedup_window_ms: q.dedup_window_ms.unwrap_or(self.dedup_window_ms),
            max_lease_duration_ms: q
                .max_lease_duration_ms
                .unwrap_or(self.max_lease_duration_ms),
            default_max_attempts: q.default_max_attempts.unwrap_or(self.default_max_attempts),
            max_attempts_ceiling: q.max_attempts_ceiling.unwrap_or(self.max_attempts_ceiling),
            default_priority: q.default_priority.unwrap_or(self.default_priority),
            retry_delay_ms: q.retry_delay_ms.unwrap_or(self.retry_delay_ms),
            retry_backoff: q.retry_backoff.unwrap_or(self.retry_backoff),
            retry_delay_max_ms: q.retry_delay_max_ms.unwrap_or(self.retry_delay_max_ms),
            max_payload_bytes: q.max_payload_bytes.unwrap_or(self.max_payload_bytes),
            allowed_encodings: q
                .allowed_encodings
                .clone()
                .or_else(|| self.allowed_encodings.clone()),
            max_schedule_horizon_ms: q
                .max_schedule_horizon_ms
                .unwrap_or(self.max_schedule_horizon_ms),
            max_custom_entries: q.max_custom_entries.unwrap_or(self.max_custom_entries),
            max_custom_total_bytes: q
                .max_custom_total_bytes
                .unwrap_or(self.max_custom_total_bytes),
            max_custom_key_bytes: q.max_custom_key_bytes.unwrap_or(self.max_custom_key_bytes),
            max_queue_depth: q.max_queue_depth.or(self.max_queue_depth),
        }
    }
}

/// Every limit the server enforces, resolved once at start-up.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest idempotency key, in UTF-8 bytes (global only).
    pub max_idempotency_key_bytes: u32,
    /// Most jobs per enqueue batch.
    pub max_enqueue_batch: u32,
    /// Most jobs per Reserve.
    pub max_reserve_batch: u32,
    /// Most queues per Reserve.
    pub max_reserve_queues: u32,
    /// Longest Reserve wait, in milliseconds.
    pub max_wait_timeout_ms: u64,
    /// Largest request, in bytes.
    pub max_message_bytes: u64,
    /// Longest queue name, in UTF-8 bytes.
    pub max_queue_name_bytes: u32,
    /// Longest job type, in UTF-8 bytes.
    pub max_job_type_bytes: u32,
    /// Largest Reserve reply, in bytes (upper bound of its encoding).
    pub max_reserve_reply_bytes: u64,
    /// Longest traceparent and longest tracestate, each, in bytes.
    pub max_trace_context_bytes: u32,
    /// Longest payload encoding, in bytes.
    pub max_encoding_bytes: u32,
    /// Longest Reserve worker id, in bytes.
    pub max_worker_id_bytes: u32,
    /// Longest nack reason kept, in bytes (longer ones are truncated).
    pub max_reason_bytes: u32,
    /// Only declared queues exist.
    pub strict_queues: bool,
    /// Dead letters are kept (retention > 0).
    pub dead_letter_retention_enabled: bool,
    /// The policy of undeclared queues.
    pub defaults: Arc<QueuePolicy>,
    declared: HashMap<String, Arc<QueuePolicy>>,
}

impl Limits {
    /// Resolves the limits of a (validated) configuration.
    pub fn from_config(config: &Config) -> Self {
        let defaults = QueuePolicy::defaults(config);
        let declared = config
            .queues
            .iter()
            .map(|q| (q.name.clone(), Arc::new(defaults.with_overrides(q))))
            .collect();
        let l = &config.limits;
        Limits {
            max_idempotency_key_bytes: l.max_idempotency_key_bytes,
            max_enqueue_batch: l.max_enqueue_batch,
            max_reserve_batch: l.max_reserve_batch,
            max_reserve_queues: l.max_reserve_queues,
            max_wait_timeout_ms: l.max_wait_timeout_ms,
            max_message_bytes: l.max_message_bytes,
            max_queue_name_bytes: l.max_queue_name_bytes,
            max_job_type_bytes: l.max_job_type_bytes,
            max_reserve_reply_bytes: l.max_reserve_reply_bytes,
            max_trace_context_bytes: l.max_trace_context_bytes,
            max_encoding_bytes: l.max_encoding_bytes,
            max_worker_id_bytes: l.max_worker_id_bytes,
            max_reason_bytes: l.max_reason_bytes,
            strict_queues: config.server.strict_queues,
            dead_letter_retention_enabled: config.storage.dead_letter_retention_ms > 0,
            defaults: Arc::new(defaults),
            declared,
        }
    }

    /// The policy of `queue`: its `[[queues]]` entry, else the defaults.
    pub fn policy(&self, queue: &str) -> &QueuePolicy {
        self.declared.get(queue).unwrap_or(&self.defaults)
    }

    /// Whether `queue` has a `[[queues]]` entry.
    pub fn is_declared(&self, queue: &str) -> bool {
        self.declared.contains_key(queue)
    }
}
