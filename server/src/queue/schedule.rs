//! Recurring jobs: the `[[schedules]]` of the configuration, their ticks, and the one scheduler
//! task of a server that enqueues each tick once (`docs/lifecycle.md`, "Recurring jobs").
//!
//! A schedule ticks on a cron expression read in an IANA time zone ([`Spec::Cron`], parsed by
//! `croner`, zones from `jiff`) or on a fixed interval counted from the Unix epoch
//! ([`Spec::Every`]). For each tick the server enqueues one job through the normal enqueue path
//! ([`Queue::enqueue_batch`]) with the idempotency key [`tick_key`]:
//! `schedule:<name>:<tick as RFC 3339 UTC with milliseconds>`. The dedup record of that key is
//! the only shared state: several servers on one store, a restart or a clock step enqueue a
//! tick at most once, because every enqueue of it after the first is a dedup hit.
//!
//! That holds while the key's record lives, that is for the queue's `dedup_window_ms` from the
//! first enqueue of the tick. So a tick is enqueued only while it is *in reach*
//! ([`Schedule::in_reach`]): less than the window, less a margin for clock differences between
//! servers ([`SKEW_MARGIN_MS`], at most half the window), after its time. Later than that a
//! record written by another server could be gone, and the tick is skipped (logged).
//!
//! What a scheduler keeps in memory is only its own progress (every tick up to `handled_to` was
//! enqueued or skipped by it); nothing another server needs. On start, `catch_up = false` marks
//! every tick before the start time handled (a tick missed during downtime is skipped);
//! `catch_up = true` lets the first pass enqueue the most recent tick at or before the start
//! time, if in reach (a no-op dedup hit when a server already enqueued it). Only that one:
//! several ticks missed during a long downtime are enqueued once in all, as their latest. A
//! pass that finds several ticks due at once (a clock step forward, a stalled process) does
//! the same: it enqueues the latest due tick only.
//!
//! The last tick a schedule enqueued is read from the store, not remembered:
//! [`Queue::list_schedules`] looks up the keys of the two most recent ticks at or before now.

use super::Queue;
use super::limits::Limits;
use super::model::{Accepted, EnqueueInput, Rejection};
use super::validate;
use crate::config::{Config, ConfigError, DAY_MS, ScheduleConfig};
use crate::domain::{JobId, Payload, UnixMs};
use crate::error::QueueError;
use crate::time_fmt::rfc3339;
use base64::Engine as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Longest schedule name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// Shortest `every_ms`.
pub const MIN_EVERY_MS: u64 = 1_000;

/// Longest `every_ms`.
pub const MAX_EVERY_MS: u64 = 3650 * DAY_MS;

/// How much of the dedup window a tick's reach leaves for clocks that disagree between
/// servers: one minute, or half the window when that is shorter.
pub const SKEW_MARGIN_MS: u64 = 60_000;

/// The longest the scheduler task sleeps between passes, however far the next tick is: how
/// soon it notices a step of the wall clock.
pub const MAX_PAUSE_MS: u64 = 1_000;

/// The prefix of every tick's idempotency key.
pub const KEY_PREFIX: &str = "schedule:";

/// When a schedule ticks.
#[derive(Debug, Clone)]
pub enum Spec {
    /// A cron expression read in a time zone; whole seconds.
    Cron {
        /// The expression as configured.
        expr: String,
        /// The parsed expression.
        cron: Box<croner::Cron>,
        /// The zone's IANA name as configured (`UTC` by default).
        zone_name: String,
        /// The zone.
        zone: jiff::tz::TimeZone,
    },
    /// Every `ms` milliseconds, at whole multiples of it since the Unix epoch.
    Every {
        /// The interval.
        ms: u64,
    },
}

impl Spec {
    fn zoned(zone: &jiff::tz::TimeZone, at: UnixMs) -> Option<jiff::Zoned> {
        // Cron ticks are whole seconds: search from the second `at` falls in.
        let secs = at.div_euclid(1000);
        jiff::Timestamp::from_second(secs)
            .ok()
            .map(|t| t.to_zoned(zone.clone()))
    }

    /// The latest tick at or before `at`; `None` when there is none the search can reach.
    pub fn at_or_before(&self, at: UnixMs) -> Option<UnixMs> {
        match self {
            Spec::Every { ms } => {
                let ms = i64::try_from(*ms).ok()?;
                Some(at.div_euclid(ms).checked_mul(ms)?)
            }
            Spec::Cron { cron, zone, .. } => {
                let from = Self::zoned(zone, at)?;
                let t = cron.find_previous_occurrence(&from, true).ok()?;
                Some(t.timestamp().as_millisecond())
            }
        }
    }

    /// The first tick after `at`; `None` when it never ticks again (within the search's
    /// reach: years up to 9999).
    pub fn after(&self, at: UnixMs) -> Option<UnixMs> {
        match self {
            Spec::Every { ms } => {
                let ms = i64::try_from(*ms).ok()?;
                at.div_euclid(ms).checked_add(1)?.checked_mul(ms)
            }
            Spec::Cron { cron, zone, .. } => {
                // Ticks are whole seconds, so the first one after `at` is the first one after
                // the second `at` falls in.
                let from = Self::zoned(zone, at)?;
                let t = cron.find_next_occurrence(&from, false).ok()?;
                Some(t.timestamp().as_millisecond())
            }
        }
    }

    /// The time zone's name (`UTC` for an interval).
    pub fn zone_name(&self) -> &str {
        match self {
            Spec::Cron { zone_name, .. } => zone_name,
            Spec::Every { .. } => "UTC",
        }
    }
}

/// One resolved `[[schedules]]` entry.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Unique name; part of every tick's key.
    pub name: String,
    /// Where its jobs go.
    pub queue: String,
    /// Their job type.
    pub job_type: String,
    /// Their payload.
    pub payload: Option<Payload>,
    /// Their priority (`None`: the queue's default).
    pub priority: Option<u32>,
    /// Their attempts (`None`: the queue's default).
    pub max_attempts: Option<u32>,
    /// Whether the first pass after a start enqueues the most recent missed tick.
    pub catch_up: bool,
    /// When it ticks.
    pub spec: Spec,
    /// The queue's dedup window, in milliseconds: how long a tick's key deduplicates.
    pub window_ms: u64,
}

/// The idempotency key of `name`'s tick at `tick`: `schedule:<name>:<RFC 3339 UTC, ms>`, e.g.
/// `schedule:nightly:2026-03-08T07:00:00.000Z`. Fixed width after the name, so keys of one
/// schedule sort in time order.
pub fn tick_key(name: &str, tick: UnixMs) -> String {
    format!("{KEY_PREFIX}{name}:{}", rfc3339(tick))
}

impl Schedule {
    /// The key of the tick at `tick`.
    pub fn key(&self, tick: UnixMs) -> String {
        tick_key(&self.name, tick)
    }

    /// How long after its time a tick may still be enqueued: the dedup window less
    /// [`SKEW_MARGIN_MS`] (at most half the window).
    pub fn reach_ms(&self) -> u64 {
        self.window_ms - SKEW_MARGIN_MS.min(self.window_ms / 2)
    }

    /// Whether the tick at `tick` may be enqueued at `now`: a record another server wrote for
    /// it (at or after `tick`) is sure to live until then.
    pub fn in_reach(&self, tick: UnixMs, now: UnixMs) -> bool {
        let reach = i64::try_from(self.reach_ms()).unwrap_or(i64::MAX);
        now.saturating_sub(tick) < reach
    }

    /// The enqueue of the tick at `tick`.
    pub fn input(&self, tick: UnixMs) -> EnqueueInput {
        EnqueueInput {
            queue: self.queue.clone(),
            job_type: self.job_type.clone(),
            payload: self.payload.clone(),
            idempotency_key: Some(self.key(tick)),
            priority: self.priority,
            max_attempts: self.max_attempts,
            ..EnqueueInput::default()
        }
    }

    /// How the schedule ticks, as the admin service shows it: the cron expression, or
    /// `every N ms`.
    pub fn spec_text(&self) -> String {
        match &self.spec {
            Spec::Cron { expr, .. } => expr.clone(),
            Spec::Every { ms } => format!("every {ms} ms"),
        }
    }
}

/// Every schedule of a configuration, checked.
#[derive(Debug, Clone, Default)]
pub struct Schedules {
    list: Vec<Arc<Schedule>>,
}

fn bad(i: usize, name: &str, field: &str, what: impl std::fmt::Display) -> ConfigError {
    if field.is_empty() {
        ConfigError(format!("config key schedules[{i}] (\"{name}\"): {what}"))
    } else {
        ConfigError(format!(
            "config key schedules[{i}].{field} (schedule \"{name}\"): {what}"
        ))
    }
}

/// The field of a `[[schedules]]` entry that makes the queue reject its job.
fn rejected_field(r: &Rejection) -> &'static str {
    match r {
        Rejection::UnknownQueue { .. } | Rejection::QueueNameTooLong { .. } => "queue",
        Rejection::JobTypeNotAllowed { .. } | Rejection::JobTypeNameTooLong { .. } => "job_type",
        Rejection::PayloadTooLarge { .. } => "payload",
        Rejection::EncodingNotAllowed { .. } => "content_type",
        Rejection::IdempotencyKeyTooLong { .. } => "name",
        _ => "",
    }
}

fn rejection_text(r: &Rejection) -> String {
    match r {
        Rejection::UnknownQueue { queue } => {
            format!(
                "queue \"{queue}\" is not declared in [[queues]] and server.strict_queues is on"
            )
        }
        Rejection::QueueNameTooLong { limit, actual } => {
            format!("{actual} bytes: limits.max_queue_name_bytes is {limit}")
        }
        Rejection::JobTypeNameTooLong { limit, actual } => {
            format!("{actual} bytes: limits.max_job_type_bytes is {limit}")
        }
        Rejection::JobTypeNotAllowed { job_type, allowed } => {
            format!("\"{job_type}\" is not in the queue's allowed_job_types {allowed:?}")
        }
        Rejection::PayloadTooLarge { limit, actual } => {
            format!("{actual} bytes: the queue's max_payload_bytes is {limit}")
        }
        Rejection::EncodingNotAllowed { encoding, allowed } => {
            format!("\"{encoding}\" is not in the queue's allowed_encodings {allowed:?}")
        }
        Rejection::IdempotencyKeyTooLong { limit, actual } => format!(
            "its tick keys are {actual} bytes: limits.max_idempotency_key_bytes is {limit} \
             (shorten the name)"
        ),
        Rejection::InvalidRequest { message } => message.clone(),
        other => format!("the queue rejects its job: {other:?}"),
    }
}

fn payload_of(i: usize, s: &ScheduleConfig) -> Result<Option<Payload>, ConfigError> {
    let data = match (&s.payload, &s.payload_base64) {
        (Some(_), Some(_)) => {
            return Err(bad(
                i,
                &s.name,
                "payload_base64",
                "set either payload or payload_base64, not both",
            ));
        }
        (Some(text), None) => Some(text.as_bytes().to_vec()),
        (None, Some(b64)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| bad(i, &s.name, "payload_base64", format!("is not base64: {e}")))?,
        ),
        (None, None) => None,
    };
    match data {
        None => {
            if s.content_type.is_some() {
                return Err(bad(
                    i,
                    &s.name,
                    "content_type",
                    "is set without a payload: set payload or payload_base64, or remove it",
                ));
            }
            Ok(None)
        }
        Some(d) if d.is_empty() => Err(bad(
            i,
            &s.name,
            if s.payload.is_some() {
                "payload"
            } else {
                "payload_base64"
            },
            "is empty: leave it out for a job without a payload",
        )),
        Some(data) => Ok(Some(Payload {
            data,
            encoding: s
                .content_type
                .clone()
                .unwrap_or_else(|| "application/json".into()),
        })),
    }
}

fn spec_of(i: usize, s: &ScheduleConfig) -> Result<Spec, ConfigError> {
    match (&s.cron, s.every_ms) {
        (Some(_), Some(_)) | (None, None) => Err(bad(
            i,
            &s.name,
            "",
            "set exactly one of cron (a cron expression) and every_ms (an interval)",
        )),
        (None, Some(ms)) => {
            if s.timezone.is_some() {
                return Err(bad(
                    i,
                    &s.name,
                    "timezone",
                    "applies to cron only: every_ms ticks at multiples of the interval since \
                     the Unix epoch (use cron for times of day in a zone)",
                ));
            }
            if !(MIN_EVERY_MS..=MAX_EVERY_MS).contains(&ms) {
                return Err(bad(
                    i,
                    &s.name,
                    "every_ms",
                    format!("= {ms} is out of range: allowed {MIN_EVERY_MS} to {MAX_EVERY_MS}"),
                ));
            }
            Ok(Spec::Every { ms })
        }
        (Some(expr), None) => {
            let cron = croner::parser::CronParser::new().parse(expr).map_err(|e| {
                bad(
                    i,
                    &s.name,
                    "cron",
                    format!("\"{expr}\" is not a valid cron expression: {e}"),
                )
            })?;
            let zone_name = s.timezone.clone().unwrap_or_else(|| "UTC".into());
            let zone = jiff::tz::TimeZone::get(&zone_name).map_err(|e| {
                bad(
                    i,
                    &s.name,
                    "timezone",
                    format!("\"{zone_name}\" is not an IANA time zone name known here: {e}"),
                )
            })?;
            Ok(Spec::Cron {
                expr: expr.clone(),
                cron: Box::new(cron),
                zone_name,
                zone,
            })
        }
    }
}

fn name_ok(name: &str) -> bool {
    (1..=MAX_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl Schedules {
    /// Checks and resolves the `[[schedules]]` of `config` against the resolved `limits`, at
    /// `now` (a schedule must tick at least once after it).
    ///
    /// # Errors
    /// [`ConfigError`]: one line naming the entry, its name, the field and the rule.
    pub fn from_config(config: &Config, limits: &Limits, now: UnixMs) -> Result<Self, ConfigError> {
        let mut seen: HashMap<&str, usize> = HashMap::new();
        let mut list = Vec::with_capacity(config.schedules.len());
        for (i, s) in config.schedules.iter().enumerate() {
            if !name_ok(&s.name) {
                return Err(bad(
                    i,
                    &s.name,
                    "name",
                    format!("use 1 to {MAX_NAME_BYTES} bytes of A-Z, a-z, 0-9, '_', '.' and '-'"),
                ));
            }
            if let Some(j) = seen.insert(&s.name, i) {
                return Err(bad(
                    i,
                    &s.name,
                    "name",
                    format!("is also the name of schedules[{j}]: names must be unique"),
                ));
            }
            let spec = spec_of(i, s)?;
            let payload = payload_of(i, s)?;
            let Some(next) = spec.after(now) else {
                return Err(bad(
                    i,
                    &s.name,
                    "cron",
                    "never ticks: no time after now matches it",
                ));
            };
            let schedule = Schedule {
                name: s.name.clone(),
                queue: s.queue.clone(),
                job_type: s.job_type.clone(),
                payload,
                priority: s.priority,
                max_attempts: s.max_attempts,
                catch_up: s.catch_up,
                spec,
                window_ms: limits.policy(&s.queue).dedup_window_ms,
            };
            // The job of a tick must pass the queue's rules: check one now rather than fail
            // every tick.
            if let Err(r) = validate::validate_job(schedule.input(next), limits, now) {
                return Err(bad(i, &s.name, rejected_field(&r), rejection_text(&r)));
            }
            list.push(Arc::new(schedule));
        }
        Ok(Schedules { list })
    }

    /// The schedules, in configuration order.
    pub fn list(&self) -> &[Arc<Schedule>] {
        &self.list
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// What a scheduler pass did with one schedule's due tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Fired {
    /// The schedule.
    pub schedule: String,
    /// The tick.
    pub tick: UnixMs,
    /// What happened to it.
    pub outcome: FiredOutcome,
}

/// What happened to a due tick.
#[derive(Debug, Clone, PartialEq)]
pub enum FiredOutcome {
    /// Enqueued: a new job, or a dedup hit when it already was.
    Enqueued(Accepted),
    /// The queue rejected the job (logged); the tick is not tried again.
    Rejected(Rejection),
    /// Out of reach ([`Schedule::in_reach`]): skipped (logged).
    TooLate,
    /// The store failed (logged); the next pass tries again while the tick is in reach.
    Failed(String),
}

struct Entry {
    schedule: Arc<Schedule>,
    /// Every tick at or before this time was enqueued or skipped by this scheduler.
    handled_to: UnixMs,
    /// The first tick after `handled_to`.
    next: Option<UnixMs>,
}

/// One server's scheduler: see the module docs. Driven by [`Scheduler::run_due`] (the task
/// [`run`] calls it; tests call it after moving a manual clock).
pub struct Scheduler {
    queue: Arc<Queue>,
    entries: Vec<Entry>,
}

impl Scheduler {
    /// A scheduler of `queue`'s schedules, starting at the clock's time.
    pub fn new(queue: Arc<Queue>) -> Self {
        let now = queue.clock.now();
        let entries = queue
            .schedules
            .list()
            .iter()
            .map(|s| {
                // catch_up: nothing is handled yet, so the first pass takes the latest tick at
                // or before now; otherwise a tick before the start was missed and is skipped.
                let handled_to = if s.catch_up {
                    UnixMs::MIN
                } else {
                    now.saturating_sub(1)
                };
                Entry {
                    schedule: s.clone(),
                    handled_to,
                    next: None,
                }
            })
            .collect();
        Scheduler { queue, entries }
    }

    /// Enqueues every schedule's latest due tick not handled yet, at the clock's time. Returns
    /// what it did, one item per schedule that had a due tick.
    pub async fn run_due(&mut self) -> Vec<Fired> {
        let now = self.queue.clock.now();
        let mut fired = Vec::new();
        for e in &mut self.entries {
            let s = &e.schedule;
            let due = s.spec.at_or_before(now).filter(|t| *t > e.handled_to);
            let mut retry = false;
            if let Some(tick) = due {
                let outcome = if s.in_reach(tick, now) {
                    match self.queue.enqueue_batch(vec![s.input(tick)]).await {
                        Ok(mut out) => match out.pop() {
                            Some(Ok(a)) => FiredOutcome::Enqueued(a),
                            Some(Err(r)) => FiredOutcome::Rejected(r),
                            None => FiredOutcome::Failed("no outcome".into()),
                        },
                        Err(e) => FiredOutcome::Failed(e.to_string()),
                    }
                } else {
                    FiredOutcome::TooLate
                };
                let key = s.key(tick);
                match &outcome {
                    FiredOutcome::Enqueued(a) => tracing::info!(
                        schedule = %s.name, queue = %s.queue, key = %key, job_id = %a.job_id,
                        deduplicated = a.deduplicated, "schedule tick enqueued"
                    ),
                    FiredOutcome::Rejected(r) => tracing::error!(
                        schedule = %s.name, queue = %s.queue, key = %key,
                        rejection = ?r, "schedule tick rejected by its queue"
                    ),
                    FiredOutcome::TooLate => tracing::warn!(
                        schedule = %s.name, queue = %s.queue, key = %key,
                        reach_ms = s.reach_ms(),
                        "schedule tick skipped: later than the queue's dedup window allows"
                    ),
                    FiredOutcome::Failed(why) => {
                        retry = true;
                        tracing::warn!(
                            schedule = %s.name, queue = %s.queue, key = %key, error = %why,
                            "schedule tick not enqueued; trying again"
                        );
                    }
                }
                fired.push(Fired {
                    schedule: s.name.clone(),
                    tick,
                    outcome,
                });
            }
            if !retry && now > e.handled_to {
                e.handled_to = now;
                e.next = None;
            }
            if e.next.is_none() {
                e.next = s.spec.after(e.handled_to);
            }
        }
        fired
    }

    /// The earliest tick not handled yet, over every schedule.
    pub fn next_tick(&self) -> Option<UnixMs> {
        self.entries.iter().filter_map(|e| e.next).min()
    }
}

/// Runs `scheduler` until `shutdown` is cancelled: a pass, then a pause until the next tick
/// (at most [`MAX_PAUSE_MS`]; exactly that after a pass whose enqueue failed, so that a store
/// that refuses writes is asked again once a second, not in a loop).
pub async fn run(mut scheduler: Scheduler, shutdown: CancellationToken) {
    loop {
        let fired = scheduler.run_due().await;
        let failed = fired
            .iter()
            .any(|f| matches!(f.outcome, FiredOutcome::Failed(_)));
        let now = scheduler.queue.clock.now();
        let pause = match scheduler.next_tick() {
            _ if failed => MAX_PAUSE_MS,
            None => MAX_PAUSE_MS,
            Some(t) => u64::try_from(t.saturating_sub(now)).unwrap_or(0),
        }
        .min(MAX_PAUSE_MS);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(pause)) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// A schedule as the admin service lists it.
#[derive(Debug, Clone)]
pub struct ScheduleView {
    /// The schedule.
    pub schedule: Arc<Schedule>,
    /// The first tick after now, if it ticks again.
    pub next_tick: Option<UnixMs>,
    /// The most recent enqueued tick the store still holds the key of.
    pub last: Option<LastTick>,
}

/// A tick that was enqueued, from its key's dedup record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastTick {
    /// The tick's time.
    pub tick: UnixMs,
    /// The job its key names.
    pub job_id: JobId,
    /// When the key's record was written (the tick's first enqueue).
    pub enqueued_at: UnixMs,
}

impl Queue {
    /// The schedules this queue enqueues.
    pub fn schedules(&self) -> &Arc<Schedules> {
        &self.schedules
    }

    /// Every schedule with its next tick and its last enqueued tick: the latest of the two most
    /// recent ticks at or before now whose key has a live dedup record (so every server on one
    /// store answers alike; a tick older than those, or whose record expired, is not shown).
    ///
    /// # Errors
    /// [`QueueError::Storage`].
    pub async fn list_schedules(&self) -> Result<Vec<ScheduleView>, QueueError> {
        let now = self.clock.now();
        let mut out = Vec::with_capacity(self.schedules.list().len());
        for s in self.schedules.list() {
            let mut last = None;
            let mut at = now;
            for _ in 0..2 {
                let Some(tick) = s.spec.at_or_before(at) else {
                    break;
                };
                if let Some(rec) = self
                    .store
                    .lookup_key(&s.queue, &s.key(tick))
                    .await?
                    .filter(|r| super::dedup::is_live(r.expires_at, now))
                {
                    last = Some(LastTick {
                        tick,
                        job_id: rec.job_id,
                        enqueued_at: rec.created_at,
                    });
                    break;
                }
                at = tick - 1;
            }
            out.push(ScheduleView {
                schedule: s.clone(),
                next_tick: s.spec.after(now),
                last,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::QueueConfig;
    use crate::domain::PersistMode;
    use crate::queue::clock::{Clock, ManualClock};
    use crate::storage::Store;
    use crate::storage::embedded::{EmbeddedOptions, EmbeddedStore};

    /// 2026-12-02T00:00:00Z.
    const T0: UnixMs = 1_796_169_600_000;
    const MIN: i64 = 60_000;
    const HOUR: i64 = 3_600_000;

    fn ms(rfc: &str) -> UnixMs {
        rfc.parse::<jiff::Timestamp>().unwrap().as_millisecond()
    }

    fn cron(expr: &str, zone: &str) -> Spec {
        let mut c = Config::default();
        c.schedules.push(ScheduleConfig {
            name: "s".into(),
            queue: "q".into(),
            job_type: "t".into(),
            cron: Some(expr.into()),
            timezone: Some(zone.into()),
            ..Default::default()
        });
        let limits = Limits::from_config(&c).unwrap();
        let s = Schedules::from_config(&c, &limits, T0).unwrap();
        s.list()[0].spec.clone()
    }

    /// Every tick in `[from, to)`.
    fn ticks(spec: &Spec, from: UnixMs, to: UnixMs) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = from - 1;
        while let Some(t) = spec.after(at).filter(|t| *t < to) {
            out.push(rfc3339(t));
            at = t;
        }
        out
    }

    #[test]
    fn an_interval_ticks_at_multiples_since_the_epoch() {
        let s = Spec::Every { ms: 30_000 };
        assert_eq!(s.at_or_before(T0), Some(T0));
        assert_eq!(s.at_or_before(T0 + 29_999), Some(T0));
        assert_eq!(s.after(T0), Some(T0 + 30_000));
        assert_eq!(s.after(T0 - 1), Some(T0));
        assert_eq!(s.at_or_before(T0 - 1), Some(T0 - 30_000));
    }

    #[test]
    fn a_cron_ticks_in_utc_by_default_and_in_whole_seconds() {
        let s = cron("*/15 * * * *", "UTC");
        assert_eq!(s.at_or_before(T0 + 20 * MIN + 500), Some(T0 + 15 * MIN));
        assert_eq!(s.after(T0 + 15 * MIN), Some(T0 + 30 * MIN));
        assert_eq!(s.after(T0 + 15 * MIN - 1), Some(T0 + 15 * MIN));
        assert_eq!(s.at_or_before(T0 + 15 * MIN), Some(T0 + 15 * MIN));
        let secs = cron("*/10 * * * * *", "UTC");
        assert_eq!(secs.after(T0 + 1), Some(T0 + 10_000));
    }

    #[test]
    fn a_cron_in_a_zone_follows_its_dst_changes() {
        // New York: EST (UTC-5) until 2026-03-08 02:00, EDT (UTC-4) until 2026-11-01 02:00.
        let nine = cron("0 9 * * *", "America/New_York");
        assert_eq!(
            ticks(
                &nine,
                ms("2026-03-07T00:00:00Z"),
                ms("2026-03-10T00:00:00Z")
            ),
            [
                "2026-03-07T14:00:00.000Z",
                "2026-03-08T13:00:00.000Z",
                "2026-03-09T13:00:00.000Z"
            ]
        );
        assert_eq!(
            nine.after(ms("2026-03-07T14:00:00Z")).unwrap() - ms("2026-03-07T14:00:00Z"),
            23 * HOUR,
            "the day of the spring change has 23 hours"
        );
        assert_eq!(
            ticks(
                &nine,
                ms("2026-10-31T00:00:00Z"),
                ms("2026-11-03T00:00:00Z")
            ),
            [
                "2026-10-31T13:00:00.000Z",
                "2026-11-01T14:00:00.000Z",
                "2026-11-02T14:00:00.000Z"
            ]
        );
        // 02:30 does not exist on 2026-03-08; 01:30 happens twice on 2026-11-01. Either way
        // the job runs once that day.
        let gap = cron("30 2 * * *", "America/New_York");
        assert_eq!(
            ticks(&gap, ms("2026-03-08T05:00:00Z"), ms("2026-03-09T05:00:00Z")),
            ["2026-03-08T07:00:00.000Z"],
            "once, at 03:00 EDT, the end of the gap"
        );
        let fold = cron("30 1 * * *", "America/New_York");
        assert_eq!(
            ticks(
                &fold,
                ms("2026-11-01T04:00:00Z"),
                ms("2026-11-02T05:00:00Z")
            ),
            ["2026-11-01T05:30:00.000Z"],
            "the first 01:30 (EDT) only"
        );
        assert_eq!(
            fold.at_or_before(ms("2026-11-01T07:00:00Z")),
            Some(ms("2026-11-01T05:30:00Z"))
        );
    }

    #[test]
    fn tick_keys_are_rfc3339_utc_with_milliseconds() {
        assert_eq!(
            tick_key("nightly", ms("2026-03-08T07:00:00Z")),
            "schedule:nightly:2026-03-08T07:00:00.000Z"
        );
    }

    fn entry(name: &str) -> ScheduleConfig {
        ScheduleConfig {
            name: name.into(),
            queue: "q".into(),
            job_type: "t".into(),
            every_ms: Some(60_000),
            ..Default::default()
        }
    }

    fn check(tweak: impl FnOnce(&mut Config)) -> Result<Schedules, String> {
        let mut c = Config::default();
        tweak(&mut c);
        let limits = Limits::from_config(&c).unwrap();
        Schedules::from_config(&c, &limits, T0).map_err(|e| e.0)
    }

    #[test]
    fn a_bad_schedule_is_named_with_its_field() {
        let err = |f: fn(&mut ScheduleConfig)| {
            check(|c| {
                let mut s = entry("nightly");
                f(&mut s);
                c.schedules.push(s);
            })
            .unwrap_err()
        };
        let e = err(|s| s.name = "a b".into());
        assert!(
            e.starts_with("config key schedules[0].name (schedule \"a b\")"),
            "{e}"
        );
        let e = err(|s| s.cron = Some("0 3 * * *".into()));
        assert!(
            e.contains("schedules[0] (\"nightly\"): set exactly one of cron"),
            "{e}"
        );
        let e = err(|s| {
            s.every_ms = None;
            s.cron = Some("61 * * * *".into());
        });
        assert!(
            e.starts_with("config key schedules[0].cron (schedule \"nightly\")"),
            "{e}"
        );
        let e = err(|s| {
            s.every_ms = None;
            s.cron = Some("0 3 * * *".into());
            s.timezone = Some("Mars/Olympus".into());
        });
        assert!(e.starts_with("config key schedules[0].timezone"), "{e}");
        let e = err(|s| s.timezone = Some("UTC".into()));
        assert!(e.contains(".timezone") && e.contains("cron only"), "{e}");
        let e = err(|s| s.every_ms = Some(999));
        assert!(
            e.contains(".every_ms") && e.contains("allowed 1000 to"),
            "{e}"
        );
        let e = err(|s| {
            s.payload = Some("{}".into());
            s.payload_base64 = Some("e30=".into());
        });
        assert!(
            e.contains(".payload_base64") && e.contains("not both"),
            "{e}"
        );
        let e = err(|s| s.payload_base64 = Some("!!".into()));
        assert!(
            e.contains(".payload_base64") && e.contains("not base64"),
            "{e}"
        );
        let e = err(|s| s.content_type = Some("text/plain".into()));
        assert!(e.contains(".content_type"), "{e}");
        let e = err(|s| s.priority = Some(12));
        assert!(
            e.contains("schedules[0] (\"nightly\")") && e.contains("priority"),
            "{e}"
        );
        let e = err(|s| {
            s.every_ms = None;
            s.cron = Some("0 0 30 2 *".into());
        });
        assert!(e.contains(".cron") && e.contains("never ticks"), "{e}");

        let e = check(|c| {
            c.schedules.push(entry("a"));
            c.schedules.push(entry("a"));
        })
        .unwrap_err();
        assert!(e.starts_with("config key schedules[1].name") && e.contains("schedules[0]"));
        let e = check(|c| {
            c.server.strict_queues = true;
            c.schedules.push(entry("a"));
        })
        .unwrap_err();
        assert!(e.starts_with("config key schedules[0].queue"), "{e}");
        let e = check(|c| {
            c.limits.max_idempotency_key_bytes = 40;
            c.schedules.push(entry("a-rather-long-schedule-name"));
        })
        .unwrap_err();
        assert!(
            e.starts_with("config key schedules[0].name") && e.contains("40"),
            "{e}"
        );
    }

    #[test]
    fn a_payload_defaults_to_json_and_base64_carries_bytes() {
        let s = check(|c| {
            let mut a = entry("a");
            a.payload = Some("{\"x\":1}".into());
            c.schedules.push(a);
            let mut b = entry("b");
            b.payload_base64 = Some("AAEC".into());
            b.content_type = Some("application/octet-stream".into());
            c.schedules.push(b);
        })
        .unwrap();
        let p = s.list()[0].payload.clone().unwrap();
        assert_eq!(
            (p.data.as_slice(), p.encoding.as_str()),
            (&b"{\"x\":1}"[..], "application/json")
        );
        let p = s.list()[1].payload.clone().unwrap();
        assert_eq!(p.data, [0, 1, 2]);
    }

    struct World {
        _dir: tempfile::TempDir,
        store: Arc<dyn Store>,
        clock: Arc<ManualClock>,
        config: Config,
    }

    impl World {
        fn new(tweak: impl FnOnce(&mut Config)) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let store: Arc<dyn Store> = Arc::new(
                EmbeddedStore::open(
                    EmbeddedOptions {
                        path: dir.path().join("data"),
                        persist_mode: PersistMode::Buffer,
                        min_free_bytes: 0,
                    },
                    T0,
                )
                .unwrap(),
            );
            let mut config = Config::default();
            config.queues.push(QueueConfig {
                name: "q".into(),
                dedup_window_ms: Some(10 * MIN as u64),
                ..Default::default()
            });
            tweak(&mut config);
            World {
                _dir: dir,
                store,
                clock: Arc::new(ManualClock::new(T0 + 10)),
                config,
            }
        }

        /// A server's queue layer over the shared store (one per server).
        fn server(&self) -> Arc<Queue> {
            let limits = Arc::new(Limits::from_config(&self.config).unwrap());
            let schedules =
                Arc::new(Schedules::from_config(&self.config, &limits, self.clock.now()).unwrap());
            Arc::new(
                Queue::new(
                    self.store.clone(),
                    limits,
                    self.clock.clone(),
                    CancellationToken::new(),
                )
                .with_schedules(schedules),
            )
        }

        async fn keys(&self, name: &str, ticks: &[UnixMs]) -> Vec<Option<JobId>> {
            let mut out = Vec::new();
            for t in ticks {
                out.push(
                    self.store
                        .lookup_key("q", &tick_key(name, *t))
                        .await
                        .unwrap()
                        .map(|r| r.job_id),
                );
            }
            out
        }

        async fn jobs(&self) -> u64 {
            let s = self.store.queue_stats("q").await.unwrap();
            s.ready + s.scheduled + s.in_flight
        }
    }

    fn every_minute(catch_up: bool) -> impl FnOnce(&mut Config) {
        move |c| {
            let mut s = entry("m");
            s.catch_up = catch_up;
            c.schedules.push(s);
        }
    }

    fn created(f: &[Fired]) -> Vec<(UnixMs, bool)> {
        f.iter()
            .map(|f| match &f.outcome {
                FiredOutcome::Enqueued(a) => (f.tick, a.deduplicated),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn advancing_across_three_ticks_enqueues_three_jobs_with_their_keys() {
        let w = World::new(every_minute(false));
        let mut s = Scheduler::new(w.server());
        assert!(
            s.run_due().await.is_empty(),
            "no tick at or after the start yet"
        );
        assert_eq!(s.next_tick(), Some(T0 + MIN));
        let mut all = Vec::new();
        for i in 1..=3 {
            w.clock.set(T0 + i * MIN);
            all.extend(created(&s.run_due().await));
            // Nothing more until the next tick.
            w.clock.advance(MIN / 2);
            assert!(s.run_due().await.is_empty());
        }
        assert_eq!(
            all,
            [
                (T0 + MIN, false),
                (T0 + 2 * MIN, false),
                (T0 + 3 * MIN, false)
            ]
        );
        assert_eq!(w.jobs().await, 3);
        let ids = w.keys("m", &[T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN]).await;
        assert!(ids.iter().all(Option::is_some));
        assert_eq!(
            w.store
                .lookup_key("q", "schedule:m:2026-12-02T00:01:00.000Z")
                .await
                .unwrap()
                .map(|r| r.job_id),
            ids[0]
        );
    }

    #[tokio::test]
    async fn a_clock_step_back_or_forward_enqueues_no_tick_twice() {
        let w = World::new(every_minute(false));
        let mut s = Scheduler::new(w.server());
        w.clock.set(T0 + 2 * MIN);
        assert_eq!(created(&s.run_due().await), [(T0 + 2 * MIN, false)]);
        // Back across the tick: nothing again.
        w.clock.set(T0 + MIN + 1);
        assert!(s.run_due().await.is_empty());
        w.clock.set(T0 + 2 * MIN + 5);
        assert!(s.run_due().await.is_empty());
        // Forward across three ticks: the latest only.
        w.clock.set(T0 + 5 * MIN + 5);
        assert_eq!(created(&s.run_due().await), [(T0 + 5 * MIN, false)]);
        assert_eq!(w.jobs().await, 2);
    }

    #[tokio::test]
    async fn two_servers_on_one_store_enqueue_each_tick_once() {
        let w = World::new(every_minute(false));
        let mut a = Scheduler::new(w.server());
        let mut b = Scheduler::new(w.server());
        for i in 1..=3 {
            w.clock.set(T0 + i * MIN);
            let (fa, fb) = tokio::join!(a.run_due(), b.run_due());
            let (fa, fb) = (created(&fa), created(&fb));
            assert_eq!((fa.len(), fb.len()), (1, 1));
            assert_eq!(
                u8::from(fa[0].1) + u8::from(fb[0].1),
                1,
                "one created the job, the other was a dedup hit"
            );
        }
        assert_eq!(w.jobs().await, 3);
    }

    #[tokio::test]
    async fn on_restart_catch_up_enqueues_the_latest_missed_tick_once() {
        let w = World::new(every_minute(true));
        let mut s = Scheduler::new(w.server());
        w.clock.set(T0 + MIN);
        assert_eq!(created(&s.run_due().await), [(T0 + MIN, false)]);
        drop(s);
        // Down across three ticks; the restart enqueues the last of them only.
        w.clock.set(T0 + 4 * MIN + 30_000);
        let mut s = Scheduler::new(w.server());
        assert_eq!(created(&s.run_due().await), [(T0 + 4 * MIN, false)]);
        assert_eq!(w.jobs().await, 2);
        assert_eq!(
            w.keys("m", &[T0 + 2 * MIN, T0 + 3 * MIN]).await,
            [None, None]
        );
        // A second restart before the next tick: a dedup hit, no new job.
        let mut again = Scheduler::new(w.server());
        assert_eq!(created(&again.run_due().await), [(T0 + 4 * MIN, true)]);
        assert_eq!(w.jobs().await, 2);
    }

    #[tokio::test]
    async fn a_tick_out_of_the_windows_reach_is_skipped() {
        let w = World::new(every_minute(true));
        // The queue's window is 10 minutes, so a tick may be enqueued up to 9 minutes late.
        let mut s = Scheduler::new(w.server());
        w.clock.set(T0 + MIN);
        s.run_due().await;
        // Stalled for longer than the reach, just after a tick: the tick is still due...
        w.clock.set(T0 + 30 * MIN + 9 * MIN);
        let f = s.run_due().await;
        assert_eq!(created(&f), [(T0 + 39 * MIN, false)]);
        // ...but a catch-up of a tick older than the reach is skipped.
        let w = World::new(|c| {
            let mut s = entry("h");
            s.every_ms = Some(3_600_000);
            s.catch_up = true;
            c.schedules.push(s);
        });
        w.clock.set(T0 + 9 * MIN);
        let f = Scheduler::new(w.server()).run_due().await;
        assert_eq!(f[0].outcome, FiredOutcome::TooLate);
        assert_eq!(w.jobs().await, 0);
    }

    #[tokio::test]
    async fn on_restart_without_catch_up_a_missed_tick_is_skipped() {
        let w = World::new(every_minute(false));
        let mut s = Scheduler::new(w.server());
        w.clock.set(T0 + MIN);
        assert_eq!(created(&s.run_due().await), [(T0 + MIN, false)]);
        drop(s);
        w.clock.set(T0 + 4 * MIN + 30_000);
        let mut s = Scheduler::new(w.server());
        assert!(s.run_due().await.is_empty());
        assert_eq!(s.next_tick(), Some(T0 + 5 * MIN));
        w.clock.set(T0 + 5 * MIN);
        assert_eq!(created(&s.run_due().await), [(T0 + 5 * MIN, false)]);
        assert_eq!(w.jobs().await, 2);
    }

    #[tokio::test]
    async fn the_last_tick_is_read_from_the_store() {
        let w = World::new(every_minute(false));
        let q = w.server();
        let mut s = Scheduler::new(q.clone());
        let v = &q.list_schedules().await.unwrap()[0];
        assert_eq!((v.next_tick, v.last), (Some(T0 + MIN), None));
        w.clock.set(T0 + MIN);
        let f = s.run_due().await;
        let FiredOutcome::Enqueued(a) = &f[0].outcome else {
            panic!()
        };
        // Another server (no scheduler of its own) sees it, also after the next tick is due.
        let other = w.server();
        w.clock.set(T0 + 2 * MIN + 1);
        let v = &other.list_schedules().await.unwrap()[0];
        assert_eq!(v.next_tick, Some(T0 + 3 * MIN));
        assert_eq!(
            v.last,
            Some(LastTick {
                tick: T0 + MIN,
                job_id: a.job_id,
                enqueued_at: T0 + MIN
            })
        );
    }
}
