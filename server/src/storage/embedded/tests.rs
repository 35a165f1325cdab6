//! Tests of the embedded backend: the conformance suite, and the backend's own invariants
//! (see the module docs of `embedded`): the order of writes within one group-commit batch, a
//! failed write, a failed read in the middle of a drain.

use super::*;
use crate::config::Config;
use crate::domain::DeadLetterCause;
use crate::queue::Queue;
use crate::queue::clock::ManualClock;
use crate::queue::limits::Limits;
use crate::queue::model::EnqueueInput;
use crate::queue::{NackStrategy, ReserveInput};
use crate::storage::conformance::{Backend, T0};
use tokio_util::sync::CancellationToken;

fn options(dir: &std::path::Path) -> EmbeddedOptions {
    EmbeddedOptions {
        path: dir.join("data"),
        persist_mode: PersistMode::Buffer,
        min_free_bytes: 0,
    }
}

fn open(dir: &std::path::Path, now: UnixMs) -> EmbeddedStore {
    EmbeddedStore::open(options(dir), now).expect("open")
}

/// The embedded backend for the conformance suite: a fresh directory per case.
struct Embedded {
    dir: tempfile::TempDir,
    /// The store `open` opened last (for `corrupt_body`); weak, so that a reopen can close it.
    last: std::sync::Mutex<std::sync::Weak<EmbeddedStore>>,
}

impl Embedded {
    fn new() -> Self {
        Embedded {
            dir: tempfile::tempdir().expect("temp dir"),
            last: std::sync::Mutex::new(std::sync::Weak::new()),
        }
    }
}

#[async_trait::async_trait]
impl Backend for Embedded {
    async fn open(&self, now: UnixMs) -> Arc<dyn Store> {
        let store = Arc::new(open(self.dir.path(), now));
        *self.last.lock().unwrap() = Arc::downgrade(&store);
        store
    }

    async fn corrupt_body(&self, store: &Arc<dyn Store>, id: JobId) {
        let last = self
            .last
            .lock()
            .unwrap()
            .upgrade()
            .expect("a store is open");
        let opened: Arc<dyn Store> = last.clone();
        assert!(Arc::ptr_eq(&opened, store), "not the store opened last");
        let key = last.shared.body_key(id);
        let ks = last.shared.ks().expect("keyspaces");
        ks.get(key.ks())
            .insert(key.as_ref(), b"not a body".to_vec())
            .expect("write");
    }

    async fn open_backup(
        &self,
        dir: &std::path::Path,
        now: UnixMs,
    ) -> Result<Arc<dyn Store>, &'static [&'static str]> {
        let options = EmbeddedOptions {
            path: dir.to_path_buf(),
            ..options(self.dir.path())
        };
        Ok(Arc::new(
            EmbeddedStore::open(options, now).expect("open the backup"),
        ))
    }
}

crate::storage::conformance::conformance_suite!(Embedded::new());
crate::storage::model::model_test!(Embedded::new());

/// Everything the index holds, in a comparable order (a dedup entry's batch number is left
/// out: recovered entries are durable, batch 0).
#[allow(clippy::type_complexity)]
fn snapshot(
    st: &State,
) -> (
    Vec<(JobId, Meta)>,
    Vec<(Vec<u8>, JobId, UnixMs, UnixMs, DedupAt)>,
    Vec<(String, bool)>,
) {
    let mut jobs: Vec<_> = st.jobs.iter();
    jobs.sort_by_key(|(id, _)| *id);
    let mut keys: Vec<_> = st
        .dedup
        .iter()
        .map(|(k, e)| (k.to_vec(), e.job_id, e.created_at, e.expires_at, e.at))
        .collect();
    keys.sort();
    let mut paused: Vec<_> = st
        .jobs
        .paused()
        .filter(|(_, p)| *p)
        .map(|(q, p)| (q.to_string(), p))
        .collect();
    paused.sort();
    (jobs, keys, paused)
}

/// Asserts that the in-memory index equals what fjall holds.
fn assert_memory_equals_disk(store: &EmbeddedStore) {
    let sh = &store.shared;
    let st = sh.lock();
    let ks = sh.keyspaces().expect("keyspaces");
    let (disk, _) = recovery::load_state(&ks, None, None).expect("load");
    assert_eq!(snapshot(&st), snapshot(&disk), "memory differs from disk");
    // Recovery keeps one record per key; the disk must not hold a second one either.
    let raw = [&ks.dedup, &ks.dedup_log]
        .into_iter()
        .flat_map(|k| k.iter())
        .map(|kv| kv.key().expect("read"))
        .filter(|k| &**k != recovery::SENTINEL)
        .count();
    assert_eq!(raw, st.dedup.len(), "dedup records on disk");
}

fn queue_over(store: Arc<dyn Store>, clock: Arc<ManualClock>, retention_ms: u64) -> Queue {
    let mut c = Config::default();
    c.storage.dead_letter_retention_ms = retention_ms;
    Queue::new(
        store,
        Arc::new(Limits::from_config(&c).expect("limits")),
        clock,
        CancellationToken::new(),
    )
}

fn keyed(key: &str) -> EnqueueInput {
    EnqueueInput {
        queue: "q".into(),
        job_type: "t".into(),
        idempotency_key: Some(key.into()),
        ..Default::default()
    }
}

fn reserve(n: u32) -> ReserveInput {
    ReserveInput {
        queues: vec!["q".into()],
        wait_timeout_ms: None,
        lease_ms: Some(60_000),
        worker_id: None,
        max_jobs: Some(n),
    }
}

/// Within one group-commit batch the last write of a key wins, in memory, after a journal
/// replay and after a flush to disk tables. fjall gives every item of a write batch the same
/// sequence number (`fjall` `WriteBatch::commit`, `src/batch/mod.rs`), its memtable orders
/// entries by (user key, sequence number) only (`lsm-tree` `impl Ord for InternalKey`,
/// `src/key.rs`), and crossbeam's `SkipMap::insert` replaces an equal entry, so a later item
/// of the batch replaces an earlier one; recovery replays the journal's items in order. That
/// is an implementation property rather than a documented guarantee, hence this test: a fjall
/// upgrade that changes it fails here.
#[tokio::test]
async fn the_last_write_of_a_key_in_one_batch_wins() {
    let dir = tempfile::tempdir().expect("temp dir");
    let paused = |p: bool| QueueRecord { paused: p }.encode();
    let check = |store: &EmbeddedStore, when: &str| {
        let ks = store.shared.ks().expect("keyspaces");
        let get = |k: &str| {
            ks.queues
                .get(k)
                .expect("read")
                .map(|v| QueueRecord::decode(&v).expect("decode").paused)
        };
        assert_eq!(get("put-put"), Some(false), "{when}: the second put wins");
        assert_eq!(
            get("put-delete"),
            None,
            "{when}: the delete after a put wins"
        );
        assert_eq!(
            get("delete-put"),
            Some(true),
            "{when}: the put after a delete wins"
        );
        // The index rebuilt from the same data agrees.
        let (st, _) = recovery::load_state(&ks, None, None).expect("load");
        let p: Vec<_> = snapshot(&st).2;
        assert_eq!(p, vec![("delete-put".to_string(), true)], "{when}");
    };
    {
        let store = open(dir.path(), T0);
        let ops = vec![
            WriteOp::put(Ks::Queues, "put-put", paused(true)),
            WriteOp::put(Ks::Queues, "put-delete", paused(true)),
            WriteOp::delete(Ks::Queues, "delete-put"),
            WriteOp::put(Ks::Queues, "put-put", paused(false)),
            WriteOp::delete(Ks::Queues, "put-delete"),
            WriteOp::put(Ks::Queues, "delete-put", paused(true)),
        ];
        let batch = store.shared.commit.append(ops);
        store
            .shared
            .commit
            .wait(batch, &*store.shared)
            .await
            .expect("durable");
        check(&store, "in the memtable");
        // Not flushed: the next open replays the journal.
        drop(store.shared.lock());
        store.close().await.expect("close");
    }
    {
        let store = open(dir.path(), T0);
        check(&store, "after a journal replay");
        let ks = store.shared.ks().expect("keyspaces");
        ks.queues.rotate_memtable_and_wait().expect("flush");
        check(&store, "after a flush to a disk table");
        store.close().await.expect("close");
    }
    let store = open(dir.path(), T0);
    check(&store, "reopened from tables");
    store.close().await.expect("close");
}

/// A failed write: the waiter of the failed batch and every later write get an error (never
/// `Ok`), the store reports itself failed (health NOT_SERVING, see `api`'s test), reads still
/// work, and memory equals disk; after a restart, exactly what was acknowledged is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_fails_its_waiters_and_leaves_memory_equal_to_disk() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    let queue = Arc::new(queue_over(store.clone(), clock.clone(), 60_000));
    // Acknowledged before the failure: ready, leased, acked, dead-lettered, keyed.
    let mut before = Vec::new();
    for i in 0..8 {
        let out = queue
            .enqueue_batch(vec![keyed(&format!("before-{i}"))])
            .await
            .expect("enqueue");
        before.push(out[0].as_ref().expect("accepted").job_id);
    }
    let leased = queue.reserve(reserve(3)).await.expect("reserve");
    queue.ack(&leased[0].id.to_string(), 1).await.expect("ack");
    queue
        .nack(&leased[1].id.to_string(), 1, NackStrategy::DeadLetter, None)
        .await
        .expect("nack");
    let acknowledged = snapshot(&store.shared.lock());

    store.inject_commit_failure();
    // Concurrent writers: the failing batch, the batch filling meanwhile, and the refused.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            let enq = queue
                .enqueue_batch(vec![keyed(&format!("after-{i}"))])
                .await;
            let res = queue.reserve(reserve(1)).await;
            (enq.is_ok(), res.is_ok())
        }));
    }
    for t in tasks {
        assert_eq!(
            t.await.expect("task"),
            (false, false),
            "no write is acknowledged"
        );
    }
    assert!(
        matches!(*store.health().borrow(), StorageHealth::Failed(_)),
        "{:?}",
        *store.health().borrow()
    );
    assert!(queue.queue_stats("q").await.is_ok(), "reads still work");
    assert_memory_equals_disk(&store);
    assert_eq!(snapshot(&store.shared.lock()), acknowledged);
    store.close().await.expect("close");
    drop(queue);
    drop(store);

    let store = open(dir.path(), T0);
    assert_eq!(
        snapshot(&store.shared.lock()),
        acknowledged,
        "after a restart"
    );
    store.close().await.expect("close");
}

/// A drain that cannot read one of the records it picked fails as a whole: it returns the
/// error, removes nothing (in memory or on disk), and a later drain returns every record.
#[tokio::test]
async fn a_drain_whose_body_read_fails_loses_nothing_and_returns_an_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    let queue = queue_over(store.clone(), clock.clone(), 600_000);
    let mut dead = Vec::new();
    for i in 0..3 {
        let out = queue
            .enqueue_batch(vec![keyed(&format!("k{i}"))])
            .await
            .expect("enqueue");
        let id = out[0].as_ref().expect("accepted").job_id;
        queue.reserve(reserve(1)).await.expect("reserve");
        queue
            .nack(&id.to_string(), 1, NackStrategy::DeadLetter, None)
            .await
            .expect("nack");
        dead.push(id);
        clock.advance(10);
    }
    // The second record's body turns unreadable.
    let ks = store.shared.ks().expect("keyspaces");
    let key = store.shared.body_key(dead[1]);
    let good = ks.get(key.ks()).get(key).expect("read").expect("a body");
    ks.get(key.ks())
        .insert(key.as_ref(), b"not a body".to_vec())
        .expect("write");

    let err = queue
        .drain_dead_letters(None, Some(3))
        .await
        .expect_err("the drain fails");
    assert!(
        matches!(
            err,
            crate::error::QueueError::Storage(StorageError::Corrupt { .. })
        ),
        "{err:?}"
    );
    assert_eq!(
        queue.queue_stats("q").await.expect("stats").dead_lettered,
        3
    );
    assert_memory_equals_disk(&store);

    ks.get(key.ks()).insert(key.as_ref(), good).expect("repair");
    drop(ks);
    let drained = queue
        .drain_dead_letters(None, Some(3))
        .await
        .expect("drain");
    assert_eq!(drained.iter().map(|d| d.job.id).collect::<Vec<_>>(), dead);
    assert!(drained.iter().all(|d| d.cause == DeadLetterCause::Rejected));
    assert_memory_equals_disk(&store);
    store.close().await.expect("close");
}

/// Ready and scheduled jobs leave memory once the batch that wrote them is durable: the index
/// keeps their keys and reads their metas back from disk when a transition needs them, so
/// Reserve still hands out the oldest first, memory still equals disk, and a restart rebuilds
/// the same index.
#[tokio::test]
async fn ready_and_scheduled_jobs_are_paged_out_once_durable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    let queue = queue_over(store.clone(), clock.clone(), 60_000);
    let job = |scheduled: bool| EnqueueInput {
        queue: "q".into(),
        job_type: "t".into(),
        scheduled_at: scheduled.then_some(Ok(T0 + 3_600_000)),
        ..Default::default()
    };
    let mut ready = Vec::new();
    for _ in 0..10 {
        let out = queue
            .enqueue_batch(vec![job(false), job(true)])
            .await
            .expect("enqueue");
        ready.push(out[0].as_ref().expect("accepted").job_id.to_string());
    }
    let leased = queue.reserve(reserve(2)).await.expect("reserve");
    let leased: Vec<String> = leased.iter().map(|j| j.id.to_string()).collect();
    assert_eq!(leased, ready[..2], "the oldest ready jobs first");
    {
        let st = store.shared.lock();
        assert_eq!(st.jobs.len(), 20);
        assert_eq!(
            st.jobs.held_len(),
            2,
            "only the leased jobs' metas stay in memory"
        );
    }
    let stats = queue.queue_stats("q").await.expect("stats");
    assert_eq!((stats.ready, stats.scheduled, stats.in_flight), (8, 10, 2));
    assert_memory_equals_disk(&store);
    let before = snapshot(&store.shared.lock());
    store.close().await.expect("close");
    drop(queue);
    drop(store);

    let store = open(dir.path(), T0);
    assert_eq!(snapshot(&store.shared.lock()), before, "after a restart");
    assert_eq!(store.shared.lock().jobs.held_len(), 2);
    store.close().await.expect("close");
}

/// The dedup records on disk (format 3): the place of each, `dedup_log` numbers as keys.
fn logged_records(store: &EmbeddedStore) -> Vec<(u64, Vec<u8>, JobId)> {
    let ks = store.shared.ks().expect("keyspaces");
    let mut out = Vec::new();
    for kv in ks.dedup_log.iter() {
        let (k, v) = kv.into_inner().expect("read");
        if &*k == recovery::SENTINEL {
            continue;
        }
        let (key, rec) = DedupRecord::decode_logged(&v).expect("decode");
        out.push((
            codec::decode_seq(&k).expect("number"),
            key.to_vec(),
            rec.job_id,
        ));
    }
    out
}

/// The keys of the dedup records in format 2's keyspace, `dedup`.
fn keyed_records(store: &EmbeddedStore) -> Vec<Vec<u8>> {
    let ks = store.shared.ks().expect("keyspaces");
    ks.dedup
        .iter()
        .map(|kv| kv.key().expect("read").to_vec())
        .filter(|k| k != recovery::SENTINEL)
        .collect()
}

/// A dedup record lives in `dedup_log` under its job's enqueue number. A key enqueued again
/// after its window (before the sweeper purged the old record) has one record, the new one;
/// forgetting and purging delete the record where it is; memory equals disk all along, and a
/// restart brings back exactly what is stored.
#[tokio::test]
async fn dedup_records_are_written_replaced_and_deleted_under_their_numbers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    let queue = queue_over(store.clone(), clock.clone(), 0);
    let id = |out: Vec<crate::queue::model::JobOutcome>| {
        out.into_iter().next().unwrap().expect("accepted").job_id
    };
    let first = id(queue
        .enqueue_batch(vec![keyed("a"), keyed("b")])
        .await
        .expect("enqueue"));
    let on_disk = logged_records(&store);
    assert_eq!(on_disk.len(), 2);
    assert_eq!(
        keyed_records(&store),
        Vec::<Vec<u8>>::new(),
        "nothing in format 2's keyspace"
    );
    assert_eq!(
        (on_disk[0].1.as_slice(), on_disk[0].2),
        (record_key("q", "a").as_slice(), first)
    );
    assert!(on_disk[0].0 < on_disk[1].0, "numbers in enqueue order");
    assert_memory_equals_disk(&store);

    // Past the window (the default, 24 h), before any sweep: "a" makes a new job, whose record
    // replaces the old one on disk.
    clock.advance(86_400_001);
    let again = id(queue
        .enqueue_batch(vec![keyed("a")])
        .await
        .expect("enqueue"));
    assert_ne!(again, first);
    let on_disk = logged_records(&store);
    let a: Vec<_> = on_disk
        .iter()
        .filter(|r| r.1 == record_key("q", "a"))
        .collect();
    assert_eq!(a.len(), 1, "one record of a: {on_disk:?}");
    assert_eq!(a[0].2, again);
    assert_memory_equals_disk(&store);

    // Forgotten: gone from disk.
    assert!(
        queue
            .forget_idempotency_key("q", "a")
            .await
            .expect("forget")
            .is_some()
    );
    assert!(
        logged_records(&store)
            .iter()
            .all(|r| r.1 != record_key("q", "a"))
    );
    assert_memory_equals_disk(&store);

    // "b" expired: the sweep deletes its record.
    let report = queue.sweep(1_000).await.expect("sweep");
    assert_eq!(report.done.dedup_purged, 1);
    // The sweep does not wait for its batch; a later write's batch is committed after it.
    let unkeyed = EnqueueInput {
        idempotency_key: None,
        ..keyed("")
    };
    queue.enqueue_batch(vec![unkeyed]).await.expect("enqueue");
    assert_eq!(logged_records(&store), vec![], "every record deleted");
    assert_memory_equals_disk(&store);

    // "c" is kept through a restart; its number is not handed out again.
    let c = id(queue
        .enqueue_batch(vec![keyed("c")])
        .await
        .expect("enqueue"));
    let before = logged_records(&store);
    store.close().await.expect("close");
    drop(queue);
    drop(store);
    let store = Arc::new(open(dir.path(), crate::queue::clock::Clock::now(&*clock)));
    assert_eq!(logged_records(&store), before);
    assert_eq!(
        store
            .shared
            .lock()
            .dedup
            .get(&record_key("q", "c"))
            .map(|e| e.job_id),
        Some(c)
    );
    assert!(store.shared.lock().jobs.next_seq > before[0].0);
    store.close().await.expect("close");
}

/// A dedup record outlives its job, so its number is never handed out again, even when no
/// stored job has a number as high: here the job's meta is removed from disk by hand (as if
/// the job had ended long ago) and the next keyed enqueue after a restart must not land on it.
#[tokio::test]
async fn a_stored_dedup_record_keeps_its_number_from_new_jobs_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    let queue = queue_over(store.clone(), clock.clone(), 0);
    let out = queue
        .enqueue_batch(vec![keyed("k")])
        .await
        .expect("enqueue");
    let first = out[0].as_ref().expect("accepted").job_id;
    {
        let ks = store.shared.ks().expect("keyspaces");
        ks.meta.remove(first.to_bytes()).expect("remove");
        ks.db.persist(fjall::PersistMode::SyncAll).expect("persist");
    }
    store.close().await.expect("close");
    drop(queue);
    drop(store);

    let store = Arc::new(open(dir.path(), T0));
    assert_eq!(store.shared.lock().jobs.len(), 0, "the job is gone");
    let queue = queue_over(store.clone(), clock.clone(), 0);
    let out = queue
        .enqueue_batch(vec![keyed("k2")])
        .await
        .expect("enqueue");
    let second = out[0].as_ref().expect("accepted").job_id;
    let on_disk = logged_records(&store);
    assert_eq!(on_disk.len(), 2, "both records: {on_disk:?}");
    assert_ne!(on_disk[0].0, on_disk[1].0);
    store.close().await.expect("close");
    drop(queue);
    drop(store);

    let store = open(dir.path(), T0);
    let job_of = |k: &str| {
        let st = store.shared.lock();
        st.dedup.get(&record_key("q", k)).map(|e| e.job_id)
    };
    assert_eq!(job_of("k"), Some(first));
    assert_eq!(job_of("k2"), Some(second));
    store.close().await.expect("close");
}

/// A record of format 2, in `dedup` under its key (planted by hand, as an upgraded directory
/// holds them), is deleted there when its key is enqueued again after its window and when the
/// sweeper purges it; the new record goes to `dedup_log`.
#[tokio::test]
async fn a_format_2_dedup_record_is_replaced_and_purged_where_it_is() {
    let dir = tempfile::tempdir().expect("temp dir");
    {
        let store = open(dir.path(), T0);
        let ks = store.shared.ks().expect("keyspaces");
        for key in ["old", "old2"] {
            let rec = DedupRecord {
                job_id: JobId::new_v4(),
                created_at: T0,
                expires_at: T0 + 1_000,
                fingerprint: None,
            };
            ks.dedup
                .insert(record_key("q", key), rec.encode())
                .expect("insert");
        }
        ks.db.persist(fjall::PersistMode::SyncAll).expect("persist");
        drop(ks);
        store.close().await.expect("close");
    }
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    assert_eq!(
        store
            .shared
            .lock()
            .dedup
            .get(&record_key("q", "old"))
            .map(|e| e.at),
        Some(DedupAt::Keyed)
    );
    let queue = queue_over(store.clone(), clock.clone(), 0);
    clock.advance(1_000);
    let out = queue
        .enqueue_batch(vec![keyed("old")])
        .await
        .expect("enqueue");
    let new = out[0].as_ref().expect("accepted").job_id;
    assert!(!out[0].as_ref().expect("accepted").deduplicated);
    assert_eq!(keyed_records(&store), vec![record_key("q", "old2")]);
    let logged = logged_records(&store);
    assert_eq!(logged.len(), 1);
    assert_eq!(
        (logged[0].1.clone(), logged[0].2),
        (record_key("q", "old"), new)
    );
    assert_memory_equals_disk(&store);

    let report = queue.sweep(1_000).await.expect("sweep");
    assert_eq!(report.done.dedup_purged, 1, "old2");
    // The sweep does not wait for its batch; a later write's batch is committed after it.
    let unkeyed = EnqueueInput {
        idempotency_key: None,
        ..keyed("")
    };
    queue.enqueue_batch(vec![unkeyed]).await.expect("enqueue");
    assert_eq!(keyed_records(&store), Vec::<Vec<u8>>::new());
    assert_memory_equals_disk(&store);
    store.close().await.expect("close");
}

/// The index shares one copy of each job type name among the jobs it holds, and forgets a
/// name no held job uses: a stream of jobs of distinct types (paged out once durable) does not
/// grow it without bound.
#[tokio::test]
async fn job_type_names_no_held_job_uses_are_forgotten() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    let queue = queue_over(store.clone(), clock.clone(), 60_000);
    let job = |t: String| EnqueueInput {
        queue: "q".into(),
        job_type: t,
        ..Default::default()
    };
    queue
        .enqueue_batch(vec![job("kept".into())])
        .await
        .expect("enqueue");
    let leased = queue.reserve(reserve(1)).await.expect("reserve");
    assert_eq!(leased.len(), 1, "the kept job is leased, so held in memory");
    for i in 0..4_000 {
        queue
            .enqueue_batch(vec![job(format!("type-{i}"))])
            .await
            .expect("enqueue");
    }
    let (jobs, names) = {
        let st = store.shared.lock();
        (st.jobs.len(), st.jobs.job_type_count())
    };
    assert_eq!(jobs, 4_001);
    assert!(names <= 512, "{names} job type names kept for 4,001 jobs");
    store.close().await.expect("close");
}

/// While fjall is reopened after running out of space, the store has no handles to read a
/// paged-out meta through. Inspections must then answer "unavailable", never "no such job":
/// the job is on disk, and a client told it is unknown would take it for lost.
#[tokio::test]
async fn a_paged_out_job_is_unavailable_not_unknown_while_storage_is_reopened() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    let queue = queue_over(store.clone(), clock.clone(), 60_000);
    let job = |queue: &str| EnqueueInput {
        queue: queue.into(),
        job_type: "t".into(),
        ..Default::default()
    };
    let out = queue.enqueue_batch(vec![job("q")]).await.expect("enqueue");
    let id = out[0].as_ref().expect("accepted").job_id;
    // The next append (this one, or a background one before it) pages out what the durable
    // batches hold.
    queue.enqueue_batch(vec![job("r")]).await.expect("enqueue");
    assert!(
        !store.shared.lock().jobs.holds(id),
        "the first job is paged out"
    );

    // What `Engine::reopen` does under the state lock, stopped half-way.
    let ks = store
        .shared
        .ks
        .write()
        .expect("ks")
        .take()
        .expect("handles");
    for err in [
        store.get_job(id).await.map(|_| ()).expect_err("get_job"),
        store
            .list_jobs("q", ListState::Ready, None, 10)
            .await
            .map(|_| ())
            .expect_err("list_jobs"),
    ] {
        assert!(matches!(err, StorageError::Unavailable(_)), "{err:?}");
    }
    let gauges = store.gauges().await.expect("a scrape still answers");
    let q = gauges.queues.iter().find(|g| g.queue == "q").expect("q");
    assert_eq!(q.stats.ready, 1);
    assert_eq!(q.oldest_ready_at, None, "left out, not guessed");
    *store.shared.ks.write().expect("ks") = Some(ks);

    let job = store.get_job(id).await.expect("get_job").expect("found");
    assert_eq!(job.stage, Stage::Ready);
    assert_memory_equals_disk(&store);
    store.close().await.expect("close");
}

/// A reply room that refuses every lease until opened, and says when a lease was refused.
struct Gate {
    open: std::sync::atomic::AtomicBool,
    refused: tokio::sync::Notify,
    freed: tokio::sync::Notify,
}

impl crate::queue::reserve::ReplyRoom for Gate {
    fn try_take(&self, _bytes: u64) -> bool {
        let open = self.open.load(std::sync::atomic::Ordering::Acquire);
        if !open {
            self.refused.notify_one();
        }
        open
    }

    fn freed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(self.freed.notified())
    }
}

/// A waiting Reserve that wakes to a ready job while its reply has no room (its connection's
/// earlier replies are still being written) does not answer empty: it waits for room and
/// then leases the job.
#[tokio::test]
async fn a_waiting_reserve_without_room_for_its_reply_waits_for_room_then_leases() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::new(T0));
    let store = Arc::new(open(dir.path(), T0));
    let queue = Arc::new(queue_over(store.clone(), clock.clone(), 60_000));
    let gate = Arc::new(Gate {
        open: false.into(),
        refused: tokio::sync::Notify::new(),
        freed: tokio::sync::Notify::new(),
    });
    let waiting = {
        let (queue, gate) = (queue.clone(), gate.clone());
        tokio::spawn(async move {
            let input = ReserveInput {
                wait_timeout_ms: Some(30_000),
                ..reserve(1)
            };
            queue.reserve_within(input, &*gate).await
        })
    };
    queue.ready_signals().waiting(1).await;
    queue
        .enqueue_batch(vec![keyed("k")])
        .await
        .expect("enqueue");
    // The Reserve woke, looked and found no room for the job.
    gate.refused.notified().await;
    gate.open.store(true, std::sync::atomic::Ordering::Release);
    gate.freed.notify_waiters();
    let jobs = waiting.await.expect("the task").expect("reserve");
    assert_eq!(jobs.len(), 1, "leased once room freed, not answered empty");
    store.close().await.expect("close");
}
