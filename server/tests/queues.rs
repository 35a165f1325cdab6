//! The number of queues over real gRPC: `limits.max_queues` refuses a job that would create a
//! queue past it (unary, batch and atomic enqueues), and `DeleteQueue` removes an empty queue,
//! freeing its place, and refuses one that holds jobs, naming the counts.

mod common;

use common::{Clients, TestServer};
use sepp_proto::admin::v1 as apb;
use sepp_proto::v1 as pb;
use sepp_proto::v1::job_rejection::Reason;
use sepp_rs::{EnqueueError, EnqueueRequest, ErrorCode, ReserveOptions, SeppClient};
use sepp_server::config::{ApiKey, QueueConfig, Role};
use std::time::Duration;
use tonic::Code;

fn raw_job(queue: &str) -> pb::EnqueueRequest {
    pb::EnqueueRequest {
        queue: queue.into(),
        job_type: "t".into(),
        ..Default::default()
    }
}

async fn drain(c: &SeppClient, queue: &str) {
    let jobs = c
        .reserve(ReserveOptions::new([queue], Duration::from_secs(30)).with_max_jobs(100))
        .await
        .unwrap();
    for j in jobs {
        c.ack(&j.id, j.attempt).await.unwrap();
    }
}

fn too_many(reason: Option<Reason>, queue: &str) {
    match reason {
        Some(Reason::TooManyQueues(x)) => {
            assert_eq!((x.queue.as_str(), x.limit), (queue, 3));
        }
        other => panic!("expected too_many_queues for {queue}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_job_that_would_create_a_queue_past_max_queues_is_rejected_in_every_enqueue() {
    let server = TestServer::start(|c| {
        c.limits.max_queues = 3;
        c.queues.push(QueueConfig {
            name: "declared".into(),
            ..Default::default()
        });
    })
    .await;
    let c = server.client().await;
    let mut admin = server.admin().await;
    c.enqueue(EnqueueRequest::new("a", "t").unwrap())
        .await
        .unwrap();
    c.enqueue(EnqueueRequest::new("b", "t").unwrap())
        .await
        .unwrap();
    // The declared queue exists from the start: "a", "b" and it fill the cap.
    let names: Vec<String> = admin
        .list_queues(apb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .queues
        .into_iter()
        .map(|q| q.queue)
        .collect();
    assert_eq!(names, ["a", "b", "declared"]);

    // Unary, through the Rust client: the rejection names the queue and the limit.
    match c.enqueue(EnqueueRequest::new("c", "t").unwrap()).await {
        Err(EnqueueError::Rejected(r)) => {
            assert_eq!(r.code(), ErrorCode::TooManyQueues);
            assert!(!r.is_transient());
            let msg = r.to_string();
            assert!(
                msg.contains("limits.max_queues") && msg.contains('3') && msg.contains("\"c\""),
                "{msg}"
            );
        }
        other => panic!("expected TooManyQueues, got {other:?}"),
    }

    // Best effort: the existing queue takes its job, the new one is refused.
    let mut raw = server.raw().await;
    let results = raw
        .enqueue_batch(pb::EnqueueBatchRequest {
            jobs: vec![raw_job("a"), raw_job("c"), raw_job("declared")],
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    let reasons: Vec<Option<Reason>> = results
        .into_iter()
        .map(|r| match r.outcome.expect("outcome") {
            pb::job_result::Outcome::Success(_) => None,
            pb::job_result::Outcome::Rejection(rej) => rej.reason,
        })
        .collect();
    assert!(reasons[0].is_none(), "an existing queue keeps working");
    too_many(reasons[1].clone(), "c");
    assert!(reasons[2].is_none(), "a declared queue is never refused");

    // Atomic: nothing is written.
    let r = raw
        .enqueue_atomic(pb::EnqueueBatchRequest {
            jobs: vec![raw_job("b"), raw_job("c")],
        })
        .await
        .unwrap()
        .into_inner();
    match r.outcome {
        Some(pb::enqueue_atomic_response::Outcome::Rejection(f)) => {
            assert_eq!(f.errors.len(), 1);
            assert_eq!(f.errors[0].index, 1);
            too_many(f.errors[0].rejection.clone().and_then(|r| r.reason), "c");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    let b = admin
        .get_queue_stats(apb::GetQueueStatsRequest { queue: "b".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(b.ready, 1, "the refused atomic batch wrote nothing");

    // Deleting an emptied queue frees its place.
    drain(&c, "b").await;
    admin
        .delete_queue(apb::DeleteQueueRequest { queue: "b".into() })
        .await
        .unwrap();
    c.enqueue(EnqueueRequest::new("c", "t").unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn delete_queue_removes_an_empty_queue_and_refuses_one_with_jobs_naming_the_counts() {
    let server = TestServer::start(|c| {
        c.auth.api_keys = Some(vec![
            ApiKey::new("ops", "ops-key"),
            ApiKey {
                roles: vec![Role::Producer, Role::Worker],
                ..ApiKey::new("app", "app-key")
            },
        ]);
    })
    .await;
    let c = SeppClient::builder(server.url())
        .api_key("ops-key")
        .connect()
        .await
        .unwrap();
    let admin_as = |key: &'static str| {
        let url = server.url();
        async move {
            let channel = tonic::transport::Endpoint::from_shared(url)
                .unwrap()
                .connect()
                .await
                .unwrap();
            let bearer: tonic::metadata::MetadataValue<_> =
                format!("Bearer {key}").parse().unwrap();
            apb::admin_service_client::AdminServiceClient::with_interceptor(
                channel,
                move |mut req: tonic::Request<()>| {
                    req.metadata_mut().insert("authorization", bearer.clone());
                    Ok(req)
                },
            )
        }
    };
    let mut admin = admin_as("ops-key").await;
    let delete = |q: &str| apb::DeleteQueueRequest { queue: q.into() };

    let first = c
        .enqueue(
            EnqueueRequest::new("mail", "send")
                .unwrap()
                .with_idempotency_key("order-1"),
        )
        .await
        .unwrap();
    let j = common::enqueue_and_lease(&c, "mail").await;
    let e = admin.delete_queue(delete("mail")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("holds 1 ready, 0 scheduled, 1 in-flight and 0 dead-lettered jobs"),
        "{}",
        e.message()
    );

    // Only the admin role may delete.
    let mut app = admin_as("app-key").await;
    let e = app.delete_queue(delete("mail")).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("admin"), "{}", e.message());

    c.ack(&j.id, j.attempt).await.unwrap();
    drain(&c, "mail").await;
    admin
        .pause_queue(apb::PauseQueueRequest {
            queue: "mail".into(),
        })
        .await
        .unwrap();
    let done = admin
        .delete_queue(delete("mail"))
        .await
        .unwrap()
        .into_inner();
    assert!(done.was_paused);
    assert_eq!(done.dedup_records, 1, "the key's record outlives the queue");
    let listed = admin
        .list_queues(apb::ListQueuesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.queues.is_empty(), "{listed:?}");
    let e = admin.delete_queue(delete("mail")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("does not exist"), "{}", e.message());

    // The producer's retry still answers the job its key created.
    let again = c
        .enqueue(
            EnqueueRequest::new("mail", "send")
                .unwrap()
                .with_idempotency_key("order-1"),
        )
        .await
        .unwrap();
    assert!(again.deduplicated);
    assert_eq!(again.job_id, first.job_id);
    // A new job creates the queue again, unpaused.
    c.enqueue(EnqueueRequest::new("mail", "send").unwrap())
        .await
        .unwrap();
    let stats = admin
        .get_queue_stats(apb::GetQueueStatsRequest {
            queue: "mail".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((stats.ready, stats.paused), (1, false));
}

#[tokio::test]
async fn get_queue_rates_reports_each_minute_of_the_last_hour() {
    use sepp_server::queue::clock::ManualClock;
    // A minute boundary, so that the counts land where the test says.
    let t0 = 1_767_225_600_000; // 2026-01-01T00:00:00Z
    let clock = std::sync::Arc::new(ManualClock::new(t0));
    let server = TestServer::start_with_clock(clock.clone(), |_| {}).await;
    let c = server.client().await;
    let mut admin = server.admin().await;
    for _ in 0..2 {
        c.enqueue(EnqueueRequest::new("q", "t").unwrap())
            .await
            .unwrap();
    }
    let j = c
        .reserve(ReserveOptions::new(["q"], Duration::from_secs(30)))
        .await
        .unwrap()
        .remove(0);
    c.ack(&j.id, j.attempt).await.unwrap();
    clock.advance(60_000);
    c.enqueue(EnqueueRequest::new("other", "t").unwrap())
        .await
        .unwrap();

    let r = admin
        .get_queue_rates(apb::GetQueueRatesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = r.first_minute.expect("first_minute");
    assert_eq!(first.seconds * 1000, t0 + 60_000 - 59 * 60_000);
    let names: Vec<&str> = r.queues.iter().map(|q| q.queue.as_str()).collect();
    assert_eq!(names, ["other", "q"]);
    let q = &r.queues[1];
    assert_eq!(q.enqueued.len(), 60);
    assert_eq!((q.enqueued[58], q.acked[58], q.nacked[58]), (2, 1, 0));
    assert_eq!(q.dead_lettered.iter().sum::<u64>(), 0);
    assert_eq!(q.enqueued[59], 0);
    assert_eq!(r.queues[0].enqueued[59], 1);

    let one = admin
        .get_queue_rates(apb::GetQueueRatesRequest {
            queue: Some("q".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(one.queues.len(), 1);
    let e = admin
        .get_queue_rates(apb::GetQueueRatesRequest {
            queue: Some(String::new()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

/// `sepp queues` shows the last complete minute's dead-letterings next to the dead letters
/// kept; when a queue dead-lettered jobs and keeps none (the default retention deletes them at
/// once), it says so on stderr rather than leave the table to read like a lost job; with no
/// queue at all it says what creates one.
#[tokio::test]
async fn sepp_queues_says_where_the_dead_letters_of_the_last_minute_went() {
    use sepp_rs::NackRetry;
    use sepp_server::queue::clock::ManualClock;
    let t0 = 1_767_225_600_000; // 2026-01-01T00:00:00Z, a minute boundary
    let clock = std::sync::Arc::new(ManualClock::new(t0));
    let server = TestServer::start_with_clock(clock.clone(), |_| {}).await;
    let c = server.client().await;
    // The CLI runs on a blocking thread: the server answers it from this test's runtime.
    let cli_at = |url: String, args: &'static [&'static str]| {
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new(common::sepp_bin())
                .args(args)
                .env("SEPP_SERVER", url)
                .env_remove("SEPP_API_KEY")
                .env_remove("SEPP_CONFIG")
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            (
                String::from_utf8(out.stdout).unwrap(),
                String::from_utf8(out.stderr).unwrap(),
            )
        })
    };
    let cli = |args: &'static [&'static str]| cli_at(server.url(), args);
    let queues = || cli(&["queues"]);
    // No queue yet: the header alone, and a line on stderr that says what makes one.
    let (table, err) = queues().await.unwrap();
    assert_eq!(table.lines().count(), 1, "{table}");
    assert!(
        err.starts_with("sepp: no queues yet: a queue exists from its first enqueued job"),
        "{err}"
    );
    let j = common::enqueue_and_lease(&c, "mail").await;
    c.nack(&j.id, j.attempt, NackRetry::DeadLetter, Some("bad".into()))
        .await
        .unwrap();
    // The minute is not complete yet: nothing to explain.
    let (table, err) = queues().await.unwrap();
    assert!(err.is_empty(), "{err}");
    let cells = |table: &str| -> Vec<String> {
        let row = table.lines().find(|l| l.starts_with("mail")).unwrap();
        row.split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(
        (cells(&table)[4].as_str(), cells(&table)[9].as_str()),
        ("0", "0")
    );

    clock.advance(60_000);
    let (table, err) = queues().await.unwrap();
    // DEAD 0, DLQ/MIN 1.
    assert_eq!(
        (cells(&table)[4].as_str(), cells(&table)[9].as_str()),
        ("0", "1")
    );
    assert!(
        err.contains(
            "queue mail dead-lettered jobs in the last minute and keeps none: this server \
             deletes a dead letter at once (storage.dead_letter_retention_ms = 0, the default"
        ),
        "{err}"
    );
    // `sepp dlq list` finds nothing under that default and says why, having asked the server.
    let (table, err) = cli(&["dlq", "list"]).await.unwrap();
    assert_eq!(table.lines().count(), 1);
    assert!(
        err.starts_with(
            "sepp: no dead letters: this server deletes a dead-lettered job at once \
             (storage.dead_letter_retention_ms = 0, the default"
        ),
        "{err}"
    );
    // `--server host:port` is taken as the clients take it, as http://host:port.
    let bare = server.url().strip_prefix("http://").unwrap().to_string();
    let (table, _) = cli_at(bare, &["queues"]).await.unwrap();
    assert_eq!(cells(&table)[0], "mail");
    // A server that keeps dead letters does not blame the retention.
    let keeping = TestServer::start(|c| c.storage.dead_letter_retention_ms = 60_000).await;
    let (table, err) = cli_at(keeping.url(), &["dlq", "list"]).await.unwrap();
    assert_eq!(table.lines().count(), 1);
    assert_eq!(
        err.trim_end(),
        "sepp: no dead letters: none are kept now: none failed for good, or they were \
         requeued, deleted or expired since"
    );
}
