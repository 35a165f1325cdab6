//! The workloads and the loop that drives one measurement point: N connections, each its own
//! [`SeppClient`] (its own HTTP/2 connection) with one request in flight at a time; or, with
//! `--shared-client`, N tasks sharing one client.

use crate::server::{BoxError, machine_busy_ticks, proc_sample};
use hdrhistogram::Histogram;
use sepp_rs::{EnqueueRequest, ReserveOptions, SeppClient};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Job type of every bench job.
const JOB_TYPE: &str = "bench";
/// Payload encoding of every bench job.
const ENCODING: &str = "application/octet-stream";
/// Lease of a reserved job.
const LEASE: Duration = Duration::from_secs(30);
/// Longest wait of one Reserve.
const RESERVE_WAIT: Duration = Duration::from_secs(1);
/// Distinct error messages kept per point.
const MAX_SAMPLES: usize = 8;
/// A connection gives up after this many consecutive failed calls (server gone).
const MAX_CONSECUTIVE_ERRORS: u64 = 200;

/// What one point does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Workload {
    /// Single enqueues, each with a fresh idempotency key.
    Unique,
    /// Single enqueues, every one a dedup hit on a pre-enqueued key.
    Hits,
    /// Single enqueues without a key.
    Nokey,
    /// `enqueue_batch` of 100 keyed jobs per call.
    Batch100,
    /// `enqueue_batch` of 1,000 keyed jobs per call (not in the default set: ask for it).
    Batch1000,
    /// Reserve + ack of a pre-filled queue until it is empty.
    Drain,
    /// One connection: enqueue → reserve → ack.
    Cycle,
    /// The public sepp's published method: N jobs enqueued one per call by the producers, then
    /// drained by as many workers (reserve + ack per job). Reported as two rows,
    /// `published-enqueue` and `published-drain`.
    Published,
    /// Enqueue phase of `published` (a report row, not selectable).
    #[value(skip)]
    #[serde(rename = "published-enqueue")]
    PublishedEnqueue,
    /// Drain phase of `published` (a report row, not selectable).
    #[value(skip)]
    #[serde(rename = "published-drain")]
    PublishedDrain,
}

impl Workload {
    /// Every workload, in run order.
    pub(crate) const ALL: [Workload; 7] = [
        Workload::Unique,
        Workload::Hits,
        Workload::Nokey,
        Workload::Batch100,
        Workload::Drain,
        Workload::Cycle,
        Workload::Published,
    ];

    /// Its command-line spelling.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Workload::Unique => "unique",
            Workload::Hits => "hits",
            Workload::Nokey => "nokey",
            Workload::Batch100 => "batch100",
            Workload::Batch1000 => "batch1000",
            Workload::Drain => "drain",
            Workload::Cycle => "cycle",
            Workload::Published => "published",
            Workload::PublishedEnqueue => "published-enqueue",
            Workload::PublishedDrain => "published-drain",
        }
    }

    /// What its latency figures time.
    pub(crate) fn latency_unit(self) -> &'static str {
        match self {
            Workload::Cycle => "enqueue+reserve+ack cycle",
            Workload::Batch100 => "EnqueueBatch call (100 jobs)",
            Workload::Batch1000 => "EnqueueBatch call (1,000 jobs)",
            Workload::Drain | Workload::PublishedDrain => "Reserve or Ack call",
            _ => "Enqueue call",
        }
    }
}

/// Everything one point needs.
#[derive(Debug, Clone)]
pub(crate) struct PointSpec {
    /// Server address (`host:port`).
    pub(crate) addr: String,
    /// The workload.
    pub(crate) workload: Workload,
    /// Connections (one request in flight each).
    pub(crate) connections: usize,
    /// A queue of its own, so points do not see each other's jobs.
    pub(crate) queue: String,
    /// Job payloads.
    pub(crate) payload: Arc<Payloads>,
    /// Keys pre-enqueued for `hits`.
    pub(crate) hit_keys: usize,
    /// Jobs pre-filled for `drain`.
    pub(crate) drain_jobs: usize,
    /// Longest drain, after which the workers stop.
    pub(crate) drain_cap: Duration,
    /// Drain with a Reserve and an Ack per job instead of acks that bring the next job.
    pub(crate) drain_separate_calls: bool,
    /// Jobs the `published` enqueue phase enqueues.
    pub(crate) published_jobs: usize,
    /// Whether the `published` producers give each job a fresh idempotency key.
    pub(crate) published_keyed: bool,
    /// Measured time of the timed workloads.
    pub(crate) duration: Duration,
    /// Unmeasured time before it.
    pub(crate) warmup: Duration,
    /// The server's pid when the bench started it (CPU figures).
    pub(crate) server_pid: Option<u32>,
    /// How the clients are built and shared.
    pub(crate) client: ClientSpec,
}

/// How a point's clients are built and shared.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientSpec {
    /// One client for all the point's tasks, instead of one per connection.
    pub(crate) shared: bool,
    /// The clients' `coalesce` setting.
    pub(crate) coalesce: bool,
    /// The clients' `max_batches_in_flight`, when given.
    pub(crate) max_batches_in_flight: Option<usize>,
}

impl ClientSpec {
    async fn connect(self, addr: String) -> Result<SeppClient, sepp_rs::ClientError> {
        let mut b = SeppClient::builder(addr).coalesce(self.coalesce);
        if let Some(n) = self.max_batches_in_flight {
            b = b.max_batches_in_flight(n);
        }
        b.connect().await
    }
}

/// Raw figures of one point.
pub(crate) struct Measured {
    /// Jobs done in the measured window.
    pub(crate) jobs: u64,
    /// RPCs completed in the measured window.
    pub(crate) rpcs: u64,
    /// Length of the measured window.
    pub(crate) elapsed: Duration,
    /// Latency per RPC (per cycle for `cycle`), microseconds.
    pub(crate) latency: Histogram<u64>,
    /// Latency of each RPC kind where a workload mixes them, microseconds.
    pub(crate) by_rpc: BTreeMap<&'static str, Histogram<u64>>,
    /// Failed RPCs plus rejected jobs.
    pub(crate) errors: u64,
    /// Answers that succeeded but were wrong (a dedup hit that was not one, ...).
    pub(crate) anomalies: u64,
    /// Distinct error and anomaly messages with their counts.
    pub(crate) samples: BTreeMap<String, u64>,
    /// Server CPU ticks (utime + stime) over the window.
    pub(crate) server_cpu_ticks: Option<u64>,
    /// This process's CPU ticks over the window.
    pub(crate) client_cpu_ticks: Option<u64>,
    /// Busy CPU ticks of the whole machine over the window (all cores).
    pub(crate) machine_busy_ticks: Option<u64>,
    /// Remarks (a drain that did not finish, ...).
    pub(crate) notes: Vec<String>,
}

/// Makes a latency histogram: 1 µs to 120 s, 3 significant digits.
pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("valid histogram bounds")
}

/// Per-connection counters, merged at the end of a point.
struct Stats {
    latency: Histogram<u64>,
    by_rpc: BTreeMap<&'static str, Histogram<u64>>,
    jobs: u64,
    rpcs: u64,
    errors: u64,
    anomalies: u64,
    samples: BTreeMap<String, u64>,
    last_done: Option<Instant>,
    consecutive_errors: u64,
}

impl Stats {
    fn new() -> Self {
        Stats {
            latency: new_histogram(),
            by_rpc: BTreeMap::new(),
            jobs: 0,
            rpcs: 0,
            errors: 0,
            anomalies: 0,
            samples: BTreeMap::new(),
            last_done: None,
            consecutive_errors: 0,
        }
    }

    fn sample(&mut self, msg: String) {
        if let Some(n) = self.samples.get_mut(&msg) {
            *n += 1;
        } else if self.samples.len() < MAX_SAMPLES {
            self.samples.insert(msg, 1);
        }
    }

    fn error(&mut self, msg: String) {
        self.errors += 1;
        self.sample(msg);
    }

    fn anomaly(&mut self, msg: String) {
        self.anomalies += 1;
        self.sample(msg);
    }

    fn rpc(&mut self, name: &'static str, d: Duration) {
        self.by_rpc
            .entry(name)
            .or_insert_with(new_histogram)
            .saturating_record(micros(d));
    }

    fn merge(&mut self, other: Stats) {
        let _ = self.latency.add(&other.latency);
        for (k, h) in other.by_rpc {
            let _ = self.by_rpc.entry(k).or_insert_with(new_histogram).add(&h);
        }
        self.jobs += other.jobs;
        self.rpcs += other.rpcs;
        self.errors += other.errors;
        self.anomalies += other.anomalies;
        for (m, n) in other.samples {
            if let Some(c) = self.samples.get_mut(&m) {
                *c += n;
            } else if self.samples.len() < MAX_SAMPLES {
                self.samples.insert(m, n);
            }
        }
        self.last_done = self.last_done.max(other.last_done);
    }
}

/// The payloads a point's jobs carry: one of repeated bytes, or a pool of random ones handed
/// out in turn (consecutive jobs differ, so a storage block of them does not compress).
#[derive(Debug)]
pub(crate) struct Payloads {
    pool: Vec<Vec<u8>>,
    next: std::sync::atomic::AtomicUsize,
}

impl Payloads {
    /// Pool size of random payloads.
    const RANDOM: usize = 1024;

    pub(crate) fn new(bytes: usize, random: bool) -> Self {
        let pool = if random {
            (0..Self::RANDOM)
                .map(|_| {
                    let mut p = Vec::with_capacity(bytes + 16);
                    while p.len() < bytes {
                        p.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
                    }
                    p.truncate(bytes);
                    p
                })
                .collect()
        } else {
            vec![vec![b'x'; bytes]]
        };
        Payloads {
            pool,
            next: 0.into(),
        }
    }

    pub(crate) fn next(&self) -> &[u8] {
        if self.pool.len() == 1 {
            return &self.pool[0];
        }
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.pool[i % self.pool.len()]
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn request(spec: &PointSpec, key: Option<String>) -> Result<EnqueueRequest, BoxError> {
    let r = EnqueueRequest::new(spec.queue.clone(), JOB_TYPE)?
        .with_payload(spec.payload.next(), ENCODING);
    Ok(match key {
        Some(k) => r.with_idempotency_key(k),
        None => r,
    })
}

/// Connections opened at once by [`connect_all`].
const CONNECT_PARALLEL: usize = 16;

/// Opens `n` connections, each its own client (its own HTTP/2 connection), a few at a time.
/// `addr` may list several servers separated by commas (several sepp servers on one
/// database): connection `i` goes to server `i % count`, so they share the load evenly.
/// With `spec.shared`, opens one client and returns `n` clones of it.
async fn connect_all(addr: &str, n: usize, spec: ClientSpec) -> Result<Vec<SeppClient>, BoxError> {
    if spec.shared {
        let first = addr.split(',').next().unwrap_or(addr).trim().to_string();
        let c = spec
            .connect(first)
            .await
            .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        return Ok(vec![c; n]);
    }
    let addrs: Vec<&str> = addr
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if addrs.is_empty() {
        return Err(format!("no server address in {addr:?}").into());
    }
    let mut clients = Vec::with_capacity(n);
    let mut set = JoinSet::new();
    let mut started = 0;
    while clients.len() < n {
        while started < n && set.len() < CONNECT_PARALLEL {
            let addr = addrs[started % addrs.len()].to_string();
            set.spawn(spec.connect(addr));
            started += 1;
        }
        let Some(r) = set.join_next().await else {
            break;
        };
        let c = r?.map_err(|e| {
            format!(
                "cannot connect to {addr} (connection {} of {n}): {e}",
                clients.len() + 1
            )
        })?;
        clients.push(c);
    }
    Ok(clients)
}

/// Enqueues `count` jobs in batches of 100 over `clients`; keys from `key(i)`.
async fn prefill(
    spec: &PointSpec,
    clients: &[SeppClient],
    count: usize,
    key: fn(usize) -> Option<String>,
) -> Result<(), BoxError> {
    let lanes = clients.len().clamp(1, 8);
    let next = Arc::new(AtomicU64::new(0));
    let mut set = JoinSet::new();
    for client in clients.iter().take(lanes) {
        let client = client.clone();
        let spec = spec.clone();
        let next = next.clone();
        set.spawn(async move {
            loop {
                let start = next.fetch_add(100, Ordering::Relaxed) as usize;
                if start >= count {
                    return Ok::<(), BoxError>(());
                }
                let end = (start + 100).min(count);
                let batch = (start..end)
                    .map(|i| request(&spec, key(i)))
                    .collect::<Result<Vec<_>, _>>()?;
                let results = client
                    .enqueue_batch(batch)
                    .await
                    .map_err(|e| format!("pre-fill batch failed: {e}"))?;
                if let Some(Err(r)) = results.iter().find(|r| r.is_err()) {
                    return Err(format!("pre-fill job rejected: {r}").into());
                }
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

fn hit_key(i: usize) -> Option<String> {
    Some(format!("hit-{i}"))
}

fn no_key(_: usize) -> Option<String> {
    None
}

/// Runs one point and returns its raw figures.
pub(crate) async fn run_point(spec: PointSpec) -> Result<Measured, BoxError> {
    let conns = if spec.workload == Workload::Cycle {
        1
    } else {
        spec.connections
    };
    let clients = connect_all(&spec.addr, conns, spec.client).await?;
    match spec.workload {
        Workload::Hits => prefill(&spec, &clients, spec.hit_keys, hit_key).await?,
        Workload::Drain => prefill(&spec, &clients, spec.drain_jobs, no_key).await?,
        _ => {}
    }
    match spec.workload {
        // The published drain phase works on the jobs its enqueue phase left in the queue.
        Workload::Drain | Workload::PublishedDrain => drain(spec, clients).await,
        Workload::PublishedEnqueue => enqueue_all(spec, clients).await,
        Workload::Published => Err("`published` runs as its two phases".into()),
        _ => timed(spec, clients).await,
    }
}

/// CPU ticks of the server, of this process and of the whole machine at one moment.
#[derive(Clone, Copy)]
struct CpuSample {
    server: Option<u64>,
    client: Option<u64>,
    machine: Option<u64>,
}

impl CpuSample {
    fn now(server_pid: Option<u32>) -> Self {
        CpuSample {
            server: server_pid.and_then(|p| proc_sample(&p.to_string()).map(|s| s.cpu_ticks)),
            client: proc_sample("self").map(|s| s.cpu_ticks),
            machine: machine_busy_ticks(),
        }
    }

    /// Fills the CPU fields of `m` with the deltas from `self` to `later`.
    fn fill(self, later: CpuSample, m: &mut Measured) {
        let delta = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
        m.server_cpu_ticks = delta(self.server, later.server);
        m.client_cpu_ticks = delta(self.client, later.client);
        m.machine_busy_ticks = delta(self.machine, later.machine);
    }
}

/// The timed workloads: every connection loops until the end of the window; calls started
/// in the warm-up are not counted.
async fn timed(spec: PointSpec, clients: Vec<SeppClient>) -> Result<Measured, BoxError> {
    let spec = Arc::new(spec);
    let measure_start = Instant::now() + spec.warmup;
    let end = measure_start + spec.duration;
    let n = clients.len();
    let mut set = JoinSet::new();
    for (conn, client) in clients.into_iter().enumerate() {
        let spec = spec.clone();
        set.spawn(async move {
            let mut st = Stats::new();
            // Warm-up calls are recorded here and thrown away. One per connection: a fresh
            // `Stats` per call zeroed a whole histogram each time, a few percent of the
            // bench's CPU that the server then lacked on a shared machine.
            let mut scratch = Stats::new();
            let mut i: u64 = 0;
            loop {
                let t0 = Instant::now();
                if t0 >= end || st.consecutive_errors >= MAX_CONSECUTIVE_ERRORS {
                    break;
                }
                let measured = t0 >= measure_start;
                let target = if measured { &mut st } else { &mut scratch };
                let before = target.errors;
                one_op(&spec, &client, conn, n, i, target, t0).await;
                let failed = target.errors > before;
                st.consecutive_errors = if failed { st.consecutive_errors + 1 } else { 0 };
                i += 1;
                if measured {
                    st.last_done = Some(Instant::now());
                }
            }
            st
        });
    }
    tokio::time::sleep_until(measure_start.into()).await;
    let cpu0 = CpuSample::now(spec.server_pid);
    let mut total = Stats::new();
    let mut gave_up = false;
    while let Some(r) = set.join_next().await {
        let st = r?;
        // `merge` does not carry the streak, so look at each connection's own.
        gave_up |= st.consecutive_errors >= MAX_CONSECUTIVE_ERRORS;
        total.merge(st);
    }
    let cpu1 = CpuSample::now(spec.server_pid);
    let elapsed = total.last_done.map_or(spec.duration, |t| {
        t.saturating_duration_since(measure_start)
    });
    let mut notes = Vec::new();
    if gave_up {
        notes.push("a connection gave up after repeated errors".to_string());
    }
    let mut m = Measured {
        jobs: total.jobs,
        rpcs: total.rpcs,
        elapsed,
        latency: total.latency,
        by_rpc: total.by_rpc,
        errors: total.errors,
        anomalies: total.anomalies,
        samples: total.samples,
        server_cpu_ticks: None,
        client_cpu_ticks: None,
        machine_busy_ticks: None,
        notes,
    };
    cpu0.fill(cpu1, &mut m);
    Ok(m)
}

/// One iteration of a timed workload on connection `conn` of `n`, recorded into `st`.
async fn one_op(
    spec: &PointSpec,
    client: &SeppClient,
    conn: usize,
    n: usize,
    i: u64,
    st: &mut Stats,
    t0: Instant,
) {
    match spec.workload {
        Workload::Unique | Workload::Hits | Workload::Nokey => {
            let (key, expect_dedup) = match spec.workload {
                Workload::Unique => (Some(format!("u-{conn}-{i}")), false),
                Workload::Hits => {
                    let k = spec.hit_keys.max(1);
                    let idx = (conn * k / n.max(1) + i as usize) % k;
                    (hit_key(idx), true)
                }
                _ => (None, false),
            };
            let req = match request(spec, key) {
                Ok(r) => r,
                Err(e) => return st.error(e.to_string()),
            };
            let r = client.enqueue(req).await;
            st.latency.saturating_record(micros(t0.elapsed()));
            st.rpcs += 1;
            match r {
                Ok(ack) => {
                    st.jobs += 1;
                    if ack.deduplicated != expect_dedup {
                        st.anomaly(format!(
                            "{} enqueue answered deduplicated={}",
                            spec.workload.name(),
                            ack.deduplicated
                        ));
                    }
                }
                Err(e) => st.error(format!("enqueue: {e}")),
            }
        }
        Workload::Batch100 | Workload::Batch1000 => {
            let size = if spec.workload == Workload::Batch100 {
                100
            } else {
                1000
            };
            let batch = (0..size)
                .map(|j| request(spec, Some(format!("b-{conn}-{i}-{j}"))))
                .collect::<Result<Vec<_>, _>>();
            let batch = match batch {
                Ok(b) => b,
                Err(e) => return st.error(e.to_string()),
            };
            let r = client.enqueue_batch(batch).await;
            st.latency.saturating_record(micros(t0.elapsed()));
            st.rpcs += 1;
            match r {
                Ok(results) => {
                    for res in results {
                        match res {
                            Ok(ack) if ack.deduplicated => {
                                st.jobs += 1;
                                st.anomaly("fresh batch key answered deduplicated=true".into());
                            }
                            Ok(_) => st.jobs += 1,
                            Err(rej) => st.error(format!("batch job rejected: {rej}")),
                        }
                    }
                }
                Err(e) => st.error(format!("enqueue_batch: {e}")),
            }
        }
        Workload::Cycle => cycle_op(spec, client, i, st, t0).await,
        Workload::Drain
        | Workload::Published
        | Workload::PublishedEnqueue
        | Workload::PublishedDrain => unreachable!("not a timed workload"),
    }
}

async fn cycle_op(spec: &PointSpec, client: &SeppClient, i: u64, st: &mut Stats, t0: Instant) {
    let req = match request(spec, Some(format!("y-{i}"))) {
        Ok(r) => r,
        Err(e) => return st.error(e.to_string()),
    };
    let enq = client.enqueue(req).await;
    let t1 = Instant::now();
    st.rpc("enqueue", t1 - t0);
    st.rpcs += 1;
    let id = match enq {
        Ok(ack) => ack.job_id,
        Err(e) => return st.error(format!("enqueue: {e}")),
    };
    let opts = ReserveOptions::new([spec.queue.clone()], LEASE)
        .with_max_jobs(1)
        .with_wait_timeout(RESERVE_WAIT);
    let res = client.reserve(opts).await;
    let t2 = Instant::now();
    st.rpc("reserve", t2 - t1);
    st.rpcs += 1;
    let job = match res {
        Ok(mut jobs) if !jobs.is_empty() => jobs.swap_remove(0),
        Ok(_) => return st.anomaly("reserve returned no job right after an enqueue".into()),
        Err(e) => return st.error(format!("reserve: {e}")),
    };
    if job.id != id {
        st.anomaly("reserve returned a different job than the one just enqueued".into());
    }
    let ack = client.ack(&job.id, job.attempt).await;
    let t3 = Instant::now();
    st.rpc("ack", t3 - t2);
    st.rpcs += 1;
    match ack {
        Ok(()) => {
            st.jobs += 1;
            st.latency.saturating_record(micros(t3 - t0));
        }
        Err(e) => st.error(format!("ack: {e}")),
    }
}

/// The enqueue phase of `published`: the connections take job numbers from a shared counter
/// and enqueue one job per call until `published_jobs` have been sent. The whole phase is
/// measured (no warm-up), from the first call to the last answer.
async fn enqueue_all(spec: PointSpec, clients: Vec<SeppClient>) -> Result<Measured, BoxError> {
    let spec = Arc::new(spec);
    let total_jobs = spec.published_jobs as u64;
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let cpu0 = CpuSample::now(spec.server_pid);
    let mut set = JoinSet::new();
    for client in clients {
        let spec = spec.clone();
        let next = next.clone();
        set.spawn(async move {
            let mut st = Stats::new();
            while st.consecutive_errors < MAX_CONSECUTIVE_ERRORS {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total_jobs {
                    break;
                }
                let key = spec.published_keyed.then(|| format!("p-{i}"));
                let req = match request(&spec, key) {
                    Ok(r) => r,
                    Err(e) => {
                        st.error(e.to_string());
                        st.consecutive_errors += 1;
                        continue;
                    }
                };
                let t0 = Instant::now();
                let r = client.enqueue(req).await;
                st.latency.saturating_record(micros(t0.elapsed()));
                st.rpcs += 1;
                match r {
                    Ok(ack) => {
                        st.consecutive_errors = 0;
                        st.last_done = Some(Instant::now());
                        if ack.deduplicated {
                            st.anomaly("published enqueue answered deduplicated=true".into());
                        } else {
                            st.jobs += 1;
                        }
                    }
                    Err(e) => {
                        st.consecutive_errors += 1;
                        st.error(format!("enqueue: {e}"));
                    }
                }
            }
            st
        });
    }
    let mut total = Stats::new();
    let mut gave_up = false;
    while let Some(r) = set.join_next().await {
        let st = r?;
        gave_up |= st.consecutive_errors >= MAX_CONSECUTIVE_ERRORS;
        total.merge(st);
    }
    let cpu1 = CpuSample::now(spec.server_pid);
    let elapsed = total
        .last_done
        .map_or(start.elapsed(), |t| t.saturating_duration_since(start));
    let mut notes = Vec::new();
    if gave_up {
        notes.push("a connection gave up after repeated errors".to_string());
    }
    if total.jobs < total_jobs {
        notes.push(format!(
            "{} of {total_jobs} jobs enqueued as new jobs",
            total.jobs
        ));
    }
    let mut m = Measured {
        jobs: total.jobs,
        rpcs: total.rpcs,
        elapsed,
        latency: total.latency,
        by_rpc: total.by_rpc,
        errors: total.errors,
        anomalies: total.anomalies,
        samples: total.samples,
        server_cpu_ticks: None,
        client_cpu_ticks: None,
        machine_busy_ticks: None,
        notes,
    };
    cpu0.fill(cpu1, &mut m);
    Ok(m)
}

/// Workers reserve (max 1 job, 30 s lease, 1 s wait) and ack until every pre-filled job is
/// acked, or the queue answers empty, or the cap is reached. Each ack asks for the next job
/// (`ack_then_reserve`; a server without it answers none, and the worker reserves) unless
/// `drain_separate_calls`.
async fn drain(spec: PointSpec, clients: Vec<SeppClient>) -> Result<Measured, BoxError> {
    let target = spec.drain_jobs as u64;
    let acked = Arc::new(AtomicU64::new(0));
    let done = CancellationToken::new();
    let start = Instant::now();
    let cpu0 = CpuSample::now(spec.server_pid);
    let mut set = JoinSet::new();
    let separate = spec.drain_separate_calls;
    for client in clients {
        let queue = spec.queue.clone();
        let acked = acked.clone();
        let done = done.clone();
        set.spawn(async move {
            let mut st = Stats::new();
            let opts = ReserveOptions::new([queue.clone()], LEASE)
                .with_max_jobs(1)
                .with_wait_timeout(RESERVE_WAIT);
            'outer: while !done.is_cancelled() && st.consecutive_errors < MAX_CONSECUTIVE_ERRORS {
                let t0 = Instant::now();
                let res = tokio::select! {
                    r = client.reserve(opts.clone()) => r,
                    () = done.cancelled() => break,
                };
                let d = t0.elapsed();
                st.latency.saturating_record(micros(d));
                st.rpc("reserve", d);
                st.rpcs += 1;
                let mut jobs = match res {
                    Ok(jobs) if jobs.is_empty() => break,
                    Ok(jobs) => jobs,
                    Err(e) => {
                        st.consecutive_errors += 1;
                        st.error(format!("reserve: {e}"));
                        continue;
                    }
                };
                st.consecutive_errors = 0;
                // The last job of what is in hand is acked with a request for the next one
                // (one call and one commit per job, as a worker does), unless separate calls
                // are asked for; an empty or absent answer goes back to a waiting Reserve.
                while let Some(job) = jobs.pop() {
                    let t1 = Instant::now();
                    let (r, rpc) = if separate || !jobs.is_empty() {
                        (client.ack(&job.id, job.attempt).await.map(|()| None), "ack")
                    } else {
                        let next = ReserveOptions::new([queue.clone()], LEASE).with_max_jobs(1);
                        (
                            client.ack_then_reserve(&job.id, job.attempt, next).await,
                            "ack+reserve",
                        )
                    };
                    let d = t1.elapsed();
                    st.latency.saturating_record(micros(d));
                    st.rpc(rpc, d);
                    st.rpcs += 1;
                    match r {
                        Ok(next) => {
                            st.jobs += 1;
                            st.last_done = Some(Instant::now());
                            if acked.fetch_add(1, Ordering::Relaxed) + 1 >= target {
                                done.cancel();
                                break 'outer;
                            }
                            jobs.extend(next.unwrap_or_default());
                        }
                        Err(e) => st.error(format!("{rpc}: {e}")),
                    }
                }
            }
            st
        });
    }
    let cap = {
        let done = done.clone();
        let cap = spec.drain_cap;
        tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(cap) => { done.cancel(); true }
                () = done.cancelled() => false,
            }
        })
    };
    let mut total = Stats::new();
    let mut gave_up = false;
    while let Some(r) = set.join_next().await {
        let st = r?;
        gave_up |= st.consecutive_errors >= MAX_CONSECUTIVE_ERRORS;
        total.merge(st);
    }
    done.cancel();
    let capped = cap.await.unwrap_or(false);
    let cpu1 = CpuSample::now(spec.server_pid);
    let elapsed = total
        .last_done
        .map_or(start.elapsed(), |t| t.saturating_duration_since(start));
    let mut notes = Vec::new();
    if gave_up {
        notes.push("a connection gave up after repeated errors".to_string());
    }
    if total.jobs < target {
        notes.push(format!(
            "drain stopped at {} of {} jobs ({})",
            total.jobs,
            target,
            if capped {
                format!("time cap {:.0} s", spec.drain_cap.as_secs_f64())
            } else if gave_up {
                "workers gave up".to_string()
            } else {
                "the queue answered empty early".to_string()
            }
        ));
    }
    if total.jobs < target && !capped && !gave_up {
        total.anomaly(format!(
            "reserve found the queue empty with {} of {} pre-filled jobs unacked",
            target - total.jobs,
            target
        ));
    }
    let mut m = Measured {
        jobs: total.jobs,
        rpcs: total.rpcs,
        elapsed,
        latency: total.latency,
        by_rpc: total.by_rpc,
        errors: total.errors,
        anomalies: total.anomalies,
        samples: total.samples,
        server_cpu_ticks: None,
        client_cpu_ticks: None,
        machine_busy_ticks: None,
        notes,
    };
    cpu0.fill(cpu1, &mut m);
    Ok(m)
}
