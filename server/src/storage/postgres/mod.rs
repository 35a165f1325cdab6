//! The PostgreSQL backend: one database that any number of sepp servers share.
//!
//! Each transition is one PostgreSQL transaction that reads the facts it concerns with row
//! locks (`SELECT … FOR UPDATE`, or the dedup claim below), calls the rule the queue layer
//! gave it, applies the plan and commits; a method returns only after `COMMIT`. Times are
//! parameters from the queue's clock: no statement reads the database's clock (`now()`), so a
//! manual clock drives this backend as it drives the embedded one. Schema and indexes:
//! `migrations/` and `docs/postgres.md`.
//!
//! - **Dedup**: the unique key of `sepp_dedup (queue, key)`. A keyed job claims its key with one
//!   `INSERT … ON CONFLICT (queue, key) DO UPDATE … WHERE <the record expired> RETURNING`: the
//!   statement decides between concurrent enqueues of one key (on any server) and replaces an
//!   expired record in place; when it returns nothing, a live record holds the key, locked by
//!   the statement, and is read for the rule. No check-then-insert.
//! - **Group commit** (`group_commit`): the enqueues waiting on one server are done by one
//!   flush, in one transaction and a fixed number of statements (multi-row statements over
//!   `unnest` arrays); every enqueue of it replies after that `COMMIT`.
//! - **Reserve**: `FOR UPDATE SKIP LOCKED` over the partial index `sepp_jobs_ready (queue,
//!   priority DESC, seq) WHERE stage = 0`, so a reserve reads the jobs it returns (plus those
//!   other reserves hold), not the queue; it starts after where the last one on this server
//!   stopped when it can (`cursor`), past the index entries of the jobs leased before.
//! - **Settlements** are fenced in the `UPDATE … WHERE` itself (the attempt the rule saw, and a
//!   lease not yet [`crate::domain::reached`] at the time passed in), besides the row lock.
//! - **Sweeper**: `maintain` runs only in the server that gets the transaction-level advisory
//!   lock `SWEEP_LOCK`; each pass is a bounded set of statements (`LIMIT budget`).

mod cursor;
mod group_commit;
mod listen;
pub(crate) mod schema;
pub(crate) mod tls;

use self::cursor::Cursors;
use self::group_commit::{GroupCommit, ToCaller};
use super::embedded::codec::Body;
use super::{
    BackupReport, CreateQueueRule, Deadlines, DeleteQueueRule, EnqueueFacts, EnqueueRule,
    ExpiryRule, FitRule, Maintenance, PauseOutcome, QueueDeletion, QueueGauges, ReadyJobs,
    ReadyListener, RemovalRule, ReserveFitRule, SettleRule, Settled, StorageError, StorageHealth,
    Store, StoreGauges, SweepPass,
};
use super::{RateBucket, RateCounts};
use crate::domain::{
    CancelSelector, DeadLetter, DeadLetterCause, DeadLetterCursor, DeadLetterSelector, Expiry,
    Fingerprint, Finish, Fit, InsertOutcome, Job, JobCursor, JobFacts, JobId, KeyRecord,
    LastReason, ListState, NewJob, Placement, QueueStats, Requeue, ReserveSpec, Settle,
    SettleRefusal, Stage, StoredJob, UnixMs,
};
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use tokio_postgres::Row;
use uuid::Uuid;

/// The transaction-level advisory lock of the sweeper: one server sweeps at a time.
pub(crate) const SWEEP_LOCK: i64 = 0x7365_7070_0000_0002;

/// How to open the PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// The libpq connection string (with its password; never log it).
    pub url: String,
    /// Most pooled connections.
    pub pool_size: u32,
    /// `statement_timeout` of every session, in milliseconds.
    pub statement_timeout_ms: u64,
    /// Longest a waiting Reserve goes without a look at the database, in milliseconds.
    pub poll_interval_ms: u64,
    /// PEM certificate(s) of the CA the server's certificate must lead to (`storage.postgres_ca_file`).
    pub ca_file: Option<std::path::PathBuf>,
}

const READY: i16 = 0;
const SCHEDULED: i16 = 1;
const IN_FLIGHT: i16 = 2;
const DEAD: i16 = 3;
const TOMBSTONE: i16 = 4;

fn cause_code(c: DeadLetterCause) -> i16 {
    match c {
        DeadLetterCause::AttemptsExhausted => 0,
        DeadLetterCause::Rejected => 1,
        DeadLetterCause::LeaseExpired => 2,
        DeadLetterCause::Admin => 3,
    }
}

fn cause_of(code: i16) -> Result<DeadLetterCause, StorageError> {
    Ok(match code {
        0 => DeadLetterCause::AttemptsExhausted,
        1 => DeadLetterCause::Rejected,
        2 => DeadLetterCause::LeaseExpired,
        3 => DeadLetterCause::Admin,
        n => return Err(corrupt(format!("dead_cause {n}"))),
    })
}

fn corrupt(detail: String) -> StorageError {
    StorageError::Corrupt {
        what: "sepp_jobs row",
        detail,
    }
}

fn invalid_plan(what: &str) -> StorageError {
    StorageError::InvalidPlan(what.to_string())
}

/// A driver error as a storage error: connection loss, timeouts, cancellations, conflicts
/// and a server shutting down are `Unavailable` (a client may retry); the rest is `Io`.
pub(crate) fn pg_err(e: tokio_postgres::Error) -> StorageError {
    let text = schema::error_text(&e);
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            if ["08", "40", "53", "57", "58", "25"]
                .iter()
                .any(|c| code.starts_with(c))
            {
                StorageError::Unavailable(format!("PostgreSQL: {text}"))
            } else {
                StorageError::Io(format!("PostgreSQL: {text} (SQLSTATE {code})"))
            }
        }
        None => StorageError::Unavailable(format!("PostgreSQL: {text}")),
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StorageError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => pg_err(e),
        other => StorageError::Unavailable(format!("PostgreSQL pool: {other}")),
    }
}

fn is_retryable(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        let c = db.code();
        *c == tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED
            || *c == tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
    })
}

fn uuid(id: JobId) -> Uuid {
    Uuid::from_u128(id.0)
}

fn job_id(u: Uuid) -> JobId {
    JobId(u.as_u128())
}

fn u32_of(v: i32, what: &str) -> Result<u32, StorageError> {
    u32::try_from(v).map_err(|_| corrupt(format!("{what} {v}")))
}

/// Every column of a job row, in the order [`JobRow::from_row`] reads them.
const JOB_COLUMNS: &str = "id, queue, job_type, priority, seq, enqueued_at, attempt, \
     max_attempts, stage, due_at, lease_expires_at, dead_cause, failed_at, finished_at, \
     tomb_until, worker_id, last_reason, dedup_until, reply_bytes, body";

/// The small columns (no body): what a rule's facts need.
const FACT_COLUMNS: &str = "id, queue, job_type, priority, seq, enqueued_at, attempt, \
     max_attempts, stage, due_at, lease_expires_at, dead_cause, failed_at, finished_at, \
     tomb_until, worker_id, last_reason, dedup_until, reply_bytes, NULL::bytea AS body";

/// One `sepp_jobs` row.
struct JobRow {
    id: JobId,
    queue: String,
    job_type: String,
    priority: u8,
    enqueued_at: UnixMs,
    attempt: u32,
    max_attempts: u32,
    stage: Stage,
    worker_id: Option<String>,
    last_reason: Option<String>,
    dedup_until: Option<UnixMs>,
    body: Option<Vec<u8>>,
}

impl JobRow {
    fn from_row(r: &Row) -> Result<Self, StorageError> {
        let get_ms = |i: usize, what: &str| -> Result<UnixMs, StorageError> {
            r.get::<_, Option<i64>>(i)
                .ok_or_else(|| corrupt(format!("{what} is NULL")))
        };
        let stage = match r.get::<_, i16>(8) {
            READY => Stage::Ready,
            SCHEDULED => Stage::Scheduled {
                due: get_ms(9, "due_at")?,
            },
            IN_FLIGHT => Stage::InFlight {
                expires: get_ms(10, "lease_expires_at")?,
            },
            DEAD => Stage::Dead {
                cause: cause_of(
                    r.get::<_, Option<i16>>(11)
                        .ok_or_else(|| corrupt("dead_cause is NULL".into()))?,
                )?,
                failed_at: get_ms(12, "failed_at")?,
            },
            TOMBSTONE => Stage::Tombstone {
                finished_at: get_ms(13, "finished_at")?,
                until: get_ms(14, "tomb_until")?,
                dead: r.get::<_, Option<i16>>(11).map(cause_of).transpose()?,
            },
            n => return Err(corrupt(format!("stage {n}"))),
        };
        Ok(JobRow {
            id: job_id(r.get(0)),
            queue: r.get(1),
            job_type: r.get(2),
            priority: u8::try_from(r.get::<_, i16>(3))
                .map_err(|_| corrupt("priority out of range".into()))?,
            enqueued_at: r.get(5),
            attempt: u32_of(r.get(6), "attempt")?,
            max_attempts: u32_of(r.get(7), "max_attempts")?,
            stage,
            worker_id: r.get(15),
            last_reason: r.get(16),
            dedup_until: r.get(17),
            body: r.get(19),
        })
    }

    fn facts(&self) -> JobFacts<'_> {
        JobFacts {
            id: self.id,
            queue: &self.queue,
            stage: self.stage,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            dedup_until: self.dedup_until,
        }
    }

    fn body(&self) -> Result<Option<Body>, StorageError> {
        self.body.as_deref().map(Body::decode).transpose()
    }

    fn job(&self, body: Body) -> Job {
        Job {
            id: self.id,
            queue: self.queue.clone(),
            job_type: body.job_type,
            payload: body.payload,
            priority: self.priority,
            trace_context: body.trace_context,
            enqueued_at: self.enqueued_at,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            lease_expires_at: match self.stage {
                Stage::InFlight { expires } => Some(expires),
                _ => None,
            },
            custom: body.custom,
            scheduled_at: body.scheduled_at,
        }
    }

    /// The dead letter this row is, with its body; `None` when it is not one or has no body.
    fn dead_letter(&self) -> Result<Option<DeadLetter>, StorageError> {
        let Stage::Dead { cause, failed_at } = self.stage else {
            return Ok(None);
        };
        Ok(self.body()?.map(|b| DeadLetter {
            job: self.job(b),
            cause,
            failed_at,
            final_attempt: self.attempt,
            last_reason: self.last_reason.clone(),
        }))
    }
}

struct Shared {
    pool: Pool,
    commit: GroupCommit,
    closed: AtomicBool,
    health: tokio::sync::watch::Sender<StorageHealth>,
    listener: OnceLock<Arc<dyn ReadyListener>>,
    /// One maintenance pass at a time in this server (the advisory lock keeps the others
    /// out; without this, two passes of one server would race for it and one find nothing).
    sweeping: tokio::sync::Mutex<()>,
    /// This store's id in its `NOTIFY` payloads.
    origin: u64,
    /// Where the last Reserve of each queue stopped (a hint).
    cursors: Arc<Cursors>,
    /// The connection settings, for the `LISTEN` connection.
    cfg: tokio_postgres::Config,
    /// Its TLS connector ([`tls::connection`]).
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    /// Stops the `LISTEN` task.
    stop: tokio_util::sync::CancellationToken,
    /// Where the database is, for messages (no password).
    place: String,
}

/// The PostgreSQL [`Store`].
pub struct PostgresStore {
    shared: Arc<Shared>,
    opts: PostgresOptions,
}

impl PostgresStore {
    /// Connects, applies the migrations this build has (under an advisory lock) and builds the
    /// connection pool.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] naming host, port, database and user (never the password)
    /// when the database cannot be reached or refuses the login; [`StorageError::Io`] for a
    /// bad connection string, a schema newer than this build, or a failed migration.
    pub async fn open(opts: PostgresOptions) -> Result<Self, StorageError> {
        let (mut cfg, tls) = tls::connection(&opts.url, opts.ca_file.as_deref())?;
        let mut options = cfg.get_options().unwrap_or("").to_string();
        if !options.is_empty() {
            options.push(' ');
        }
        options.push_str(&format!(
            "-c statement_timeout={} -c lock_timeout={}",
            opts.statement_timeout_ms, opts.statement_timeout_ms
        ));
        cfg.options(&options);
        if cfg.get_application_name().is_none() {
            cfg.application_name("sepp");
        }
        if cfg.get_connect_timeout().is_none() {
            cfg.connect_timeout(std::time::Duration::from_secs(10));
        }
        let place = schema::describe(&cfg);
        let listen_cfg = cfg.clone();
        schema::migrate(&cfg, tls.clone()).await?;
        let manager = Manager::from_config(
            cfg,
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(opts.pool_size as usize)
            .build()
            .map_err(|e| StorageError::Io(format!("cannot build the PostgreSQL pool: {e}")))?;
        // One connection now: a database that accepts the migration connection but not the
        // pool's fails here, not at the first request.
        drop(pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e) => StorageError::Unavailable(format!(
                "cannot connect to PostgreSQL ({place}): {}",
                schema::error_text(&e)
            )),
            other => StorageError::Unavailable(format!(
                "cannot connect to PostgreSQL ({place}): {other}"
            )),
        })?);
        let (health, _) = tokio::sync::watch::channel(StorageHealth::Serving);
        let origin = u64::try_from(Uuid::new_v4().as_u128() >> 64).unwrap_or(1);
        let cursors = Arc::new(Cursors::default());
        let shared = Arc::new(Shared {
            commit: GroupCommit::new(
                pool.clone(),
                origin,
                cursors.clone(),
                group_commit::flush_slots(opts.pool_size),
            ),
            cursors,
            pool,
            closed: AtomicBool::new(false),
            health,
            listener: OnceLock::new(),
            sweeping: tokio::sync::Mutex::new(()),
            origin,
            cfg: listen_cfg,
            tls,
            stop: tokio_util::sync::CancellationToken::new(),
            place,
        });
        Ok(PostgresStore { shared, opts })
    }

    /// Where the database is (hosts, ports, database, user), for the start-up log.
    pub fn place(&self) -> &str {
        &self.shared.place
    }

    /// The options it was opened with.
    pub fn options(&self) -> &PostgresOptions {
        &self.opts
    }
}

impl Shared {
    fn check_writable(&self) -> Result<(), StorageError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StorageError::Unavailable(
                "storage is closed: the server is shutting down".into(),
            ));
        }
        Ok(())
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StorageError> {
        self.pool.get().await.map_err(pool_err)
    }
}

/// What the enqueue rule reads: the records and depths read before it ran, in the same
/// transaction, under the locks that keep them true until `COMMIT`.
struct Facts {
    records: Vec<Option<KeyRecord>>,
    depths: Vec<(String, u64)>,
    /// Where the jobs the live records name are, read with the records.
    stages: Vec<(JobId, Stage)>,
    /// The batch's queues that have a `sepp_queues` row, each locked `FOR KEY SHARE` until
    /// `COMMIT` (a DeleteQueue waits for it).
    queues: Vec<String>,
    /// Rows of `sepp_queues`, read under [`QUEUE_CREATE_LOCK`] when a queue of the batch has
    /// none.
    queue_count: Option<u64>,
}

impl EnqueueFacts for Facts {
    fn record(&self, i: usize) -> Option<KeyRecord> {
        self.records.get(i).copied().flatten()
    }

    fn depth(&self, queue: &str) -> u64 {
        self.depths
            .iter()
            .find(|(q, _)| q == queue)
            .map_or(0, |(_, n)| *n)
    }

    fn queue_exists(&self, queue: &str) -> bool {
        self.queues.iter().any(|q| q == queue)
    }

    fn queue_count(&self) -> u64 {
        self.queue_count.unwrap_or(self.queues.len() as u64)
    }

    fn stage(&self, id: JobId) -> Option<Stage> {
        self.stages.iter().find(|(j, _)| *j == id).map(|(_, s)| *s)
    }
}

/// The transaction-level advisory lock under which a queue is created (an arbitrary constant:
/// "sepp" + 2): the count of queues read under it stays true until `COMMIT`, so that two
/// servers cannot both take the last place under `limits.max_queues`.
const QUEUE_CREATE_LOCK: i64 = 0x7365_7070_0000_0002;

/// Which of the queues `$1` exist, locked so that a DeleteQueue waits for this transaction.
const QUEUES_HELD: &str = "SELECT name FROM sepp_queues WHERE name = ANY($1::text[]) FOR KEY SHARE";

/// A fingerprint as its column stores it (the same 64 bits, as a signed `bigint`).
fn fingerprint_column(f: Option<Fingerprint>) -> Option<i64> {
    f.map(|f| i64::from_ne_bytes(f.get().to_ne_bytes()))
}

fn fingerprint_of(v: Option<i64>) -> Option<Fingerprint> {
    v.and_then(|v| Fingerprint::new(u64::from_ne_bytes(v.to_ne_bytes())))
}

/// The hot paths' statements go through each pooled connection's statement cache (deadpool's
/// `prepare_cached`): a statement is parsed and planned once per connection instead of once per
/// call, which saves a round trip to the database per statement. Only for SQL whose text comes
/// from a small fixed set (constants, or formats of constants), never SQL with data in it, so
/// the caches stay bounded.
#[async_trait::async_trait]
trait Cached: GenericClient + Sync {
    async fn cached_query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let st = self.prepare_cached(sql).await?;
        self.query(&st, params).await
    }

    async fn cached_query_opt(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
        let st = self.prepare_cached(sql).await?;
        self.query_opt(&st, params).await
    }

    async fn cached_execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let st = self.prepare_cached(sql).await?;
        self.execute(&st, params).await
    }
}

impl<T: GenericClient + Sync> Cached for T {}

/// The counts of `queue`, read through `client` (inside a transaction when it is one).
async fn stats_in(
    client: &impl GenericClient,
    queue: &str,
) -> Result<QueueStats, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT stage, count(*) FROM sepp_jobs WHERE queue = $1 GROUP BY stage",
            &[&queue],
        )
        .await?;
    let mut s = QueueStats::default();
    for r in &rows {
        let n = u64::try_from(r.get::<_, i64>(1)).unwrap_or(0);
        match r.get::<_, i16>(0) {
            READY => s.ready = n,
            SCHEDULED => s.scheduled = n,
            IN_FLIGHT => s.in_flight = n,
            DEAD => s.dead_lettered = n,
            _ => {}
        }
    }
    let r = client
        .query_one(
            "SELECT (SELECT count(*) FROM sepp_dedup WHERE queue = $1), \
             coalesce((SELECT paused FROM sepp_queues WHERE name = $1), false)",
            &[&queue],
        )
        .await?;
    s.dedup_records = u64::try_from(r.get::<_, i64>(0)).unwrap_or(0);
    s.paused = r.get(1);
    Ok(s)
}

/// What job inspection reports of a row: the key and, `with_content`, what the job carries,
/// read from its body (none for a tombstone).
fn stored_of(row: JobRow, with_content: bool) -> Result<StoredJob, StorageError> {
    let body = match row.stage {
        Stage::Tombstone { .. } => None,
        _ => row.body()?,
    };
    let (key, content) = body.map_or((None, None), |b| b.inspected(with_content));
    Ok(StoredJob {
        id: row.id,
        queue: row.queue,
        job_type: row.job_type,
        stage: row.stage,
        attempt: row.attempt,
        max_attempts: row.max_attempts,
        priority: row.priority,
        enqueued_at: row.enqueued_at,
        last_reason: row.last_reason,
        idempotency_key: key,
        worker_id: row.worker_id,
        content,
    })
}

/// A job's place in the listing of its state ([`JobCursor`]), and the SQL of that listing:
/// its condition, the position to compare with a cursor, and its order.
fn listing_sql(state: ListState) -> (&'static str, &'static str, &'static str) {
    match state {
        ListState::Ready => (
            "stage = 0",
            "(9 - priority)::bigint, seq",
            "priority DESC, seq, id",
        ),
        ListState::Scheduled => ("stage = 1", "due_at, 0::bigint", "due_at, id"),
        ListState::InFlight => (
            "stage = 2",
            "lease_expires_at, 0::bigint",
            "lease_expires_at, id",
        ),
        ListState::DeadLettered => ("stage = 3", "failed_at, 0::bigint", "failed_at, id"),
    }
}

/// Tells every server listening (`LISTEN sepp_ready`) which queues got ready jobs, as
/// `<origin> <count> <queue>` (`origin`: the sending store, which ignores its own: its queue
/// layer woke its waiters already); delivered at `COMMIT`, dropped on rollback.
///
/// Also forgets this server's Reserve cursor of each of those queues ([`Cursors`]): jobs made
/// ready now may sit before it.
async fn notify_ready<'a>(
    client: &impl GenericClient,
    sh: &Shared,
    queues: impl Iterator<Item = &'a str>,
) -> Result<(), tokio_postgres::Error> {
    let origin = sh.origin;
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for q in queues {
        sh.cursors.forget(q);
        match counts.iter_mut().find(|(x, _)| *x == q) {
            Some((_, n)) => *n += 1,
            None => counts.push((q, 1)),
        }
    }
    for (q, n) in counts {
        client
            .cached_execute(
                "SELECT pg_notify('sepp_ready', $1)",
                &[&format!("{origin:016x} {n} {q}")],
            )
            .await?;
    }
    Ok(())
}

fn push_ready(ready: &mut ReadyJobs, queue: &str) {
    match ready.iter_mut().find(|(q, _)| &**q == queue) {
        Some((_, n)) => *n += 1,
        None => ready.push((Arc::from(queue), 1)),
    }
}

/// `$2` (the reason) and `$3` (whether to set it) of a settlement's statement.
fn reason_params(reason: &LastReason) -> (Option<String>, bool) {
    match reason {
        LastReason::Unchanged => (None, false),
        LastReason::Set(r) => (r.clone(), true),
    }
}

/// Applies what stays of job `id` as it leaves the live set (or a dead letter leaves). The
/// statement's parameters: `$1` id, `$2` reason, `$3` whether to set it, then `guard_params`
/// from `$4` (used by `guard`, extra `AND …` conditions fencing the change). Returns the rows
/// changed.
async fn apply_finish(
    tx: &impl GenericClient,
    id: JobId,
    finish: Finish,
    reason: &LastReason,
    guard: &str,
    guard_params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<u64, tokio_postgres::Error> {
    let (reason_val, set_reason) = reason_params(reason);
    let id = uuid(id);
    let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
        vec![&id, &reason_val, &set_reason];
    params.extend_from_slice(guard_params);
    let next = params.len() + 1;
    const REASON: &str = "last_reason = CASE WHEN $3 THEN $2::text ELSE last_reason END";
    let (cause, failed_at, finished_at, until, dead);
    let sql = match finish {
        Finish::DeadLetter {
            cause: c,
            failed_at: f,
        } => {
            (cause, failed_at) = (cause_code(c), f);
            params.push(&cause);
            params.push(&failed_at);
            format!(
                "UPDATE sepp_jobs SET stage = 3, dead_cause = ${}, failed_at = ${}, \
                 lease_expires_at = NULL, due_at = NULL, {REASON} WHERE id = $1 {guard}",
                next,
                next + 1
            )
        }
        Finish::Tombstone {
            finished_at: f,
            until: u,
            dead: d,
        } => {
            (finished_at, until, dead) = (f, u, d.map(cause_code));
            params.push(&finished_at);
            params.push(&until);
            params.push(&dead);
            format!(
                "UPDATE sepp_jobs SET stage = 4, finished_at = ${}, tomb_until = ${}, \
                 dead_cause = ${}, lease_expires_at = NULL, due_at = NULL, failed_at = NULL, \
                 worker_id = NULL, body = NULL, {REASON} WHERE id = $1 {guard}",
                next,
                next + 1,
                next + 2
            )
        }
        Finish::Delete => format!(
            "DELETE FROM sepp_jobs WHERE id = $1 AND ($3 OR $2::text IS NULL OR TRUE) {guard}"
        ),
    };
    tx.cached_execute(&sql, &params).await
}

/// The dead letters a selector names (locked), oldest first for a queue selection.
async fn select_dead(
    tx: &impl GenericClient,
    selector: &DeadLetterSelector,
) -> Result<Vec<JobRow>, StorageError> {
    let rows = match selector {
        DeadLetterSelector::Ids(ids) => {
            let u: Vec<Uuid> = ids.iter().map(|i| uuid(*i)).collect();
            let rows = tx
                .query(
                    &format!(
                        "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE id = ANY($1) AND stage = 3 \
                         FOR UPDATE"
                    ),
                    &[&u],
                )
                .await
                .map_err(pg_err)?;
            let mut found: Vec<JobRow> = rows
                .iter()
                .map(JobRow::from_row)
                .collect::<Result<_, _>>()?;
            // In the selector's order, each once.
            let mut out = Vec::with_capacity(found.len());
            for id in ids {
                if let Some(p) = found.iter().position(|r| r.id == *id) {
                    out.push(found.swap_remove(p));
                }
            }
            return Ok(out);
        }
        DeadLetterSelector::Oldest { queue, max } => {
            let max = i64::from(*max);
            match queue {
                Some(q) => tx
                    .query(
                        &format!(
                            "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE queue = $1 AND stage = 3 \
                             ORDER BY failed_at, id LIMIT $2 FOR UPDATE"
                        ),
                        &[q, &max],
                    )
                    .await
                    .map_err(pg_err)?,
                None => tx
                    .query(
                        &format!(
                            "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE stage = 3 \
                             ORDER BY failed_at, id LIMIT $1 FOR UPDATE"
                        ),
                        &[&max],
                    )
                    .await
                    .map_err(pg_err)?,
            }
        }
    };
    rows.iter().map(JobRow::from_row).collect()
}

/// What a lease took inside a transaction not yet committed: the ids in the order taken, their
/// rows as the lease left them, and the queues whose Reserve cursors it moved.
struct Lease<'s> {
    taken: Vec<Uuid>,
    rows: HashMap<Uuid, JobRow>,
    touched: Vec<&'s str>,
}

impl Lease<'_> {
    /// The cursors moved by a lease whose transaction did not commit are forgotten: they may
    /// point past jobs that are still ready.
    fn forget_cursors(&self, sh: &Shared) {
        for q in &self.touched {
            sh.cursors.forget(q);
        }
    }

    /// The leased jobs, in the order taken (without those [`super::leased_body`] leaves out).
    fn jobs(mut self) -> Result<Vec<Job>, StorageError> {
        let mut jobs = Vec::with_capacity(self.taken.len());
        for id in &self.taken {
            if let Some(row) = self.rows.remove(id)
                && let Some(body) = super::leased_body(row.id, row.body())?
            {
                jobs.push(row.job(body));
            }
        }
        Ok(jobs)
    }
}

/// Leases up to `spec.max_jobs` ready jobs of `spec.queues` inside `tx`, as `fit` lets them
/// into the reply (none when `spec` asks for none); the caller commits (and forgets the
/// cursors if that fails).
async fn lease_in<'s>(
    sh: &Shared,
    tx: &deadpool_postgres::Transaction<'_>,
    spec: &'s ReserveSpec,
    fit: &ReserveFitRule<'_>,
) -> Result<Lease<'s>, StorageError> {
    let paused: Vec<String> = tx
        .cached_query(
            "SELECT name FROM sepp_queues WHERE paused AND name = ANY($1)",
            &[&spec.queues],
        )
        .await
        .map_err(pg_err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut taken: Vec<Uuid> = Vec::new();
    let mut used = 0u64;
    let mut touched: Vec<&str> = Vec::new();
    let result = async {
        'queues: for queue in &spec.queues {
            if paused.contains(queue) {
                continue;
            }
            let left = i64::from(spec.max_jobs) - taken.len() as i64;
            if left <= 0 {
                break;
            }
            touched.push(queue);
            // From this server's cursor first (`cursor.rs`), from the start of the queue
            // when that finds fewer jobs than asked.
            let mut rows = Vec::new();
            if let Some((priority, seq)) = sh.cursors.get(queue) {
                rows = tx
                    .cached_query(
                        "SELECT id, reply_bytes, priority, seq FROM sepp_jobs \
                         WHERE queue = $1 AND stage = 0 AND priority = $3 AND seq > $4 \
                         ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
                        &[queue, &left, &priority, &seq],
                    )
                    .await?;
            }
            if (rows.len() as i64) < left {
                // The rows the first scan locked come back in this one (this transaction
                // holds their locks), in their place.
                rows = tx
                    .cached_query(
                        "SELECT id, reply_bytes, priority, seq FROM sepp_jobs \
                         WHERE queue = $1 AND stage = 0 \
                         ORDER BY priority DESC, seq LIMIT $2 FOR UPDATE SKIP LOCKED",
                        &[queue, &left],
                    )
                    .await?;
            }
            let mut last = None;
            let mut stopped = false;
            for r in &rows {
                let size = u32::try_from(r.get::<_, i32>(1)).unwrap_or(0);
                match fit(size, used, taken.len()) {
                    Fit::Take(n) => used = used.saturating_add(n),
                    Fit::Skip | Fit::Stop => {
                        stopped = true;
                        break;
                    }
                }
                taken.push(r.get(0));
                last = Some((r.get::<_, i16>(2), r.get::<_, i64>(3)));
            }
            match last {
                // The queue may hold more after the last job taken.
                Some((priority, seq)) if stopped || rows.len() as i64 == left => {
                    sh.cursors.set(queue, priority, seq);
                }
                _ => sh.cursors.forget(queue),
            }
            if stopped {
                break 'queues;
            }
        }
        Ok::<_, tokio_postgres::Error>(())
    }
    .await;
    let mut lease = Lease {
        taken,
        rows: HashMap::new(),
        touched,
    };
    if let Err(e) = result {
        lease.forget_cursors(sh);
        return Err(pg_err(e));
    }
    if lease.taken.is_empty() {
        return Ok(lease);
    }
    let updated = async {
        let rows = tx
            .cached_query(
                &format!(
                    "UPDATE sepp_jobs SET stage = 2, attempt = attempt + 1, \
                     lease_expires_at = $2, worker_id = $3 \
                     WHERE id = ANY($1) AND stage = 0 RETURNING {JOB_COLUMNS}"
                ),
                &[&lease.taken, &spec.lease_expires_at, &spec.worker_id],
            )
            .await
            .map_err(pg_err)?;
        for r in &rows {
            let row = JobRow::from_row(r)?;
            lease.rows.insert(uuid(row.id), row);
        }
        Ok::<_, StorageError>(())
    }
    .await;
    if let Err(e) = updated {
        lease.forget_cursors(sh);
        return Err(e);
    }
    Ok(lease)
}

/// Settles job `id` inside `tx` as [`Store::settle`] does; the caller commits.
async fn settle_in(
    sh: &Shared,
    tx: &deadpool_postgres::Transaction<'_>,
    id: JobId,
    rule: &SettleRule<'_>,
    reason: &LastReason,
    now: UnixMs,
) -> Result<Result<Settled, SettleRefusal>, StorageError> {
    let row = tx
        .cached_query_opt(
            &format!("SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE id = $1 FOR UPDATE"),
            &[&uuid(id)],
        )
        .await
        .map_err(pg_err)?
        .map(|r| JobRow::from_row(&r))
        .transpose()?;
    let Some(row) = row else {
        return match rule(None) {
            Ok(_) => Err(invalid_plan("a settlement of a job that is not there")),
            Err(r) => Ok(Err(r)),
        };
    };
    let plan = match rule(Some(row.facts())) {
        Ok(p) => p,
        Err(r) => return Ok(Err(r)),
    };
    // The fence, in the statement itself: the attempt the rule saw, still in flight, its
    // lease not reached at `now` (the queue's clock).
    let attempt = i32::try_from(row.attempt).unwrap_or(i32::MAX);
    let guard = "AND stage = 2 AND attempt = $4 AND lease_expires_at > $5";
    let changed = match plan {
        Settle::Finish(finish) => apply_finish(tx, id, finish, reason, guard, &[&attempt, &now])
            .await
            .map_err(pg_err)?,
        Settle::Retry(to) => {
            let (stage, due) = match to {
                Placement::Ready => (READY, None),
                Placement::Scheduled { due } => (SCHEDULED, Some(due)),
            };
            let (reason_val, set_reason) = reason_params(reason);
            let changed = tx
                .execute(
                    &format!(
                        "UPDATE sepp_jobs SET stage = $6, due_at = $7, lease_expires_at = NULL, \
                         worker_id = NULL, \
                         last_reason = CASE WHEN $3 THEN $2::text ELSE last_reason END \
                         WHERE id = $1 {guard}"
                    ),
                    &[
                        &uuid(id),
                        &reason_val,
                        &set_reason,
                        &attempt,
                        &now,
                        &stage,
                        &due,
                    ],
                )
                .await
                .map_err(pg_err)?;
            if stage == READY && changed > 0 {
                notify_ready(tx, sh, std::iter::once(row.queue.as_str()))
                    .await
                    .map_err(pg_err)?;
            }
            changed
        }
        Settle::Extend { expires } => {
            let (reason_val, set_reason) = reason_params(reason);
            tx.execute(
                &format!(
                    "UPDATE sepp_jobs SET lease_expires_at = $6, \
                     last_reason = CASE WHEN $3 THEN $2::text ELSE last_reason END \
                     WHERE id = $1 {guard}"
                ),
                &[
                    &uuid(id),
                    &reason_val,
                    &set_reason,
                    &attempt,
                    &now,
                    &expires,
                ],
            )
            .await
            .map_err(pg_err)?
        }
    };
    if changed != 1 {
        return Err(invalid_plan(
            "a settlement the fence refused after its rule accepted it",
        ));
    }
    Ok(Ok(Settled {
        plan,
        queue: Arc::from(row.queue.as_str()),
    }))
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn enqueue(
        &self,
        jobs: Vec<NewJob>,
        rule: &EnqueueRule<'_>,
        now: UnixMs,
    ) -> Result<Vec<InsertOutcome>, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let jobs = Arc::new(jobs);
        let mut flush = sh.commit.submit(jobs.clone(), now)?;
        // The flusher asks for this enqueue's plan (again, if the flush is retried) and tells
        // its outcome after COMMIT.
        while let Some(msg) = flush.recv().await {
            match msg {
                ToCaller::Decide(facts, plan) => {
                    let _ = plan.send(rule(&jobs, &facts));
                }
                ToCaller::Done(outcome) => return outcome,
            }
        }
        Err(StorageError::Unavailable("the group commit stopped".into()))
    }

    async fn reserve(
        &self,
        spec: &ReserveSpec,
        fit: &ReserveFitRule<'_>,
        _now: UnixMs,
    ) -> Result<Vec<Job>, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        if spec.max_jobs == 0 || spec.queues.is_empty() {
            return Ok(Vec::new());
        }
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let lease = lease_in(sh, &tx, spec, fit).await?;
        if lease.taken.is_empty() {
            return Ok(Vec::new());
        }
        if let Err(e) = tx.commit().await {
            lease.forget_cursors(sh);
            return Err(pg_err(e));
        }
        lease.jobs()
    }

    async fn settle(
        &self,
        id: JobId,
        rule: &SettleRule<'_>,
        reason: LastReason,
        now: UnixMs,
    ) -> Result<Result<Settled, SettleRefusal>, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let settled = match settle_in(sh, &tx, id, rule, &reason, now).await? {
            Ok(s) => s,
            Err(r) => return Ok(Err(r)),
        };
        tx.commit().await.map_err(pg_err)?;
        Ok(Ok(settled))
    }

    /// The ack and the leases it brings in one transaction: one commit (one WAL flush) for
    /// both, as the embedded store's one batch. A lease that fails rolls the transaction back
    /// and the ack is committed alone, as the default of [`Store::settle_then_reserve`] would.
    async fn settle_then_reserve(
        &self,
        id: JobId,
        rule: &SettleRule<'_>,
        now: UnixMs,
        spec: &ReserveSpec,
        fit: &ReserveFitRule<'_>,
    ) -> Result<Result<(Settled, Option<Vec<Job>>), SettleRefusal>, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let lease_failed = {
            let mut client = sh.client().await?;
            let tx = client.transaction().await.map_err(pg_err)?;
            let settled = match settle_in(sh, &tx, id, rule, &LastReason::Unchanged, now).await? {
                Ok(s) => s,
                Err(r) => return Ok(Err(r)),
            };
            match lease_in(sh, &tx, spec, fit).await {
                Ok(lease) => {
                    if let Err(e) = tx.commit().await {
                        lease.forget_cursors(sh);
                        return Err(pg_err(e));
                    }
                    let next = match lease.jobs() {
                        Ok(jobs) => Some(jobs),
                        Err(e) => {
                            tracing::warn!(error = %e, "reading the jobs leased after an ack failed; the ack took");
                            None
                        }
                    };
                    return Ok(Ok((settled, next)));
                }
                Err(e) => {
                    let _ = tx.rollback().await;
                    e
                }
            }
        };
        tracing::warn!(error = %lease_failed, "the lease after an ack failed; the ack is committed alone");
        Ok(self
            .settle(id, rule, LastReason::Unchanged, now)
            .await?
            .map(|settled| (settled, None)))
    }

    async fn drain_dead_letters(
        &self,
        queue: Option<&str>,
        max: u32,
        fit: &FitRule<'_>,
        rule: &RemovalRule<'_>,
        _now: UnixMs,
    ) -> Result<Vec<DeadLetter>, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let max = i64::from(max);
        let rows = match queue {
            Some(q) => tx
                .query(
                    &format!(
                        "SELECT {JOB_COLUMNS} FROM sepp_jobs WHERE queue = $1 AND stage = 3 \
                         ORDER BY failed_at, id LIMIT $2 FOR UPDATE SKIP LOCKED"
                    ),
                    &[&q, &max],
                )
                .await
                .map_err(pg_err)?,
            None => tx
                .query(
                    &format!(
                        "SELECT {JOB_COLUMNS} FROM sepp_jobs WHERE stage = 3 \
                         ORDER BY failed_at, id LIMIT $1 FOR UPDATE SKIP LOCKED"
                    ),
                    &[&max],
                )
                .await
                .map_err(pg_err)?,
        };
        let mut records = Vec::with_capacity(rows.len());
        let mut removed = Vec::with_capacity(rows.len());
        let mut used = 0u64;
        for r in &rows {
            let row = JobRow::from_row(r)?;
            let Some(record) = row.dead_letter()? else {
                removed.push(row);
                continue;
            };
            match fit(&record, used, records.len()) {
                Fit::Take(n) => {
                    used += n;
                    records.push(record);
                    removed.push(row);
                }
                Fit::Skip => {}
                Fit::Stop => break,
            }
        }
        for row in &removed {
            let finish = rule(row.facts());
            apply_finish(&tx, row.id, finish, &LastReason::Unchanged, "", &[])
                .await
                .map_err(pg_err)?;
        }
        tx.commit().await.map_err(pg_err)?;
        Ok(records)
    }

    async fn maintain(&self, pass: &SweepPass<'_>) -> Result<Maintenance, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let now = pass.now;
        let mut report = Maintenance::default();
        let _one_pass = sh.sweeping.lock().await;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let mine: bool = tx
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&SWEEP_LOCK])
            .await
            .map_err(pg_err)?
            .get(0);
        if mine {
            let mut left = pass.budget as i64;
            // Expired leases: as the rule says (redeliver, or leave the live set).
            let rows = tx
                .query(
                    &format!(
                        "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE stage = 2 \
                         AND lease_expires_at <= $1 ORDER BY lease_expires_at \
                         LIMIT $2 FOR UPDATE SKIP LOCKED"
                    ),
                    &[&now, &left],
                )
                .await
                .map_err(pg_err)?;
            left -= rows.len() as i64;
            let mut redelivered: Vec<Uuid> = Vec::new();
            for r in &rows {
                let row = JobRow::from_row(r)?;
                match (pass.lease_expired)(row.facts()) {
                    Expiry::Redeliver => {
                        redelivered.push(uuid(row.id));
                        push_ready(&mut report.ready, &row.queue);
                        report.redelivered += 1;
                    }
                    Expiry::Finish(finish) => {
                        apply_finish(&tx, row.id, finish, &LastReason::Unchanged, "", &[])
                            .await
                            .map_err(pg_err)?;
                        push_ready(&mut report.dead_lettered_by_queue, &row.queue);
                        report.dead_lettered += 1;
                    }
                }
            }
            if !redelivered.is_empty() {
                tx.execute(
                    "UPDATE sepp_jobs SET stage = 0, lease_expires_at = NULL, worker_id = NULL \
                     WHERE id = ANY($1)",
                    &[&redelivered],
                )
                .await
                .map_err(pg_err)?;
            }
            // Scheduled jobs that are due (they keep their enqueue order).
            if left > 0 {
                let rows = tx
                    .query(
                        "UPDATE sepp_jobs SET stage = 0, due_at = NULL WHERE id IN \
                         (SELECT id FROM sepp_jobs WHERE stage = 1 AND due_at <= $1 \
                          ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING queue",
                        &[&now, &left],
                    )
                    .await
                    .map_err(pg_err)?;
                left -= rows.len() as i64;
                for r in &rows {
                    push_ready(&mut report.ready, r.get(0));
                    report.promoted += 1;
                }
            }
            // Dedup records past their window.
            if left > 0 {
                let n = tx
                    .execute(
                        "DELETE FROM sepp_dedup d USING (SELECT queue, key FROM sepp_dedup \
                         WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2 \
                         FOR UPDATE SKIP LOCKED) x WHERE d.queue = x.queue AND d.key = x.key",
                        &[&now, &left],
                    )
                    .await
                    .map_err(pg_err)?;
                left -= n as i64;
                report.dedup_purged = n;
            }
            // Dead letters past their retention: what stays is the rule's answer.
            if left > 0 {
                let rows = tx
                    .query(
                        &format!(
                            "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE stage = 3 \
                             AND failed_at <= $1 ORDER BY failed_at, id LIMIT $2 \
                             FOR UPDATE SKIP LOCKED"
                        ),
                        &[&pass.retained_until, &left],
                    )
                    .await
                    .map_err(pg_err)?;
                left -= rows.len() as i64;
                for r in &rows {
                    let row = JobRow::from_row(r)?;
                    let finish = (pass.retention_over)(row.facts());
                    apply_finish(&tx, row.id, finish, &LastReason::Unchanged, "", &[])
                        .await
                        .map_err(pg_err)?;
                    report.records_purged += 1;
                }
            }
            // Tombstones past their time.
            if left > 0 {
                let n = tx
                    .execute(
                        "DELETE FROM sepp_jobs WHERE id IN (SELECT id FROM sepp_jobs \
                         WHERE stage = 4 AND tomb_until <= $1 ORDER BY tomb_until LIMIT $2 \
                         FOR UPDATE SKIP LOCKED)",
                        &[&now, &left],
                    )
                    .await
                    .map_err(pg_err)?;
                left -= n as i64;
                report.records_purged += n;
            }
            report.more = left <= 0;
            if !report.ready.is_empty() {
                let queues: Vec<String> = report
                    .ready
                    .iter()
                    .flat_map(|(q, n)| std::iter::repeat_n(q.to_string(), *n))
                    .collect();
                notify_ready(&tx, sh, queues.iter().map(String::as_str))
                    .await
                    .map_err(pg_err)?;
            }
        }
        let d = tx
            .query_one(
                "SELECT (SELECT min(lease_expires_at) FROM sepp_jobs WHERE stage = 2), \
                 (SELECT min(due_at) FROM sepp_jobs WHERE stage = 1), \
                 (SELECT min(expires_at) FROM sepp_dedup), \
                 (SELECT min(failed_at) FROM sepp_jobs WHERE stage = 3), \
                 (SELECT min(tomb_until) FROM sepp_jobs WHERE stage = 4)",
                &[],
            )
            .await
            .map_err(pg_err)?;
        report.deadlines = Deadlines {
            lease: d.get(0),
            scheduled: d.get(1),
            dedup: d.get(2),
            oldest_dead_letter: d.get(3),
            tombstone: d.get(4),
        };
        tx.commit().await.map_err(pg_err)?;
        Ok(report)
    }

    async fn get_job(&self, id: JobId) -> Result<Option<StoredJob>, StorageError> {
        let client = self.shared.client().await?;
        let Some(r) = client
            .query_opt(
                &format!("SELECT {JOB_COLUMNS} FROM sepp_jobs WHERE id = $1"),
                &[&uuid(id)],
            )
            .await
            .map_err(pg_err)?
        else {
            return Ok(None);
        };
        Ok(Some(stored_of(JobRow::from_row(&r)?, true)?))
    }

    async fn backup(&self, _dir: &std::path::Path) -> Result<BackupReport, StorageError> {
        // The data lives in PostgreSQL, whose own tools make a consistent copy while servers
        // run; a copy written by a sepp server would be neither consistent with the other
        // servers' writes nor restorable by PostgreSQL (docs/postgres.md, "Backups").
        Err(StorageError::Io(format!(
            "backup: the PostgreSQL backend ({}) is backed up with PostgreSQL's tools \
             (pg_dump for a logical copy; pg_basebackup with WAL archiving for a point in time), \
             not with sepp backup",
            self.shared.place
        )))
    }

    async fn release_leases(
        &self,
        worker_id: &str,
        rule: &ExpiryRule<'_>,
        _now: UnixMs,
    ) -> Result<(Vec<JobId>, ReadyJobs), StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        // Every lease the worker holds, locked (waiting for a settlement in progress, never
        // skipping one): each is decided as if it had expired.
        let rows = tx
            .query(
                &format!(
                    "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE stage = 2 AND worker_id = $1 \
                     ORDER BY lease_expires_at FOR UPDATE"
                ),
                &[&worker_id],
            )
            .await
            .map_err(pg_err)?;
        let mut ids = Vec::with_capacity(rows.len());
        let mut ready = ReadyJobs::new();
        let mut redelivered: Vec<Uuid> = Vec::new();
        let mut ready_queues: Vec<String> = Vec::new();
        for r in &rows {
            let row = JobRow::from_row(r)?;
            ids.push(row.id);
            match rule(row.facts()) {
                Expiry::Redeliver => {
                    redelivered.push(uuid(row.id));
                    push_ready(&mut ready, &row.queue);
                    ready_queues.push(row.queue.clone());
                }
                Expiry::Finish(finish) => {
                    apply_finish(&tx, row.id, finish, &LastReason::Unchanged, "", &[])
                        .await
                        .map_err(pg_err)?;
                }
            }
        }
        if !redelivered.is_empty() {
            tx.execute(
                "UPDATE sepp_jobs SET stage = 0, lease_expires_at = NULL, worker_id = NULL \
                 WHERE id = ANY($1)",
                &[&redelivered],
            )
            .await
            .map_err(pg_err)?;
            notify_ready(&tx, sh, ready_queues.iter().map(String::as_str))
                .await
                .map_err(pg_err)?;
        }
        tx.commit().await.map_err(pg_err)?;
        Ok((ids, ready))
    }

    async fn forget_key(&self, queue: &str, key: &str) -> Result<Option<KeyRecord>, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let client = sh.client().await?;
        Ok(client
            .query_opt(
                "DELETE FROM sepp_dedup WHERE queue = $1 AND key = $2 \
                 RETURNING job_id, created_at, expires_at, fingerprint",
                &[&queue, &key],
            )
            .await
            .map_err(pg_err)?
            .map(|r| KeyRecord {
                job_id: job_id(r.get(0)),
                created_at: r.get(1),
                expires_at: r.get(2),
                fingerprint: fingerprint_of(r.get(3)),
            }))
    }

    async fn lookup_key(&self, queue: &str, key: &str) -> Result<Option<KeyRecord>, StorageError> {
        let client = self.shared.client().await?;
        Ok(client
            .query_opt(
                "SELECT job_id, created_at, expires_at, fingerprint FROM sepp_dedup \
                 WHERE queue = $1 AND key = $2",
                &[&queue, &key],
            )
            .await
            .map_err(pg_err)?
            .map(|r| KeyRecord {
                job_id: job_id(r.get(0)),
                created_at: r.get(1),
                expires_at: r.get(2),
                fingerprint: fingerprint_of(r.get(3)),
            }))
    }

    async fn list_dead_letters(
        &self,
        queue: Option<&str>,
        after: Option<DeadLetterCursor>,
        limit: u32,
        fit: &FitRule<'_>,
    ) -> Result<(Vec<DeadLetter>, Option<DeadLetterCursor>), StorageError> {
        let client = self.shared.client().await?;
        let mut records = Vec::new();
        let (mut last, mut more) = (None, false);
        let mut used = 0u64;
        let mut cursor = after;
        let chunk = i64::from(limit).saturating_add(1).clamp(1, 1000);
        'pages: loop {
            let (af, ai) = cursor.map_or((i64::MIN, Uuid::nil()), |(f, i)| (f, uuid(i)));
            let rows = client
                .query(
                    &format!(
                        "SELECT {JOB_COLUMNS} FROM sepp_jobs WHERE stage = 3 \
                         AND ($1::text IS NULL OR queue = $1) AND (failed_at, id) > ($2, $3) \
                         ORDER BY failed_at, id LIMIT $4"
                    ),
                    &[&queue, &af, &ai, &chunk],
                )
                .await
                .map_err(pg_err)?;
            if rows.is_empty() {
                break;
            }
            let full = rows.len() as i64 == chunk;
            for r in &rows {
                if records.len() == limit as usize {
                    more = true;
                    break 'pages;
                }
                let row = JobRow::from_row(r)?;
                let Stage::Dead { failed_at, .. } = row.stage else {
                    continue;
                };
                if let Some(d) = row.dead_letter()? {
                    match fit(&d, used, records.len()) {
                        Fit::Take(n) => {
                            used += n;
                            records.push(d);
                        }
                        Fit::Skip => {}
                        Fit::Stop => {
                            more = true;
                            break 'pages;
                        }
                    }
                }
                last = Some((failed_at, row.id));
                cursor = last;
            }
            if !full {
                break;
            }
        }
        Ok((records, if more { last } else { None }))
    }

    async fn requeue_dead_letters(
        &self,
        selector: &DeadLetterSelector,
        plan: Requeue,
        _now: UnixMs,
    ) -> Result<(Vec<JobId>, ReadyJobs), StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let rows = select_dead(&tx, selector).await?;
        let attempt = i32::try_from(plan.attempt).unwrap_or(i32::MAX);
        let mut ids = Vec::with_capacity(rows.len());
        let mut ready = ReadyJobs::new();
        for row in &rows {
            // Enqueued anew: after every job enqueued so far.
            tx.execute(
                "UPDATE sepp_jobs SET stage = 0, seq = nextval('sepp_job_seq'), \
                 enqueued_at = $2, attempt = $3, last_reason = NULL, worker_id = NULL, \
                 dead_cause = NULL, failed_at = NULL WHERE id = $1",
                &[&uuid(row.id), &plan.enqueued_at, &attempt],
            )
            .await
            .map_err(pg_err)?;
            ids.push(row.id);
            push_ready(&mut ready, &row.queue);
        }
        let queues: Vec<&str> = rows.iter().map(|r| r.queue.as_str()).collect();
        notify_ready(&tx, sh, queues.into_iter())
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok((ids, ready))
    }

    async fn delete_dead_letters(
        &self,
        selector: &DeadLetterSelector,
        rule: &RemovalRule<'_>,
        _now: UnixMs,
    ) -> Result<Vec<JobId>, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let rows = select_dead(&tx, selector).await?;
        for row in &rows {
            let finish = rule(row.facts());
            apply_finish(&tx, row.id, finish, &LastReason::Unchanged, "", &[])
                .await
                .map_err(pg_err)?;
        }
        tx.commit().await.map_err(pg_err)?;
        Ok(rows.iter().map(|r| r.id).collect())
    }

    async fn set_paused(
        &self,
        queue: &str,
        paused: bool,
        may_create: &CreateQueueRule<'_>,
    ) -> Result<PauseOutcome, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let updated = tx
            .execute(
                "UPDATE sepp_queues SET paused = $2 WHERE name = $1",
                &[&queue, &paused],
            )
            .await
            .map_err(pg_err)?;
        if updated == 0 {
            if !paused {
                return Ok(PauseOutcome::Absent);
            }
            // A new queue: the creation lock, then the count under it, as an enqueue that
            // creates one does (a queue created meanwhile by another server is counted, or is
            // this one and takes the flag below).
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&QUEUE_CREATE_LOCK])
                .await
                .map_err(pg_err)?;
            let held: i64 = tx
                .query_one("SELECT count(*) FROM sepp_queues", &[])
                .await
                .map_err(pg_err)?
                .get(0);
            let exists = tx
                .query_opt("SELECT 1 FROM sepp_queues WHERE name = $1", &[&queue])
                .await
                .map_err(pg_err)?
                .is_some();
            if !exists && !may_create(u64::try_from(held).unwrap_or(0)) {
                return Ok(PauseOutcome::TooManyQueues);
            }
            tx.execute(
                "INSERT INTO sepp_queues (name, paused) VALUES ($1, $2) \
                 ON CONFLICT (name) DO UPDATE SET paused = EXCLUDED.paused",
                &[&queue, &paused],
            )
            .await
            .map_err(pg_err)?;
        }
        let n: i64 = tx
            .query_one(
                "SELECT count(*) FROM sepp_jobs WHERE queue = $1 AND stage = 0",
                &[&queue],
            )
            .await
            .map_err(pg_err)?
            .get(0);
        if !paused && n > 0 {
            notify_ready(
                &tx,
                sh,
                std::iter::repeat_n(queue, usize::try_from(n).unwrap_or(0)),
            )
            .await
            .map_err(pg_err)?;
        }
        tx.commit().await.map_err(pg_err)?;
        Ok(PauseOutcome::Set {
            ready: u64::try_from(n).unwrap_or(0),
        })
    }

    async fn list_queues(
        &self,
        after: Option<&str>,
        limit: u32,
    ) -> Result<(Vec<(String, QueueStats)>, bool), StorageError> {
        let names: Vec<String> = {
            let client = self.shared.client().await?;
            client
                .query(
                    "SELECT name FROM sepp_queues \
                     WHERE $1::text IS NULL OR name > $1 ORDER BY name LIMIT $2",
                    &[&after, &(i64::from(limit) + 1)],
                )
                .await
                .map_err(pg_err)?
                .iter()
                .map(|r| r.get(0))
                .collect()
        };
        let more = names.len() > limit as usize;
        let mut page = Vec::with_capacity(names.len().min(limit as usize));
        for name in names.into_iter().take(limit as usize) {
            let stats = self.queue_stats(&name).await?;
            page.push((name, stats));
        }
        Ok((page, more))
    }

    async fn list_jobs(
        &self,
        queue: &str,
        state: ListState,
        after: Option<JobCursor>,
        limit: u32,
    ) -> Result<(Vec<(JobCursor, StoredJob)>, bool), StorageError> {
        let (cond, pos, order) = listing_sql(state);
        let (a, b, id) = match after {
            Some((a, b, id)) => (
                Some(a),
                Some(i64::try_from(b).unwrap_or(i64::MAX)),
                Some(uuid(id)),
            ),
            None => (None, None, None),
        };
        let client = self.shared.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {JOB_COLUMNS}, {pos} FROM sepp_jobs WHERE queue = $1 AND {cond} \
                     AND ($2::bigint IS NULL OR ({pos}, id) > ($2, $3, $4)) \
                     ORDER BY {order} LIMIT $5"
                ),
                &[&queue, &a, &b, &id, &(i64::from(limit) + 1)],
            )
            .await
            .map_err(pg_err)?;
        let more = rows.len() > limit as usize;
        let mut page = Vec::with_capacity(rows.len().min(limit as usize));
        for r in rows.iter().take(limit as usize) {
            let first: Option<i64> = r.get(20);
            let second: i64 = r.get(21);
            let row = JobRow::from_row(r)?;
            let cursor = (
                first.unwrap_or(0),
                u64::try_from(second).unwrap_or(0),
                row.id,
            );
            page.push((cursor, stored_of(row, false)?));
        }
        Ok((page, more))
    }

    async fn cancel_jobs(
        &self,
        selector: &CancelSelector,
        rule: &RemovalRule<'_>,
        reason: &str,
        _now: UnixMs,
    ) -> Result<Vec<JobId>, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let rows = match selector {
            CancelSelector::Ids(ids) => {
                let ids: Vec<Uuid> = ids.iter().map(|i| uuid(*i)).collect();
                tx.query(
                    &format!(
                        "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE id = ANY($1) \
                         AND stage IN (0, 1) ORDER BY id FOR UPDATE"
                    ),
                    &[&ids],
                )
                .await
            }
            // Ready jobs first (reserve order), then scheduled ones (soonest first).
            CancelSelector::Queue { queue, max } => {
                tx.query(
                    &format!(
                        "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE queue = $1 AND stage IN (0, 1) \
                         ORDER BY stage, CASE WHEN stage = 0 THEN (9 - priority)::bigint ELSE due_at END, \
                         CASE WHEN stage = 0 THEN seq ELSE 0 END, id LIMIT $2 FOR UPDATE"
                    ),
                    &[&&**queue, &i64::from(*max)],
                )
                .await
            }
        }
        .map_err(pg_err)?;
        let mut jobs = rows
            .iter()
            .map(JobRow::from_row)
            .collect::<Result<Vec<_>, _>>()?;
        if let CancelSelector::Ids(asked) = selector {
            // In the order asked.
            jobs.sort_by_key(|j| asked.iter().position(|i| *i == j.id));
        }
        let mut ids = Vec::with_capacity(jobs.len());
        let reason = LastReason::Set(Some(reason.to_string()));
        for row in jobs {
            let finish = rule(row.facts());
            apply_finish(&tx, row.id, finish, &reason, "AND stage IN (0, 1)", &[])
                .await
                .map_err(pg_err)?;
            ids.push(row.id);
        }
        tx.commit().await.map_err(pg_err)?;
        Ok(ids)
    }

    async fn gauges(&self) -> Result<StoreGauges, StorageError> {
        // One snapshot for all of it, so the figures agree with one another. The counts scan
        // the (queue, stage) index: a scrape costs O(jobs), as GetQueueStats does per queue.
        let mut client = self.shared.client().await?;
        let tx = client
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .await
            .map_err(pg_err)?;
        let mut queues: std::collections::BTreeMap<String, QueueGauges> = Default::default();
        fn gauge(
            queues: &mut std::collections::BTreeMap<String, QueueGauges>,
            q: String,
        ) -> &mut QueueGauges {
            queues.entry(q.clone()).or_insert_with(|| QueueGauges {
                queue: q,
                ..Default::default()
            })
        }
        for r in tx
            .query(
                "SELECT queue, stage, count(*) FROM sepp_jobs WHERE stage IN (0, 1, 2, 3) \
                 GROUP BY queue, stage",
                &[],
            )
            .await
            .map_err(pg_err)?
        {
            let q: String = r.get(0);
            let n = u64::try_from(r.get::<_, i64>(2)).unwrap_or(0);
            let g = gauge(&mut queues, q);
            match r.get::<_, i16>(1) {
                READY => g.stats.ready = n,
                SCHEDULED => g.stats.scheduled = n,
                IN_FLIGHT => g.stats.in_flight = n,
                DEAD => g.stats.dead_lettered = n,
                _ => {}
            }
        }
        // The oldest ready job: first in enqueue order, whatever its priority.
        for r in tx
            .query(
                "SELECT DISTINCT ON (queue) queue, enqueued_at FROM sepp_jobs WHERE stage = 0 \
                 ORDER BY queue, seq",
                &[],
            )
            .await
            .map_err(pg_err)?
        {
            let q: String = r.get(0);
            gauge(&mut queues, q).oldest_ready_at = Some(r.get(1));
        }
        let mut dedup_records = 0u64;
        for r in tx
            .query("SELECT queue, count(*) FROM sepp_dedup GROUP BY queue", &[])
            .await
            .map_err(pg_err)?
        {
            let q: String = r.get(0);
            let n = u64::try_from(r.get::<_, i64>(1)).unwrap_or(0);
            dedup_records += n;
            gauge(&mut queues, q).stats.dedup_records = n;
        }
        for r in tx
            .query("SELECT name FROM sepp_queues WHERE paused", &[])
            .await
            .map_err(pg_err)?
        {
            if let Some(g) = queues.get_mut(r.get::<_, &str>(0)) {
                g.stats.paused = true;
            }
        }
        let next_expiring_dedup_created_at: Option<UnixMs> = tx
            .query_opt(
                "SELECT created_at FROM sepp_dedup ORDER BY expires_at LIMIT 1",
                &[],
            )
            .await
            .map_err(pg_err)?
            .map(|r| r.get(0));
        tx.commit().await.map_err(pg_err)?;
        Ok(StoreGauges {
            queues: queues.into_values().collect(),
            dedup_records,
            next_expiring_dedup_created_at,
        })
    }

    async fn queue_stats(&self, queue: &str) -> Result<QueueStats, StorageError> {
        let client = self.shared.client().await?;
        stats_in(&client, queue).await.map_err(pg_err)
    }

    async fn add_rates(&self, buckets: &[RateBucket], keep_from: i64) -> Result<(), StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        // In (minute, queue) order, so that servers adding to the same buckets lock them in one
        // order.
        let mut sorted: Vec<&RateBucket> = buckets.iter().collect();
        sorted.sort_by(|a, b| (a.minute, &a.queue).cmp(&(b.minute, &b.queue)));
        let col = |f: fn(&RateCounts) -> u64| -> Vec<i64> {
            sorted
                .iter()
                .map(|b| i64::try_from(f(&b.counts)).unwrap_or(i64::MAX))
                .collect()
        };
        let minutes: Vec<i64> = sorted.iter().map(|b| b.minute).collect();
        let queues: Vec<&str> = sorted.iter().map(|b| b.queue.as_str()).collect();
        let (enq, ack, nack, dead) = (
            col(|c| c.enqueued),
            col(|c| c.acked),
            col(|c| c.nacked),
            col(|c| c.dead_lettered),
        );
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        if !sorted.is_empty() {
            tx.execute(
                "INSERT INTO sepp_rates AS r (minute, queue, enqueued, acked, nacked, dead_lettered) \
                 SELECT * FROM unnest($1::int8[], $2::text[], $3::int8[], $4::int8[], $5::int8[], \
                 $6::int8[]) \
                 ON CONFLICT (minute, queue) DO UPDATE SET \
                 enqueued = r.enqueued + EXCLUDED.enqueued, acked = r.acked + EXCLUDED.acked, \
                 nacked = r.nacked + EXCLUDED.nacked, \
                 dead_lettered = r.dead_lettered + EXCLUDED.dead_lettered",
                &[&minutes, &queues, &enq, &ack, &nack, &dead],
            )
            .await
            .map_err(pg_err)?;
        }
        tx.execute("DELETE FROM sepp_rates WHERE minute < $1", &[&keep_from])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)
    }

    async fn rates(&self, from: i64) -> Result<Vec<RateBucket>, StorageError> {
        let client = self.shared.client().await?;
        let rows = client
            .query(
                "SELECT minute, queue, enqueued, acked, nacked, dead_lettered FROM sepp_rates \
                 WHERE minute >= $1 ORDER BY minute, queue",
                &[&from],
            )
            .await
            .map_err(pg_err)?;
        let n = |r: &Row, i: usize| u64::try_from(r.get::<_, i64>(i)).unwrap_or(0);
        Ok(rows
            .iter()
            .map(|r| RateBucket {
                minute: r.get(0),
                queue: r.get(1),
                counts: RateCounts {
                    enqueued: n(r, 2),
                    acked: n(r, 3),
                    nacked: n(r, 4),
                    dead_lettered: n(r, 5),
                },
            })
            .collect())
    }

    async fn create_queues(&self, names: &[String]) -> Result<(), StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let client = sh.client().await?;
        client
            .execute(
                "INSERT INTO sepp_queues (name, paused) SELECT unnest($1::text[]), false \
                 ON CONFLICT (name) DO NOTHING",
                &[&names],
            )
            .await
            .map_err(pg_err)?;
        Ok(())
    }

    async fn delete_queue(
        &self,
        queue: &str,
        rule: &DeleteQueueRule<'_>,
    ) -> Result<QueueDeletion, StorageError> {
        let sh = &*self.shared;
        sh.check_writable()?;
        let mut client = sh.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        // FOR UPDATE waits for every enqueue that holds the row FOR KEY SHARE (its jobs are
        // committed when the counts below are read, each statement seeing what is committed
        // when it starts) and keeps new ones out until COMMIT.
        let row = tx
            .query_opt(
                "SELECT paused FROM sepp_queues WHERE name = $1 FOR UPDATE",
                &[&queue],
            )
            .await
            .map_err(pg_err)?;
        if row.is_none() {
            return Ok(QueueDeletion::NotFound);
        }
        let stats = stats_in(&tx, queue).await.map_err(pg_err)?;
        if !rule(&stats) {
            return Ok(QueueDeletion::Refused(stats));
        }
        if stats.ready + stats.scheduled + stats.in_flight + stats.dead_lettered > 0 {
            return Err(invalid_plan("a queue that holds jobs cannot be deleted"));
        }
        tx.execute("DELETE FROM sepp_queues WHERE name = $1", &[&queue])
            .await
            .map_err(pg_err)?;
        tx.commit().await.map_err(pg_err)?;
        Ok(QueueDeletion::Deleted(stats))
    }

    fn listen(&self, listener: Arc<dyn ReadyListener>) {
        if self.shared.listener.set(listener.clone()).is_err() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(listen::run(
                    self.shared.cfg.clone(),
                    self.shared.tls.clone(),
                    listener,
                    self.shared.origin,
                    self.shared.cursors.clone(),
                    std::time::Duration::from_millis(self.opts.poll_interval_ms),
                    self.shared.stop.clone(),
                ));
            }
            Err(_) => {
                tracing::warn!("no Tokio runtime: Reserves wait for this server's own jobs only")
            }
        }
    }

    fn health(&self) -> tokio::sync::watch::Receiver<StorageHealth> {
        self.shared.health.subscribe()
    }

    async fn close(&self) -> Result<(), StorageError> {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.shared.stop.cancel();
        self.shared.commit.close().await;
        Ok(())
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

#[cfg(test)]
pub(crate) mod tests;
