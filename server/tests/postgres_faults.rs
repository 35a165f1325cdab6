//! Fault tests of the PostgreSQL backend (docs/postgres.md, "Fault tests"): real `sepp`
//! processes (this build's binary, so that a kill is a real SIGKILL) on real PostgreSQL.
//!
//! - Three servers on one database drain `SEPP_TEST_PG_DRAIN_JOBS` jobs (default 3,000; `make
//!   soak-postgres` runs 20,000): each is acked once, none delivered twice unless its lease
//!   expired.
//! - `kill -9` of one of three servers under load: every acknowledged enqueue and ack is still
//!   there, the jobs it had leased come back after their lease, the others keep serving.
//! - A private PostgreSQL cluster stopped hard and started again under load: `UNAVAILABLE`
//!   while it is down, recovery without restarting sepp, nothing acknowledged lost.
//! - Failover: a primary and a synchronous hot standby (two private clusters); the primary is
//!   stopped hard and the standby promoted under load; the servers, given both hosts with
//!   `target_session_attrs=read-write`, carry on against the new primary and nothing
//!   acknowledged is lost.
//!
//! The first two use the shared test PostgreSQL (`SEPP_TEST_POSTGRES_URL`, a fresh database
//! each); the last two run their own clusters (initdb under the temp dir, their own ports) and
//! print a SKIPPED line when PostgreSQL's server binaries are not installed.

mod common;

use common::pg_cluster::{Cluster, cannot_run_clusters, pg_bin};
use futures_util::StreamExt;
use sepp_rs::admin::JobState;
use sepp_rs::{EnqueueError, EnqueueRequest, Job, LeaseError, ReserveOptions, SeppClient};
use sepp_server::testing::postgres::TestDatabase;
use sepp_server::testing::{ServerProcess, TempDir};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const QUEUE: &str = "faults";
/// Pause after a failed call before the next try (pacing only: the peer is down).
const AFTER_ERROR: Duration = Duration::from_millis(20);
/// gRPC's UNAVAILABLE.
const UNAVAILABLE: i32 = 14;

// ---------------------------------------------------------------------------------------
// sepp servers

/// A `sepp` process on PostgreSQL, with its config directory.
struct Sepp {
    process: ServerProcess,
    url: String,
    _dir: TempDir,
}

fn start_sepp(postgres_url: &str) -> Sepp {
    let dir = TempDir::new();
    let escaped = postgres_url.replace('\\', "\\\\").replace('"', "\\\"");
    let toml = format!(
        "[storage]\n\
         backend = \"postgres\"\n\
         postgres_url = \"{escaped}\"\n\
         postgres_pool_size = 8\n\
         postgres_poll_interval_ms = 200\n\
         postgres_statement_timeout_ms = 5000\n\
         sweep_interval_ms = 100\n"
    );
    let process = common::ServerProcess::start(dir.path(), &toml);
    let url = process.url();
    Sepp {
        process,
        url,
        _dir: dir,
    }
}

/// A client that makes each call once (the load retries itself, and counts every failure).
fn client_once(url: &str) -> SeppClient {
    SeppClient::builder(url.to_string())
        .no_retries()
        .rpc_timeout(Some(Duration::from_secs(15)))
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy()
        .expect("client")
}

/// A client with the default retries, for the checks at the end.
async fn client(url: &str) -> SeppClient {
    SeppClient::connect(url.to_string()).await.expect("connect")
}

// ---------------------------------------------------------------------------------------
// The ledger: what the clients were told

#[derive(Debug, Clone)]
struct Failure {
    call: &'static str,
    server: usize,
    phase: u8,
    grpc_code: Option<i32>,
    message: String,
}

#[derive(Debug, Default)]
struct JobView {
    /// `(attempt, server)` of each delivery, in order.
    deliveries: Vec<(u32, usize)>,
    /// The attempt of the acknowledged ack.
    acked: Option<u32>,
    /// An ack was sent and its outcome is unknown (its reply was an error).
    ack_unknown: bool,
}

#[derive(Debug, Default)]
struct Inner {
    /// Acknowledged keyed enqueues: key -> job id.
    keys: HashMap<String, String>,
    /// Acknowledged enqueues, in order, with the phase they were acknowledged in.
    enqueued: Vec<(String, u8)>,
    jobs: HashMap<String, JobView>,
    acks: u64,
    acks_by_phase: [u64; 3],
    enqueues_by_phase: [u64; 3],
    leases_lost: u64,
    redeliveries: u64,
    /// Deliveries that came in an ack's reply (`then_reserve`), not a Reserve's.
    brought: u64,
    failures: Vec<Failure>,
    violations: Vec<String>,
}

/// Everything the servers acknowledged to the load, checked as it arrives (a delivery after an
/// acknowledged ack, two deliveries of one attempt, a key naming two jobs) and against the
/// servers' view at the end.
struct Ledger {
    inner: Mutex<Inner>,
    /// 0 before the fault, 1 while it lasts, 2 after.
    phase: AtomicU8,
    enqueues: watch::Sender<u64>,
    acks: watch::Sender<u64>,
    failures: watch::Sender<u64>,
}

impl Ledger {
    fn new() -> Arc<Self> {
        Arc::new(Ledger {
            inner: Mutex::default(),
            phase: AtomicU8::new(0),
            enqueues: watch::Sender::new(0),
            acks: watch::Sender::new(0),
            failures: watch::Sender::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("ledger lock")
    }

    fn phase(&self) -> u8 {
        self.phase.load(Ordering::SeqCst)
    }

    fn set_phase(&self, p: u8) {
        self.phase.store(p, Ordering::SeqCst);
    }

    fn enqueued(&self, key: Option<&str>, id: &str) {
        let phase = self.phase();
        let mut g = self.lock();
        if let Some(key) = key
            && let Some(old) = g.keys.insert(key.to_string(), id.to_string())
        {
            if old != id {
                g.violations
                    .push(format!("key {key} named job {old}, then job {id}"));
            }
            return;
        }
        g.enqueued.push((id.to_string(), phase));
        g.enqueues_by_phase[usize::from(phase)] += 1;
        let n = g.enqueued.len() as u64;
        drop(g);
        self.enqueues.send_replace(n);
    }

    fn delivered(&self, job: &Job, server: usize) {
        let mut g = self.lock();
        let view = g.jobs.entry(job.id.clone()).or_default();
        let mut bad = Vec::new();
        if let Some(a) = view.acked {
            bad.push(format!(
                "job {} delivered (attempt {}, server {server}) after its ack of attempt {a} was acknowledged",
                job.id, job.attempt
            ));
        }
        if let Some(&(last, s)) = view.deliveries.last()
            && job.attempt <= last
        {
            bad.push(format!(
                "job {} delivered with attempt {} (server {server}) after attempt {last} \
                 (server {s}): delivered twice without a lease expiry",
                job.id, job.attempt
            ));
        }
        let again = !view.deliveries.is_empty();
        view.deliveries.push((job.attempt, server));
        if again {
            g.redeliveries += 1;
        }
        g.violations.extend(bad);
    }

    fn acked(&self, id: &str, attempt: u32) {
        let phase = self.phase();
        let mut g = self.lock();
        let view = g.jobs.entry(id.to_string()).or_default();
        let twice = view.acked.replace(attempt);
        if let Some(a) = twice {
            g.violations.push(format!(
                "job {id}: two acknowledged acks (attempts {a} and {attempt})"
            ));
        }
        g.acks += 1;
        g.acks_by_phase[usize::from(phase)] += 1;
        let n = g.acks;
        drop(g);
        self.acks.send_replace(n);
    }

    fn ack_unknown(&self, id: &str) {
        self.lock()
            .jobs
            .entry(id.to_string())
            .or_default()
            .ack_unknown = true;
    }

    /// A delivery in an ack's reply.
    fn brought(&self, job: &Job, server: usize) {
        self.delivered(job, server);
        self.lock().brought += 1;
    }

    fn lease_lost(&self) {
        self.lock().leases_lost += 1;
    }

    fn failed(&self, call: &'static str, server: usize, e: &dyn ErrorCode) {
        let phase = self.phase();
        let mut g = self.lock();
        g.failures.push(Failure {
            call,
            server,
            phase,
            grpc_code: e.grpc(),
            message: e.to_string(),
        });
        let n = g.failures.len() as u64;
        drop(g);
        self.failures.send_replace(n);
    }

    fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }
}

/// The gRPC status code of a client error, when it came from a status.
trait ErrorCode: std::fmt::Display {
    fn grpc(&self) -> Option<i32>;
}

impl ErrorCode for sepp_rs::ClientError {
    fn grpc(&self) -> Option<i32> {
        self.grpc_code()
    }
}

impl ErrorCode for EnqueueError {
    fn grpc(&self) -> Option<i32> {
        match self {
            EnqueueError::Client(c) => c.grpc_code(),
            EnqueueError::Rejected(_) => None,
        }
    }
}

impl ErrorCode for LeaseError {
    fn grpc(&self) -> Option<i32> {
        match self {
            LeaseError::Client(c) => c.grpc_code(),
            _ => None,
        }
    }
}

impl ErrorCode for sepp_rs::ReserveError {
    fn grpc(&self) -> Option<i32> {
        match self {
            sepp_rs::ReserveError::Client(c) => c.grpc_code(),
            _ => None,
        }
    }
}

impl ErrorCode for sepp_rs::BatchError {
    fn grpc(&self) -> Option<i32> {
        match self {
            sepp_rs::BatchError::Client(c) => c.grpc_code(),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The load: keyed producers that retry a key until it is acknowledged (on the next server
// after an error), and workers on every server that ack what they get.

#[derive(Clone, Copy)]
struct Mix {
    producers: usize,
    keys_per_producer: usize,
    workers_per_server: usize,
    lease: Duration,
}

impl Mix {
    /// The keys of all producers.
    fn total(&self) -> u64 {
        (self.producers * self.keys_per_producer) as u64
    }
}

struct Load {
    producers: Vec<tokio::task::JoinHandle<()>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    /// Servers marked dead (killed by the test): their workers give up.
    dead: Arc<Vec<AtomicBool>>,
}

fn start_load(urls: &[String], ledger: &Arc<Ledger>, mix: Mix) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let dead: Arc<Vec<AtomicBool>> =
        Arc::new(urls.iter().map(|_| AtomicBool::new(false)).collect());
    let clients: Vec<SeppClient> = urls.iter().map(|u| client_once(u)).collect();
    let mut producers = Vec::new();
    for p in 0..mix.producers {
        let (clients, ledger) = (clients.clone(), ledger.clone());
        producers.push(tokio::spawn(async move {
            let mut s = p % clients.len();
            for n in 0..mix.keys_per_producer {
                let key = format!("p{p}-{n}");
                loop {
                    let req = EnqueueRequest::new(QUEUE, "t")
                        .expect("request")
                        .with_idempotency_key(key.clone())
                        .with_max_attempts(50);
                    match clients[s].enqueue(req).await {
                        Ok(ack) => {
                            ledger.enqueued(Some(&key), &ack.job_id);
                            break;
                        }
                        Err(e) => {
                            ledger.failed("enqueue", s, &e);
                            s = (s + 1) % clients.len();
                            tokio::time::sleep(AFTER_ERROR).await;
                        }
                    }
                }
            }
        }));
    }
    let mut workers = Vec::new();
    for (s, c) in clients.iter().enumerate() {
        for _ in 0..mix.workers_per_server {
            let (c, ledger, stop, dead) = (c.clone(), ledger.clone(), stop.clone(), dead.clone());
            workers.push(tokio::spawn(async move {
                work(&c, s, &ledger, &stop, &dead[s], mix.lease).await;
            }));
        }
    }
    Load {
        producers,
        workers,
        stop,
        dead,
    }
}

/// One worker on server `s`: reserve, ack each job (retrying an ack whose outcome is unknown
/// until the lease is lost or over), until told to stop or its server is killed. The last job
/// in hand is acked with `then_reserve` (one transaction for the ack and the next lease, the
/// way the worker engine acks): the jobs it brings are deliveries like a Reserve's.
async fn work(
    c: &SeppClient,
    s: usize,
    ledger: &Ledger,
    stop: &AtomicBool,
    dead: &AtomicBool,
    lease: Duration,
) {
    while !stop.load(Ordering::SeqCst) && !dead.load(Ordering::SeqCst) {
        let opts = ReserveOptions::new([QUEUE], lease)
            .with_max_jobs(8)
            .with_wait_timeout(Duration::from_millis(300));
        let mut jobs: std::collections::VecDeque<Job> = match c.reserve(opts).await {
            Ok(jobs) => jobs.into(),
            Err(e) => {
                ledger.failed("reserve", s, &e);
                tokio::time::sleep(AFTER_ERROR).await;
                continue;
            }
        };
        for job in &jobs {
            ledger.delivered(job, s);
        }
        while let Some(job) = jobs.pop_front() {
            let until = Instant::now() + lease;
            let bring = jobs.is_empty() && !stop.load(Ordering::SeqCst);
            loop {
                if dead.load(Ordering::SeqCst) {
                    return;
                }
                let r = if bring {
                    let next = ReserveOptions::new([QUEUE], lease).with_max_jobs(2);
                    c.ack_then_reserve(&job.id, job.attempt, next).await
                } else {
                    c.ack(&job.id, job.attempt).await.map(|()| None)
                };
                match r {
                    Ok(next) => {
                        ledger.acked(&job.id, job.attempt);
                        for j in next.unwrap_or_default() {
                            ledger.brought(&j, s);
                            jobs.push_back(j);
                        }
                        break;
                    }
                    Err(e) if e.is_lease_lost() => {
                        ledger.lease_lost();
                        break;
                    }
                    Err(e) => {
                        ledger.failed("ack", s, &e);
                        ledger.ack_unknown(&job.id);
                        if Instant::now() > until {
                            break;
                        }
                        tokio::time::sleep(AFTER_ERROR).await;
                    }
                }
            }
        }
    }
}

impl Load {
    /// Marks server `s` dead: its workers stop at their next call.
    fn server_died(&self, s: usize) {
        self.dead[s].store(true, Ordering::SeqCst);
    }

    /// Waits for the producers, then for the queue to be empty (everything acked), then stops
    /// the workers.
    async fn finish(self, check: &SeppClient) {
        for p in self.producers {
            p.await.expect("producer");
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(st) = check.get_queue_stats(QUEUE).await
                && st.ready + st.scheduled + st.in_flight == 0
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the queue did not drain within 120 s of the last enqueue"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers {
            w.await.expect("worker");
        }
    }
}

/// The end: every acknowledged key still names its job, every job is acked (the load drained
/// the queue), no violation seen on the way. Returns how many jobs had an ack whose reply was
/// lost but that the server shows committed.
async fn verify_end(ledger: &Ledger, check: &SeppClient) -> usize {
    let (keys, jobs): (Vec<(String, String)>, HashMap<String, bool>) = {
        let g = ledger.lock();
        (
            g.keys.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            g.jobs
                .iter()
                .map(|(id, v)| (id.clone(), v.acked.is_none() && v.ack_unknown))
                .collect(),
        )
    };
    let results: Vec<Result<(String, String, JobState), String>> = futures_util::stream::iter(keys)
        .map(|(key, id)| async move {
            let rec = check
                .lookup_idempotency_key(QUEUE, &key)
                .await
                .map_err(|e| format!("LookupIdempotencyKey {key}: {e}"))?;
            match rec {
                Some(r) if r.job_id == id => {}
                other => {
                    return Err(format!(
                        "key {key}: acknowledged as job {id}, now {other:?}"
                    ));
                }
            }
            let info = check
                .get_job(&id)
                .await
                .map_err(|e| format!("GetJob {id}: {e}"))?;
            Ok((key, id, info.state))
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut bad = ledger.violations();
    let mut unknown_but_committed = 0;
    for r in results {
        match r {
            Ok((key, id, JobState::Acked)) => {
                if jobs.get(&id).copied().unwrap_or(false) {
                    unknown_but_committed += 1;
                }
                let _ = key;
            }
            Ok((key, id, state)) => bad.push(format!("key {key}, job {id}: {state:?} at the end")),
            Err(e) => bad.push(e),
        }
    }
    let st = check.get_queue_stats(QUEUE).await.expect("stats");
    if st.ready + st.scheduled + st.in_flight + st.dead_lettered != 0 {
        bad.push(format!("the queue is not empty at the end: {st:?}"));
    }
    assert!(
        bad.is_empty(),
        "{} violations:\n{}",
        bad.len(),
        bad.join("\n")
    );
    unknown_but_committed
}

/// Failures as `count × call on server: code message`, the same ones folded, after their
/// total.
fn failure_summary(failures: &[Failure]) -> String {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for f in failures {
        let mut m = f.message.clone();
        if m.len() > 160 {
            m.truncate(160);
        }
        let line = format!(
            "{} on server {}: grpc {:?}: {m}",
            f.call, f.server, f.grpc_code
        );
        match seen.iter_mut().find(|(l, _)| *l == line) {
            Some((_, n)) => *n += 1,
            None => seen.push((line, 1)),
        }
    }
    let mut out = format!("{} failed calls", failures.len());
    for (l, n) in seen {
        out.push_str(&format!("\n  {n} × {l}"));
    }
    out
}

// ---------------------------------------------------------------------------------------
// 1. Three servers drain N jobs

/// Jobs of the drain test: `SEPP_TEST_PG_DRAIN_JOBS`, default 3,000 (`make soak-postgres`: 20,000).
fn drain_jobs() -> usize {
    std::env::var("SEPP_TEST_PG_DRAIN_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_servers_drain_every_job_once() {
    let n = drain_jobs();
    let db = TestDatabase::create().await;
    let servers: Vec<Sepp> = (0..3).map(|_| start_sepp(db.url())).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let ledger = Ledger::new();
    let started = Instant::now();
    // Enqueue: batches of 250 unkeyed jobs, spread over the three servers.
    let mut producers = Vec::new();
    let batches = n.div_ceil(250);
    for p in 0..6 {
        let (c, ledger) = (client_once(&urls[p % 3]), ledger.clone());
        producers.push(tokio::spawn(async move {
            for b in (p..batches).step_by(6) {
                let size = 250.min(n - b * 250);
                let reqs = (0..size)
                    .map(|_| EnqueueRequest::new(QUEUE, "t").expect("request"))
                    .collect();
                let acks = c.enqueue_batch(reqs).await.expect("enqueue batch");
                for a in acks {
                    ledger.enqueued(None, &a.expect("accepted").job_id);
                }
            }
        }));
    }
    for p in producers {
        p.await.expect("producer");
    }
    let enqueued_in = started.elapsed();
    // Drain: four workers per server, a lease far longer than the test.
    let lease = Duration::from_secs(120);
    let stop = Arc::new(AtomicBool::new(false));
    let never = Arc::new(AtomicBool::new(false));
    let acked_all = {
        let mut acks = ledger.acks.subscribe();
        let stop = stop.clone();
        let n = n as u64;
        tokio::spawn(async move {
            let _ = acks.wait_for(|a| *a >= n).await;
            stop.store(true, Ordering::SeqCst);
        })
    };
    let drain_started = Instant::now();
    let mut workers = Vec::new();
    for (s, url) in urls.iter().enumerate() {
        for _ in 0..4 {
            let (c, ledger, stop, never) = (
                client_once(url),
                ledger.clone(),
                stop.clone(),
                never.clone(),
            );
            workers.push(tokio::spawn(async move {
                work(&c, s, &ledger, &stop, &never, lease).await;
            }));
        }
    }
    tokio::time::timeout(Duration::from_secs(600), acked_all)
        .await
        .expect("every job acked within 600 s")
        .expect("watcher");
    for w in workers {
        w.await.expect("worker");
    }
    let drained_in = drain_started.elapsed();
    let bad = {
        let g = ledger.lock();
        let mut by_server = [0u64; 3];
        let mut bad = g.violations.clone();
        for (id, _) in &g.enqueued {
            match g.jobs.get(id) {
                None => bad.push(format!("job {id} never delivered")),
                Some(v) => {
                    if v.acked.is_none() {
                        bad.push(format!("job {id} never acked: {v:?}"));
                    }
                    by_server[v.deliveries[0].1] += 1;
                }
            }
        }
        if g.jobs.len() != n {
            bad.push(format!(
                "{} distinct jobs delivered, {n} enqueued",
                g.jobs.len()
            ));
        }
        if !g.failures.is_empty() {
            bad.push(format!("failed calls:\n{}", failure_summary(&g.failures)));
        }
        eprintln!(
            "drain: {n} jobs enqueued in {enqueued_in:?}, drained by 12 workers on 3 servers in \
             {drained_in:?}; first deliveries by server {by_server:?}; {} acks, {} redeliveries \
             (each after its lease expired: a higher attempt), {} leases lost; {} jobs came \
             in an ack's reply",
            g.acks, g.redeliveries, g.leases_lost, g.brought
        );
        if g.brought == 0 {
            bad.push("no ack brought a job: then_reserve went untested".into());
        }
        bad
    };
    assert!(
        bad.is_empty(),
        "{} violations:\n{}",
        bad.len(),
        bad.join("\n")
    );
    // Nothing was left behind on any server.
    let st = client(&urls[2])
        .await
        .get_queue_stats(QUEUE)
        .await
        .expect("stats");
    assert_eq!((st.ready, st.in_flight, st.scheduled), (0, 0, 0), "{st:?}");
}

// ---------------------------------------------------------------------------------------
// 2. kill -9 of one server under load

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_of_one_server_under_load_loses_nothing() {
    let db = TestDatabase::create().await;
    let mut servers: Vec<Sepp> = (0..3).map(|_| start_sepp(db.url())).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let ledger = Ledger::new();
    let lease = Duration::from_secs(2);
    let mix = Mix {
        producers: 6,
        lease,
        ..fault_mix()
    };
    let load = start_load(&urls, &ledger, mix);
    ledger
        .enqueues
        .subscribe()
        .wait_for(|n| *n >= mix.total() / 3)
        .await
        .expect("enqueues");
    // A worker of the victim holds jobs (leased, not acked) when it dies.
    let victim = 2;
    let victim_client = client_once(&urls[victim]);
    let mut held = Vec::new();
    while held.len() < 5 {
        held.extend(
            victim_client
                .reserve(
                    ReserveOptions::new([QUEUE], lease)
                        .with_max_jobs(5 - held.len() as u32)
                        .with_wait_timeout(Duration::from_secs(10)),
                )
                .await
                .expect("the victim leases jobs"),
        );
    }
    for j in &held {
        ledger.delivered(j, victim);
    }
    ledger.set_phase(1);
    load.server_died(victim);
    servers[victim].process.kill9();
    let (enq_before, acks_before) = {
        let g = ledger.lock();
        (g.enqueued.len(), g.acks)
    };
    let check = client(&urls[0]).await;
    load.finish(&check).await;
    let unknown_committed = verify_end(&ledger, &check).await;
    let g = ledger.lock();
    let mut bad = Vec::new();
    for j in &held {
        let v = &g.jobs[&j.id];
        let back = v
            .deliveries
            .iter()
            .any(|&(a, s)| a > j.attempt && s != victim);
        if !back || v.acked.is_none() {
            bad.push(format!(
                "job {} held by the killed server did not come back to another: {v:?}",
                j.id
            ));
        }
    }
    let survivors: Vec<Failure> = g
        .failures
        .iter()
        .filter(|f| f.server != victim)
        .cloned()
        .collect();
    if !survivors.is_empty() {
        bad.push(format!(
            "the surviving servers failed calls:\n{}",
            failure_summary(&survivors)
        ));
    }
    eprintln!(
        "kill -9: {} keyed jobs ({enq_before} acknowledged before the kill), {} acks \
         ({acks_before} before); {} jobs held by the killed server, all redelivered by the \
         others after their lease; {} redeliveries in all, {} leases lost, {unknown_committed} \
         acks whose reply the kill took but which had committed; {} jobs came in an ack's \
         reply; failures:\n{}",
        g.enqueued.len(),
        g.acks,
        held.len(),
        g.redeliveries,
        g.leases_lost,
        g.brought,
        failure_summary(&g.failures)
    );
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Private PostgreSQL clusters

/// The load of the restart and failover tests: 4 producers of `SEPP_TEST_PG_FAULT_KEYS` keys each
/// (default 300; `make soak-postgres`: 2,500), two workers per server.
fn fault_mix() -> Mix {
    Mix {
        producers: 4,
        keys_per_producer: std::env::var("SEPP_TEST_PG_FAULT_KEYS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
        workers_per_server: 2,
        lease: Duration::from_secs(3),
    }
}

/// Waits until the load saw `n` more failed calls than `since`.
async fn failures_seen(ledger: &Ledger, since: u64, n: u64) {
    tokio::time::timeout(
        Duration::from_secs(30),
        ledger.failures.subscribe().wait_for(|f| *f >= since + n),
    )
    .await
    .expect("the load saw the database go within 30 s")
    .expect("failures");
}

// ---------------------------------------------------------------------------------------
// 3. The database restarted under load

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_restarted_under_load_loses_nothing() {
    if let Some(why) = cannot_run_clusters() {
        eprintln!("SKIPPED a_database_restarted_under_load_loses_nothing: {why}");
        return;
    }
    let pg = Cluster::primary(&pg_bin().expect("bin"));
    pg.connect("postgres")
        .await
        .batch_execute("CREATE DATABASE sepp")
        .await
        .expect("create database");
    let servers: Vec<Sepp> = (0..2).map(|_| start_sepp(&pg.conninfo("sepp"))).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let ledger = Ledger::new();
    let load = start_load(&urls, &ledger, fault_mix());
    ledger
        .enqueues
        .subscribe()
        .wait_for(|n| *n >= fault_mix().total() / 3)
        .await
        .expect("enqueues");
    let since = ledger.lock().failures.len() as u64;
    ledger.set_phase(1);
    pg.stop_hard();
    let stopped = Instant::now();
    let (enq_before, acks_before) = {
        let g = ledger.lock();
        (g.enqueued.len(), g.acks)
    };
    failures_seen(&ledger, since, 20).await;
    pg.start();
    let down_for = stopped.elapsed();
    ledger.set_phase(2);
    let check = client(&urls[1]).await;
    load.finish(&check).await;
    let unknown_committed = verify_end(&ledger, &check).await;
    let g = ledger.lock();
    let before: Vec<&Failure> = g.failures.iter().filter(|f| f.phase == 0).collect();
    let not_unavailable: Vec<Failure> = g
        .failures
        .iter()
        .filter(|f| f.grpc_code != Some(UNAVAILABLE))
        .cloned()
        .collect();
    eprintln!(
        "restart: database down for {down_for:?}; {} keyed jobs ({enq_before} acknowledged \
         before the stop, {} while down, {} after the start), {} acks ({acks_before} before, \
         {} while down, {} after); {} redeliveries, {} leases lost, {unknown_committed} acks \
         with a lost reply that had committed; failures:\n{}",
        g.enqueued.len(),
        g.enqueues_by_phase[1],
        g.enqueues_by_phase[2],
        g.acks,
        g.acks_by_phase[1],
        g.acks_by_phase[2],
        g.redeliveries,
        g.leases_lost,
        failure_summary(&g.failures)
    );
    assert!(
        before.is_empty(),
        "calls failed before the stop: {before:?}"
    );
    assert!(
        not_unavailable.is_empty(),
        "failures other than UNAVAILABLE:\n{}",
        failure_summary(&not_unavailable)
    );
    assert!(
        g.enqueues_by_phase[2] > 0 && g.acks_by_phase[2] > 0,
        "nothing was acknowledged after the database came back"
    );
}

// ---------------------------------------------------------------------------------------
// 4. Failover to a synchronous hot standby

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_to_a_promoted_standby_loses_nothing() {
    if let Some(why) = cannot_run_clusters() {
        eprintln!("SKIPPED failover_to_a_promoted_standby_loses_nothing: {why}");
        return;
    }
    let primary = Cluster::primary(&pg_bin().expect("bin"));
    let admin = primary.connect("postgres").await;
    admin
        .batch_execute("CREATE DATABASE sepp")
        .await
        .expect("create database");
    let standby = Cluster::standby_of(&primary, "standby1");
    // Synchronous replication: a COMMIT returns once the standby has flushed it.
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
        .await
        .expect("synchronous_standby_names");
    admin
        .batch_execute("ALTER SYSTEM SET synchronous_commit = 'on'")
        .await
        .expect("synchronous_commit");
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = admin
            .query_opt(
                "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1' \
                 AND state = 'streaming'",
                &[],
            )
            .await
            .expect("pg_stat_replication");
        if row.is_some_and(|r| r.get::<_, String>(0) == "sync") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standby did not become a synchronous standby within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(admin);
    let url = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=postgres dbname=sepp \
         target_session_attrs=read-write connect_timeout=5",
        primary.port, standby.port
    );
    let servers: Vec<Sepp> = (0..2).map(|_| start_sepp(&url)).collect();
    let urls: Vec<String> = servers.iter().map(|s| s.url.clone()).collect();
    let ledger = Ledger::new();
    let load = start_load(&urls, &ledger, fault_mix());
    ledger
        .enqueues
        .subscribe()
        .wait_for(|n| *n >= fault_mix().total() / 3)
        .await
        .expect("enqueues");
    let since = ledger.lock().failures.len() as u64;
    ledger.set_phase(1);
    primary.stop_hard();
    let stopped = Instant::now();
    let (enq_before, acks_before) = {
        let g = ledger.lock();
        (g.enqueued.len(), g.acks)
    };
    failures_seen(&ledger, since, 20).await;
    standby.promote();
    let failover_in = stopped.elapsed();
    ledger.set_phase(2);
    let check = client(&urls[0]).await;
    load.finish(&check).await;
    let unknown_committed = verify_end(&ledger, &check).await;
    let g = ledger.lock();
    let not_unavailable: Vec<Failure> = g
        .failures
        .iter()
        .filter(|f| f.grpc_code != Some(UNAVAILABLE))
        .cloned()
        .collect();
    eprintln!(
        "failover: primary stopped, standby promoted {failover_in:?} later; acknowledged \
         writes before the stop: {enq_before} enqueues, {acks_before} acks; at the end (all \
         found on the new primary): {} enqueues ({} while no primary, {} after the promotion), \
         {} acks ({} while no primary, {} after); {} redeliveries, {} leases lost, \
         {unknown_committed} acks with a lost reply that had committed; failures:\n{}",
        g.enqueued.len(),
        g.enqueues_by_phase[1],
        g.enqueues_by_phase[2],
        g.acks,
        g.acks_by_phase[1],
        g.acks_by_phase[2],
        g.redeliveries,
        g.leases_lost,
        failure_summary(&g.failures)
    );
    assert!(
        not_unavailable.is_empty(),
        "failures other than UNAVAILABLE:\n{}",
        failure_summary(&not_unavailable)
    );
    assert!(
        g.enqueues_by_phase[2] > 0 && g.acks_by_phase[2] > 0,
        "nothing was acknowledged after the promotion"
    );
}
