//! The checker: the client's view of everything the server acknowledged, and the properties
//! it must keep across crashes.
//!
//! Load tasks report each acknowledged enqueue (key, id), each delivery (attempt, lease), and
//! each acknowledged ack, nack and extend. Some properties are checked as events arrive (an
//! acked job delivered again, attempts repeated or above `max_attempts`, two valid leases on
//! one job at once, a key naming two jobs, a corrupted payload); the others after every
//! restart and at the end, against the server's own view through the admin service (every
//! acknowledged enqueue and key still there, acks not undone, attempts never reset, every dedup
//! record naming a job that exists, every job delivered or dead-lettered by the end).

use rand::RngExt;
use sepp_rs::admin::JobState;
use sepp_rs::{Job, SeppClient};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// The queue the load uses.
pub const QUEUE: &str = "crash";
/// The debounce queue (`on_duplicate = "replace_pending"` in the default config): keyed jobs
/// whose pending payload later enqueues of the same key replace.
pub const DEBOUNCE_QUEUE: &str = "crash-debounce";
/// Keys of the debounce queue start with this (the load's debouncers make them).
pub const DEBOUNCE_PREFIX: &str = "d";

/// The custom-map entry in which a debounce job carries its key.
pub const DEBOUNCE_KEY_ENTRY: &str = "key";

/// The queue a key was used on.
pub fn queue_of_key(key: &str) -> &'static str {
    if key.starts_with(DEBOUNCE_PREFIX) {
        DEBOUNCE_QUEUE
    } else {
        QUEUE
    }
}
/// The job type of every job.
pub const JOB_TYPE: &str = "crash-job";
/// Clock slack when comparing the server's lease timestamps with the client's clock (same
/// machine, same clock; this only absorbs rounding).
const SLACK: Duration = Duration::from_millis(2);

/// A random generator, seeded from the clock and a counter (Send, unlike a thread-local one).
pub fn new_rng() -> rand::rngs::SmallRng {
    use rand::SeedableRng;
    static N: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    rand::rngs::SmallRng::seed_from_u64(
        t ^ N
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15),
    )
}

/// A payload that carries its own check: `seed (8 bytes) ‖ len (4) ‖ len bytes from seed`.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(12 + len);
    out.extend_from_slice(&seed.to_le_bytes());
    out.extend_from_slice(&(len as u32).to_le_bytes());
    let mut x = seed | 1;
    for _ in 0..len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.push(x as u8);
    }
    out
}

/// The seed of a payload, if it is intact.
pub fn payload_seed(data: &[u8]) -> Option<u64> {
    let seed = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    let len = u32::from_le_bytes(data.get(8..12)?.try_into().ok()?) as usize;
    (data.len() == 12 + len && payload(seed, len) == data).then_some(seed)
}

/// The server's lease, as the client learned it.
#[derive(Debug, Clone)]
struct Delivery {
    attempt: u32,
    /// The lease lasted at least until here: its expiry, later extends, or earlier the
    /// sending of a nack (which may have ended it, even when its reply was lost).
    end_lb: SystemTime,
    /// The server incarnation (cycle) it was delivered in.
    cycle: u32,
}

/// A debounce key: the payloads sent for it, in order, and which replacements were
/// acknowledged.
#[derive(Debug, Default)]
struct DebounceKey {
    /// The seed of each version sent (index 0: the first enqueue), in the order sent; each
    /// version is retried until acknowledged before the next is sent.
    seeds: Vec<u64>,
    /// (when the reply arrived, version index) of each enqueue answered `replaced = true`,
    /// and of the one that created the job.
    applied: Vec<(SystemTime, usize)>,
}

impl DebounceKey {
    /// The oldest version a reserve sent at `sent` may deliver: every version acknowledged as
    /// written (created or replaced) before the reserve was sent was written before the
    /// server handed the job out, so the delivery carries it or a later one.
    fn floor(&self, sent: SystemTime) -> usize {
        self.applied
            .iter()
            .filter(|(at, _)| *at < sent)
            .map(|(_, i)| *i)
            .max()
            .unwrap_or(0)
    }
}

#[derive(Debug, Default)]
struct JobView {
    key: Option<String>,
    seed: Option<u64>,
    /// When the enqueue (or a dedup hit naming the job) was acknowledged.
    enqueue_acked_at: Option<SystemTime>,
    max_attempts: Option<u32>,
    deliveries: Vec<Delivery>,
    /// Highest attempt delivered, over the whole run.
    max_attempt: u32,
    delivered_ever: bool,
    /// The attempt of an acknowledged ack.
    acked: Option<u32>,
    /// An ack was sent (its outcome may be unknown: a kill took the reply).
    ack_sent: bool,
    /// An acknowledged nack dead-lettered it.
    dead_lettered: bool,
    /// The server showed it completed or dead-lettered (or, unkeyed and acked, forgotten):
    /// nothing more will happen to it.
    server_final: bool,
    /// Buffer mode: lost in a power cut (expectations dropped, counted as a loss).
    lost: bool,
    /// The cycle of the last event; recent and live jobs are verified after every restart.
    touched: u32,
}

impl JobView {
    fn settled(&self) -> bool {
        self.acked.is_some() || self.dead_lettered || self.server_final || self.lost
    }
}

/// Counts for the summary.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    /// Acknowledged enqueues (new jobs and dedup hits).
    pub enqueues: u64,
    /// Of which dedup hits.
    pub dedup_hits: u64,
    /// Of which debounce hits that replaced a pending job's payload.
    pub replaced: u64,
    /// Unkeyed enqueues whose outcome is unknown (an error after sending).
    pub enqueues_unknown: u64,
    /// Deliveries.
    pub deliveries: u64,
    /// Acknowledged acks.
    pub acks: u64,
    /// Acknowledged nacks.
    pub nacks: u64,
    /// Acknowledged extends.
    pub extends: u64,
    /// Lease-lost answers (NOT_FOUND / FAILED_PRECONDITION) to settlements.
    pub lease_lost: u64,
    /// Other errors of any call (the server was killed under it, or refused it).
    pub errors: u64,
    /// Job and key look-ups made by the verifications.
    pub checks: u64,
}

/// Buffer mode: what a power cut took.
#[derive(Debug, Default, Clone)]
pub struct Losses {
    /// Acknowledged enqueues gone after a cut, with how long before the cut each was
    /// acknowledged.
    pub enqueues: Vec<Duration>,
    /// Acknowledged acks undone (the job back in the queue).
    pub acks: u64,
    /// Jobs whose attempt count went back (a lease or nack lost).
    pub attempts: u64,
}

/// A failed call, as recorded.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Its number among all failed calls.
    pub seq: u64,
    /// The gRPC status code, if a server answered.
    pub code: Option<i32>,
    /// The message.
    pub message: String,
}

/// Failed calls kept for inspection.
const MAX_FAILURES: usize = 200_000;

struct Inner {
    failures: Vec<Failure>,
    jobs: HashMap<String, JobView>,
    /// Key → the id every acknowledged reply named.
    keys: HashMap<String, Option<String>>,
    /// Debounce keys (see [`DEBOUNCE_QUEUE`]).
    debounce: HashMap<String, DebounceKey>,
    violations: std::collections::BTreeSet<String>,
    counts: Counts,
    losses: Losses,
    cycle: u32,
    /// Buffer mode after a cut: deliveries of earlier incarnations are no longer compared.
    lossy: bool,
}

/// The client's view.
pub struct Model {
    inner: Mutex<Inner>,
    seq: AtomicU64,
    /// Whether acknowledged writes may be lost at a cut (buffer mode with power cuts).
    lossy: bool,
}

/// How many violations are printed in full.
const SHOW: usize = 20;

impl Model {
    /// An empty view. `lossy`: acknowledged writes may vanish at a power cut (buffer mode);
    /// they are then counted as losses, not violations.
    pub fn new(lossy: bool) -> Self {
        Model {
            inner: Mutex::new(Inner {
                failures: Vec::new(),
                jobs: HashMap::new(),
                keys: HashMap::new(),
                debounce: HashMap::new(),
                violations: Default::default(),
                counts: Counts::default(),
                losses: Losses::default(),
                cycle: 0,
                lossy,
            }),
            seq: AtomicU64::new(0),
            lossy,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh idempotency key.
    pub fn next_key(&self, producer: &str) -> String {
        format!("{producer}-{}", self.seq.fetch_add(1, Ordering::Relaxed))
    }

    /// Records a violation (once: a job still missing at the next restart is not counted
    /// again).
    pub fn violation(&self, what: String) {
        let mut g = self.lock();
        if g.violations.contains(&what) {
            return;
        }
        if g.violations.len() < SHOW {
            eprintln!("VIOLATION: {what}");
        }
        g.violations.insert(what);
    }

    /// The server incarnation changed.
    pub fn set_cycle(&self, cycle: u32) {
        self.lock().cycle = cycle;
    }

    /// An attempt to enqueue `key` was made (its outcome may stay unknown).
    pub fn key_tried(&self, key: &str) {
        self.lock().keys.entry(key.to_string()).or_insert(None);
    }

    /// A version of a debounce key is about to be sent for the first time.
    pub fn debounce_sending(&self, key: &str, seed: u64) {
        self.lock()
            .debounce
            .entry(key.to_string())
            .or_default()
            .seeds
            .push(seed);
    }

    /// An enqueue of a debounce key was acknowledged: version `version` (its index among the
    /// versions sent), `replaced` as the ack said.
    pub fn debounce_enqueued(
        &self,
        key: &str,
        id: &str,
        deduplicated: bool,
        replaced: bool,
        version: usize,
        max_attempts: u32,
    ) {
        let now = SystemTime::now();
        let seed = {
            let mut g = self.lock();
            if replaced {
                g.counts.replaced += 1;
            }
            let d = g.debounce.entry(key.to_string()).or_default();
            if !deduplicated || replaced {
                d.applied.push((now, version));
            }
            d.seeds.get(version).copied().unwrap_or_default()
        };
        if replaced && !deduplicated {
            self.violation(format!(
                "key {key}: enqueue answered replaced = true, deduplicated = false"
            ));
        }
        self.enqueued(Some(key), id, deduplicated, seed, max_attempts);
    }

    /// An enqueue was acknowledged.
    pub fn enqueued(
        &self,
        key: Option<&str>,
        id: &str,
        deduplicated: bool,
        seed: u64,
        max_attempts: u32,
    ) {
        let now = SystemTime::now();
        let mut g = self.lock();
        let cycle = g.cycle;
        g.counts.enqueues += 1;
        if deduplicated {
            g.counts.dedup_hits += 1;
        }
        if let Some(key) = key {
            let known = g.keys.entry(key.to_string()).or_insert(None);
            match known {
                Some(prev) if prev != id => {
                    let msg = format!(
                        "key {key} named job {prev}, now job {id} (deduplicated = {deduplicated}): \
                         two jobs for one key inside its window"
                    );
                    let prev = prev.clone();
                    drop(g);
                    self.violation(msg);
                    let _ = prev;
                    return;
                }
                _ => *known = Some(id.to_string()),
            }
        } else if deduplicated {
            drop(g);
            self.violation(format!("unkeyed enqueue answered deduplicated ({id})"));
            return;
        }
        let debounce = key.is_some_and(|k| g.debounce.contains_key(k));
        let j = g.jobs.entry(id.to_string()).or_default();
        j.touched = cycle;
        if j.enqueue_acked_at.is_none() {
            j.enqueue_acked_at = Some(now);
        }
        if let Some(key) = key {
            j.key = Some(key.to_string());
        }
        // A dedup hit carries the first request's content, not this one's (a debounce key's
        // payload is checked against its versions instead).
        if !deduplicated {
            if !debounce {
                j.seed = Some(seed);
            }
            j.max_attempts = Some(max_attempts);
        }
    }

    /// An unkeyed enqueue failed after it may have been sent.
    pub fn enqueue_unknown(&self) {
        self.lock().counts.enqueues_unknown += 1;
    }

    /// Any other failed call, with its gRPC status code (none: failed before reaching a
    /// server) and message.
    pub fn failed(&self, code: Option<i32>, message: &str) {
        let mut g = self.lock();
        g.counts.errors += 1;
        let seq = g.counts.errors;
        if g.failures.len() < MAX_FAILURES {
            g.failures.push(Failure {
                seq,
                code,
                message: message.to_string(),
            });
        }
    }

    /// The failures recorded after number `since` (see [`Counts::errors`]).
    pub fn failures_since(&self, since: u64) -> Vec<Failure> {
        self.lock()
            .failures
            .iter()
            .filter(|f| f.seq > since)
            .cloned()
            .collect()
    }

    /// A lease-lost answer.
    pub fn lease_lost(&self) {
        self.lock().counts.lease_lost += 1;
    }

    /// A job was delivered (its reply just arrived) by a reserve sent at `reserve_sent`.
    pub fn delivered(&self, job: &Job, reserve_sent: SystemTime) {
        let mut bad = Vec::new();
        {
            let mut g = self.lock();
            let cycle = g.cycle;
            let lossy = g.lossy;
            g.counts.deliveries += 1;
            let id = &job.id;
            let seed = job.payload.as_ref().and_then(|p| payload_seed(&p.data));
            // A debounce job carries its key in its custom map (the delivery may arrive before
            // the enqueue's acknowledgement is recorded).
            let key = match job.custom.get(DEBOUNCE_KEY_ENTRY) {
                Some(sepp_rs::Value::String(k)) => Some(k.as_str()),
                _ => None,
            };
            if job.queue == DEBOUNCE_QUEUE
                && let Some(s) = seed
            {
                match key.and_then(|k| g.debounce.get(k).map(|d| (k, d))) {
                    None => bad.push(format!(
                        "job {id}: delivered from {DEBOUNCE_QUEUE} without a key the load sent \
                         (custom {:?})",
                        job.custom
                    )),
                    Some((k, d)) => match d.seeds.iter().rposition(|v| *v == s) {
                        None => bad.push(format!(
                            "job {id} (key {k}): payload of seed {s}, never sent for its key"
                        )),
                        Some(v) => {
                            let floor = d.floor(reserve_sent);
                            if v < floor && !lossy {
                                bad.push(format!(
                                    "job {id} (key {k}) attempt {}: delivered version {v}, \
                                     version {floor} was acknowledged as written before the \
                                     reserve was sent: an acknowledged replacement undone",
                                    job.attempt
                                ));
                            }
                        }
                    },
                }
            }
            let j = g.jobs.entry(job.id.clone()).or_default();
            j.touched = cycle;
            match (seed, j.seed) {
                (None, _) => bad.push(format!(
                    "job {id} attempt {}: payload corrupted ({} bytes)",
                    job.attempt,
                    job.payload.as_ref().map_or(0, |p| p.data.len())
                )),
                // Checked against its key's versions above.
                (Some(_), _) if job.queue == DEBOUNCE_QUEUE => {}
                (Some(s), Some(want)) if s != want => bad.push(format!(
                    "job {id}: payload of seed {s}, enqueued with seed {want}"
                )),
                (Some(s), _) => j.seed = Some(s),
            }
            if (job.queue != QUEUE && job.queue != DEBOUNCE_QUEUE) || job.job_type != JOB_TYPE {
                bad.push(format!(
                    "job {id}: delivered from {}/{}",
                    job.queue, job.job_type
                ));
            }
            if let Some(m) = j.max_attempts
                && m != job.max_attempts
            {
                bad.push(format!(
                    "job {id}: max_attempts {} delivered, {m} enqueued",
                    job.max_attempts
                ));
            }
            if job.attempt == 0 || job.attempt > job.max_attempts {
                bad.push(format!(
                    "job {id}: attempt {} delivered, max_attempts {}",
                    job.attempt, job.max_attempts
                ));
            }
            if let Some(a) = j.acked {
                if lossy {
                    // Checked at the restart that follows the cut.
                } else {
                    bad.push(format!(
                        "job {id}: delivered again (attempt {}) after its ack of attempt {a} \
                         was acknowledged",
                        job.attempt
                    ));
                }
            }
            if j.server_final && !lossy && j.acked.is_none() && !j.dead_lettered {
                bad.push(format!(
                    "job {id}: delivered (attempt {}) after the server showed it completed or \
                     dead-lettered",
                    job.attempt
                ));
            }
            if j.dead_lettered && !lossy {
                bad.push(format!(
                    "job {id}: delivered (attempt {}) after an acknowledged nack dead-lettered it",
                    job.attempt
                ));
            }
            let expires = job.lease_expires_at.unwrap_or(SystemTime::UNIX_EPOCH);
            // The new lease was granted before its reply arrived (now); the server's expiry
            // minus the requested duration is only a lower bound of the grant (the server
            // reads its clock before it takes its lock).
            let received = SystemTime::now();
            if let Some(prev) = j.deliveries.last() {
                if job.attempt <= prev.attempt {
                    bad.push(format!(
                        "job {id}: attempt {} delivered after attempt {} (cycle {} then {cycle}): \
                         attempts repeated or reset",
                        job.attempt, prev.attempt, prev.cycle
                    ));
                }
                if received + SLACK < prev.end_lb {
                    bad.push(format!(
                        "job {id}: attempt {} delivered at {:?} while attempt {}'s lease ran to \
                         at least {:?}: two workers held the job",
                        job.attempt,
                        since_epoch(received),
                        prev.attempt,
                        since_epoch(prev.end_lb)
                    ));
                }
            }
            j.max_attempt = j.max_attempt.max(job.attempt);
            j.delivered_ever = true;
            j.deliveries.push(Delivery {
                attempt: job.attempt,
                end_lb: expires,
                cycle,
            });
        }
        for b in bad {
            self.violation(b);
        }
    }

    fn with_delivery(&self, id: &str, attempt: u32, f: impl FnOnce(&mut Delivery)) {
        let mut g = self.lock();
        if let Some(d) = g
            .jobs
            .get_mut(id)
            .and_then(|j| j.deliveries.iter_mut().rev().find(|d| d.attempt == attempt))
        {
            f(d);
        }
    }

    /// A nack or an ack (`ack`) is about to be sent: the lease may end from now on.
    pub fn settling(&self, id: &str, attempt: u32, ack: bool) {
        let now = SystemTime::now();
        if ack && let Some(j) = self.lock().jobs.get_mut(id) {
            j.ack_sent = true;
        }
        self.with_delivery(id, attempt, |d| d.end_lb = d.end_lb.min(now));
    }

    /// An extend was acknowledged: the lease now runs to `until`.
    pub fn extended(&self, id: &str, attempt: u32, until: SystemTime) {
        self.lock().counts.extends += 1;
        self.with_delivery(id, attempt, |d| d.end_lb = d.end_lb.max(until));
    }

    /// An ack was acknowledged.
    pub fn acked(&self, id: &str, attempt: u32) {
        let mut g = self.lock();
        let cycle = g.cycle;
        g.counts.acks += 1;
        let j = g.jobs.entry(id.to_string()).or_default();
        j.touched = cycle;
        j.acked = Some(attempt);
    }

    /// A nack was acknowledged; `dead_letter` = it asked for a dead letter.
    pub fn nacked(&self, id: &str, attempt: u32, dead_letter: bool, dead_lettered: bool) {
        let mut bad = None;
        {
            let mut g = self.lock();
            let cycle = g.cycle;
            g.counts.nacks += 1;
            let j = g.jobs.entry(id.to_string()).or_default();
            j.touched = cycle;
            if dead_lettered {
                j.dead_lettered = true;
            }
            if let Some(max) = j.max_attempts {
                let expect = dead_letter || attempt >= max;
                if expect != dead_lettered {
                    bad = Some(format!(
                        "job {id}: nack of attempt {attempt} (max_attempts {max}, dead_letter \
                         asked: {dead_letter}) answered dead_lettered = {dead_lettered}"
                    ));
                }
            }
        }
        if let Some(b) = bad {
            self.violation(b);
        }
    }

    /// The number of violations so far.
    pub fn violations(&self) -> usize {
        self.lock().violations.len()
    }

    /// Counts so far.
    pub fn counts(&self) -> Counts {
        self.lock().counts.clone()
    }

    /// Buffer-mode losses so far.
    pub fn losses(&self) -> Losses {
        self.lock().losses.clone()
    }

    /// Jobs with an acknowledged enqueue, and keys acknowledged.
    pub fn sizes(&self) -> (usize, usize) {
        let g = self.lock();
        (
            g.jobs
                .values()
                .filter(|j| j.enqueue_acked_at.is_some())
                .count(),
            g.keys.values().filter(|v| v.is_some()).count(),
        )
    }

    /// Checks the server's view against the client's, after a restart (load paused).
    ///
    /// `full`: every job and key; otherwise the jobs touched in the last two cycles, every job
    /// not yet acked or dead-lettered, every key whose enqueue is unresolved, and a random
    /// sample of `sample` older ones. `cut_at`: when the power was cut (buffer mode: losses
    /// are measured from there).
    pub async fn verify(
        &self,
        client: &SeppClient,
        full: bool,
        sample: usize,
        cut_at: Option<SystemTime>,
    ) -> Result<(), String> {
        let (jobs, keys) = {
            let g = self.lock();
            let cycle = g.cycle;
            let mut rng = new_rng();
            #[allow(clippy::type_complexity)]
            let jobs: Vec<(
                String,
                Option<String>,
                bool,
                bool,
                bool,
                u32,
                Option<SystemTime>,
            )> = g
                .jobs
                .iter()
                .filter(|(_, j)| j.enqueue_acked_at.is_some() || j.delivered_ever)
                .filter(|(_, j)| {
                    full || !j.settled()
                        || j.touched + 2 >= cycle
                        || rng.random_range(0..g.jobs.len().max(1)) < sample
                })
                .filter(|(_, j)| !j.lost)
                .map(|(id, j)| {
                    (
                        id.clone(),
                        j.key.clone(),
                        j.acked.is_some(),
                        j.ack_sent,
                        j.dead_lettered,
                        j.max_attempt,
                        j.enqueue_acked_at,
                    )
                })
                .collect();
            let keys: Vec<(String, Option<String>)> = g
                .keys
                .iter()
                .filter(|(_, id)| {
                    full || id.is_none()
                        || id
                            .as_ref()
                            .and_then(|i| g.jobs.get(i))
                            .is_some_and(|j| !j.settled() || j.touched + 2 >= cycle)
                        || rng.random_range(0..g.keys.len().max(1)) < sample
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            (jobs, keys)
        };
        let mut checks = 0u64;
        let mut bad = Vec::new();
        let mut lost_enqueues = Vec::new();
        let mut undone_acks = Vec::new();
        let mut rolled_back = Vec::new();
        let mut finals = Vec::new();
        let infos = get_jobs(client, jobs.iter().map(|j| j.0.clone())).await?;
        let records = lookup_keys(client, keys.iter().map(|k| k.0.clone())).await?;
        let named = get_jobs(client, records.values().flatten().map(|r| r.job_id.clone())).await?;
        for (id, key, acked, ack_sent, dead, max_attempt, acked_at) in jobs {
            checks += 1;
            let info = &infos[&id];
            let state = info.state;
            let known = !matches!(state, JobState::Unknown);
            if matches!(state, JobState::Acked | JobState::DeadLettered)
                || (!known && key.is_none() && (acked || ack_sent))
            {
                finals.push(id.clone());
            }
            // An acked unkeyed job leaves nothing behind (no record names it); one whose ack
            // reply was lost may be acked too.
            if acked_at.is_some() && !known && !(key.is_none() && (acked || ack_sent)) {
                if self.lossy {
                    lost_enqueues.push((id.clone(), acked_at));
                    continue;
                }
                bad.push(format!(
                    "job {id} (key {key:?}): its enqueue was acknowledged, the server does not \
                     know it"
                ));
                continue;
            }
            if acked && !matches!(state, JobState::Acked | JobState::Unknown) {
                if self.lossy {
                    undone_acks.push(id.clone());
                    continue;
                }
                bad.push(format!(
                    "job {id}: its ack was acknowledged, the server has it {state:?}"
                ));
            }
            if dead && !matches!(state, JobState::DeadLettered) && !self.lossy {
                bad.push(format!(
                    "job {id}: an acknowledged nack dead-lettered it, the server has it {state:?}"
                ));
            }
            if known && !matches!(state, JobState::Acked) && info.attempt < max_attempt {
                if self.lossy {
                    rolled_back.push((id.clone(), info.attempt));
                    continue;
                }
                bad.push(format!(
                    "job {id}: attempt {max_attempt} was delivered, the server is at attempt {} \
                     ({state:?}): attempts reset",
                    info.attempt
                ));
            }
            let want_queue = key.as_deref().map_or(QUEUE, queue_of_key);
            if known && (info.queue != want_queue || info.job_type != JOB_TYPE) {
                bad.push(format!(
                    "job {id}: the server has it on {}/{} ({state:?})",
                    info.queue, info.job_type
                ));
            }
        }
        for (key, id) in keys {
            checks += 1;
            let rec = records[&key].clone();
            match (&id, rec) {
                (Some(id), None) => {
                    if !self.lossy {
                        bad.push(format!(
                            "key {key}: acknowledged with job {id}, the server has no record"
                        ));
                    }
                }
                (Some(id), Some(r)) if &r.job_id != id => bad.push(format!(
                    "key {key}: acknowledged with job {id}, the server's record names job {}",
                    r.job_id
                )),
                (_, Some(r)) => {
                    // The record names a job that exists (it may be completed: a tombstone
                    // stays while a record names it).
                    checks += 1;
                    let info = &named[&r.job_id];
                    if matches!(info.state, JobState::Unknown) {
                        bad.push(format!(
                            "key {key}: the dedup record names job {}, which the server does \
                             not know",
                            r.job_id
                        ));
                    }
                }
                (None, None) => {}
            }
        }
        {
            let mut g = self.lock();
            g.counts.checks += checks;
            for id in finals {
                if let Some(j) = g.jobs.get_mut(&id) {
                    j.server_final = true;
                }
            }
            if self.lossy {
                let cut = cut_at.unwrap_or_else(SystemTime::now);
                for (id, at) in lost_enqueues {
                    let age = at
                        .and_then(|a| cut.duration_since(a).ok())
                        .unwrap_or_default();
                    g.losses.enqueues.push(age);
                    if let Some(j) = g.jobs.get_mut(&id) {
                        j.lost = true;
                        if let Some(k) = j.key.clone() {
                            g.keys.insert(k, None);
                        }
                    }
                }
                for (id, attempt) in rolled_back {
                    g.losses.attempts += 1;
                    if let Some(j) = g.jobs.get_mut(&id) {
                        j.max_attempt = attempt;
                    }
                }
                for id in undone_acks {
                    g.losses.acks += 1;
                    if let Some(j) = g.jobs.get_mut(&id) {
                        j.acked = None;
                    }
                }
            }
        }
        for b in bad {
            self.violation(b);
        }
        Ok(())
    }

    /// Buffer mode, after a cut: forget the leases of earlier incarnations (a lost lease
    /// write lets the job be delivered again under the same attempt) and the dead letters
    /// not confirmed by the server; the loss is counted by [`Model::verify`].
    pub fn forget_leases(&self) {
        let mut g = self.lock();
        let mut n = 0;
        for j in g.jobs.values_mut() {
            if !j.deliveries.is_empty() {
                n += 1;
                j.deliveries.clear();
            }
            j.dead_lettered = false;
        }
        let _ = n;
    }

    /// Every job and key the model knows, in a fixed order, with whether the server knows
    /// it (a job: any state but unknown; a key: a live record).
    pub async fn existence(&self, client: &SeppClient) -> Result<Vec<(String, bool)>, String> {
        let (mut ids, mut keys): (Vec<String>, Vec<String>) = {
            let g = self.lock();
            (
                g.jobs.keys().cloned().collect(),
                g.keys.keys().cloned().collect(),
            )
        };
        ids.sort();
        keys.sort();
        let infos = get_jobs(client, ids.iter().cloned()).await?;
        let recs = lookup_keys(client, keys.iter().cloned()).await?;
        let mut out: Vec<(String, bool)> = ids
            .into_iter()
            .map(|id| {
                let known = !matches!(infos[&id].state, JobState::Unknown);
                (format!("job {id}"), known)
            })
            .collect();
        out.extend(keys.into_iter().map(|k| {
            let found = recs[&k].is_some();
            (format!("key {k}"), found)
        }));
        self.lock().counts.checks += out.len() as u64;
        Ok(out)
    }

    /// At the end (load stopped, queue drained): every acknowledged enqueue was delivered at
    /// least once or is dead-lettered.
    pub async fn verify_end(&self, client: &SeppClient) -> Result<(), String> {
        let jobs: Vec<(String, bool)> = {
            let g = self.lock();
            g.jobs
                .iter()
                .filter(|(_, j)| j.enqueue_acked_at.is_some() && !j.lost)
                .map(|(id, j)| (id.clone(), j.delivered_ever))
                .collect()
        };
        let mut bad = Vec::new();
        let undelivered: Vec<String> = jobs
            .into_iter()
            .filter(|(_, delivered)| !delivered)
            .map(|(id, _)| id)
            .collect();
        let infos = get_jobs(client, undelivered.iter().cloned()).await?;
        for id in undelivered {
            let info = &infos[&id];
            if !matches!(info.state, JobState::DeadLettered) {
                bad.push(format!(
                    "job {id}: acknowledged at enqueue, never delivered, and {:?} at the end",
                    info.state
                ));
            }
        }
        for b in bad {
            self.violation(b);
        }
        Ok(())
    }
}

/// Look-ups run this many at a time.
const CONCURRENT_CHECKS: usize = 16;

async fn get_jobs(
    client: &SeppClient,
    ids: impl Iterator<Item = String>,
) -> Result<HashMap<String, sepp_rs::admin::JobInfo>, String> {
    use futures_util::StreamExt;
    futures_util::stream::iter(ids)
        .map(|id| async move {
            // Reads are refused with UNAVAILABLE for the few milliseconds the embedded store
            // takes to reopen after running out of space (docs/durability.md): retried, with a
            // deadline, like any client would.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                match client.get_job(&id).await {
                    Ok(info) => return Ok((id, info)),
                    Err(e)
                        if e.code() == sepp_rs::ErrorCode::Transport
                            && std::time::Instant::now() < deadline =>
                    {
                        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    }
                    Err(e) => return Err(format!("GetJob {id}: {e}")),
                }
            }
        })
        .buffer_unordered(CONCURRENT_CHECKS)
        .collect::<Vec<Result<_, String>>>()
        .await
        .into_iter()
        .collect()
}

async fn lookup_keys(
    client: &SeppClient,
    keys: impl Iterator<Item = String>,
) -> Result<HashMap<String, Option<sepp_rs::admin::KeyRecord>>, String> {
    use futures_util::StreamExt;
    futures_util::stream::iter(keys)
        .map(|key| async move {
            let r = client
                .lookup_idempotency_key(queue_of_key(&key), &key)
                .await
                .map_err(|e| format!("LookupIdempotencyKey {key}: {e}"))?;
            Ok((key, r))
        })
        .buffer_unordered(CONCURRENT_CHECKS)
        .collect::<Vec<Result<_, String>>>()
        .await
        .into_iter()
        .collect()
}

fn since_epoch(t: SystemTime) -> Duration {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_check_themselves() {
        let p = payload(42, 100);
        assert_eq!(payload_seed(&p), Some(42));
        let mut torn = p.clone();
        torn[50] ^= 1;
        assert_eq!(payload_seed(&torn), None);
        assert_eq!(payload_seed(&p[..60]), None);
    }

    fn job(id: &str, attempt: u32, expires: SystemTime) -> Job {
        Job {
            id: id.into(),
            queue: QUEUE.into(),
            job_type: JOB_TYPE.into(),
            payload: Some(sepp_rs::Payload {
                data: payload(7, 10),
                encoding: "application/octet-stream".into(),
            }),
            priority: 0,
            trace_context: None,
            enqueued_at: None,
            attempt,
            max_attempts: 3,
            lease_expires_at: Some(expires),
            custom: Default::default(),
            scheduled_at: None,
        }
    }

    /// The checker can fail: each rule it enforces on events fires on a breach.
    #[test]
    fn event_rules_catch_their_breaches() {
        let lease = Duration::from_secs(1);
        // Attempt 1's lease runs for a second from now.
        let t0 = SystemTime::now() + lease;
        let m = Model::new(false);
        m.enqueued(Some("k"), "a", false, 7, 3);
        m.enqueued(Some("k"), "b", true, 7, 3);
        assert_eq!(m.violations(), 1, "a key naming two jobs");
        let sent = SystemTime::now();
        m.delivered(&job("a", 1, t0), sent);
        assert_eq!(m.violations(), 1);
        // Attempt 2 leased before attempt 1's lease ran out: two holders.
        m.delivered(&job("a", 2, t0 + Duration::from_millis(500)), sent);
        assert_eq!(m.violations(), 2);
        // The same attempt again (after its lease was ended by a nack): a reset.
        m.settling("a", 2, false);
        m.delivered(&job("a", 2, t0 + Duration::from_secs(5)), sent);
        assert_eq!(m.violations(), 3);
        m.settling("a", 2, true);
        m.acked("a", 2);
        m.delivered(&job("a", 3, t0 + Duration::from_secs(10)), sent);
        assert_eq!(m.violations(), 4, "delivered after an acknowledged ack");
        let mut over = job("c", 4, t0);
        over.id = "c".into();
        m.delivered(&over, sent);
        assert_eq!(m.violations(), 5, "attempt above max_attempts");
        let mut torn = job("d", 1, t0);
        torn.payload.as_mut().unwrap().data[13] ^= 0xff;
        m.delivered(&torn, sent);
        assert_eq!(m.violations(), 6, "corrupted payload");
    }

    /// The debounce rules fire on their breaches: a version never sent for the key, and a
    /// version older than a replacement acknowledged before the reserve was sent.
    #[test]
    fn debounce_rules_catch_their_breaches() {
        let m = Model::new(false);
        let deliver = |id: &str, attempt: u32, seed: u64, sent: SystemTime| {
            let mut j = job(id, attempt, SystemTime::now());
            j.queue = DEBOUNCE_QUEUE.into();
            j.payload.as_mut().unwrap().data = payload(seed, 10);
            j.custom
                .insert(DEBOUNCE_KEY_ENTRY.into(), sepp_rs::Value::from("d0-1"));
            m.delivered(&j, sent);
        };
        m.debounce_sending("d0-1", 100);
        m.debounce_enqueued("d0-1", "x", false, false, 0, 3);
        let before_replace = SystemTime::now();
        m.debounce_sending("d0-1", 101);
        m.debounce_enqueued("d0-1", "x", true, true, 1, 3);
        m.debounce_sending("d0-1", 102);
        // Version 2 sent but not yet acknowledged: a reserve may see version 1 or 2.
        let after_replace = SystemTime::now() + Duration::from_millis(1);
        deliver("x", 1, 101, after_replace);
        deliver("x", 2, 102, after_replace + Duration::from_secs(5));
        assert_eq!(m.violations(), 0);
        // Version 0 delivered to a reserve sent before the replacement's ack: allowed.
        let m2 = Model::new(false);
        m2.debounce_sending("d0-1", 100);
        m2.debounce_enqueued("d0-1", "x", false, false, 0, 3);
        m2.debounce_sending("d0-1", 101);
        m2.debounce_enqueued("d0-1", "x", true, true, 1, 3);
        let mut j = job("x", 1, SystemTime::now());
        j.queue = DEBOUNCE_QUEUE.into();
        j.custom
            .insert(DEBOUNCE_KEY_ENTRY.into(), sepp_rs::Value::from("d0-1"));
        j.payload.as_mut().unwrap().data = payload(100, 10);
        m2.delivered(&j, before_replace);
        assert_eq!(m2.violations(), 0);
        // The same delivery to a reserve sent after the replacement's ack: undone.
        j.attempt = 2;
        m2.delivered(&j, after_replace + Duration::from_secs(10));
        assert_eq!(m2.violations(), 1, "an acknowledged replacement undone");
        // A payload never sent for the key.
        deliver("x", 3, 999, after_replace + Duration::from_secs(20));
        assert_eq!(m.violations(), 1, "a version never sent");
        // replaced = true on a first enqueue.
        m.debounce_sending("d0-2", 5);
        m.debounce_enqueued("d0-2", "y", false, true, 0, 3);
        assert_eq!(m.violations(), 2, "replaced without a hit");
    }
}
