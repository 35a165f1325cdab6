//! The Rust Worker (and the engine under it) against a real in-process server.

use sepp_rs::admin::JobState;
use sepp_rs::{EnqueueRequest, HandlerError, ReserveOptions, SeppClient, Worker};
use sepp_server::testing::TestServer;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

async fn setup() -> (TestServer, SeppClient) {
    let server = TestServer::start(|c| c.storage.dead_letter_retention_ms = 60_000).await;
    let client = SeppClient::connect(server.url()).await.expect("connect");
    (server, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_jobs_at_concurrency_32_are_each_processed_once() {
    let (_server, c) = setup().await;
    const N: usize = 10_000;
    for chunk in 0..N / 250 {
        let batch = (0..250)
            .map(|i| {
                EnqueueRequest::new("bulk", "work")
                    .unwrap()
                    .with_custom_entry("n", (chunk * 250 + i) as i64)
            })
            .collect();
        for r in c.enqueue_batch(batch).await.unwrap() {
            r.unwrap();
        }
    }
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let done = Arc::new(Notify::new());
    let worker = {
        let (seen, done) = (seen.clone(), done.clone());
        Worker::builder(c.clone(), ["bulk"])
            .max_in_flight(32)
            .wait_timeout(Duration::from_millis(200))
            .handle("work", move |ctx| {
                let (seen, done) = (seen.clone(), done.clone());
                async move {
                    let mut s = seen.lock().unwrap();
                    *s.entry(ctx.job().id.clone()).or_default() += 1;
                    if s.len() == N {
                        done.notify_one();
                    }
                    Ok(())
                }
            })
            .build()
    };
    let report = tokio::time::timeout(
        Duration::from_secs(120),
        worker.run_until(async move { done.notified().await }),
    )
    .await
    .expect("finished in time")
    .unwrap();
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), N);
        assert!(seen.values().all(|n| *n == 1), "a job ran twice");
    }
    assert!(report.succeeded as usize >= N - 32, "{report:?}");
    let stats = c.get_queue_stats("bulk").await.unwrap();
    assert_eq!((stats.ready, stats.in_flight), (0, 0));
}

#[tokio::test]
async fn auto_extend_keeps_a_slow_handlers_lease() {
    let (_server, c) = setup().await;
    let ack = c
        .enqueue(EnqueueRequest::new("slow", "t").unwrap())
        .await
        .unwrap();
    let finished = Arc::new(Notify::new());
    let worker = {
        let finished = finished.clone();
        Worker::builder(c.clone(), ["slow"])
            .lease_duration(Duration::from_millis(600))
            .handle("t", move |_ctx| {
                let finished = finished.clone();
                async move {
                    tokio::time::sleep(Duration::from_millis(2_000)).await;
                    finished.notify_one();
                    Ok(())
                }
            })
            .build()
    };
    let run = tokio::spawn(worker.run_until({
        let finished = finished.clone();
        async move { finished.notified().await }
    }));
    // While the handler runs (3 lease lengths), nobody else can reserve the job.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let got = c
            .reserve(ReserveOptions::new(["slow"], Duration::from_secs(5)))
            .await
            .unwrap();
        assert!(got.is_empty(), "the lease ran out under a running handler");
    }
    let report = run.await.unwrap().unwrap();
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert_eq!(
        c.get_job(&ack.job_id).await.unwrap().state,
        JobState::Unknown
    );
}

#[tokio::test]
async fn shutdown_lets_in_flight_handlers_finish() {
    let (_server, c) = setup().await;
    c.enqueue(EnqueueRequest::new("q", "t").unwrap())
        .await
        .unwrap();
    let started = Arc::new(Notify::new());
    let worker = {
        let started = started.clone();
        Worker::builder(c.clone(), ["q"])
            .handle("t", move |_ctx| {
                let started = started.clone();
                async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    Ok(())
                }
            })
            .build()
    };
    let report = worker
        .run_until(async move { started.notified().await })
        .await
        .unwrap();
    assert_eq!(report.succeeded, 1, "{report:?}");
    assert_eq!(report.abandoned, 0);
}

#[tokio::test]
async fn handlers_past_the_shutdown_timeout_are_cancelled_and_their_jobs_nacked() {
    let (_server, c) = setup().await;
    let ack = c
        .enqueue(EnqueueRequest::new("q", "t").unwrap().with_max_attempts(3))
        .await
        .unwrap();
    let started = Arc::new(Notify::new());
    let worker = {
        let started = started.clone();
        Worker::builder(c.clone(), ["q"])
            .shutdown_timeout(Duration::from_millis(200))
            .handle("t", move |_ctx| {
                let started = started.clone();
                async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    Ok(())
                }
            })
            .build()
    };
    let report = worker
        .run_until(async move { started.notified().await })
        .await
        .unwrap();
    assert_eq!(report.abandoned, 1, "{report:?}");
    let info = c.get_job(&ack.job_id).await.unwrap();
    assert_eq!(info.state, JobState::Ready);
    assert!(info.last_reason.unwrap().contains("shut down"));
}

#[tokio::test]
async fn a_panicking_handler_does_not_stop_the_worker_and_errors_map_to_nacks() {
    let (_server, c) = setup().await;
    let panicky = c
        .enqueue(
            EnqueueRequest::new("q", "panics")
                .unwrap()
                .with_max_attempts(5),
        )
        .await
        .unwrap();
    let permanent = c
        .enqueue(EnqueueRequest::new("q", "bad").unwrap())
        .await
        .unwrap();
    let unknown = c
        .enqueue(EnqueueRequest::new("q", "nobody").unwrap())
        .await
        .unwrap();
    let fine = c
        .enqueue(EnqueueRequest::new("q", "ok").unwrap())
        .await
        .unwrap();
    let ok_runs = Arc::new(AtomicUsize::new(0));
    let panics_seen = Arc::new(AtomicUsize::new(0));
    let worker = {
        let ok_runs = ok_runs.clone();
        let panics_seen = panics_seen.clone();
        Worker::builder(c.clone(), ["q"])
            .wait_timeout(Duration::from_millis(100))
            .handle("panics", move |ctx| {
                let panics_seen = panics_seen.clone();
                async move {
                    if ctx.attempt() == 1 {
                        panics_seen.fetch_add(1, Ordering::SeqCst);
                        panic!("kaboom");
                    }
                    Ok(())
                }
            })
            .handle("bad", |_ctx| async {
                Err(HandlerError::permanent().with_reason("malformed"))
            })
            .handle("ok", move |_ctx| {
                let ok_runs = ok_runs.clone();
                async move {
                    ok_runs.fetch_add(1, Ordering::SeqCst);
                    Ok(())
                }
            })
            .build()
    };
    let report = worker
        .run_until(tokio::time::sleep(Duration::from_millis(1_500)))
        .await
        .unwrap();
    assert_eq!(panics_seen.load(Ordering::SeqCst), 1);
    assert_eq!(ok_runs.load(Ordering::SeqCst), 1);
    // The panicked job was retried and then succeeded.
    assert_eq!(
        c.get_job(&panicky.job_id).await.unwrap().state,
        JobState::Unknown
    );
    let bad = c.get_job(&permanent.job_id).await.unwrap();
    assert_eq!(bad.state, JobState::DeadLettered);
    assert_eq!(bad.last_reason.as_deref(), Some("malformed"));
    let nobody = c.get_job(&unknown.job_id).await.unwrap();
    assert!(
        nobody.last_reason.unwrap().contains("no handler"),
        "missing handler reason"
    );
    assert_eq!(
        c.get_job(&fine.job_id).await.unwrap().state,
        JobState::Unknown
    );
    assert!(report.failed >= 3, "{report:?}");
}

#[tokio::test]
async fn retry_after_delays_the_next_attempt() {
    let (_server, c) = setup().await;
    let ack = c
        .enqueue(EnqueueRequest::new("q", "t").unwrap())
        .await
        .unwrap();
    let worker = Worker::builder(c.clone(), ["q"])
        .handle("t", |_ctx| async {
            Err(HandlerError::retry_after(Duration::from_secs(60)))
        })
        .build();
    worker
        .run_until(tokio::time::sleep(Duration::from_millis(500)))
        .await
        .unwrap();
    let info = c.get_job(&ack.job_id).await.unwrap();
    assert_eq!(info.state, JobState::Scheduled);
    assert_eq!(info.attempt, 1);
}

#[tokio::test]
async fn a_worker_whose_server_is_down_backs_off_instead_of_spinning() {
    // A port that accepts connections and drops them at once: every reserve fails.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    {
        let accepted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                drop(sock);
            }
        });
    }
    let c = SeppClient::builder(format!("http://{addr}"))
        .connect_lazy()
        .unwrap();
    let worker = Worker::builder(c, ["q"])
        .handle("t", |_ctx| async { Ok(()) })
        .build();
    let report = tokio::time::timeout(
        Duration::from_secs(5),
        worker.run_until(tokio::time::sleep(Duration::from_millis(1_500))),
    )
    .await
    .expect("shut down promptly")
    .unwrap();
    assert_eq!(report, sepp_rs::worker::WorkerReport::default());
    // Backoff 0.1, 0.2, 0.4, 0.8 s...: a handful of attempts in 1.5 s, not hundreds.
    let n = accepted.load(Ordering::SeqCst);
    assert!((1..=12).contains(&n), "{n} connection attempts in 1.5 s");
}

#[tokio::test]
async fn without_auto_extend_a_lease_that_runs_out_is_reported_lost() {
    use sepp_rs::engine::{Engine, EngineOptions, Outcome};
    let (_server, c) = setup().await;
    c.enqueue(EnqueueRequest::new("short", "t").unwrap())
        .await
        .unwrap();
    c.enqueue(EnqueueRequest::new("short", "t").unwrap())
        .await
        .unwrap();
    let mut opts = EngineOptions::new(["short"]);
    opts.lease_duration = Duration::from_millis(300);
    opts.auto_extend = false;
    opts.max_in_flight = 2;
    let engine = Engine::start(c.clone(), opts).unwrap();
    let a = engine.next().await.unwrap();
    let b = engine.next().await.unwrap();
    // One is completed in time: its lease ends without being lost.
    engine
        .complete(&a.job.id, a.job.attempt, Outcome::Success)
        .await
        .unwrap();
    assert!(
        !tokio::time::timeout(Duration::from_secs(1), a.ended())
            .await
            .unwrap()
    );
    // The other runs out.
    assert!(
        tokio::time::timeout(Duration::from_secs(2), b.ended())
            .await
            .unwrap()
    );
    assert!(b.is_lost());
    engine.shutdown();
}

#[tokio::test]
async fn a_job_redelivered_to_the_same_engine_is_held_once_per_attempt() {
    use sepp_rs::engine::{Engine, EngineOptions, Outcome};
    let (_server, c) = setup().await;
    c.enqueue(
        EnqueueRequest::new("again", "t")
            .unwrap()
            .with_max_attempts(5),
    )
    .await
    .unwrap();
    let mut opts = EngineOptions::new(["again"]);
    opts.lease_duration = Duration::from_millis(300);
    opts.auto_extend = false;
    opts.max_in_flight = 2;
    opts.wait_timeout = Duration::from_millis(200);
    let engine = Engine::start(c.clone(), opts).unwrap();
    let first = engine.next().await.unwrap();
    // Its lease runs out; the job comes back to this engine as attempt 2.
    let second = tokio::time::timeout(Duration::from_secs(5), engine.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.job.id, first.job.id);
    assert_eq!((first.job.attempt, second.job.attempt), (1, 2));
    assert_eq!(engine.in_flight(), 2);
    // The stale delivery's result is refused and frees only its own slot.
    let stale = engine
        .complete(&first.job.id, 1, Outcome::Success)
        .await
        .unwrap_err();
    assert!(stale.is_lease_lost());
    assert_eq!(engine.in_flight(), 1);
    engine
        .complete(&second.job.id, 2, Outcome::Success)
        .await
        .unwrap();
    assert_eq!(engine.in_flight(), 0);
    engine.shutdown();
}
