//! The Rust Worker (and the engine under it) against a real in-process server. Tests wait for
//! conditions (a handler's signal, a job's state polled with a deadline), never for fixed
//! times.

mod common;

use sepp_rs::admin::{JobInfo, JobState};
use sepp_rs::job::DeadLetterCause;
use sepp_rs::worker::WorkerBuilder;
use sepp_rs::{EnqueueRequest, HandlerError, ReserveOptions, SeppClient, Worker};
use sepp_server::testing::TestServer;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Notify;

async fn setup() -> (TestServer, SeppClient) {
    let server = TestServer::start(|c| {
        c.storage.dead_letter_retention_ms = 60_000;
        // Expired leases are noticed within ~50 ms.
        c.storage.sweep_interval_ms = 50;
    })
    .await;
    let client = SeppClient::connect(server.url()).await.expect("connect");
    (server, client)
}

/// Polls the job until `done` holds (the server pushes no such events), failing after 20 s.
async fn job_when(c: &SeppClient, job_id: &str, done: impl Fn(&JobInfo) -> bool) -> JobInfo {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = c.get_job(job_id).await.unwrap();
        if done(&info) {
            return info;
        }
        assert!(Instant::now() < deadline, "job never got there: {info:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn gone(info: &JobInfo) -> bool {
    matches!(info.state, JobState::Unknown | JobState::Acked)
}

/// Runs of each job id a worker's handler saw.
type Seen = Arc<Mutex<HashMap<String, u32>>>;

/// `builder`'s worker with a handler for `job_type` that counts the runs of each job and
/// notifies the returned `Notify` once `n` distinct jobs ran.
fn counting_worker(
    builder: WorkerBuilder,
    job_type: &str,
    n: usize,
) -> (Worker, Seen, Arc<Notify>) {
    let seen: Seen = Arc::default();
    let done = Arc::new(Notify::new());
    let worker = {
        let (seen, done) = (seen.clone(), done.clone());
        builder
            .handle(job_type, move |ctx| {
                let (seen, done) = (seen.clone(), done.clone());
                async move {
                    let mut s = seen.lock().unwrap();
                    *s.entry(ctx.job().id.clone()).or_default() += 1;
                    if s.len() == n {
                        done.notify_one();
                    }
                    Ok(())
                }
            })
            .build()
    };
    (worker, seen, done)
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
    let (worker, seen, done) = counting_worker(
        Worker::builder(c.clone(), ["bulk"])
            .max_in_flight(32)
            .wait_timeout(Duration::from_millis(200)),
        "work",
        N,
    );
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
    // The drain lets the last handlers' settlements finish: every job is counted.
    assert_eq!(report.acked as usize, N, "{report:?}");
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
    let lease = Duration::from_millis(600);
    let worker = {
        let (finished, c) = (finished.clone(), c.clone());
        Worker::builder(c.clone(), ["slow"])
            .lease_duration(lease)
            .handle("t", move |ctx| {
                let (finished, c) = (finished.clone(), c.clone());
                async move {
                    // Runs until its lease was extended past three lease lengths from the
                    // first expiry, then checks that nobody else can reserve the job.
                    let first = ctx.lease_expires_at().unwrap();
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while ctx.lease_expires_at().unwrap() < first + lease * 3 {
                        assert!(Instant::now() < deadline, "the lease was not extended");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let got = c
                        .reserve(ReserveOptions::new(["slow"], Duration::from_secs(5)))
                        .await
                        .unwrap();
                    assert!(got.is_empty(), "the lease ran out under a running handler");
                    finished.notify_one();
                    Ok(())
                }
            })
            .build()
    };
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        worker.run_until(async move { finished.notified().await }),
    )
    .await
    .expect("finished in time")
    .unwrap();
    assert_eq!(report.acked, 1, "{report:?}");
    assert_eq!(report.lease_lost, 0, "{report:?}");
    assert!(gone(&c.get_job(&ack.job_id).await.unwrap()));
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
    assert_eq!(report.acked, 1, "{report:?}");
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
    assert_eq!(
        info.last_reason.as_deref(),
        Some("worker shut down before the job finished")
    );
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
    let settled = {
        let c = c.clone();
        let ids = [&panicky, &permanent, &unknown, &fine].map(|a| a.job_id.clone());
        async move {
            job_when(&c, &ids[0], gone).await;
            job_when(&c, &ids[1], |i| i.state == JobState::DeadLettered).await;
            job_when(&c, &ids[2], |i| i.last_reason.is_some()).await;
            job_when(&c, &ids[3], gone).await;
        }
    };
    let report = worker.run_until(settled).await.unwrap();
    assert_eq!(panics_seen.load(Ordering::SeqCst), 1);
    assert_eq!(ok_runs.load(Ordering::SeqCst), 1);
    let bad = c.get_job(&permanent.job_id).await.unwrap();
    assert_eq!(bad.state, JobState::DeadLettered);
    assert_eq!(bad.last_reason.as_deref(), Some("malformed"));
    let nobody = c.get_job(&unknown.job_id).await.unwrap();
    assert_eq!(
        nobody.last_reason.as_deref(),
        Some("no handler for job type \"nobody\"")
    );
    assert!(report.nacked >= 3, "{report:?}");
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
    let scheduled = {
        let (c, id) = (c.clone(), ack.job_id.clone());
        async move {
            job_when(&c, &id, |i| i.state == JobState::Scheduled).await;
        }
    };
    let report = worker.run_until(scheduled).await.unwrap();
    assert_eq!(report.nacked, 1, "{report:?}");
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
    // Runs until the fourth connection attempt. Backing off 0.1, 0.2, 0.4 s between them,
    // that takes at least 0.7 s; a worker that spun would get there in milliseconds.
    let started = Instant::now();
    let fourth = {
        let accepted = accepted.clone();
        async move {
            while accepted.load(Ordering::SeqCst) < 4 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let report = tokio::time::timeout(Duration::from_secs(20), worker.run_until(fourth))
        .await
        .expect("shut down promptly")
        .unwrap();
    assert_eq!(report, sepp_rs::worker::WorkerReport::default());
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(600),
        "4 connection attempts in {took:?}"
    );
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
        .settle(&a.job.id, a.job.attempt, Outcome::Success)
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
    // The first delivery's lease ran out: its slot was freed at once, and its result is
    // refused.
    assert!(first.is_lost());
    assert_eq!(engine.in_flight(), 1);
    let stale = engine
        .settle(&first.job.id, 1, Outcome::Success)
        .await
        .unwrap_err();
    assert!(stale.is_lease_lost());
    assert_eq!(engine.in_flight(), 1);
    engine
        .settle(&second.job.id, 2, Outcome::Success)
        .await
        .unwrap();
    assert_eq!(engine.in_flight(), 0);
    engine.shutdown();
}

/// A client of `server` through a proxy that counts the settlements (acks and nacks) that
/// pass, so a test can show that the worker made none; and the count.
async fn counted_client(server: &TestServer) -> (SeppClient, Arc<AtomicUsize>) {
    let tamper = common::Tamper::default();
    let settlements = tamper.settlements.clone();
    let url = common::proxy(server, tamper).await;
    (SeppClient::connect(url).await.unwrap(), settlements)
}

/// A worker's ack brings the job that takes its slot: one Ack per job and no Reserve between
/// them. Against a server that ignores the request (the public sepp), each ack brings none and
/// the poller reserves as before; every job is processed once either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_acks_bring_its_next_jobs_and_without_the_extension_it_reserves() {
    let (server, c) = setup().await;
    let tamper = common::Tamper::default();
    let url = common::proxy(&server, tamper.clone()).await;
    let through_proxy = SeppClient::connect(url).await.unwrap();
    const N: usize = 20;
    for strip in [false, true] {
        tamper.strip_then_reserve.store(strip, Ordering::SeqCst);
        let reserves_before = tamper.reserves.load(Ordering::SeqCst);
        let settlements_before = tamper.settlements.load(Ordering::SeqCst);
        let batch = (0..N)
            .map(|_| EnqueueRequest::new("next", "t").unwrap())
            .collect();
        for r in c.enqueue_batch(batch).await.unwrap() {
            r.unwrap();
        }
        let (worker, seen, done) = counting_worker(
            Worker::builder(through_proxy.clone(), ["next"])
                .max_in_flight(1)
                .wait_timeout(Duration::from_secs(10)),
            "t",
            N,
        );
        // The drain lets the last handler's ack finish.
        let all_acked = async move { done.notified().await };
        let report = tokio::time::timeout(Duration::from_secs(60), worker.run_until(all_acked))
            .await
            .expect("finished in time")
            .unwrap();
        assert_eq!(report.acked as usize, N, "{report:?}");
        assert!(
            seen.lock().unwrap().values().all(|n| *n == 1),
            "a job ran twice"
        );
        assert_eq!(seen.lock().unwrap().len(), N);
        let reserves = tamper.reserves.load(Ordering::SeqCst) - reserves_before;
        let acks = tamper.settlements.load(Ordering::SeqCst) - settlements_before;
        assert_eq!(acks, N);
        if strip {
            assert!(
                reserves >= N,
                "{reserves} Reserves for {N} jobs without the extension"
            );
        } else {
            // The first job's Reserve; then, should the last ack (which brings none: the queue
            // is empty) land before the stop, the poller's two: one that does not wait (its
            // last answer had a job) and the long-poll after it came back empty.
            assert!(reserves <= 3, "{reserves} Reserves for {N} jobs");
        }
    }
}

/// A lost lease frees the worker's slot without any call: the server's lease expiry decides,
/// so on the last attempt the dead letter says `LEASE_EXPIRED`, not `ATTEMPTS_EXHAUSTED`
/// (a nack would have spent the attempt).
#[tokio::test]
async fn a_lost_lease_frees_its_slot_without_a_call_and_the_server_expiry_decides() {
    let (server, c) = setup().await;
    let (through_proxy, settlements) = counted_client(&server).await;
    let ack = c
        .enqueue(
            EnqueueRequest::new("lost", "t")
                .unwrap()
                .with_max_attempts(1),
        )
        .await
        .unwrap();
    let cancelled = Arc::new(Notify::new());
    let worker = {
        let cancelled = cancelled.clone();
        Worker::builder(through_proxy, ["lost"])
            .lease_duration(Duration::from_millis(500))
            .auto_extend(false)
            .handle("t", move |_ctx| {
                let cancelled = cancelled.clone();
                async move {
                    // Dropped at this await when the lease is lost.
                    struct OnDrop(Arc<Notify>);
                    impl Drop for OnDrop {
                        fn drop(&mut self) {
                            self.0.notify_one();
                        }
                    }
                    let _guard = OnDrop(cancelled);
                    std::future::pending::<()>().await;
                    Ok(())
                }
            })
            .build()
    };
    let dead = {
        let (c, id) = (c.clone(), ack.job_id.clone());
        async move {
            cancelled.notified().await;
            job_when(&c, &id, |i| i.state == JobState::DeadLettered).await;
        }
    };
    let report = worker.run_until(dead).await.unwrap();
    assert_eq!(report.lease_lost, 1, "{report:?}");
    assert_eq!((report.acked, report.nacked, report.abandoned), (0, 0, 0));
    assert_eq!(
        settlements.load(Ordering::SeqCst),
        0,
        "the worker sent a settlement for a lost lease"
    );
    let info = c.get_job(&ack.job_id).await.unwrap();
    assert_eq!(info.dead_letter_cause, Some(DeadLetterCause::LeaseExpired));
    assert_eq!(info.attempt, 1);
}

#[tokio::test]
async fn a_handler_past_handler_timeout_is_cancelled_and_its_job_nacked() {
    let (_server, c) = setup().await;
    let ack = c
        .enqueue(
            EnqueueRequest::new("slowpoke", "t")
                .unwrap()
                .with_max_attempts(1),
        )
        .await
        .unwrap();
    let worker = Worker::builder(c.clone(), ["slowpoke"])
        .handler_timeout(Duration::from_millis(300))
        .handle("t", |_ctx| async {
            std::future::pending::<()>().await;
            Ok(())
        })
        .build();
    let dead = {
        let (c, id) = (c.clone(), ack.job_id.clone());
        async move {
            job_when(&c, &id, |i| i.state == JobState::DeadLettered).await;
        }
    };
    let report = worker.run_until(dead).await.unwrap();
    assert_eq!((report.nacked, report.abandoned), (1, 0), "{report:?}");
    let info = c.get_job(&ack.job_id).await.unwrap();
    assert_eq!(
        info.last_reason.as_deref(),
        Some("the handler ran past handler_timeout (300 ms)")
    );
    assert_eq!(
        info.dead_letter_cause,
        Some(DeadLetterCause::AttemptsExhausted)
    );
}

#[tokio::test]
async fn an_engine_dropped_with_jobs_held_gives_them_back() {
    use sepp_rs::engine::{Engine, EngineOptions, LeaseEnd};
    let (_server, c) = setup().await;
    let ack = c
        .enqueue(EnqueueRequest::new("dropped", "t").unwrap())
        .await
        .unwrap();
    let engine = Engine::start(c.clone(), EngineOptions::new(["dropped"])).unwrap();
    let lease = engine.next().await.unwrap();
    drop(engine);
    assert_eq!(lease.done().await, LeaseEnd::Abandoned);
    let info = job_when(&c, &ack.job_id, |i| i.state == JobState::Ready).await;
    assert_eq!(
        info.last_reason.as_deref(),
        Some("worker shut down before the job finished")
    );
}

#[tokio::test]
async fn the_stop_notice_says_how_many_jobs_are_held_and_how_long_the_stop_may_wait() {
    use sepp_rs::engine::{Engine, EngineOptions, Outcome};
    let (_server, c) = setup().await;
    for _ in 0..2 {
        c.enqueue(EnqueueRequest::new("notice", "t").unwrap())
            .await
            .unwrap();
    }
    let mut opts = EngineOptions::new(["notice"]);
    opts.shutdown_timeout = Duration::from_millis(1500);
    let engine = Engine::start(c.clone(), opts).unwrap();
    assert_eq!(engine.stop_notice(), None, "nothing handed out yet");
    let one_running = "sepp worker stopping: waiting up to 1500 ms (shutdown_timeout) for 1 \
                       running job to finish; if not done by then, it is given back to the \
                       queue (nacked, counting the attempt)";
    let first = engine.next().await.unwrap();
    // The second job came in the same Reserve (one per free slots) and waits to be handed
    // out: held, but no handler runs it, so the notice does not count it.
    while engine.in_flight() < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(engine.running(), 1);
    assert_eq!(engine.stop_notice().as_deref(), Some(one_running));
    let second = engine.next().await.unwrap();
    assert_eq!(
        engine.stop_notice().as_deref(),
        Some(
            "sepp worker stopping: waiting up to 1500 ms (shutdown_timeout) for 2 running jobs \
             to finish; if not done by then, they are given back to the queue (nacked, \
             counting the attempt)"
        )
    );
    // The engine lets go of the job when settle is called, before its call is sent: a stop
    // that begins while the ack is in flight does not count it as running.
    let ack = engine.settle(&first.job.id, first.job.attempt, Outcome::Success);
    assert_eq!(engine.in_flight(), 1);
    assert_eq!(engine.stop_notice().as_deref(), Some(one_running));
    ack.await.unwrap();
    assert_eq!(engine.stop_notice().as_deref(), Some(one_running));
    engine
        .settle(&second.job.id, second.job.attempt, Outcome::Success)
        .await
        .unwrap();
    assert_eq!(engine.stop_notice(), None);
}

/// A server, a relay in front of it that the test can freeze, and an engine through the relay
/// holding the one job of queue `silent`: a short lease (2 s), extended by the engine, and one
/// slot (so that, with the job in hand, its poller is not reserving).
async fn one_job_held_behind_a_relay() -> (
    TestServer,
    common::Relay,
    sepp_rs::engine::Engine,
    sepp_rs::engine::Lease,
) {
    use sepp_rs::engine::{Engine, EngineOptions};
    let (server, _) = setup().await;
    let relay = common::Relay::default();
    let url = relay.start(&server.url()).await;
    let c = SeppClient::connect(url).await.unwrap();
    c.enqueue(EnqueueRequest::new("silent", "t").unwrap())
        .await
        .unwrap();
    let mut opts = EngineOptions::new(["silent"]);
    opts.max_in_flight = 1;
    opts.lease_duration = Duration::from_secs(2);
    opts.wait_timeout = Duration::from_millis(500);
    let engine = Engine::start(c, opts).unwrap();
    let lease = engine.next().await.unwrap();
    (server, relay, engine, lease)
}

/// A connection that stops carrying packets (a partition, a NAT that forgot it) leaves extend
/// calls unanswered; the lease is lost when it runs out, not when the calls give up (three
/// tries of 30 s each), since the server hands the job to another worker at that time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_extensions_go_unanswered_is_lost_when_it_runs_out() {
    use sepp_rs::engine::LeaseEnd;
    let (_server, relay, engine, lease) = one_job_held_behind_a_relay().await;
    let expiry = lease.expires_at().unwrap();
    relay.freeze();
    let end = tokio::time::timeout(Duration::from_secs(15), lease.done())
        .await
        .expect("the lease ended within 15 s");
    assert_eq!(end, LeaseEnd::Lost);
    let late = SystemTime::now().duration_since(expiry).unwrap_or_default();
    assert!(late < Duration::from_secs(2), "lost {late:?} after expiry");
    assert_eq!(engine.in_flight(), 0);
}

/// Abandoning jobs on a connection that carries nothing ends with their leases: the nacks do
/// not wait out the client's retries (a stopping worker would otherwise hang for 90 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoning_on_a_silent_connection_takes_no_longer_than_the_lease() {
    let (server, relay, engine, lease) = one_job_held_behind_a_relay().await;
    relay.freeze();
    engine.shutdown();
    let abandoned = tokio::time::timeout(Duration::from_secs(15), engine.abandon_all("bye"))
        .await
        .expect("abandoned within 15 s");
    assert_eq!(abandoned, 1);
    assert_eq!(engine.report().abandoned, 1, "{:?}", engine.report());
    assert_eq!(engine.in_flight(), 0);
    // The nack never reached the server: the job comes back when its lease runs out.
    let direct = SeppClient::connect(server.url()).await.unwrap();
    let info = job_when(&direct, &lease.job.id, |i| i.state == JobState::Ready).await;
    assert_eq!(info.attempt, 1);
}

/// An ack that fails (the server is gone) is not counted as acked: the job's lease runs out
/// and it is delivered again, so the report counts it with the lost leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_ack_is_counted_as_a_lost_lease_not_as_acked() {
    use sepp_rs::engine::{Engine, EngineOptions, Outcome};
    let (server, c) = setup().await;
    c.enqueue(EnqueueRequest::new("gone", "t").unwrap())
        .await
        .unwrap();
    let engine = Engine::start(c.clone(), EngineOptions::new(["gone"])).unwrap();
    let lease = engine.next().await.unwrap();
    server.stop().await;
    let err = engine
        .settle(&lease.job.id, lease.job.attempt, Outcome::Success)
        .await
        .unwrap_err();
    assert!(!err.is_lease_lost(), "{err}");
    let report = engine.report();
    assert_eq!((report.acked, report.lease_lost), (0, 1), "{report:?}");
}

/// However many slots are free, the poller asks for at most 1,000 jobs per reserve (a
/// `max_in_flight` of millions once made it build a permit per slot on every reserve: a core
/// busy and memory growing while idle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_max_in_flight_asks_for_at_most_1000_jobs_per_reserve() {
    use sepp_rs::engine::{Engine, EngineOptions};
    let (server, _) = setup().await;
    let tamper = common::Tamper::default();
    let url = common::proxy(&server, tamper.clone()).await;
    let c = SeppClient::connect(url).await.unwrap();
    c.enqueue(EnqueueRequest::new("wide", "t").unwrap())
        .await
        .unwrap();
    let mut opts = EngineOptions::new(["wide"]);
    opts.max_in_flight = u32::MAX as usize;
    let engine = Engine::start(c.clone(), opts).unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(10), engine.next())
        .await
        .expect("a job within 10 s")
        .unwrap();
    assert_eq!(lease.job.queue, "wide");
    let asked = tamper.reserve_max_jobs.lock().unwrap().clone();
    assert!(!asked.is_empty());
    assert!(asked.iter().all(|n| *n == Some(1_000)), "{asked:?}");
    engine.shutdown();
}

/// A stop while the poller's reserve is in flight, answered but not yet back, gives the jobs
/// of that reply back at once: the reserve did not wait (ready jobs were there), so the engine
/// lets it finish instead of cancelling it, which would leave its jobs leased into a reply
/// nobody reads until their leases ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_a_reserve_brings_jobs_gives_them_back_at_once() {
    use sepp_rs::engine::{Engine, EngineOptions};
    let (server, direct) = setup().await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let tamper = common::Tamper {
        reserve_reply_gate: Some(gate.clone()),
        ..common::Tamper::default()
    };
    let url = common::proxy(&server, tamper.clone()).await;
    let c = SeppClient::connect(url).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(
            c.enqueue(EnqueueRequest::new("early", "t").unwrap())
                .await
                .unwrap()
                .job_id,
        );
    }
    let mut opts = EngineOptions::new(["early"]);
    opts.max_in_flight = 8;
    let engine = Engine::start(c.clone(), opts).unwrap();
    // The server leased the five jobs; the reply waits in the proxy.
    let mut held = tamper.reserve_replies_held.subscribe();
    held.wait_for(|n| *n >= 1).await.unwrap();
    engine.shutdown();
    gate.add_permits(1_000);
    assert_eq!(engine.abandon_all("test over").await, 0);
    assert_eq!(engine.report().abandoned, 5, "{:?}", engine.report());
    for id in &ids {
        let info = direct.get_job(id).await.unwrap();
        assert_eq!(info.state, JobState::Ready, "{info:?}");
    }
}

#[tokio::test]
async fn a_worker_whose_key_lacks_the_worker_role_fails_instead_of_waiting_forever() {
    use sepp_server::config::{ApiKey, Role};
    let server = TestServer::start(|c| {
        c.auth.api_keys = Some(vec![
            ApiKey {
                name: "producer".into(),
                key: "p-secret".into(),
                roles: vec![Role::Producer],
            },
            ApiKey::new("all", "a-secret"),
        ]);
    })
    .await;
    let connect = |key: &str| {
        SeppClient::builder(server.url())
            .api_key(key)
            .connect_lazy()
            .unwrap()
    };
    let admin = connect("a-secret");
    let id = admin
        .enqueue(EnqueueRequest::new("roles", "t").unwrap())
        .await
        .unwrap()
        .job_id;
    let worker = Worker::builder(connect("p-secret"), ["roles"])
        .handle("t", |_ctx| async { Ok(()) })
        .build();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        worker.run_until(std::future::pending()),
    )
    .await
    .expect("the worker fails at once, instead of retrying the reserve")
    .expect_err("a refused reserve fails the worker");
    assert_eq!(err.code(), sepp_rs::ErrorCode::PermissionDenied, "{err}");
    assert!(err.to_string().contains("worker"), "names the role: {err}");
    // The job was not touched.
    let info = admin.get_job(&id).await.unwrap();
    assert_eq!(info.state, JobState::Ready);
    assert_eq!(info.attempt, 0);
}

#[tokio::test]
async fn a_worker_stopped_before_it_runs_leases_nothing() {
    let (_server, c) = setup().await;
    let id = c
        .enqueue(EnqueueRequest::new("early-stop", "t").unwrap())
        .await
        .unwrap()
        .job_id;
    for _ in 0..3 {
        let worker = Worker::builder(c.clone(), ["early-stop"])
            .handle("t", |_ctx| async { Ok(()) })
            .build();
        let report = worker.run_until(std::future::ready(())).await.unwrap();
        assert_eq!(report, sepp_rs::worker::WorkerReport::default());
    }
    // Not leased and given back three times over: no attempt was spent.
    let info = c.get_job(&id).await.unwrap();
    assert_eq!(info.state, JobState::Ready);
    assert_eq!(info.attempt, 0);
}
