//! Group commit of enqueues: the enqueues waiting on one server are done together, by one
//! *flush*, in one transaction and a fixed number of statements, whatever their number.
//!
//! An enqueue hands its jobs to the flusher and waits. The flusher takes every enqueue waiting
//! (up to [`MAX_FLUSH_JOBS`] jobs), and, in one transaction on a pooled connection:
//!
//! 1. claims every key of the flush with one `INSERT … SELECT … FROM unnest(…) ON CONFLICT …
//!    DO UPDATE … WHERE <expired> RETURNING` (in key order), pipelined with `BEGIN` and, when a
//!    queue of the flush has `max_queue_depth`, the advisory locks of those queues and their
//!    counts: one round trip;
//! 2. only when a key is held by a live record: reads those records and the jobs they name
//!    (one statement), and locks the jobs a `replace_pending` hit may replace (one more);
//! 3. asks each enqueue's caller to run its rule on the facts (the rule runs in the caller's
//!    task: it borrows from it), in arrival order, an enqueue waiting for the plans of the
//!    earlier ones that share a key or a depth-limited queue with it, so that the first
//!    writer of a key wins and a later one sees its job as a live record;
//! 4. writes what the plans say in one statement (give back unused claims, move a claim to the
//!    enqueue of the flush that created the job, replace pending jobs' contents, insert the
//!    created jobs, one `pg_notify` per queue), pipelined with `COMMIT`: one round trip.
//!
//! So a flush of keyed enqueues without hits costs two round trips and one `COMMIT` (one WAL
//! flush) however many enqueues it holds, and every enqueue replies after that `COMMIT`.
//! While flushes are in flight ([`GroupCommit::new`]'s `slots` at most), new enqueues wait for
//! the next one.
//!
//! A deadlock or serialization failure runs the flush again (3 times at most). Any other error
//! a statement reports (one enqueue's data may be at fault, e.g. a key too long for the
//! index) rolls the flush back and runs each of its enqueues alone, in its own transaction,
//! so that the error reaches only the enqueue that caused it. A lost connection fails every
//! enqueue of the flush with `Unavailable` (and says that the enqueue may or may not be stored
//! when it happened during the `COMMIT`).

use super::cursor::Cursors;
use super::{
    Cached, FACT_COLUMNS, Facts, JobRow, QUEUE_CREATE_LOCK, QUEUES_HELD, fingerprint_column,
    fingerprint_of, is_retryable, job_id, pg_err, pool_err, uuid,
};
use crate::domain::{
    EnqueuePlan, InsertOutcome, JobId, KeyRecord, NewJob, Placement, Stage, UnixMs,
};
use crate::storage::StorageError;
use crate::storage::embedded::codec::Body;
use deadpool_postgres::{Object, Pool};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use uuid::Uuid;

/// Most jobs one flush takes (it takes at least one enqueue, whatever its size).
pub(crate) const MAX_FLUSH_JOBS: usize = 2000;

/// How many flushes may be in flight at once with a pool of `pool_size` connections: a quarter
/// of the pool, 1 to 4 (so that Reserves and settlements keep most of it). While one flush
/// waits for its `COMMIT`, the next gathers and runs its statements.
pub(crate) fn flush_slots(pool_size: u32) -> usize {
    (pool_size as usize / 4).clamp(1, 4)
}

/// What the flusher asks of an enqueue's caller, and finally tells it.
pub(crate) enum ToCaller {
    /// Run the enqueue rule on these facts and send back the plan.
    Decide(Facts, oneshot::Sender<EnqueuePlan>),
    /// The outcome, after `COMMIT` (or why there is none).
    Done(Result<Vec<InsertOutcome>, StorageError>),
}

/// An enqueue waiting for a flush.
struct Waiting {
    jobs: Arc<Vec<NewJob>>,
    now: UnixMs,
    tell: mpsc::UnboundedSender<ToCaller>,
}

struct Inner {
    pool: Pool,
    /// This store's id in its `NOTIFY` payloads.
    origin: u64,
    /// The Reserve cursors, forgotten where a flush makes jobs ready before them.
    cursors: Arc<Cursors>,
    waiting: std::sync::Mutex<Vec<Waiting>>,
    wake: Notify,
    /// Set by `close` (under `waiting`'s lock): no enqueue is taken after it.
    closed: AtomicBool,
}

/// The group committer of one store.
pub(crate) struct GroupCommit {
    inner: Arc<Inner>,
    flusher: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl GroupCommit {
    /// Starts the flusher (needs a Tokio runtime): at most `slots` flushes in flight, each on a
    /// pooled connection of its own.
    pub(crate) fn new(pool: Pool, origin: u64, cursors: Arc<Cursors>, slots: usize) -> Self {
        let inner = Arc::new(Inner {
            pool,
            origin,
            cursors,
            waiting: std::sync::Mutex::new(Vec::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        let slots = slots.max(1);
        let flusher = {
            let inner = inner.clone();
            tokio::spawn(async move {
                let permits = Arc::new(Semaphore::new(slots));
                loop {
                    let Ok(permit) = permits.clone().acquire_owned().await else {
                        return;
                    };
                    let batch = loop {
                        let (batch, closed) = {
                            let mut w = inner.waiting.lock().unwrap_or_else(|e| e.into_inner());
                            (take_batch(&mut w), inner.closed.load(Ordering::SeqCst))
                        };
                        if !batch.is_empty() {
                            break Some(batch);
                        }
                        if closed {
                            break None;
                        }
                        inner.wake.notified().await;
                    };
                    match batch {
                        Some(batch) => {
                            let inner = inner.clone();
                            tokio::spawn(async move {
                                flush(&inner, batch).await;
                                drop(permit);
                            });
                        }
                        None => {
                            drop(permit);
                            // Every flush in flight has finished once all the permits are back.
                            let _ = permits.acquire_many(slots as u32).await;
                            return;
                        }
                    }
                }
            })
        };
        GroupCommit {
            inner,
            flusher: std::sync::Mutex::new(Some(flusher)),
        }
    }

    /// Hands an enqueue to the flusher; its caller then answers [`ToCaller::Decide`] until
    /// [`ToCaller::Done`] comes.
    ///
    /// # Errors
    /// [`StorageError::Unavailable`] once the store is closed.
    pub(crate) fn submit(
        &self,
        jobs: Arc<Vec<NewJob>>,
        now: UnixMs,
    ) -> Result<mpsc::UnboundedReceiver<ToCaller>, StorageError> {
        let (tell, rx) = mpsc::unbounded_channel();
        {
            let mut w = self.inner.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if self.inner.closed.load(Ordering::SeqCst) {
                return Err(StorageError::Unavailable(
                    "storage is closed: the server is shutting down".into(),
                ));
            }
            w.push(Waiting { jobs, now, tell });
        }
        self.inner.wake.notify_one();
        Ok(rx)
    }

    /// Flushes every enqueue handed over so far and stops the flusher once they are done.
    pub(crate) async fn close(&self) {
        {
            let _w = self.inner.waiting.lock().unwrap_or_else(|e| e.into_inner());
            self.inner.closed.store(true, Ordering::SeqCst);
        }
        self.inner.wake.notify_one();
        let handle = self
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = handle {
            let _ = h.await;
        }
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        if let Some(h) = self
            .flusher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.abort();
        }
    }
}

/// The enqueues of the next flush, oldest first: at least one, then as many as fit in
/// [`MAX_FLUSH_JOBS`].
fn take_batch(waiting: &mut Vec<Waiting>) -> Vec<Waiting> {
    let mut jobs = 0;
    let mut n = 0;
    for w in waiting.iter() {
        if n > 0 && jobs + w.jobs.len() > MAX_FLUSH_JOBS {
            break;
        }
        jobs += w.jobs.len();
        n += 1;
    }
    waiting.drain(..n).collect()
}

/// Why a flush did not commit.
struct Fail {
    unavailable: bool,
    msg: String,
    /// A deadlock or serialization failure: the flush may run again.
    retryable: bool,
    /// The database refused a statement (not the connection): one enqueue may be at fault.
    refused: bool,
}

impl Fail {
    fn of(e: tokio_postgres::Error) -> Self {
        let retryable = is_retryable(&e);
        let refused = e.as_db_error().is_some();
        match pg_err(e) {
            StorageError::Unavailable(msg) => Fail {
                unavailable: true,
                msg,
                retryable,
                refused,
            },
            StorageError::Io(msg) => Fail {
                unavailable: false,
                msg,
                retryable,
                refused,
            },
            other => Fail {
                unavailable: false,
                msg: other.to_string(),
                retryable,
                refused,
            },
        }
    }

    fn error(&self) -> StorageError {
        if self.unavailable {
            StorageError::Unavailable(self.msg.clone())
        } else {
            StorageError::Io(self.msg.clone())
        }
    }
}

/// Runs one flush to its end: every enqueue of it gets its [`ToCaller::Done`] (unless its
/// caller is gone).
async fn flush(inner: &Inner, batch: Vec<Waiting>) {
    let mut attempts = 0;
    let fail = loop {
        attempts += 1;
        match run(inner, &batch).await {
            Ok(outcomes) => {
                for (w, o) in batch.iter().zip(outcomes) {
                    if let Some(o) = o {
                        let _ = w.tell.send(ToCaller::Done(Ok(o)));
                    }
                }
                return;
            }
            Err(f) if f.retryable && attempts < 4 => continue,
            Err(f) => break f,
        }
    };
    if fail.refused && !fail.unavailable && batch.len() > 1 {
        tracing::debug!(
            enqueues = batch.len(),
            error = %fail.msg,
            "a group commit was refused; its enqueues run one by one"
        );
        for w in batch {
            Box::pin(flush(inner, vec![w])).await;
        }
        return;
    }
    for w in &batch {
        let _ = w.tell.send(ToCaller::Done(Err(fail.error())));
    }
}

/// Ends a transaction that failed before its `COMMIT`: rolls it back, or closes the connection
/// rather than pooling it when even that fails.
async fn abandon(client: Object) {
    if client.batch_execute("ROLLBACK").await.is_err() {
        drop(Object::take(client));
    }
}

/// A key of the flush, and what the enqueues after the one being decided see of it.
struct Key<'a> {
    queue: &'a str,
    key: &'a str,
    /// The job (enqueue, index) whose values the claim statement wrote: the first of the flush.
    claimant: (usize, usize),
    /// The claim statement wrote the claim (no record, or an expired one replaced in place).
    won: bool,
    /// Some enqueue of the flush may replace the job (`replace_pending`): lock it.
    lock: bool,
    /// The record as the next enqueue sees it (`None`: the key is free).
    record: Option<KeyRecord>,
    /// Where the record's job is, and its type; `None` when nothing of it is left.
    stage: Option<Stage>,
    job_type: Option<String>,
    /// The job of this flush the record names: (enqueue, index), and its row to insert.
    owner: Option<((usize, usize), usize)>,
}

/// A job the flush inserts.
struct NewRow<'a> {
    job: &'a NewJob,
    body: Vec<u8>,
    reply_bytes: i32,
    due_at: Option<i64>,
}

/// A replacement of a pending job's contents (`replace_pending`) already in the database.
struct Replace {
    id: JobId,
    body: Vec<u8>,
    reply_bytes: i32,
    due_at: Option<i64>,
}

/// Claims the keys of a flush (sorted by queue then key): returns the keys written.
const CLAIMS: &str = "INSERT INTO sepp_dedup AS d (queue, key, job_id, created_at, expires_at, fingerprint) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::int8[], $5::int8[], $6::int8[]) \
     ON CONFLICT (queue, key) DO UPDATE \
     SET job_id = EXCLUDED.job_id, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, \
     fingerprint = EXCLUDED.fingerprint \
     WHERE d.expires_at <= EXCLUDED.created_at \
     RETURNING queue, key";

/// The jobs' columns of [`RECORDS`], qualified, in [`JobRow::from_row`]'s order.
const JOINED_FACT_COLUMNS: &str = "j.id, j.queue, j.job_type, j.priority, j.seq, j.enqueued_at, \
     j.attempt, j.max_attempts, j.stage, j.due_at, j.lease_expires_at, j.dead_cause, j.failed_at, \
     j.finished_at, j.tomb_until, j.worker_id, j.last_reason, j.dedup_until, j.reply_bytes, \
     NULL::bytea";

/// Everything a flush writes once the plans are in: claims given back, claims moved to the job
/// that was created, pending jobs' contents replaced, the created jobs, the queues they create,
/// and the wake-ups.
/// `unnest … WITH ORDINALITY` yields the rows in array order, so `nextval` numbers the created
/// jobs in flush order (enqueue order).
const WRITE: &str = "WITH gone AS (DELETE FROM sepp_dedup d \
     USING unnest($1::text[], $2::text[], $3::uuid[]) AS g(queue, key, job_id) \
     WHERE d.queue = g.queue AND d.key = g.key AND d.job_id = g.job_id), \
     moved AS (UPDATE sepp_dedup d SET job_id = m.job_id, created_at = m.created_at, \
     expires_at = m.expires_at, fingerprint = m.fingerprint \
     FROM unnest($4::text[], $5::text[], $6::uuid[], $7::int8[], $8::int8[], $9::int8[]) \
     AS m(queue, key, job_id, created_at, expires_at, fingerprint) \
     WHERE d.queue = m.queue AND d.key = m.key), \
     replaced AS (UPDATE sepp_jobs j SET body = r.body, reply_bytes = r.reply_bytes, \
     due_at = r.due_at, stage = CASE WHEN r.due_at IS NULL THEN 0 ELSE 1 END \
     FROM unnest($10::uuid[], $11::bytea[], $12::int4[], $13::int8[]) \
     AS r(id, body, reply_bytes, due_at) \
     WHERE j.id = r.id AND j.stage IN (0, 1)), \
     created AS (INSERT INTO sepp_jobs (id, queue, job_type, priority, seq, enqueued_at, attempt, \
     max_attempts, stage, due_at, dedup_until, reply_bytes, body) \
     SELECT t.id, t.queue, t.job_type, t.priority, nextval('sepp_job_seq'), \
     t.enqueued_at, 0, t.max_attempts, \
     CASE WHEN t.due_at IS NULL THEN 0 ELSE 1 END, t.due_at, t.dedup_until, \
     t.reply_bytes, t.body \
     FROM unnest($14::uuid[], $15::text[], $16::text[], $17::int2[], $18::int8[], \
     $19::int4[], $20::int8[], $21::int8[], $22::int4[], $23::bytea[]) \
     WITH ORDINALITY AS t(id, queue, job_type, priority, enqueued_at, max_attempts, \
     due_at, dedup_until, reply_bytes, body, ord)) \
     , queues AS (INSERT INTO sepp_queues (name, paused) SELECT unnest($25::text[]), false \
     ON CONFLICT (name) DO NOTHING) \
     SELECT pg_notify('sepp_ready', p) FROM unnest($24::text[]) AS p";

fn placed(due: Option<UnixMs>) -> Stage {
    match due {
        Some(due) => Stage::Scheduled { due },
        None => Stage::Ready,
    }
}

fn i32_of(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// One try of a flush in one transaction: each enqueue's outcomes (`None` where its caller is
/// gone and nothing of it was written).
#[allow(clippy::too_many_lines)]
async fn run(inner: &Inner, batch: &[Waiting]) -> Result<Vec<Option<Vec<InsertOutcome>>>, Fail> {
    // The keys: the first job of each (queue, key) of each enqueue claims it, and the first
    // enqueue of the flush with a key gives the values the claim statement writes.
    let mut keys: Vec<Key<'_>> = Vec::new();
    let mut key_of: HashMap<(&str, &str), usize> = HashMap::new();
    // Per enqueue: (job index, key index) of its first job of each key.
    let mut firsts: Vec<Vec<(usize, usize)>> = Vec::with_capacity(batch.len());
    let mut limited: Vec<&str> = Vec::new();
    for (r, w) in batch.iter().enumerate() {
        let mut mine: Vec<(usize, usize)> = Vec::new();
        for (i, j) in w.jobs.iter().enumerate() {
            if j.max_queue_depth.is_some() && !limited.contains(&&*j.queue) {
                limited.push(&j.queue);
            }
            let Some(d) = &j.dedup else { continue };
            let k = match key_of.get(&(&*j.queue, d.key.as_str())) {
                Some(&k) => k,
                None => {
                    keys.push(Key {
                        queue: &j.queue,
                        key: &d.key,
                        claimant: (r, i),
                        won: false,
                        lock: false,
                        record: None,
                        stage: None,
                        job_type: None,
                        owner: None,
                    });
                    key_of.insert((&j.queue, &d.key), keys.len() - 1);
                    keys.len() - 1
                }
            };
            if !mine.iter().any(|(_, m)| *m == k) {
                if d.replace.is_some() {
                    keys[k].lock = true;
                }
                mine.push((i, k));
            }
        }
        firsts.push(mine);
    }
    limited.sort_unstable();
    // Every queue of the flush: those with a `sepp_queues` row are locked FOR KEY SHARE until
    // COMMIT (a DeleteQueue waits for it); one without a row is created by its first job,
    // under the creation lock and a count of the queues (`limits.max_queues`).
    let mut all_queues: Vec<&str> = batch
        .iter()
        .flat_map(|w| w.jobs.iter().map(|j| &*j.queue))
        .collect();
    all_queues.sort_unstable();
    all_queues.dedup();
    let claim_job = |k: &Key<'_>| &batch[k.claimant.0].jobs[k.claimant.1];

    let client = inner.pool.get().await.map_err(|e| {
        let msg = match pool_err(e) {
            StorageError::Unavailable(m) | StorageError::Io(m) => m,
            other => other.to_string(),
        };
        Fail {
            unavailable: true,
            msg,
            retryable: false,
            refused: false,
        }
    })?;

    // Round trip 1: BEGIN, the claims (in key order, so that two flushes claiming the same
    // keys lock them in one order), the depth limits' locks and counts.
    let mut began = false;
    let mut counts: Vec<(String, u64)> = Vec::new();
    let mut known: Vec<String> = Vec::new();
    if !keys.is_empty() || !limited.is_empty() || !all_queues.is_empty() {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_unstable_by(|a, b| {
            (keys[*a].queue, keys[*a].key).cmp(&(keys[*b].queue, keys[*b].key))
        });
        let queues: Vec<&str> = order.iter().map(|k| keys[*k].queue).collect();
        let names: Vec<&str> = order.iter().map(|k| keys[*k].key).collect();
        let ids: Vec<Uuid> = order
            .iter()
            .map(|k| uuid(claim_job(&keys[*k]).id))
            .collect();
        let created: Vec<i64> = order
            .iter()
            .map(|k| batch[keys[*k].claimant.0].now)
            .collect();
        let expires: Vec<i64> = order
            .iter()
            .map(|k| {
                claim_job(&keys[*k])
                    .dedup
                    .as_ref()
                    .map_or(0, |d| d.expires_at)
            })
            .collect();
        let prints: Vec<Option<i64>> = order
            .iter()
            .map(|k| {
                fingerprint_column(
                    claim_job(&keys[*k])
                        .dedup
                        .as_ref()
                        .and_then(|d| d.fingerprint),
                )
            })
            .collect();
        let prepared = async {
            let claims = if keys.is_empty() {
                None
            } else {
                Some(client.prepare_cached(CLAIMS).await?)
            };
            let (lock, count) = if limited.is_empty() {
                (None, None)
            } else {
                (
                    Some(
                        client
                            .prepare_cached(
                                "SELECT pg_advisory_xact_lock(hashtextextended(q, 7365707000)) \
                                 FROM unnest($1::text[]) AS q",
                            )
                            .await?,
                    ),
                    Some(
                        client
                            .prepare_cached(
                                "SELECT queue, count(*) FROM sepp_jobs \
                                 WHERE queue = ANY($1::text[]) AND stage IN (0, 1, 2) GROUP BY queue",
                            )
                            .await?,
                    ),
                )
            };
            let held = client.prepare_cached(QUEUES_HELD).await?;
            Ok::<_, tokio_postgres::Error>((claims, lock, count, held))
        };
        let (claims, lock, count, held) = match prepared.await {
            Ok(p) => p,
            Err(e) => return Err(Fail::of(e)),
        };
        let begin = client.batch_execute("BEGIN");
        let claim = async {
            match &claims {
                Some(st) => client
                    .query(st, &[&queues, &names, &ids, &created, &expires, &prints])
                    .await
                    .map(Some),
                None => Ok(None),
            }
        };
        let lock = async {
            match &lock {
                Some(st) => client.query(st, &[&limited]).await.map(Some),
                None => Ok(None),
            }
        };
        let count = async {
            match &count {
                Some(st) => client.query(st, &[&limited]).await.map(Some),
                None => Ok(None),
            }
        };
        let held_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&all_queues];
        let queues_held = client.query(&held, &held_params);
        let (b, c, l, n, h) =
            futures_util::future::join5(begin, claim, lock, count, queues_held).await;
        // The first error is the cause (the statements after it fail as the transaction is
        // aborted).
        let results = b
            .and(c)
            .and_then(|c| l.and(n).map(|n| (c, n)))
            .and_then(|cn| h.map(|h| (cn, h)));
        let ((won, depth), held_rows) = match results {
            Ok(r) => r,
            Err(e) => {
                abandon(client).await;
                return Err(Fail::of(e));
            }
        };
        began = true;
        known = held_rows.iter().map(|r| r.get(0)).collect();
        for row in won.unwrap_or_default() {
            let (q, k): (&str, &str) = (row.get(0), row.get(1));
            if let Some(&i) = key_of.get(&(q, k)) {
                keys[i].won = true;
            }
        }
        for row in depth.unwrap_or_default() {
            counts.push((row.get(0), u64::try_from(row.get::<_, i64>(1)).unwrap_or(0)));
        }
    }

    // Only when a queue of the flush has no row yet: the creation lock, then the queues and
    // their count read again under it (a queue created meanwhile by another server exists now).
    let mut queue_count: Option<u64> = None;
    if known.len() < all_queues.len() {
        let read = async {
            client
                .execute("SELECT pg_advisory_xact_lock($1)", &[&QUEUE_CREATE_LOCK])
                .await?;
            let held = client.cached_query(QUEUES_HELD, &[&all_queues]).await?;
            let n: i64 = client
                .query_one("SELECT count(*) FROM sepp_queues", &[])
                .await?
                .get(0);
            Ok::<_, tokio_postgres::Error>((held, n))
        };
        match read.await {
            Ok((held, n)) => {
                known = held.iter().map(|r| r.get(0)).collect();
                queue_count = Some(u64::try_from(n).unwrap_or(0));
            }
            Err(e) => {
                abandon(client).await;
                return Err(Fail::of(e));
            }
        }
    }
    let creates = |r: usize| {
        batch[r]
            .jobs
            .iter()
            .any(|j| !known.iter().any(|k| k == &*j.queue))
    };

    // Round trip 2, only for keys a live record holds (locked by the claim statement): the
    // records, read in a new statement (so that records committed while it waited are seen),
    // and where their jobs are; then the jobs a hit may replace, locked until COMMIT.
    let lost: Vec<usize> = (0..keys.len()).filter(|k| !keys[*k].won).collect();
    if !lost.is_empty() {
        let queues: Vec<&str> = lost.iter().map(|k| keys[*k].queue).collect();
        let names: Vec<&str> = lost.iter().map(|k| keys[*k].key).collect();
        let rows = match client
            .cached_query(
                &format!(
                    "SELECT {JOINED_FACT_COLUMNS}, d.job_id, d.created_at, d.expires_at, \
                     d.fingerprint, t.ord \
                     FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(queue, key, ord) \
                     JOIN sepp_dedup d ON d.queue = t.queue AND d.key = t.key \
                     LEFT JOIN sepp_jobs j ON j.id = d.job_id"
                ),
                &[&queues, &names],
            )
            .await
        {
            Ok(rows) => rows,
            Err(e) => {
                abandon(client).await;
                return Err(Fail::of(e));
            }
        };
        for row in &rows {
            let ord: i64 = row.get(24);
            let Some(&k) = usize::try_from(ord - 1).ok().and_then(|o| lost.get(o)) else {
                continue;
            };
            keys[k].record = Some(KeyRecord {
                job_id: job_id(row.get(20)),
                created_at: row.get(21),
                expires_at: row.get(22),
                fingerprint: fingerprint_of(row.get(23)),
            });
            // A row that cannot be read is left out: the rule then takes the job as gone.
            if row.get::<_, Option<Uuid>>(0).is_some()
                && let Ok(job) = JobRow::from_row(row)
            {
                keys[k].stage = Some(job.stage);
                keys[k].job_type = Some(job.job_type);
            }
        }
        if let Some(k) = lost.iter().find(|k| keys[**k].record.is_none()) {
            abandon(client).await;
            return Err(Fail {
                unavailable: false,
                msg: format!(
                    "PostgreSQL: the dedup record of key {:?} on queue {:?} vanished under its lock",
                    keys[*k].key, keys[*k].queue
                ),
                retryable: false,
                refused: true,
            });
        }
        // A hit that may replace the job's contents (`on_duplicate = "replace_pending"`) locks
        // its row until COMMIT: a concurrent Reserve either leased it before (the rule then
        // sees it in flight) or skips it (SKIP LOCKED) until the replacement is committed.
        let mut lock: Vec<Uuid> = lost
            .iter()
            .filter(|k| keys[**k].lock)
            .filter_map(|k| keys[*k].record.map(|r| uuid(r.job_id)))
            .collect();
        if !lock.is_empty() {
            lock.sort_unstable();
            let rows = match client
                .cached_query(
                    &format!(
                        "SELECT {FACT_COLUMNS} FROM sepp_jobs WHERE id = ANY($1) ORDER BY id \
                         FOR UPDATE"
                    ),
                    &[&lock],
                )
                .await
            {
                Ok(rows) => rows,
                Err(e) => {
                    abandon(client).await;
                    return Err(Fail::of(e));
                }
            };
            for &k in &lost {
                if keys[k].lock {
                    keys[k].stage = None;
                    keys[k].job_type = None;
                }
            }
            for row in &rows {
                let Ok(job) = JobRow::from_row(row) else {
                    continue;
                };
                if let Some(&k) = lost
                    .iter()
                    .find(|k| keys[**k].record.is_some_and(|r| r.job_id == job.id))
                {
                    keys[k].stage = Some(job.stage);
                    keys[k].job_type = Some(job.job_type);
                }
            }
        }
    }

    // The rules, in arrival order: an enqueue that shares a key or a depth-limited queue with
    // one still deciding waits for its plan (and sees what it does).
    let mut rows: Vec<NewRow<'_>> = Vec::new();
    let mut replaces: Vec<Replace> = Vec::new();
    let mut created_in: Vec<(&str, u64)> = Vec::new();
    let mut outcomes: Vec<Option<Vec<InsertOutcome>>> = (0..batch.len()).map(|_| None).collect();
    let mut deciding: Vec<(usize, oneshot::Receiver<EnqueuePlan>)> = Vec::new();
    let touches = |a: usize, b: usize| -> bool {
        firsts[a]
            .iter()
            .any(|(_, k)| firsts[b].iter().any(|(_, m)| m == k))
            || batch[a].jobs.iter().any(|j| {
                j.max_queue_depth.is_some() && batch[b].jobs.iter().any(|o| o.queue == j.queue)
            })
            // Both may create a queue: the second sees the first's (`limits.max_queues`).
            || (creates(a) && creates(b))
    };
    for r in 0..=batch.len() {
        let wait_all = r == batch.len() || deciding.iter().any(|(d, _)| touches(r, *d));
        if wait_all {
            for (d, plan) in deciding.drain(..) {
                let Ok(plan) = plan.await else { continue };
                outcomes[d] = Some(apply(
                    d,
                    &batch[d],
                    plan,
                    &firsts[d],
                    &mut keys,
                    &mut rows,
                    &mut replaces,
                    &mut created_in,
                ));
            }
        }
        if r == batch.len() {
            break;
        }
        let w = &batch[r];
        let mut records = vec![None; w.jobs.len()];
        let mut stages: Vec<(JobId, Stage)> = Vec::new();
        for &(i, k) in &firsts[r] {
            records[i] = keys[k].record;
            if let (Some(rec), Some(stage)) = (keys[k].record, keys[k].stage) {
                stages.push((rec.job_id, stage));
            }
        }
        let mut depths: Vec<(String, u64)> = Vec::new();
        for j in w.jobs.iter() {
            if j.max_queue_depth.is_some() && !depths.iter().any(|(q, _)| q == &*j.queue) {
                let stored = counts
                    .iter()
                    .find(|(q, _)| q == &*j.queue)
                    .map_or(0, |c| c.1);
                let here = created_in
                    .iter()
                    .find(|(q, _)| *q == &*j.queue)
                    .map_or(0, |c| c.1);
                depths.push((j.queue.to_string(), stored + here));
            }
        }
        // The queues that exist for this enqueue: those read, and those the enqueues decided
        // before it in this flush create.
        let mut queues = known.clone();
        for row in &rows {
            if !queues.iter().any(|q| q == &*row.job.queue) {
                queues.push(row.job.queue.to_string());
            }
        }
        let queue_count = queue_count.map(|c| c + (queues.len() - known.len()) as u64);
        let (tx, rx) = oneshot::channel();
        let facts = Facts {
            records,
            depths,
            stages,
            queues,
            queue_count,
        };
        if w.tell.send(ToCaller::Decide(facts, tx)).is_ok() {
            deciding.push((r, rx));
        }
    }

    // Round trip 3: the writes, pipelined with COMMIT (or BEGIN, the writes and COMMIT when
    // nothing was read).
    // Claims given back (no job of the flush took the key) and claims moved to the job of the
    // flush that took the key when it is not the one the claim statement wrote.
    let mut gone: Vec<(&str, &str, Uuid)> = Vec::new();
    let mut moves: Vec<(&str, &str, &NewJob, UnixMs)> = Vec::new();
    for k in &keys {
        let owner = k.owner.map(|(o, _)| o);
        if owner == Some(k.claimant) && k.won {
            continue;
        }
        match owner {
            Some((r, i)) => moves.push((k.queue, k.key, &batch[r].jobs[i], batch[r].now)),
            None if k.won => gone.push((k.queue, k.key, uuid(claim_job(k).id))),
            None => {}
        }
    }
    let gone_queues: Vec<&str> = gone.iter().map(|g| g.0).collect();
    let gone_keys: Vec<&str> = gone.iter().map(|g| g.1).collect();
    let gone_ids: Vec<Uuid> = gone.iter().map(|g| g.2).collect();
    let move_queues: Vec<&str> = moves.iter().map(|m| m.0).collect();
    let move_keys: Vec<&str> = moves.iter().map(|m| m.1).collect();
    let move_ids: Vec<Uuid> = moves.iter().map(|m| uuid(m.2.id)).collect();
    let move_created: Vec<i64> = moves.iter().map(|m| m.3).collect();
    let move_expires: Vec<i64> = moves
        .iter()
        .map(|m| m.2.dedup.as_ref().map_or(0, |d| d.expires_at))
        .collect();
    let move_prints: Vec<Option<i64>> = moves
        .iter()
        .map(|m| fingerprint_column(m.2.dedup.as_ref().and_then(|d| d.fingerprint)))
        .collect();
    let rep_ids: Vec<Uuid> = replaces.iter().map(|r| uuid(r.id)).collect();
    let rep_bodies: Vec<&[u8]> = replaces.iter().map(|r| r.body.as_slice()).collect();
    let rep_sizes: Vec<i32> = replaces.iter().map(|r| r.reply_bytes).collect();
    let rep_due: Vec<Option<i64>> = replaces.iter().map(|r| r.due_at).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| uuid(r.job.id)).collect();
    let queues: Vec<&str> = rows.iter().map(|r| &*r.job.queue).collect();
    let types: Vec<&str> = rows.iter().map(|r| r.job.job_type.as_str()).collect();
    let prios: Vec<i16> = rows.iter().map(|r| i16::from(r.job.priority)).collect();
    let enq: Vec<i64> = rows.iter().map(|r| r.job.enqueued_at).collect();
    let maxa: Vec<i32> = rows.iter().map(|r| i32_of(r.job.max_attempts)).collect();
    let due: Vec<Option<i64>> = rows.iter().map(|r| r.due_at).collect();
    let until: Vec<Option<i64>> = rows
        .iter()
        .map(|r| r.job.dedup.as_ref().map(|d| d.expires_at))
        .collect();
    let sizes: Vec<i32> = rows.iter().map(|r| r.reply_bytes).collect();
    let bodies: Vec<&[u8]> = rows.iter().map(|r| r.body.as_slice()).collect();
    let mut new_queues: Vec<&str> = queues
        .iter()
        .copied()
        .filter(|q| !known.iter().any(|k| k == q))
        .collect();
    new_queues.sort_unstable();
    new_queues.dedup();
    // One wake-up per queue that got ready jobs (delivered at COMMIT, dropped on rollback).
    let mut ready: Vec<(&str, usize)> = Vec::new();
    // Pending jobs made ready by a replacement (they keep their place in line).
    let replaced_ready: Vec<&str> = replaces
        .iter()
        .filter(|r| r.due_at.is_none())
        .filter_map(|r| {
            keys.iter()
                .find(|k| k.record.is_some_and(|rec| rec.job_id == r.id))
                .map(|k| k.queue)
        })
        .collect();
    let readies = rows
        .iter()
        .filter(|r| r.due_at.is_none())
        .map(|r| &*r.job.queue)
        .chain(replaced_ready.iter().copied());
    for q in readies {
        match ready.iter_mut().find(|(x, _)| *x == q) {
            Some((_, n)) => *n += 1,
            None => ready.push((q, 1)),
        }
    }
    let origin = inner.origin;
    let notes: Vec<String> = ready
        .iter()
        .map(|(q, n)| format!("{origin:016x} {n} {q}"))
        .collect();
    let nothing = gone.is_empty() && moves.is_empty() && replaces.is_empty() && rows.is_empty();
    if nothing && !began {
        return Ok(outcomes);
    }
    let write = if nothing {
        None
    } else {
        match client.prepare_cached(WRITE).await {
            Ok(st) => Some(st),
            Err(e) => {
                if began {
                    abandon(client).await;
                }
                return Err(Fail::of(e));
            }
        }
    };
    let begin = async {
        if began {
            Ok(())
        } else {
            client.batch_execute("BEGIN").await
        }
    };
    let writes = async {
        match &write {
            Some(st) => client
                .query(
                    st,
                    &[
                        &gone_queues,
                        &gone_keys,
                        &gone_ids,
                        &move_queues,
                        &move_keys,
                        &move_ids,
                        &move_created,
                        &move_expires,
                        &move_prints,
                        &rep_ids,
                        &rep_bodies,
                        &rep_sizes,
                        &rep_due,
                        &ids,
                        &queues,
                        &types,
                        &prios,
                        &enq,
                        &maxa,
                        &due,
                        &until,
                        &sizes,
                        &bodies,
                        &notes,
                        &new_queues,
                    ],
                )
                .await
                .map(|_| ()),
            None => Ok(()),
        }
    };
    let commit = client.batch_execute("COMMIT");
    let (b, w, c) = futures_util::future::join3(begin, writes, commit).await;
    if let Err(e) = b.and(w) {
        // COMMIT of a failed transaction rolls it back: the connection is idle again if COMMIT
        // answered.
        let fail = Fail::of(e);
        if c.is_err() {
            drop(Object::take(client));
            if !fail.refused {
                return Err(Fail {
                    msg: format!(
                        "PostgreSQL COMMIT failed (the enqueue may or may not be stored): {}",
                        fail.msg
                    ),
                    ..fail
                });
            }
        }
        return Err(fail);
    }
    if let Err(e) = c {
        drop(Object::take(client));
        let f = Fail::of(e);
        return Err(Fail {
            unavailable: true,
            msg: format!(
                "PostgreSQL COMMIT failed (the enqueue may or may not be stored): {}",
                f.msg
            ),
            retryable: false,
            refused: false,
        });
    }
    for r in rows.iter().filter(|r| r.due_at.is_none()) {
        inner
            .cursors
            .new_job(&r.job.queue, i16::from(r.job.priority));
    }
    for q in &replaced_ready {
        inner.cursors.forget(q);
    }
    Ok(outcomes)
}

/// Takes enqueue `r`'s plan into the flush: what it creates, replaces and claims, as the
/// enqueues after it will see it. Returns its outcomes.
#[allow(clippy::too_many_arguments)]
fn apply<'a>(
    r: usize,
    w: &'a Waiting,
    plan: EnqueuePlan,
    firsts: &[(usize, usize)],
    keys: &mut [Key<'a>],
    rows: &mut Vec<NewRow<'a>>,
    replaces: &mut Vec<Replace>,
    created_in: &mut Vec<(&'a str, u64)>,
) -> Vec<InsertOutcome> {
    let jobs = &w.jobs;
    let key_at = |i: usize| firsts.iter().find(|(f, _)| *f == i).map(|(_, k)| *k);
    let fits = plan.outcomes.len() == jobs.len()
        && plan
            .outcomes
            .iter()
            .zip(jobs.iter())
            .enumerate()
            .all(|(i, (o, j))| match o {
                InsertOutcome::Created(id) => *id == j.id,
                InsertOutcome::Replaced(id, _) => {
                    j.dedup.as_ref().is_some_and(|d| d.replace.is_some())
                        && key_at(i).is_some_and(|k| {
                            keys[k].record.is_some_and(|rec| rec.job_id == *id)
                                && keys[k].job_type.is_some()
                        })
                }
                _ => true,
            });
    if !fits {
        // A bug in the queue layer: nothing of this enqueue is kept.
        tracing::error!("the enqueue plan does not match its batch");
        return plan.outcomes;
    }
    if !plan.write {
        return plan.outcomes;
    }
    for (i, (j, o)) in jobs.iter().zip(&plan.outcomes).enumerate() {
        match *o {
            InsertOutcome::Created(id) => {
                rows.push(NewRow {
                    job: j,
                    body: Body::encode_of(j),
                    reply_bytes: i32_of(j.reply_bytes),
                    due_at: j.scheduled_at,
                });
                match created_in.iter_mut().find(|(q, _)| *q == &*j.queue) {
                    Some((_, n)) => *n += 1,
                    None => created_in.push((&j.queue, 1)),
                }
                if let (Some(k), Some(d)) = (key_at(i), &j.dedup) {
                    let k = &mut keys[k];
                    k.owner = Some(((r, i), rows.len() - 1));
                    k.record = Some(KeyRecord {
                        job_id: id,
                        created_at: w.now,
                        expires_at: d.expires_at,
                        fingerprint: d.fingerprint,
                    });
                    k.stage = Some(placed(j.scheduled_at));
                    k.job_type = Some(j.job_type.clone());
                }
            }
            InsertOutcome::Replaced(target, placement) => {
                let (Some(k), Some(claim)) = (key_at(i), &j.dedup) else {
                    continue;
                };
                let Some(replace) = claim.replace else {
                    continue;
                };
                let k = &mut keys[k];
                let Some(job_type) = k.job_type.clone() else {
                    continue;
                };
                let due = match placement {
                    Placement::Scheduled { due } => Some(due),
                    Placement::Ready => None,
                };
                // One write of the whole body, so a Reserve reads the old or the new one.
                let body = Body {
                    job_type,
                    payload: j.payload.clone(),
                    trace_context: j.trace_context.clone(),
                    custom: j.custom.clone(),
                    scheduled_at: due,
                    idempotency_key: Some(claim.key.clone()),
                }
                .encode();
                let reply_bytes = i32_of(replace.reply_bytes);
                match k.owner {
                    // A job this flush creates: it is inserted with the new contents.
                    Some((_, row)) if rows[row].job.id == target => {
                        rows[row].body = body;
                        rows[row].reply_bytes = reply_bytes;
                        rows[row].due_at = due;
                    }
                    _ => match replaces.iter_mut().find(|x| x.id == target) {
                        Some(x) => {
                            x.body = body;
                            x.reply_bytes = reply_bytes;
                            x.due_at = due;
                        }
                        None => replaces.push(Replace {
                            id: target,
                            body,
                            reply_bytes,
                            due_at: due,
                        }),
                    },
                }
                k.stage = Some(placed(due));
            }
            _ => {}
        }
    }
    plan.outcomes
}
