//! The model test: random sequences of everything a client and an operator can do (enqueue,
//! keyed and unkeyed, in batches and atomic batches; reserve; ack, nack with each strategy and
//! extend, current and stale; requeue, delete and drain of dead letters; pause and resume;
//! clock advances, each followed by the sweeper's passes; restarts) run against a backend
//! through [`Queue`] on a [`ManualClock`], and against a small reference model written from
//! `../shared/spec/` (`semantics.md`, `idempotency.md`). After every step the answers must be
//! equal, and so must what the backend holds: every job's state and attempt, every queue's
//! counts and pause flag, every dedup record.
//!
//! A backend runs it with one line in its own tests (like the conformance suite):
//!
//! ```ignore
//! crate::storage::model::model_test!(my_backend());
//! ```
//!
//! `SEPP_TEST_MODEL_CASES` sets the number of random sequences (default 16, for CI; `make
//! soak-model` runs many more). A failure is shrunk to a shortest sequence, printed, and kept in
//! `proptest-regressions/` so that it runs first from then on.
//!
//! The model's conventions where the spec leaves a choice open, all of them the documented
//! behaviour (`docs/lifecycle.md`): ready jobs are taken by priority, then enqueue order, queue
//! by queue in the order listed; dead letters are oldest first by failure time, then by job id;
//! due work (a lease, a schedule, a dedup record, a retention) is due when its time is reached
//! (`<= now`), and every clock advance is followed by sweeper passes until nothing is due.

use super::conformance::{Backend, T0};
use crate::config::{Config, OnDuplicate, QueueConfig};
use crate::domain::{DeadLetterCause, JobId, JobState, UnixMs};
use crate::error::QueueError;
use crate::queue::admin::SelectorInput;
use crate::queue::clock::{Clock, ManualClock};
use crate::queue::limits::Limits;
use crate::queue::model::{EnqueueInput, Rejection};
use crate::queue::{NackStrategy, Queue, ReserveInput};
use crate::storage::Store;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The queues of a run; the last has `max_queue_depth = DEPTH`, and `DEBOUNCED` has
/// `on_duplicate = "replace_pending"`.
const QUEUES: [&str; 3] = ["a", "b", "c"];
const DEBOUNCED: usize = 1;
const DEPTH: u64 = 3;
const WINDOW_MS: u64 = 6_000;
const MAX_LEASE_MS: u64 = 2_000;
const HORIZON_MS: u64 = 60_000;

/// One job of an enqueue.
#[derive(Debug, Clone)]
pub(crate) struct JobSpec {
    queue: usize,
    key: Option<u8>,
    priority: u32,
    /// 0 is invalid (`InvalidRequest`).
    max_attempts: u32,
    /// Scheduled this many ms ahead (0: ready at once).
    delay: Option<u64>,
}

/// Which delivery a settlement names.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Aim {
    /// Delivery number `n` of those seen (modulo their number), with its attempt: current or
    /// stale, as the model holds it.
    Seen(usize),
    /// A seen delivery with the attempt after its own (a mismatch or a future attempt).
    Next(usize),
    /// A job id nobody has.
    Unknown,
}

/// Which dead letters an admin call selects.
#[derive(Debug, Clone)]
pub(crate) enum Select {
    /// The oldest `max` of a queue, or of all.
    Oldest(Option<usize>, u32),
    /// These seen deliveries' jobs (whatever their state).
    Ids(Vec<usize>),
}

/// One step of a run.
#[derive(Debug, Clone)]
pub(crate) enum Op {
    Enqueue(Vec<JobSpec>, bool),
    Reserve(Vec<usize>, u32, u64),
    Ack(Aim),
    Nack(Aim, NackStrategy),
    Extend(Aim, i64),
    Requeue(Select),
    Delete(Select),
    Drain(Option<usize>, u32),
    Pause(usize, bool),
    Advance(i64),
    Restart,
}

fn job_spec() -> impl Strategy<Value = JobSpec> {
    (
        0..QUEUES.len(),
        prop::option::weighted(0.6, 0u8..4),
        0u32..3,
        prop_oneof![9 => 1u32..4, 1 => Just(0u32)],
        prop::option::weighted(0.2, prop_oneof![Just(0u64), 1u64..5_000]),
    )
        .prop_map(|(queue, key, priority, max_attempts, delay)| JobSpec {
            queue,
            key,
            priority,
            max_attempts,
            delay,
        })
}

fn aim() -> impl Strategy<Value = Aim> {
    prop_oneof![
        8 => any::<usize>().prop_map(Aim::Seen),
        2 => any::<usize>().prop_map(Aim::Next),
        1 => Just(Aim::Unknown),
    ]
}

fn select() -> impl Strategy<Value = Select> {
    prop_oneof![
        (prop::option::of(0..QUEUES.len()), 1u32..4).prop_map(|(q, m)| Select::Oldest(q, m)),
        prop::collection::vec(any::<usize>(), 1..3).prop_map(Select::Ids),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (prop::collection::vec(job_spec(), 1..4), any::<bool>())
            .prop_map(|(jobs, atomic)| Op::Enqueue(jobs, atomic)),
        5 => (
            Just((0..QUEUES.len()).collect::<Vec<_>>()).prop_shuffle(),
            1usize..=3,
            1u32..4,
            prop_oneof![100u64..1_500, 1_500u64..4_000],
        )
            .prop_map(|(qs, n, max, lease)| Op::Reserve(qs[..n].to_vec(), max, lease)),
        3 => aim().prop_map(Op::Ack),
        3 => (
            aim(),
            prop_oneof![
                Just(NackStrategy::Default),
                prop_oneof![Just(0i64), 1i64..3_000, Just(100_000i64)].prop_map(NackStrategy::Delay),
                Just(NackStrategy::DeadLetter),
            ]
        )
            .prop_map(|(a, s)| Op::Nack(a, s)),
        2 => (aim(), 1i64..4_000).prop_map(|(a, ms)| Op::Extend(a, ms)),
        1 => select().prop_map(Op::Requeue),
        1 => select().prop_map(Op::Delete),
        1 => (prop::option::of(0..QUEUES.len()), 1u32..4).prop_map(|(q, m)| Op::Drain(q, m)),
        1 => (0..QUEUES.len(), any::<bool>()).prop_map(|(q, p)| Op::Pause(q, p)),
        4 => prop_oneof![1i64..1_000, 1_000i64..7_000].prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

/// Where a job is, in the model.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MStage {
    Ready,
    Scheduled(UnixMs),
    InFlight(UnixMs),
    Dead(DeadLetterCause, UnixMs),
    /// Finished (acked, or dead-lettered with the cause) and remembered while its key lives.
    Tombstone(Option<DeadLetterCause>, UnixMs),
    Gone,
}

#[derive(Debug, Clone)]
struct MJob {
    queue: usize,
    priority: u32,
    max_attempts: u32,
    /// Deliveries started.
    attempt: u32,
    /// Enqueue order (a requeue puts the job at the back).
    order: u64,
    /// When the dedup record naming this job expires (keyed jobs).
    dedup_until: Option<UnixMs>,
    stage: MStage,
}

/// The reference model.
struct Model {
    now: UnixMs,
    retention_ms: u64,
    jobs: BTreeMap<JobId, MJob>,
    /// (queue, key) → (job, expires_at).
    dedup: HashMap<(usize, u8), (JobId, UnixMs)>,
    paused: [bool; QUEUES.len()],
    next_order: u64,
    /// Every delivery seen: (job, attempt).
    deliveries: Vec<(JobId, u32)>,
}

/// What an enqueue of one job comes to, in the model.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    Invalid,
    Created,
    /// A hit on a live record naming this job.
    Hit(JobId),
    /// A hit on the earlier job of the batch with this index (its id comes with the answer).
    HitOf(usize),
    /// A hit on a live record naming this job, still ready or scheduled, on the debounced
    /// queue: the hit replaces its contents (and moves it when the hit sends a time).
    Replace(JobId),
    Full,
}

impl Model {
    fn live(&self, q: usize) -> impl Iterator<Item = (&JobId, &MJob)> {
        self.jobs.iter().filter(move |(_, j)| {
            j.queue == q
                && matches!(
                    j.stage,
                    MStage::Ready | MStage::Scheduled(_) | MStage::InFlight(_)
                )
        })
    }

    /// What stays of a job that leaves the live set at `finished_at` (`dead`: dead-lettered).
    fn leave(&self, j: &MJob, dead: Option<DeadLetterCause>) -> MStage {
        match j.dedup_until {
            Some(until) if until > self.now => MStage::Tombstone(dead, until),
            _ => MStage::Gone,
        }
    }

    fn finish(&self, j: &MJob, dead: Option<DeadLetterCause>) -> MStage {
        match dead {
            Some(cause) if self.retention_ms > 0 => MStage::Dead(cause, self.now),
            _ => self.leave(j, dead),
        }
    }

    /// The outcome of each job of a batch, before ids are known.
    fn enqueue_plan(&self, jobs: &[JobSpec], atomic: bool) -> Vec<Outcome> {
        let invalid: Vec<bool> = jobs.iter().map(|j| j.max_attempts == 0).collect();
        if atomic && invalid.iter().any(|i| *i) {
            return invalid
                .iter()
                .map(|i| {
                    if *i {
                        Outcome::Invalid
                    } else {
                        Outcome::Created
                    }
                })
                .collect();
        }
        let mut out: Vec<Outcome> = Vec::new();
        let mut created = [0u64; QUEUES.len()];
        for (i, j) in jobs.iter().enumerate() {
            if invalid[i] {
                out.push(Outcome::Invalid);
                continue;
            }
            let earlier = j.key.and_then(|k| {
                (0..i)
                    .find(|e| !invalid[*e] && jobs[*e].queue == j.queue && jobs[*e].key == Some(k))
            });
            if let Some(e) = earlier {
                out.push(match out[e] {
                    Outcome::Full => Outcome::Full,
                    _ => Outcome::HitOf(e),
                });
                continue;
            }
            if let Some(k) = j.key
                && let Some((id, until)) = self.dedup.get(&(j.queue, k))
                && *until > self.now
            {
                let pending = self
                    .jobs
                    .get(id)
                    .is_some_and(|m| matches!(m.stage, MStage::Ready | MStage::Scheduled(_)));
                out.push(if j.queue == DEBOUNCED && pending {
                    Outcome::Replace(*id)
                } else {
                    Outcome::Hit(*id)
                });
                continue;
            }
            if j.queue == QUEUES.len() - 1 {
                let depth = self.live(j.queue).count() as u64 + created[j.queue];
                if depth >= DEPTH {
                    out.push(Outcome::Full);
                    continue;
                }
            }
            created[j.queue] += 1;
            out.push(Outcome::Created);
        }
        out
    }

    fn settle_target(&self, aim: Aim, id_of_unknown: JobId) -> (JobId, u32) {
        match aim {
            _ if self.deliveries.is_empty() => (id_of_unknown, 1),
            Aim::Seen(n) => self.deliveries[n % self.deliveries.len()],
            Aim::Next(n) => {
                let (id, a) = self.deliveries[n % self.deliveries.len()];
                (id, a + 1)
            }
            Aim::Unknown => (id_of_unknown, 1),
        }
    }

    /// The fence of a settlement: the job in flight under `attempt`.
    fn fence(&self, id: JobId, attempt: u32) -> Result<&MJob, Fenced> {
        match self.jobs.get(&id) {
            Some(j) => match j.stage {
                MStage::InFlight(expires) if expires > self.now => {
                    if j.attempt == attempt {
                        Ok(j)
                    } else {
                        Err(Fenced::Mismatch(j.attempt))
                    }
                }
                _ => Err(Fenced::NotInFlight),
            },
            None => Err(Fenced::NotInFlight),
        }
    }

    /// One sweep at `now`: expired leases, due schedules, expired keys, dead letters past their
    /// retention, tombstones past their time.
    fn sweep(&mut self) {
        let now = self.now;
        self.dedup.retain(|_, (_, until)| *until > now);
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in ids {
            let j = self.jobs[&id].clone();
            let stage = match j.stage {
                MStage::InFlight(expires) if expires <= now => {
                    if j.attempt >= j.max_attempts {
                        self.finish(&j, Some(DeadLetterCause::LeaseExpired))
                    } else {
                        MStage::Ready
                    }
                }
                MStage::Scheduled(due) if due <= now => MStage::Ready,
                MStage::Dead(cause, failed_at)
                    if failed_at.saturating_add(self.retention_ms as i64) <= now =>
                {
                    self.leave(&j, Some(cause))
                }
                MStage::Tombstone(_, until) if until <= now => MStage::Gone,
                s => s,
            };
            self.jobs.get_mut(&id).expect("known").stage = stage;
        }
    }

    fn dead_letters(&self, queue: Option<usize>) -> Vec<JobId> {
        let mut dead: Vec<(UnixMs, JobId)> = self
            .jobs
            .iter()
            .filter_map(|(id, j)| match j.stage {
                MStage::Dead(_, at) if queue.is_none_or(|q| q == j.queue) => Some((at, *id)),
                _ => None,
            })
            .collect();
        dead.sort();
        dead.into_iter().map(|(_, id)| id).collect()
    }

    fn selected(&self, s: &Select) -> (SelectorInput, Vec<JobId>) {
        match s {
            Select::Oldest(q, max) => (
                SelectorInput {
                    job_ids: Vec::new(),
                    queue: q.map(|q| QUEUES[q].to_string()),
                    max: Some(*max),
                },
                self.dead_letters(*q)
                    .into_iter()
                    .take(*max as usize)
                    .collect(),
            ),
            Select::Ids(picks) => {
                let mut ids: Vec<JobId> = picks
                    .iter()
                    .filter(|_| !self.deliveries.is_empty())
                    .map(|n| self.deliveries[n % self.deliveries.len()].0)
                    .collect();
                ids.sort();
                ids.dedup();
                let chosen = ids
                    .iter()
                    .copied()
                    .filter(|id| matches!(self.jobs[id].stage, MStage::Dead(..)))
                    .collect();
                (
                    SelectorInput {
                        job_ids: ids.iter().map(|i| i.to_string()).collect(),
                        queue: None,
                        max: None,
                    },
                    chosen,
                )
            }
        }
    }
}

enum Fenced {
    NotInFlight,
    Mismatch(u32),
}

fn config(retention_ms: u64) -> Config {
    let mut c = Config::default();
    c.storage.dead_letter_retention_ms = retention_ms;
    c.storage.dedup_window_ms = WINDOW_MS;
    c.limits.max_lease_duration_ms = MAX_LEASE_MS;
    c.limits.max_schedule_horizon_ms = HORIZON_MS;
    c.queues = vec![
        QueueConfig {
            name: QUEUES[DEBOUNCED].into(),
            on_duplicate: Some(OnDuplicate::ReplacePending),
            ..Default::default()
        },
        QueueConfig {
            name: QUEUES[QUEUES.len() - 1].into(),
            max_queue_depth: Some(DEPTH),
            ..Default::default()
        },
    ];
    c
}

/// The system under test: a backend under the queue layer.
struct System {
    backend: Box<dyn Backend>,
    clock: Arc<ManualClock>,
    limits: Arc<Limits>,
    store: Arc<dyn Store>,
    queue: Queue,
}

impl System {
    async fn open(backend: Box<dyn Backend>, retention_ms: u64) -> Self {
        let clock = Arc::new(ManualClock::new(T0));
        let limits = Arc::new(Limits::from_config(&config(retention_ms)).expect("limits"));
        let store = backend.open(T0).await;
        let queue = Self::queue(&store, &limits, &clock);
        System {
            backend,
            clock,
            limits,
            store,
            queue,
        }
    }

    fn queue(store: &Arc<dyn Store>, limits: &Arc<Limits>, clock: &Arc<ManualClock>) -> Queue {
        Queue::new(
            store.clone(),
            limits.clone(),
            clock.clone(),
            CancellationToken::new(),
        )
    }

    async fn restart(self) -> Self {
        self.store.close().await.expect("close");
        let System {
            backend,
            clock,
            limits,
            store,
            queue,
        } = self;
        // The old store lets go of its data directory once the last handle is dropped.
        drop(queue);
        drop(store);
        let store = backend.open(clock.now()).await;
        let queue = Self::queue(&store, &limits, &clock);
        System {
            backend,
            clock,
            limits,
            store,
            queue,
        }
    }

    async fn sweep_all(&self) {
        loop {
            let r = self.queue.sweep(1_000).await.expect("sweep");
            if !r.done.more {
                return;
            }
        }
    }
}

fn input(j: &JobSpec, now: UnixMs) -> EnqueueInput {
    EnqueueInput {
        queue: QUEUES[j.queue].into(),
        job_type: "t".into(),
        idempotency_key: j.key.map(|k| format!("k{k}")),
        priority: Some(j.priority),
        max_attempts: Some(j.max_attempts),
        scheduled_at: j.delay.map(|d| Ok(now + d as i64)),
        ..Default::default()
    }
}

fn fenced(r: Result<impl std::fmt::Debug, QueueError>, want: Fenced, what: &str) {
    match (r, want) {
        (Err(QueueError::JobNotInFlight(_)), Fenced::NotInFlight) => {}
        (Err(QueueError::AttemptMismatch { current, .. }), Fenced::Mismatch(c)) if current == c => {
        }
        (r, Fenced::NotInFlight) => panic!("{what}: expected NOT_FOUND (not in flight), got {r:?}"),
        (r, Fenced::Mismatch(c)) => {
            panic!("{what}: expected FAILED_PRECONDITION (current attempt {c}), got {r:?}")
        }
    }
}

/// Applies `op` to the system and the model and compares the answers.
async fn step(sys: System, m: &mut Model, op: &Op) -> System {
    let unknown = JobId(0x0123_4567_89ab_4def_8123_4567_89ab_cdef);
    match op {
        Op::Enqueue(jobs, atomic) => {
            let plan = m.enqueue_plan(jobs, *atomic);
            let inputs = jobs.iter().map(|j| input(j, m.now)).collect();
            let writes = !(*atomic
                && plan
                    .iter()
                    .any(|o| matches!(o, Outcome::Invalid | Outcome::Full)));
            let mut ids: Vec<Option<JobId>> = vec![None; jobs.len()];
            if *atomic {
                match sys.queue.enqueue_atomic(inputs).await.expect("enqueue") {
                    Ok(acks) => {
                        assert!(writes, "atomic batch accepted; model: {plan:?}");
                        for (i, a) in acks.iter().enumerate() {
                            ids[i] = Some(a.job_id);
                            check_ack(&plan, i, a.job_id, a.deduplicated, &ids);
                            check_replaced(&plan, i, a.replaced);
                        }
                    }
                    Err(failures) => {
                        assert!(
                            !writes,
                            "atomic batch refused: {failures:?}; model: {plan:?}"
                        );
                        let invalid = plan.contains(&Outcome::Invalid);
                        let want: Vec<u32> = plan
                            .iter()
                            .enumerate()
                            .filter(|(_, o)| {
                                if invalid {
                                    **o == Outcome::Invalid
                                } else {
                                    **o == Outcome::Full
                                }
                            })
                            .map(|(i, _)| i as u32)
                            .collect();
                        let got: Vec<u32> = failures.iter().map(|(i, _)| *i).collect();
                        assert_eq!(got, want, "failing indexes; model: {plan:?}");
                        for (_, r) in failures {
                            assert!(
                                matches!(
                                    (&r, invalid),
                                    (Rejection::InvalidRequest { .. }, true)
                                        | (Rejection::QueueFull { .. }, false)
                                ),
                                "{r:?}"
                            );
                        }
                        return sys;
                    }
                }
            } else {
                let outcomes = sys.queue.enqueue_batch(inputs).await.expect("enqueue");
                assert_eq!(outcomes.len(), jobs.len());
                for (i, o) in outcomes.into_iter().enumerate() {
                    match (o, plan[i]) {
                        (Err(Rejection::InvalidRequest { .. }), Outcome::Invalid) => {}
                        (Err(Rejection::QueueFull { limit, .. }), Outcome::Full) => {
                            assert_eq!(limit, DEPTH)
                        }
                        (Ok(a), _) => {
                            ids[i] = Some(a.job_id);
                            check_ack(&plan, i, a.job_id, a.deduplicated, &ids);
                            check_replaced(&plan, i, a.replaced);
                        }
                        (o, want) => panic!("job {i}: got {o:?}, model: {want:?}"),
                    }
                }
            }
            for (i, j) in jobs.iter().enumerate() {
                if let Outcome::Replace(id) = plan[i] {
                    // Only the job's place changes (its contents are not modelled); a hit
                    // without a time leaves it where it is.
                    if let (Some(d), Some(mj)) = (j.delay, m.jobs.get_mut(&id)) {
                        mj.stage = if d > 0 {
                            MStage::Scheduled(m.now + d as i64)
                        } else {
                            MStage::Ready
                        };
                    }
                    continue;
                }
                if plan[i] != Outcome::Created {
                    continue;
                }
                let id = ids[i].expect("created");
                assert!(!m.jobs.contains_key(&id), "a new job has a known id {id}");
                let dedup_until = j.key.map(|k| {
                    let until = m.now + WINDOW_MS as i64;
                    m.dedup.insert((j.queue, k), (id, until));
                    until
                });
                let stage = match j.delay {
                    Some(d) if d > 0 => MStage::Scheduled(m.now + d as i64),
                    _ => MStage::Ready,
                };
                m.next_order += 1;
                m.jobs.insert(
                    id,
                    MJob {
                        queue: j.queue,
                        priority: j.priority,
                        max_attempts: j.max_attempts,
                        attempt: 0,
                        order: m.next_order,
                        dedup_until,
                        stage,
                    },
                );
            }
        }
        Op::Reserve(queues, max, lease) => {
            let expires = m.now + (*lease).min(MAX_LEASE_MS) as i64;
            let mut want = Vec::new();
            for q in queues {
                if m.paused[*q] {
                    continue;
                }
                let mut ready: Vec<(u32, u64, JobId)> = m
                    .jobs
                    .iter()
                    .filter(|(_, j)| j.queue == *q && j.stage == MStage::Ready)
                    .map(|(id, j)| (u32::MAX - j.priority, j.order, *id))
                    .collect();
                ready.sort();
                want.extend(ready.into_iter().map(|(_, _, id)| id));
            }
            want.truncate(*max as usize);
            let got = sys
                .queue
                .reserve(ReserveInput {
                    queues: queues.iter().map(|q| QUEUES[*q].to_string()).collect(),
                    lease_ms: Some(*lease as i64),
                    max_jobs: Some(*max),
                    wait_timeout_ms: None,
                    worker_id: None,
                })
                .await
                .expect("reserve");
            let got_ids: Vec<JobId> = got.iter().map(|j| j.id).collect();
            assert_eq!(got_ids, want, "reserved jobs");
            for j in &got {
                let mj = m.jobs.get_mut(&j.id).expect("known");
                mj.attempt += 1;
                mj.stage = MStage::InFlight(expires);
                assert_eq!(j.attempt, mj.attempt, "attempt of {}", j.id);
                assert_eq!(j.lease_expires_at, Some(expires), "lease of {}", j.id);
                m.deliveries.push((j.id, j.attempt));
            }
        }
        Op::Ack(aim) => {
            let (id, attempt) = m.settle_target(*aim, unknown);
            let r = sys.queue.ack(&id.to_string(), attempt).await;
            match m.fence(id, attempt) {
                Ok(j) => {
                    r.expect("ack");
                    let stage = m.finish(j, None);
                    m.jobs.get_mut(&id).expect("known").stage = stage;
                }
                Err(f) => fenced(r, f, "ack"),
            }
        }
        Op::Nack(aim, strategy) => {
            let (id, attempt) = m.settle_target(*aim, unknown);
            let r = sys
                .queue
                .nack(&id.to_string(), attempt, *strategy, Some("r".into()))
                .await;
            match m.fence(id, attempt) {
                Ok(j) => {
                    let (stage, dead) = match strategy {
                        NackStrategy::DeadLetter => {
                            (m.finish(j, Some(DeadLetterCause::Rejected)), true)
                        }
                        _ if j.attempt >= j.max_attempts => {
                            (m.finish(j, Some(DeadLetterCause::AttemptsExhausted)), true)
                        }
                        NackStrategy::Default => (MStage::Ready, false),
                        NackStrategy::Delay(ms) => {
                            let at = m.now + (*ms as u64).min(HORIZON_MS) as i64;
                            if at <= m.now {
                                (MStage::Ready, false)
                            } else {
                                (MStage::Scheduled(at), false)
                            }
                        }
                    };
                    assert_eq!(r.expect("nack"), dead, "nack's dead_lettered");
                    m.jobs.get_mut(&id).expect("known").stage = stage;
                }
                Err(f) => fenced(r, f, "nack"),
            }
        }
        Op::Extend(aim, ms) => {
            let (id, attempt) = m.settle_target(*aim, unknown);
            let r = sys.queue.extend(&id.to_string(), attempt, Some(*ms)).await;
            match m.fence(id, attempt) {
                Ok(_) => {
                    let expires = m.now + (*ms as u64).min(MAX_LEASE_MS) as i64;
                    assert_eq!(r.expect("extend"), expires, "extended lease");
                    m.jobs.get_mut(&id).expect("known").stage = MStage::InFlight(expires);
                }
                Err(f) => fenced(r, f, "extend"),
            }
        }
        Op::Requeue(s) => {
            let (sel, want) = m.selected(s);
            let mut got = sys.queue.requeue_dead_letters(sel).await.expect("requeue");
            if matches!(s, Select::Ids(_)) {
                got.sort();
            }
            assert_eq!(got, want, "requeued");
            for id in want {
                m.next_order += 1;
                let order = m.next_order;
                let j = m.jobs.get_mut(&id).expect("known");
                j.stage = MStage::Ready;
                j.attempt = 0;
                j.order = order;
            }
        }
        Op::Delete(s) => {
            let (sel, want) = m.selected(s);
            let mut got = sys.queue.delete_dead_letters(sel).await.expect("delete");
            if matches!(s, Select::Ids(_)) {
                got.sort();
            }
            assert_eq!(got, want, "deleted");
            for id in want {
                remove_dead(m, id);
            }
        }
        Op::Drain(q, max) => {
            let want: Vec<JobId> = m.dead_letters(*q).into_iter().take(*max as usize).collect();
            let got: Vec<JobId> = sys
                .queue
                .drain_dead_letters(q.map(|q| QUEUES[q].to_string()), Some(*max))
                .await
                .expect("drain")
                .into_iter()
                .map(|d| d.job.id)
                .collect();
            assert_eq!(got, want, "drained");
            for id in want {
                remove_dead(m, id);
            }
        }
        Op::Pause(q, paused) => {
            sys.queue
                .set_paused(QUEUES[*q], *paused)
                .await
                .expect("pause");
            m.paused[*q] = *paused;
        }
        Op::Advance(ms) => {
            m.now = sys.clock.advance(*ms);
            sys.sweep_all().await;
            m.sweep();
        }
        Op::Restart => return sys.restart().await,
    }
    sys
}

fn remove_dead(m: &mut Model, id: JobId) {
    let j = m.jobs[&id].clone();
    let MStage::Dead(cause, _) = j.stage else {
        panic!("{id} is not a dead letter");
    };
    m.jobs.get_mut(&id).expect("known").stage = m.leave(&j, Some(cause));
}

fn check_ack(plan: &[Outcome], i: usize, id: JobId, dedup: bool, ids: &[Option<JobId>]) {
    match plan[i] {
        Outcome::Created => assert!(!dedup, "job {i}: a hit, model: created"),
        Outcome::Hit(want) | Outcome::Replace(want) => {
            assert!(dedup, "job {i}: created {id}, model: a hit on {want}");
            assert_eq!(id, want, "job {i}: the hit's id");
        }
        Outcome::HitOf(e) => {
            assert!(
                dedup,
                "job {i}: created {id}, model: a hit on job {e} of the batch"
            );
            assert_eq!(Some(id), ids[e], "job {i}: the hit's id (that of job {e})");
        }
        o => panic!("job {i}: accepted as {id}, model: {o:?}"),
    }
}

fn check_replaced(plan: &[Outcome], i: usize, replaced: bool) {
    assert_eq!(
        replaced,
        matches!(plan[i], Outcome::Replace(_)),
        "job {i}: replaced, model: {:?}",
        plan[i]
    );
}

/// Compares everything the system holds with the model.
async fn compare(sys: &System, m: &Model) {
    for (id, j) in &m.jobs {
        let info = sys.queue.get_job(&id.to_string()).await.expect("get_job");
        let want = match j.stage {
            MStage::Ready => Some(JobState::Ready),
            MStage::Scheduled(_) => Some(JobState::Scheduled),
            MStage::InFlight(_) => Some(JobState::InFlight),
            MStage::Dead(..) | MStage::Tombstone(Some(_), _) => Some(JobState::DeadLettered),
            MStage::Tombstone(None, _) => Some(JobState::Acked),
            MStage::Gone => None,
        };
        assert_eq!(info.as_ref().map(|i| i.state), want, "state of {id}: {j:?}");
        if let Some(info) = info {
            assert_eq!(info.attempt, j.attempt, "attempt of {id}");
            assert_eq!(info.queue, QUEUES[j.queue], "queue of {id}");
            match j.stage {
                MStage::InFlight(e) => assert_eq!(info.lease_expires_at, Some(e), "lease of {id}"),
                MStage::Scheduled(d) => assert_eq!(info.scheduled_at, Some(d), "due of {id}"),
                MStage::Dead(cause, _) | MStage::Tombstone(Some(cause), _) => {
                    assert_eq!(info.dead_letter_cause, Some(cause), "cause of {id}")
                }
                _ => {}
            }
        }
    }
    for (q, name) in QUEUES.iter().enumerate() {
        let s = sys.queue.queue_stats(name).await.expect("stats");
        let count = |f: fn(&MStage) -> bool| {
            m.jobs
                .values()
                .filter(|j| j.queue == q && f(&j.stage))
                .count() as u64
        };
        assert_eq!(s.ready, count(|s| *s == MStage::Ready), "ready on {name}");
        assert_eq!(
            s.scheduled,
            count(|s| matches!(s, MStage::Scheduled(_))),
            "scheduled on {name}"
        );
        assert_eq!(
            s.in_flight,
            count(|s| matches!(s, MStage::InFlight(_))),
            "in flight on {name}"
        );
        assert_eq!(
            s.dead_lettered,
            count(|s| matches!(s, MStage::Dead(..))),
            "dead on {name}"
        );
        let keys = m.dedup.keys().filter(|(kq, _)| *kq == q).count() as u64;
        assert_eq!(s.dedup_records, keys, "dedup records on {name}");
        assert_eq!(s.paused, m.paused[q], "paused flag of {name}");
        for k in 0..4u8 {
            let got = sys
                .queue
                .lookup_idempotency_key(name, &format!("k{k}"))
                .await
                .expect("lookup")
                .map(|r| (r.job_id, r.expires_at));
            assert_eq!(got, m.dedup.get(&(q, k)).copied(), "key k{k} on {name}");
        }
    }
}

/// Runs `ops` against a fresh store of `backend` and the model; panics at the first difference.
pub(crate) fn run(backend: Box<dyn Backend>, retention_ms: u64, ops: &[Op]) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut sys = System::open(backend, retention_ms).await;
        let mut m = Model {
            now: T0,
            retention_ms,
            jobs: BTreeMap::new(),
            dedup: HashMap::new(),
            paused: [false; QUEUES.len()],
            next_order: 0,
            deliveries: Vec::new(),
        };
        for op in ops {
            sys = step(sys, &mut m, op).await;
            compare(&sys, &m).await;
        }
        sys.store.close().await.expect("close");
    });
}

/// The number of random sequences: `SEPP_TEST_MODEL_CASES`, else 16.
pub(crate) fn cases() -> u32 {
    std::env::var("SEPP_TEST_MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16)
}

/// The strategy of one run: the dead-letter retention (off or 5 s) and 1–60 steps.
pub(crate) fn runs() -> impl Strategy<Value = (u64, Vec<Op>)> {
    (
        prop_oneof![Just(0u64), Just(5_000u64)],
        prop::collection::vec(op(), 1..60),
    )
}

/// The model test for the backend `$backend` (an expression giving a fresh
/// [`Backend`] per run), as one `#[test]`.
macro_rules! model_test {
    ($backend:expr) => {
        #[test]
        fn the_model_agrees_with_the_backend() {
            use proptest::prelude::*;
            let config = ProptestConfig {
                cases: $crate::storage::model::cases(),
                failure_persistence: Some(Box::new(
                    proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
                )),
                ..ProptestConfig::default()
            };
            proptest!(config, |((retention, ops) in $crate::storage::model::runs())| {
                $crate::storage::model::run(Box::new($backend), retention, &ops);
            });
        }
    };
}
pub(crate) use model_test;
