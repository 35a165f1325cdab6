//! Several sepp servers on one PostgreSQL database (always PostgreSQL, whatever
//! `SEPP_TEST_BACKEND` says: the database of `SEPP_TEST_POSTGRES_URL`, default the one on
//! 127.0.0.1:5432, a fresh one per test).

mod common;

use common::{Clients, TestServer};
use sepp_rs::{EnqueueRequest, ReserveOptions};
use sepp_server::config::{Config, PostgresUrl, StorageBackend};
use sepp_server::testing::postgres::TestDatabase;
use std::time::{Duration, Instant};

fn on(db: &TestDatabase, poll_ms: u64) -> impl FnOnce(&mut Config) + use<> {
    let url = db.url().to_string();
    move |c: &mut Config| {
        c.storage.backend = StorageBackend::Postgres;
        c.storage.postgres_url = Some(PostgresUrl::new(url));
        c.storage.postgres_poll_interval_ms = poll_ms;
    }
}

#[tokio::test]
async fn a_long_poll_on_one_server_wakes_on_an_enqueue_on_another() {
    let db = TestDatabase::create().await;
    // The fallback poll is a minute: only the NOTIFY can wake the waiter within the 5 s.
    let a = TestServer::start(on(&db, 60_000)).await;
    let b = TestServer::start(on(&db, 60_000)).await;
    let (ca, cb) = (a.client().await, b.client().await);
    let waiting = tokio::spawn(async move {
        ca.reserve(
            ReserveOptions::new(["q"], Duration::from_secs(30))
                .with_wait_timeout(Duration::from_secs(30)),
        )
        .await
    });
    a.reserves_waiting(1).await;
    let sent = Instant::now();
    let ack = cb
        .enqueue(EnqueueRequest::new("q", "t").unwrap())
        .await
        .unwrap();
    let jobs = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the Reserve on server A woke within 5 s")
        .unwrap()
        .unwrap();
    eprintln!("wake-up across servers took {:?}", sent.elapsed());
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].id, ack.job_id);
}

#[tokio::test]
async fn concurrent_enqueues_of_one_key_on_three_servers_make_one_job() {
    let db = TestDatabase::create().await;
    let servers = [
        TestServer::start(on(&db, 1000)).await,
        TestServer::start(on(&db, 1000)).await,
        TestServer::start(on(&db, 1000)).await,
    ];
    let mut clients = Vec::new();
    for s in &servers {
        clients.push(s.client().await);
    }
    let mut tasks = Vec::new();
    for i in 0..64 {
        let c = clients[i % 3].clone();
        tasks.push(tokio::spawn(async move {
            c.enqueue(
                EnqueueRequest::new("q", "t")
                    .unwrap()
                    .with_idempotency_key("K"),
            )
            .await
            .unwrap()
        }));
    }
    let mut acks = Vec::new();
    for t in tasks {
        acks.push(t.await.unwrap());
    }
    let created: Vec<_> = acks.iter().filter(|a| !a.deduplicated).collect();
    assert_eq!(created.len(), 1, "exactly one enqueue created the job");
    assert!(acks.iter().all(|a| a.job_id == created[0].job_id));
    let mut admin = servers[1].admin().await;
    let stats = admin
        .get_queue_stats(sepp_proto::admin::v1::GetQueueStatsRequest { queue: "q".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stats.ready, 1);
}
