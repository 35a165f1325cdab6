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
