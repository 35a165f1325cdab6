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

/// Tests of the group commit: several enqueues in one flush.
mod flush {
    use super::*;
    use crate::domain::{DedupClaim, EnqueuePlan, JobState, Payload, Replacement};
    use crate::queue::enqueue::{decide, prepass};
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
            decide(jobs, &prepass(jobs), facts, atomic, NOW)
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
