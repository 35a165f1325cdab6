//! Limits and per-queue policies: the global `[limits]` / `[storage]` defaults merged with each
//! `[[queues]]` entry. An undeclared queue uses the defaults.

use super::reply::JobBounds;
use super::validate::{NameUse, queue_name_shape};
use crate::config::{
    Config, ConfigError, DAY_MS, KeyConflict, LimitsConfig, OnDuplicate, QueueConfig, RetryBackoff,
    check_range,
};
use std::collections::{HashMap, HashSet};
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
    /// What a hit with different contents gets (`[[queues]] key_conflict`; default `ignore`).
    pub key_conflict: KeyConflict,
    /// What a hit does to a pending job (`[[queues]] on_duplicate`; default `keep`).
    pub on_duplicate: OnDuplicate,
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
            key_conflict: KeyConflict::Ignore,
            on_duplicate: OnDuplicate::Keep,
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
            key_conflict: q.key_conflict.unwrap_or(self.key_conflict),
            on_duplicate: q.on_duplicate.unwrap_or(self.on_duplicate),
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
    /// Most Reserves waiting at once, server-wide (`limits.max_waiting_reserves`).
    pub max_waiting_reserves: u64,
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
    /// Most distinct queues the store holds (`limits.max_queues`).
    pub max_queues: u64,
    /// Only declared queues exist.
    pub strict_queues: bool,
    /// Dead letters are kept (retention > 0).
    pub dead_letter_retention_enabled: bool,
    /// How long dead letters are kept, in milliseconds; 0 keeps none.
    pub dead_letter_retention_ms: u64,
    /// The policy of undeclared queues.
    pub defaults: Arc<QueuePolicy>,
    declared: HashMap<String, Arc<QueuePolicy>>,
}

impl Limits {
    /// Checks and resolves the limits of a configuration: every `[limits]` key, the per-queue
    /// defaults and each `[[queues]]` entry merged with them.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first offending key, its value and the allowed range or rule
    /// (`config key limits.default_priority = 12 is out of range: allowed 0 to 9`).
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        check(config)?;
        let defaults = QueuePolicy::defaults(config);
        let declared = config
            .queues
            .iter()
            .map(|q| (q.name.clone(), Arc::new(defaults.with_overrides(q))))
            .collect();
        let l = &config.limits;
        Ok(Limits {
            max_idempotency_key_bytes: l.max_idempotency_key_bytes,
            max_enqueue_batch: l.max_enqueue_batch,
            max_reserve_batch: l.max_reserve_batch,
            max_reserve_queues: l.max_reserve_queues,
            max_wait_timeout_ms: l.max_wait_timeout_ms,
            max_waiting_reserves: l.max_waiting_reserves,
            max_message_bytes: l.max_message_bytes,
            max_queue_name_bytes: l.max_queue_name_bytes,
            max_job_type_bytes: l.max_job_type_bytes,
            max_reserve_reply_bytes: l.max_reserve_reply_bytes,
            max_trace_context_bytes: l.max_trace_context_bytes,
            max_encoding_bytes: l.max_encoding_bytes,
            max_worker_id_bytes: l.max_worker_id_bytes,
            max_reason_bytes: l.max_reason_bytes,
            max_queues: l.max_queues,
            strict_queues: config.server.strict_queues,
            dead_letter_retention_enabled: config.storage.dead_letter_retention_ms > 0,
            dead_letter_retention_ms: config.storage.dead_letter_retention_ms,
            defaults: Arc::new(defaults),
            declared,
        })
    }

    /// The policy of `queue`: its `[[queues]]` entry, else the defaults.
    pub fn policy(&self, queue: &str) -> &QueuePolicy {
        self.declared.get(queue).unwrap_or(&self.defaults)
    }

    /// Whether `queue` has a `[[queues]]` entry.
    pub fn is_declared(&self, queue: &str) -> bool {
        self.declared.contains_key(queue)
    }

    /// The names of the `[[queues]]` entries, in no order.
    pub fn declared_names(&self) -> impl Iterator<Item = &str> {
        self.declared.keys().map(String::as_str)
    }
}

/// Range and consistency checks of `[limits]`, the per-queue defaults (including
/// `storage.dedup_window_ms`) and every `[[queues]]` entry merged with them.
fn check(config: &Config) -> Result<(), ConfigError> {
    let l = &config.limits;
    check_range(
        "limits.max_idempotency_key_bytes",
        l.max_idempotency_key_bytes,
        1,
        4096,
    )?;
    check_range("limits.max_enqueue_batch", l.max_enqueue_batch, 1, 100_000)?;
    check_range("limits.max_reserve_batch", l.max_reserve_batch, 1, 100_000)?;
    check_range("limits.max_reserve_queues", l.max_reserve_queues, 1, 1024)?;
    check_range("limits.max_queues", l.max_queues, 1, 1_000_000)?;
    if (config.queues.len() as u64) > l.max_queues {
        return Err(ConfigError(format!(
            "config key limits.max_queues = {} is less than the {} [[queues]] entries: every \
             declared queue counts, so raise it to at least {}",
            l.max_queues,
            config.queues.len(),
            config.queues.len()
        )));
    }
    check_range(
        "limits.max_waiting_reserves",
        l.max_waiting_reserves,
        1,
        1_000_000,
    )?;
    check_range(
        "limits.max_wait_timeout_ms",
        l.max_wait_timeout_ms,
        0,
        3_600_000,
    )?;
    check_range(
        "limits.max_message_bytes",
        l.max_message_bytes,
        1024,
        1 << 30,
    )?;
    check_range(
        "limits.max_queue_name_bytes",
        l.max_queue_name_bytes,
        1,
        4096,
    )?;
    check_range("limits.max_job_type_bytes", l.max_job_type_bytes, 1, 4096)?;
    check_range(
        "limits.max_reserve_reply_bytes",
        l.max_reserve_reply_bytes,
        65_536,
        1 << 30,
    )?;
    check_range(
        "limits.max_trace_context_bytes",
        l.max_trace_context_bytes,
        55,
        1 << 20,
    )?;
    check_range("limits.max_encoding_bytes", l.max_encoding_bytes, 1, 4096)?;
    check_range("limits.max_worker_id_bytes", l.max_worker_id_bytes, 1, 4096)?;
    check_range("limits.max_reason_bytes", l.max_reason_bytes, 1, 1 << 20)?;
    let defaults = QueuePolicy::defaults(config);
    validate_policy(
        &defaults,
        "limits.",
        "storage.dedup_window_ms",
        l.max_message_bytes,
    )?;
    check_reply_budget(&defaults, "limits.", l)?;

    let mut names = HashSet::new();
    for (i, q) in config.queues.iter().enumerate() {
        let at = format!("queues[{i}]");
        if q.name.is_empty() {
            return Err(ConfigError(format!(
                "config key {at}.name is empty: every [[queues]] entry needs a unique name"
            )));
        }
        if let Err(why) = queue_name_shape(&q.name, NameUse::Write) {
            return Err(ConfigError(format!(
                "config key {at}.name = {:?}: {why}",
                q.name
            )));
        }
        if q.name.len() > l.max_queue_name_bytes as usize {
            return Err(ConfigError(format!(
                "config key {at}.name is {} bytes: limits.max_queue_name_bytes is {}",
                q.name.len(),
                l.max_queue_name_bytes
            )));
        }
        if !names.insert(q.name.as_str()) {
            return Err(ConfigError(format!(
                "config key {at}.name = {:?} is a duplicate: queue names must be unique",
                q.name
            )));
        }
        let merged = defaults.with_overrides(q);
        validate_policy(
            &merged,
            &format!("{at}."),
            &format!("{at}.dedup_window_ms"),
            l.max_message_bytes,
        )?;
        check_reply_budget(&merged, &format!("{at}."), l)?;
    }
    Ok(())
}

/// One dead letter of a job at the largest sizes `p` and the global limits allow (with the
/// longest nack reason) must fit one reply, so that every job can be delivered by Reserve and
/// every dead letter drained and listed. `at` prefixes the per-queue key names.
fn check_reply_budget(p: &QueuePolicy, at: &str, l: &LimitsConfig) -> Result<(), ConfigError> {
    let need = p
        .job_bounds(l)
        .dead_letter_reply_bytes(u64::from(l.max_reason_bytes));
    if need > l.max_reserve_reply_bytes {
        return Err(ConfigError(format!(
            "config key limits.max_reserve_reply_bytes = {} cannot hold one job at the largest \
             sizes allowed, which takes up to {need} bytes in a reply as a dead letter \
             ({at}max_payload_bytes = {}, {at}max_custom_total_bytes = {}, \
             {at}max_custom_entries = {}, limits.max_trace_context_bytes = {} (twice), \
             limits.max_encoding_bytes = {}, limits.max_queue_name_bytes = {}, \
             limits.max_job_type_bytes = {}, limits.max_reason_bytes = {}, plus framing): \
             raise the budget or lower those",
            l.max_reserve_reply_bytes,
            p.max_payload_bytes,
            p.max_custom_total_bytes,
            p.max_custom_entries,
            l.max_trace_context_bytes,
            l.max_encoding_bytes,
            l.max_queue_name_bytes,
            l.max_job_type_bytes,
            l.max_reason_bytes,
        )));
    }
    Ok(())
}

/// Range and consistency checks of one resolved per-queue policy. `at` prefixes the key names
/// (`limits.` for the defaults, `queues[i].` for an entry).
fn validate_policy(
    p: &QueuePolicy,
    at: &str,
    window_key: &str,
    max_message_bytes: u64,
) -> Result<(), ConfigError> {
    let k = |name: &str| format!("{at}{name}");
    if let Some(types) = &p.allowed_job_types
        && types.is_empty()
    {
        return Err(ConfigError(format!(
            "config key {} is an empty list: leave it unset to allow every job type",
            k("allowed_job_types")
        )));
    }
    check_range(window_key, p.dedup_window_ms, 1, 3650 * DAY_MS)?;
    check_range(
        &k("max_lease_duration_ms"),
        p.max_lease_duration_ms,
        1,
        7 * DAY_MS,
    )?;
    check_range(
        &k("max_attempts_ceiling"),
        p.max_attempts_ceiling,
        1,
        1_000_000,
    )?;
    check_range(
        &k("default_max_attempts"),
        p.default_max_attempts,
        1,
        p.max_attempts_ceiling,
    )?;
    check_range(&k("default_priority"), p.default_priority, 0, 9)?;
    check_range(&k("retry_delay_ms"), p.retry_delay_ms, 0, 3650 * DAY_MS)?;
    if p.retry_delay_max_ms < p.retry_delay_ms {
        return Err(ConfigError(format!(
            "config key {} = {} is below {} = {}: the cap must be at least the base delay",
            k("retry_delay_max_ms"),
            p.retry_delay_max_ms,
            k("retry_delay_ms"),
            p.retry_delay_ms
        )));
    }
    check_range(
        &k("retry_delay_max_ms"),
        p.retry_delay_max_ms,
        0,
        3650 * DAY_MS,
    )?;
    check_range(
        &k("max_payload_bytes"),
        p.max_payload_bytes,
        0,
        max_message_bytes,
    )
    .map_err(|e| ConfigError(format!("{} (limits.max_message_bytes)", e.0)))?;
    check_range(
        &k("max_schedule_horizon_ms"),
        p.max_schedule_horizon_ms,
        0,
        3650 * DAY_MS,
    )?;
    check_range(&k("max_custom_entries"), p.max_custom_entries, 0, 1_000_000)?;
    check_range(
        &k("max_custom_total_bytes"),
        p.max_custom_total_bytes,
        0,
        max_message_bytes,
    )
    .map_err(|e| ConfigError(format!("{} (limits.max_message_bytes)", e.0)))?;
    check_range(
        &k("max_custom_key_bytes"),
        p.max_custom_key_bytes,
        1,
        65_536,
    )?;
    if let Some(d) = p.max_queue_depth {
        check_range(&k("max_queue_depth"), d, 1, u64::MAX)?;
    }
    if p.on_duplicate == OnDuplicate::ReplacePending && p.key_conflict == KeyConflict::Reject {
        return Err(ConfigError(format!(
            "config key {} = \"replace_pending\" cannot go with {} = \"reject\": a hit \
             that replaces a pending job's contents must be allowed other contents",
            k("on_duplicate"),
            k("key_conflict")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loads `text` and resolves its limits; the error message when either fails.
    fn load(text: &str) -> Result<Limits, String> {
        let config = Config::from_toml_with_env(text, &[])
            .map_err(|e| e.0)?
            .config;
        Limits::from_config(&config).map_err(|e| e.0)
    }

    #[test]
    fn out_of_range_value_names_range() {
        let err = load("[limits]\ndefault_priority = 12\n").unwrap_err();
        assert_eq!(
            err,
            "config key limits.default_priority = 12 is out of range: allowed 0 to 9"
        );
    }

    #[test]
    fn max_waiting_reserves_has_a_range() {
        assert_eq!(
            load("[limits]\nmax_waiting_reserves = 0\n").unwrap_err(),
            "config key limits.max_waiting_reserves = 0 is out of range: allowed 1 to 1000000"
        );
        assert_eq!(
            load("").unwrap().max_waiting_reserves,
            10_000,
            "the default"
        );
    }

    #[test]
    fn max_queues_has_a_range_and_counts_the_declared_queues() {
        assert_eq!(
            load("[limits]\nmax_queues = 0\n").unwrap_err(),
            "config key limits.max_queues = 0 is out of range: allowed 1 to 1000000"
        );
        let two = "[[queues]]\nname = \"a\"\n[[queues]]\nname = \"b\"\n";
        let err = load(&format!("[limits]\nmax_queues = 1\n{two}")).unwrap_err();
        assert!(
            err.contains("limits.max_queues = 1 is less than the 2 [[queues]] entries"),
            "{err}"
        );
        let l = load(&format!("[limits]\nmax_queues = 2\n{two}")).unwrap();
        assert_eq!(l.max_queues, 2);
        assert_eq!(load("").unwrap().max_queues, 10_000, "the default");
    }

    #[test]
    fn retry_cap_below_base_is_rejected() {
        let err = load("[limits]\nretry_delay_ms = 5000\nretry_delay_max_ms = 100\n").unwrap_err();
        assert!(err.contains("retry_delay_max_ms = 100"), "{err}");
        assert!(err.contains("retry_delay_ms = 5000"), "{err}");
    }

    #[test]
    fn duplicate_queue_name_is_rejected() {
        let err = load("[[queues]]\nname = \"a\"\n[[queues]]\nname = \"a\"\n").unwrap_err();
        assert!(err.contains("queues[1].name"), "{err}");
        assert!(err.contains("duplicate"), "{err}");
    }

    #[test]
    fn per_queue_override_is_range_checked() {
        let err = load("[[queues]]\nname = \"a\"\ndefault_priority = 10\n").unwrap_err();
        assert!(err.contains("queues[0].default_priority = 10"), "{err}");
    }

    #[test]
    fn the_defaults_and_the_example_resolve() {
        assert!(load("").is_ok());
        assert!(load(crate::config::EXAMPLE).is_ok());
    }

    #[test]
    fn replace_pending_does_not_go_with_rejected_conflicts() {
        let err = load(
            "[[queues]]\nname = \"a\"\non_duplicate = \"replace_pending\"\nkey_conflict = \"reject\"\n",
        )
        .unwrap_err();
        assert!(err.contains("queues[0].on_duplicate"), "{err}");
        assert!(err.contains("queues[0].key_conflict"), "{err}");
        let ok = load("[[queues]]\nname = \"a\"\non_duplicate = \"replace_pending\"\n").unwrap();
        assert_eq!(ok.policy("a").on_duplicate, OnDuplicate::ReplacePending);
        assert_eq!(ok.policy("b").on_duplicate, OnDuplicate::Keep);
    }

    #[test]
    fn a_queue_name_the_name_rule_refuses_is_named() {
        let err = load("[[queues]]\nname = \"a/b\"\n").unwrap_err();
        assert!(err.contains("queues[0].name"), "{err}");
        assert!(err.contains("'/'"), "{err}");
    }
}
