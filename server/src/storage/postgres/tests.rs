//! Tests of the PostgreSQL backend: the conformance suite, each case on a database of its own
//! (`testing::postgres::TestDatabase`, on the PostgreSQL of `SEPP_TEST_POSTGRES_URL`).

use super::*;
use crate::storage::conformance::Backend;
use crate::testing::postgres::TestDatabase;

/// A fresh database per case; `open` opens a new store on it (the same data after a close).
pub(crate) struct Postgres {
    db: tokio::sync::OnceCell<TestDatabase>,
}

impl Postgres {
    pub(crate) fn new() -> Self {
        Postgres {
            db: tokio::sync::OnceCell::new(),
        }
    }
}

pub(crate) fn options(url: &str) -> PostgresOptions {
    PostgresOptions {
        url: url.to_string(),
        pool_size: 4,
        statement_timeout_ms: 30_000,
        poll_interval_ms: 1000,
        ca_file: None,
    }
}

#[async_trait::async_trait]
impl Backend for Postgres {
    async fn open(&self, _now: UnixMs) -> Arc<dyn Store> {
        let db = self.db.get_or_init(TestDatabase::create).await;
        Arc::new(
            PostgresStore::open(options(db.url()))
                .await
                .expect("open the PostgreSQL store"),
        )
    }

    async fn corrupt_body(&self, _store: &Arc<dyn Store>, id: JobId) {
        let db = self.db.get().expect("a store was opened");
        let (client, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(conn);
        let n = client
            .execute(
                "UPDATE sepp_jobs SET body = '\\xdeadbeef'::bytea WHERE id = $1",
                &[&uuid(id)],
            )
            .await
            .expect("update");
        assert_eq!(n, 1);
    }

    /// A PostgreSQL database is backed up with PostgreSQL's tools (docs/postgres.md).
    async fn open_backup(
        &self,
        _dir: &std::path::Path,
        _now: UnixMs,
    ) -> Result<Arc<dyn Store>, &'static [&'static str]> {
        Err(&["pg_dump", "pg_basebackup"])
    }
}

crate::storage::conformance::conformance_suite!(Postgres::new());
crate::storage::model::model_test!(Postgres::new());

/// Two servers on one database (two stores, two connection pools), each with its scheduler,
/// enqueue every tick of a schedule once, however their passes interleave.
#[tokio::test]
async fn two_servers_on_one_database_enqueue_each_schedule_tick_once() {
    use crate::config::{Config, ScheduleConfig};
    use crate::queue::Queue;
    use crate::queue::clock::ManualClock;
    use crate::queue::limits::Limits;
    use crate::queue::schedule::{FiredOutcome, Scheduler, Schedules};
    use std::sync::Arc;

    const T0: UnixMs = 1_704_067_200_000;
    let db = TestDatabase::create().await;
    let mut config = Config::default();
    config.schedules.push(ScheduleConfig {
        name: "m".into(),
        queue: "q".into(),
        job_type: "t".into(),
        every_ms: Some(60_000),
        ..Default::default()
    });
    let clock = Arc::new(ManualClock::new(T0 + 1));
    let mut servers = Vec::new();
    for _ in 0..2 {
        let store: Arc<dyn Store> = Arc::new(PostgresStore::open(options(db.url())).await.unwrap());
        let limits = Arc::new(Limits::from_config(&config).unwrap());
        let schedules = Arc::new(Schedules::from_config(&config, &limits, T0).unwrap());
        let queue = Queue::new(
            store,
            limits,
            clock.clone(),
            tokio_util::sync::CancellationToken::new(),
        )
        .with_schedules(schedules);
        servers.push(Scheduler::new(Arc::new(queue)));
    }
    let (mut a, mut b) = (servers.remove(0), servers.remove(0));
    let mut created = 0;
    for i in 1..=3 {
        clock.set(T0 + i * 60_000);
        let (fa, fb) = tokio::join!(a.run_due(), b.run_due());
        for f in fa.iter().chain(&fb) {
            match &f.outcome {
                FiredOutcome::Enqueued(acc) => created += u32::from(!acc.deduplicated),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!((fa.len(), fb.len()), (1, 1));
    }
    assert_eq!(created, 3, "one job per tick");
    let store = PostgresStore::open(options(db.url())).await.unwrap();
    assert_eq!(store.queue_stats("q").await.unwrap().ready, 3);
}

/// Two servers on one database enqueue into new queues at the same time: together they create
/// exactly `max_queues` queues (the count is read under the creation lock), and each refused job
/// names the cap.
#[tokio::test]
async fn several_servers_never_pass_max_queues_together() {
    use crate::config::Config;
    use crate::queue::Queue;
    use crate::queue::clock::ManualClock;
    use crate::queue::limits::Limits;
    use crate::queue::model::{EnqueueInput, Rejection};
    use tokio_util::sync::CancellationToken;

    let db = TestDatabase::create().await;
    let mut config = Config::default();
    config.limits.max_queues = 4;
    let limits = Arc::new(Limits::from_config(&config).expect("limits"));
    let clock = Arc::new(ManualClock::new(crate::storage::conformance::T0));
    let mut servers = Vec::new();
    for _ in 0..2 {
        let store: Arc<dyn Store> = Arc::new(
            PostgresStore::open(options(db.url()))
                .await
                .expect("open the PostgreSQL store"),
        );
        servers.push(Arc::new(Queue::new(
            store,
            limits.clone(),
            clock.clone(),
            CancellationToken::new(),
        )));
    }
    let mut calls = Vec::new();
    for i in 0..12 {
        let q = servers[i % 2].clone();
        calls.push(tokio::spawn(async move {
            q.enqueue_batch(vec![EnqueueInput {
                queue: format!("q{i}"),
                job_type: "t".into(),
                ..Default::default()
            }])
            .await
            .expect("enqueue")
            .remove(0)
        }));
    }
    let (mut created, mut refused) = (0, 0);
    for c in calls {
        match c.await.expect("task") {
            Ok(_) => created += 1,
            Err(Rejection::TooManyQueues { limit: 4, .. }) => refused += 1,
            Err(other) => panic!("unexpected rejection {other:?}"),
        }
    }
    assert_eq!((created, refused), (4, 8));
    for s in &servers {
        let page = s.list_queues(None, "").await.expect("list");
        assert_eq!(page.queues.len(), 4, "{page:?}");
    }
}

/// A DeleteQueue on one server racing with an enqueue into the same queue on another: either
/// the deletion is refused (it saw the job) or the enqueue lands after it and creates the queue
/// anew. Never a job in a queue that no longer exists.
#[tokio::test]
async fn a_delete_racing_an_enqueue_on_another_server_never_strands_the_job() {
    use crate::config::Config;
    use crate::error::QueueError;
    use crate::queue::Queue;
    use crate::queue::clock::ManualClock;
    use crate::queue::limits::Limits;
    use crate::queue::model::EnqueueInput;
    use tokio_util::sync::CancellationToken;

    let db = TestDatabase::create().await;
    let limits = Arc::new(Limits::from_config(&Config::default()).expect("limits"));
    let clock = Arc::new(ManualClock::new(crate::storage::conformance::T0));
    let mut servers = Vec::new();
    for _ in 0..2 {
        let store: Arc<dyn Store> = Arc::new(
            PostgresStore::open(options(db.url()))
                .await
                .expect("open the PostgreSQL store"),
        );
        servers.push(Arc::new(Queue::new(
            store,
            limits.clone(),
            clock.clone(),
            CancellationToken::new(),
        )));
    }
    let (a, b) = (servers[0].clone(), servers[1].clone());
    let (mut deleted, mut refused) = (0, 0);
    for i in 0..40 {
        let name = format!("race{i}");
        a.store()
            .create_queues(std::slice::from_ref(&name))
            .await
            .unwrap();
        let del = {
            let (a, name) = (a.clone(), name.clone());
            tokio::spawn(async move { a.delete_queue(&name).await })
        };
        let enq = {
            let (b, name) = (b.clone(), name.clone());
            tokio::spawn(async move {
                b.enqueue_batch(vec![EnqueueInput {
                    queue: name,
                    job_type: "t".into(),
                    ..Default::default()
                }])
                .await
            })
        };
        match del.await.unwrap() {
            Ok(_) => deleted += 1,
            Err(QueueError::QueueNotEmpty { ready: 1, .. }) => refused += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
        assert!(enq.await.unwrap().unwrap()[0].is_ok());
        let names: Vec<String> = a
            .list_queues(Some(1000), "")
            .await
            .unwrap()
            .queues
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert!(
            names.contains(&name),
            "{name} holds a job, so it exists (deleted {deleted}, refused {refused})"
        );
    }
}

/// Tests of the group commit: several enqueues in one flush.
mod flush {
    use super::*;
    use crate::domain::{DedupClaim, EnqueuePlan, JobState, Payload, Replacement};
    use crate::queue::enqueue::{QueueCap, decide, prepass};
    use crate::storage::EnqueueFacts;

    const NOW: UnixMs = 1_000_000;

    fn new_job(id: u128, queue: &str, key: Option<&str>, payload: &str) -> NewJob {
        NewJob {
            id: JobId(id),
            queue: Arc::from(queue),
            job_type: "t".into(),
            payload: Some(Payload {
                data: payload.as_bytes().to_vec(),
                encoding: "text/plain".into(),
            }),
            priority: 0,
            max_attempts: 3,
            trace_context: None,
            custom: Default::default(),
            enqueued_at: NOW,
            scheduled_at: None,
            dedup: key.map(|k| DedupClaim {
                key: k.into(),
                expires_at: NOW + 60_000,
                fingerprint: None,
                replace: None,
            }),
            max_queue_depth: None,
            reply_bytes: 100,
        }
    }

    /// The queue layer's rule, as `Queue` hands it over.
    fn rule(atomic: bool) -> impl Fn(&[NewJob], &dyn EnqueueFacts) -> EnqueuePlan + Sync {
        move |jobs: &[NewJob], facts: &dyn EnqueueFacts| {
            let cap = QueueCap {
                max: 10_000,
                exempt: &|_| false,
            };
            decide(jobs, &prepass(jobs), facts, &cap, atomic, NOW)
        }
    }

    async fn open(db: &TestDatabase) -> PostgresStore {
        PostgresStore::open(options(db.url()))
            .await
            .expect("open the PostgreSQL store")
    }

    /// Every enqueue's future is polled once (and hands its jobs to the flusher) before the
    /// flusher task runs on this one-thread runtime: they all go into one flush.
    async fn in_one_flush(
        store: &PostgresStore,
        batches: Vec<(Vec<NewJob>, bool)>,
    ) -> Vec<Result<Vec<InsertOutcome>, StorageError>> {
        let rules: Vec<_> = batches.iter().map(|(_, atomic)| rule(*atomic)).collect();
        futures_util::future::join_all(
            batches
                .into_iter()
                .zip(&rules)
                .map(|((jobs, _), rule)| store.enqueue(jobs, rule, NOW)),
        )
        .await
    }

    async fn reserve_all(store: &PostgresStore, queue: &str) -> Vec<Job> {
        let spec = ReserveSpec {
            queues: vec![queue.to_string()],
            max_jobs: 100,
            lease_expires_at: NOW + 30_000,
            worker_id: None,
            max_reply_bytes: u64::MAX,
        };
        store
            .reserve(&spec, &|_, _, _| Fit::Take(1), NOW)
            .await
            .unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn in_one_flush_the_first_writer_of_a_key_wins_and_a_refused_one_passes_it_on() {
        let db = TestDatabase::create().await;
        let store = open(&db).await;
        let mut full = new_job(4, "full", None, "d");
        full.max_queue_depth = Some(0);
        let mut replacing = new_job(6, "q", Some("k1"), "new");
        if let Some(d) = &mut replacing.dedup {
            d.replace = Some(Replacement {
                placement: None,
                reply_bytes: 120,
            });
        }
        let outcomes = in_one_flush(
            &store,
            vec![
                (vec![new_job(1, "q", Some("k1"), "a")], false),
                (vec![new_job(2, "q", Some("k1"), "b")], false),
                // An atomic batch that writes nothing: its claim of k2 is not kept.
                (vec![new_job(3, "q", Some("k2"), "c"), full], true),
                (vec![new_job(5, "q", Some("k2"), "e")], false),
                // A replace_pending hit on the job this same flush creates.
                (vec![replacing], false),
            ],
        )
        .await;
        let outcomes: Vec<Vec<InsertOutcome>> = outcomes.into_iter().map(|o| o.unwrap()).collect();
        assert_eq!(outcomes[0], vec![InsertOutcome::Created(JobId(1))]);
        assert_eq!(
            outcomes[1],
            vec![InsertOutcome::Deduplicated(JobId(1), JobState::Ready)]
        );
        assert_eq!(
            outcomes[2],
            vec![
                InsertOutcome::Created(JobId(3)),
                InsertOutcome::QueueFull { limit: 0 }
            ]
        );
        assert_eq!(outcomes[3], vec![InsertOutcome::Created(JobId(5))]);
        assert_eq!(
            outcomes[4],
            vec![InsertOutcome::Replaced(JobId(1), Placement::Ready)]
        );
        let k1 = store.lookup_key("q", "k1").await.unwrap().unwrap();
        assert_eq!((k1.job_id, k1.created_at), (JobId(1), NOW));
        let k2 = store.lookup_key("q", "k2").await.unwrap().unwrap();
        assert_eq!(k2.job_id, JobId(5));
        assert!(store.get_job(JobId(3)).await.unwrap().is_none());
        assert!(store.get_job(JobId(4)).await.unwrap().is_none());
        let jobs = reserve_all(&store, "q").await;
        let got: Vec<(JobId, Vec<u8>)> = jobs
            .iter()
            .map(|j| (j.id, j.payload.as_ref().unwrap().data.clone()))
            .collect();
        assert_eq!(
            got,
            vec![(JobId(1), b"new".to_vec()), (JobId(5), b"e".to_vec())]
        );
        store.close().await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_enqueue_the_database_refuses_fails_alone_and_the_others_of_its_flush_commit() {
        let db = TestDatabase::create().await;
        let store = open(&db).await;
        // Random characters, so that PostgreSQL cannot compress the key below the B-tree's limit
        // of about 2,700 bytes per index entry.
        let long: String = (0..400)
            .map(|_| uuid::Uuid::new_v4().simple().to_string())
            .collect();
        let outcomes = in_one_flush(
            &store,
            vec![
                (vec![new_job(1, "q", Some("a"), "a")], false),
                (vec![new_job(2, "q", Some(&long), "b")], false),
                (vec![new_job(3, "q", None, "c")], false),
            ],
        )
        .await;
        assert_eq!(
            outcomes[0].as_ref().unwrap(),
            &vec![InsertOutcome::Created(JobId(1))]
        );
        assert!(
            matches!(&outcomes[1], Err(StorageError::Io(m)) if m.contains("index row")),
            "{:?}",
            outcomes[1]
        );
        assert_eq!(
            outcomes[2].as_ref().unwrap(),
            &vec![InsertOutcome::Created(JobId(3))]
        );
        let ids: Vec<JobId> = reserve_all(&store, "q")
            .await
            .iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(ids, vec![JobId(1), JobId(3)]);
        assert_eq!(
            store.lookup_key("q", "a").await.unwrap().unwrap().job_id,
            JobId(1)
        );
        store.close().await.unwrap();
    }
}

/// The Reserve cursor (`cursor.rs`) is a hint: jobs made ready before it are still delivered
/// in priority and enqueue order.
mod reserve_cursor {
    use super::*;
    use crate::config::Config;
    use crate::queue::clock::ManualClock;
    use crate::queue::limits::Limits;
    use crate::queue::model::EnqueueInput;
    use crate::queue::{NackStrategy, Queue, ReserveInput};
    use tokio_util::sync::CancellationToken;

    fn input(job_type: &str, priority: u32) -> EnqueueInput {
        EnqueueInput {
            queue: "q".into(),
            job_type: job_type.into(),
            priority: Some(priority),
            max_attempts: Some(3),
            ..Default::default()
        }
    }

    async fn next(queue: &Queue) -> String {
        let jobs = queue
            .reserve(ReserveInput {
                queues: vec!["q".into()],
                wait_timeout_ms: None,
                lease_ms: Some(30_000),
                worker_id: None,
                max_jobs: Some(1),
            })
            .await
            .unwrap();
        assert_eq!(jobs.len(), 1);
        jobs[0].job_type.clone()
    }

    #[tokio::test]
    async fn jobs_made_ready_before_the_cursor_come_first() {
        let db = TestDatabase::create().await;
        let store: Arc<dyn Store> = Arc::new(PostgresStore::open(options(db.url())).await.unwrap());
        let queue = Queue::new(
            store.clone(),
            Arc::new(Limits::from_config(&Config::default()).unwrap()),
            Arc::new(ManualClock::new(1_000_000)),
            CancellationToken::new(),
        );
        queue
            .enqueue_batch(vec![input("a", 0), input("b", 0), input("c", 0)])
            .await
            .unwrap();
        assert_eq!(next(&queue).await, "a");
        // A new job of a higher priority sorts before the cursor (after "a").
        queue.enqueue_batch(vec![input("urgent", 5)]).await.unwrap();
        assert_eq!(next(&queue).await, "urgent");
        let b = queue
            .reserve(ReserveInput {
                queues: vec!["q".into()],
                wait_timeout_ms: None,
                lease_ms: Some(30_000),
                worker_id: None,
                max_jobs: Some(1),
            })
            .await
            .unwrap();
        assert_eq!(b[0].job_type, "b");
        // A retry (not dead-lettered) keeps its place in line: before the cursor (after "b"),
        // before "c".
        assert!(
            !queue
                .nack(
                    &b[0].id.to_string(),
                    b[0].attempt,
                    NackStrategy::Delay(0),
                    None
                )
                .await
                .unwrap()
        );
        assert_eq!(next(&queue).await, "b");
        assert_eq!(next(&queue).await, "c");
        store.close().await.unwrap();
    }
}

/// An ack that brings the next job commits both in one transaction; a lease that fails there
/// leaves the ack committed alone.
mod ack_then_reserve {
    use super::*;
    use crate::config::Config;
    use crate::queue::clock::ManualClock;
    use crate::queue::limits::Limits;
    use crate::queue::model::EnqueueInput;
    use crate::queue::{Queue, ReserveInput};
    use tokio_util::sync::CancellationToken;

    fn one(queue: &str) -> ReserveInput {
        ReserveInput {
            queues: vec![queue.into()],
            wait_timeout_ms: None,
            lease_ms: Some(30_000),
            worker_id: None,
            max_jobs: Some(1),
        }
    }

    /// Jobs "a" and "b" in queue "q", "a" leased, and a second connection to the database.
    struct Rig {
        db: TestDatabase,
        store: Arc<dyn Store>,
        queue: Queue,
        a: crate::domain::Job,
        admin: tokio_postgres::Client,
    }

    impl Rig {
        async fn new() -> Rig {
            let db = TestDatabase::create().await;
            let store: Arc<dyn Store> =
                Arc::new(PostgresStore::open(options(db.url())).await.unwrap());
            let queue = Queue::new(
                store.clone(),
                Arc::new(Limits::from_config(&Config::default()).unwrap()),
                Arc::new(ManualClock::new(1_000_000)),
                CancellationToken::new(),
            );
            let input = |job_type: &str| EnqueueInput {
                queue: "q".into(),
                job_type: job_type.into(),
                ..Default::default()
            };
            queue
                .enqueue_batch(vec![input("a"), input("b")])
                .await
                .unwrap();
            let a = queue.reserve(one("q")).await.unwrap().remove(0);
            assert_eq!(a.job_type, "a");
            let (admin, conn) = tokio_postgres::connect(db.url(), tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            Rig {
                db,
                store,
                queue,
                a,
                admin,
            }
        }
    }

    #[tokio::test]
    async fn a_lease_that_fails_after_the_ack_leaves_the_ack_committed_alone() {
        // `_db` keeps the database until the test ends.
        let Rig {
            db: _db,
            store,
            queue,
            a,
            admin,
        } = Rig::new().await;

        // Every lease of a ready job now fails inside the database.
        admin
            .batch_execute(
                "CREATE FUNCTION refuse_lease() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'lease refused by the test'; END $$; \
                 CREATE TRIGGER refuse_lease BEFORE UPDATE ON sepp_jobs FOR EACH ROW \
                 WHEN (OLD.stage = 0 AND NEW.stage = 2) EXECUTE FUNCTION refuse_lease();",
            )
            .await
            .unwrap();
        let next = queue
            .ack_then_reserve(&a.id.to_string(), a.attempt, one("q"))
            .await
            .unwrap();
        assert!(next.is_none(), "the failed lease brought {next:?}");
        admin
            .batch_execute("DROP TRIGGER refuse_lease ON sepp_jobs")
            .await
            .unwrap();

        // The ack took: a second ack of the same attempt finds the job gone.
        assert!(
            queue.ack(&a.id.to_string(), a.attempt).await.is_err(),
            "the ack was rolled back with the lease"
        );
        assert_eq!(queue.queue_stats("q").await.unwrap().in_flight, 0);
        // The job the lease tried to take is still ready, on its first attempt.
        let b = queue.reserve(one("q")).await.unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!((b[0].job_type.as_str(), b[0].attempt), ("b", 1));
        store.close().await.unwrap();
    }

    #[tokio::test]
    async fn the_ack_and_its_lease_commit_in_one_transaction() {
        // `_db` keeps the database until the test ends.
        let Rig {
            db: _db,
            store,
            queue,
            a,
            admin,
        } = Rig::new().await;
        // Each transaction that changes sepp_jobs counts itself (txid_current() is that
        // transaction's id: one row per transaction, however many rows it changed).
        admin
            .batch_execute(
                "CREATE TABLE test_txs (tx bigint PRIMARY KEY); \
                 CREATE FUNCTION count_tx() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN INSERT INTO test_txs VALUES (txid_current()) ON CONFLICT DO NOTHING; \
                 RETURN NULL; END $$; \
                 CREATE TRIGGER count_tx AFTER UPDATE OR DELETE ON sepp_jobs \
                 FOR EACH STATEMENT EXECUTE FUNCTION count_tx();",
            )
            .await
            .unwrap();
        let next = queue
            .ack_then_reserve(&a.id.to_string(), a.attempt, one("q"))
            .await
            .unwrap()
            .expect("the ack brought a job");
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].job_type, "b");
        let txs: i64 = admin
            .query_one("SELECT count(*) FROM test_txs", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(txs, 1, "the ack and the lease took {txs} transactions");
        store.close().await.unwrap();
    }
}
