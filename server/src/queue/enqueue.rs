//! The commit-time rules of an enqueue, decided inside the store's transition: dedup hits (a
//! live record, or an earlier job of the same batch with the same key) and `max_queue_depth`.
//!
//! [`prepass`] is pure and runs before the store is called: it finds the jobs whose key an
//! earlier job of the batch already carries. [`decide`] runs inside the transition with what
//! the store read ([`EnqueueFacts`]): the dedup record of each first-of-its-key job and the
//! depth of each queue with a limit. In order, for each job:
//!
//! 1. a repeat of an earlier job's key gets that job's outcome: a hit on its id
//!    (`deduplicated = true`), or `QueueFull` if it was refused (spec: "the second is a dedup
//!    hit of the first", in both batch modes); on a queue with `key_conflict = "reject"`, a
//!    repeat whose fingerprint differs from the one the key holds is a `KeyConflict` instead;
//! 2. a key whose record is live ([`super::dedup::is_live`]) is a hit on the record's job, or
//!    a `KeyConflict` naming that job when both fingerprints are known and differ
//!    ([`super::dedup::conflicts`]);
//!    On a queue with `on_duplicate = "replace_pending"`, a hit on a job that is still ready
//!    or scheduled is `Replaced` instead ([`replaces`]): the store writes this job's contents
//!    into it. Only the first job of a batch with a key can replace; a repeat of it is a hit;
//! 3. a job whose queue the store does not hold yet creates it, unless the queue is undeclared
//!    and the store holds `limits.max_queues` queues already, counting those this batch
//!    creates before this job (`TooManyQueues`). A declared queue is never refused: every
//!    `[[queues]]` entry is created at start-up and counted, and the configuration refuses a
//!    cap below their number. A dedup hit creates nothing, so it is never refused by the cap;
//! 4. a queue that holds `max_queue_depth` jobs, counting those this batch creates before this
//!    one, refuses it (`QueueFull`); a dedup hit creates nothing, so it does not count;
//! 5. otherwise the job is created.
//!
//! An atomic batch with any `QueueFull`, `TooManyQueues` or `KeyConflict` writes nothing.

use super::dedup;
use crate::domain::{
    EnqueuePlan, Fingerprint, InsertOutcome, JobState, NewJob, Placement, Replacement, Stage,
    UnixMs,
};
use crate::storage::EnqueueFacts;
use std::collections::HashMap;

/// For each job, the index of the earlier job of the batch with the same queue and key, if
/// any. Allocates a map only when two or more jobs are keyed.
pub fn prepass(jobs: &[NewJob]) -> Vec<Option<u32>> {
    let mut first = vec![None; jobs.len()];
    if jobs.iter().filter(|j| j.dedup.is_some()).nth(1).is_none() {
        return first;
    }
    // foldhash, seeded at random per process: SipHash was a good part of a batch's cost, and
    // the map lives for one batch (at most `max_enqueue_batch` keys).
    let mut seen: HashMap<(&str, &str), u32, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(jobs.len(), foldhash::fast::RandomState::default());
    for (i, job) in jobs.iter().enumerate() {
        if let Some(claim) = &job.dedup {
            match seen.entry((&*job.queue, claim.key.as_str())) {
                std::collections::hash_map::Entry::Occupied(e) => first[i] = Some(*e.get()),
                std::collections::hash_map::Entry::Vacant(e) => {
                    e.insert(i as u32);
                }
            }
        }
    }
    first
}

/// The cap on the number of queues (`limits.max_queues`) and which queues it spares.
pub struct QueueCap<'a> {
    /// Most queues the store holds.
    pub max: u64,
    /// True for a queue the cap never refuses (a declared one).
    pub exempt: &'a (dyn Fn(&str) -> bool + Sync),
}

impl QueueCap<'_> {
    /// Whether a new queue `queue` may be created while the store holds `held` queues
    /// (counting those created earlier in the same transition): a declared queue always, any
    /// other below the cap. The one rule for every way a queue is created (an enqueue, a pause).
    pub fn admits(&self, queue: &str, held: u64) -> bool {
        (self.exempt)(queue) || held < self.max
    }
}

/// The plan of a batch, from the jobs, their [`prepass`], what the store read, the queue cap,
/// whether the batch is atomic, and the time of the transition.
pub fn decide(
    jobs: &[NewJob],
    repeats: &[Option<u32>],
    facts: &dyn EnqueueFacts,
    cap: &QueueCap<'_>,
    atomic: bool,
    now: UnixMs,
) -> EnqueuePlan {
    let mut outcomes: Vec<InsertOutcome> = Vec::with_capacity(jobs.len());
    // The fingerprint each job's key holds after it: the record's on a hit, its own when it
    // creates the job (what a repeat later in the batch is compared with).
    let mut held: Vec<Option<Fingerprint>> = Vec::with_capacity(jobs.len());
    // Jobs this batch creates per queue with a depth limit (batches rarely span many queues).
    let mut created: Vec<(&str, u64)> = Vec::new();
    // Queues this batch creates, in order (the store's count is read once, on the first).
    let mut new_queues: Vec<&str> = Vec::new();
    let mut count: Option<u64> = None;
    for (i, job) in jobs.iter().enumerate() {
        let mine = job.dedup.as_ref().and_then(|d| d.fingerprint);
        if let Some(j) = repeats.get(i).copied().flatten() {
            let first = held[j as usize];
            let outcome = match outcomes[j as usize] {
                full @ (InsertOutcome::QueueFull { .. } | InsertOutcome::TooManyQueues { .. }) => {
                    full
                }
                InsertOutcome::KeyConflict { original: id } if dedup::conflicts(first, mine) => {
                    InsertOutcome::KeyConflict { original: id }
                }
                InsertOutcome::Created(id) | InsertOutcome::Deduplicated(id, _)
                    if dedup::conflicts(first, mine) =>
                {
                    InsertOutcome::KeyConflict { original: id }
                }
                // The job this batch creates: where it will be once written.
                InsertOutcome::Created(id) => InsertOutcome::Deduplicated(
                    id,
                    match jobs[j as usize].scheduled_at {
                        Some(_) => JobState::Scheduled,
                        None => JobState::Ready,
                    },
                ),
                hit @ InsertOutcome::Deduplicated(..) => hit,
                // The first job of the batch with this key replaced the pending job's
                // contents: a repeat is a hit of it and replaces nothing more.
                InsertOutcome::Replaced(id, placement) => {
                    InsertOutcome::Deduplicated(id, placed_state(placement))
                }
                // Same contents as the record's, after a job of the batch that conflicted.
                InsertOutcome::KeyConflict { original: id } => {
                    InsertOutcome::Deduplicated(id, dedup::original_state(facts.stage(id)))
                }
            };
            outcomes.push(outcome);
            held.push(first);
            continue;
        }
        if job.dedup.is_some()
            && let Some(rec) = facts.record(i)
            && dedup::is_live(rec.expires_at, now)
        {
            let stage = facts.stage(rec.job_id);
            let replace = job.dedup.as_ref().and_then(|d| d.replace);
            outcomes.push(if dedup::conflicts(rec.fingerprint, mine) {
                InsertOutcome::KeyConflict {
                    original: rec.job_id,
                }
            } else if let Some(placement) = replaces(replace, stage) {
                InsertOutcome::Replaced(rec.job_id, placement)
            } else {
                InsertOutcome::Deduplicated(rec.job_id, dedup::original_state(stage))
            });
            held.push(rec.fingerprint);
            continue;
        }
        held.push(mine);
        if !new_queues.contains(&&*job.queue) && !facts.queue_exists(&job.queue) {
            let held_now = *count.get_or_insert_with(|| facts.queue_count());
            if !cap.admits(&job.queue, held_now + new_queues.len() as u64) {
                outcomes.push(InsertOutcome::TooManyQueues { limit: cap.max });
                continue;
            }
            new_queues.push(&job.queue);
        }
        if let Some(limit) = job.max_queue_depth {
            let slot = match created.iter().position(|(q, _)| *q == &*job.queue) {
                Some(s) => s,
                None => {
                    created.push((&job.queue, 0));
                    created.len() - 1
                }
            };
            if facts.depth(&job.queue) + created[slot].1 >= limit {
                outcomes.push(InsertOutcome::QueueFull { limit });
                continue;
            }
            created[slot].1 += 1;
        }
        outcomes.push(InsertOutcome::Created(job.id));
    }
    let refused = outcomes.iter().any(InsertOutcome::is_refusal);
    EnqueuePlan {
        outcomes,
        write: !(atomic && refused),
    }
}

/// Whether a hit with `replace` (set on a queue with `on_duplicate = "replace_pending"`)
/// replaces the contents of a job at `stage`, and where the job goes then: only a job still
/// ready or scheduled is replaced (one in flight or settled is kept as it is); it goes where
/// the hit's `scheduled_at` says, or stays where it is when the hit sent none.
pub fn replaces(replace: Option<Replacement>, stage: Option<Stage>) -> Option<Placement> {
    let replace = replace?;
    let now_at = match stage? {
        Stage::Ready => Placement::Ready,
        Stage::Scheduled { due } => Placement::Scheduled { due },
        Stage::InFlight { .. } | Stage::Dead { .. } | Stage::Tombstone { .. } => return None,
    };
    Some(replace.placement.unwrap_or(now_at))
}

/// Where a job placed at `placement` is, as a hit reports it.
pub fn placed_state(placement: Placement) -> JobState {
    match placement {
        Placement::Ready => JobState::Ready,
        Placement::Scheduled { .. } => JobState::Scheduled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DedupClaim, JobId, KeyRecord};
    use std::sync::Arc;

    fn never(_: &str) -> bool {
        false
    }

    const NO_CAP: QueueCap<'static> = QueueCap {
        max: u64::MAX,
        exempt: &never,
    };

    struct Facts {
        records: Vec<Option<KeyRecord>>,
        depth: u64,
    }

    impl EnqueueFacts for Facts {
        fn record(&self, i: usize) -> Option<KeyRecord> {
            self.records.get(i).copied().flatten()
        }
        fn depth(&self, _: &str) -> u64 {
            self.depth
        }
        fn queue_exists(&self, _: &str) -> bool {
            true
        }
        fn queue_count(&self) -> u64 {
            1
        }
        fn stage(&self, _: JobId) -> Option<crate::domain::Stage> {
            Some(crate::domain::Stage::InFlight { expires: 1 })
        }
    }

    fn job(id: u128, key: Option<&str>, depth: Option<u64>) -> NewJob {
        NewJob {
            id: JobId(id),
            queue: Arc::from("q"),
            job_type: "t".into(),
            payload: None,
            priority: 0,
            max_attempts: 1,
            trace_context: None,
            custom: Default::default(),
            enqueued_at: 0,
            scheduled_at: None,
            dedup: key.map(|k| DedupClaim {
                key: k.into(),
                expires_at: 100,
                fingerprint: None,
                replace: None,
            }),
            max_queue_depth: depth,
            reply_bytes: 1,
        }
    }

    fn record(id: u128, expires_at: UnixMs) -> Option<KeyRecord> {
        Some(KeyRecord {
            job_id: JobId(id),
            created_at: 0,
            expires_at,
            fingerprint: None,
        })
    }

    #[test]
    fn the_second_job_with_a_key_is_a_hit_of_the_first() {
        let jobs = [
            job(1, Some("a"), None),
            job(2, Some("a"), None),
            job(3, None, None),
        ];
        let repeats = prepass(&jobs);
        assert_eq!(repeats, vec![None, Some(0), None]);
        let plan = decide(
            &jobs,
            &repeats,
            &Facts {
                records: vec![],
                depth: 0,
            },
            &NO_CAP,
            false,
            0,
        );
        assert_eq!(
            plan.outcomes,
            vec![
                InsertOutcome::Created(JobId(1)),
                InsertOutcome::Deduplicated(JobId(1), JobState::Ready),
                InsertOutcome::Created(JobId(3)),
            ]
        );
        assert!(plan.write);
    }

    #[test]
    fn a_record_deduplicates_until_its_expiry_and_not_at_it() {
        let jobs = [job(1, Some("a"), None)];
        let facts = Facts {
            records: vec![record(9, 50)],
            depth: 0,
        };
        let at = |now| decide(&jobs, &prepass(&jobs), &facts, &NO_CAP, false, now).outcomes[0];
        assert_eq!(
            at(49),
            InsertOutcome::Deduplicated(JobId(9), JobState::InFlight)
        );
        assert_eq!(at(50), InsertOutcome::Created(JobId(1)));
    }

    #[test]
    fn depth_counts_the_jobs_the_batch_creates_and_not_its_hits() {
        let jobs = [
            job(1, Some("a"), Some(3)),
            job(2, Some("a"), Some(3)),
            job(3, None, Some(3)),
            job(4, None, Some(3)),
        ];
        let facts = Facts {
            records: vec![],
            depth: 1,
        };
        let plan = decide(&jobs, &prepass(&jobs), &facts, &NO_CAP, false, 0);
        assert_eq!(
            plan.outcomes,
            vec![
                InsertOutcome::Created(JobId(1)),
                InsertOutcome::Deduplicated(JobId(1), JobState::Ready),
                InsertOutcome::Created(JobId(3)),
                InsertOutcome::QueueFull { limit: 3 },
            ]
        );
        assert!(plan.write, "best effort writes the jobs it accepts");
        let atomic = decide(&jobs, &prepass(&jobs), &facts, &NO_CAP, true, 0);
        assert!(
            !atomic.write,
            "an atomic batch with a refusal writes nothing"
        );
    }

    #[test]
    fn a_repeat_of_a_refused_job_is_refused_too() {
        let jobs = [job(1, Some("a"), Some(1)), job(2, Some("a"), Some(1))];
        let facts = Facts {
            records: vec![],
            depth: 1,
        };
        let plan = decide(&jobs, &prepass(&jobs), &facts, &NO_CAP, false, 0);
        assert_eq!(
            plan.outcomes,
            vec![
                InsertOutcome::QueueFull { limit: 1 },
                InsertOutcome::QueueFull { limit: 1 },
            ]
        );
    }

    fn keyed(id: u128, key: &str, fp: u64) -> NewJob {
        let mut j = job(id, Some(key), None);
        if let Some(d) = j.dedup.as_mut() {
            d.fingerprint = Fingerprint::new(fp);
        }
        j
    }

    #[test]
    fn a_hit_with_another_fingerprint_is_a_conflict_naming_the_original() {
        let facts = |fp: u64| Facts {
            records: vec![Some(KeyRecord {
                job_id: JobId(9),
                created_at: 0,
                expires_at: 100,
                fingerprint: Fingerprint::new(fp),
            })],
            depth: 0,
        };
        let decide1 = |j: NewJob, f: &Facts, atomic| {
            let jobs = [j];
            decide(&jobs, &prepass(&jobs), f, &NO_CAP, atomic, 0)
        };
        assert_eq!(
            decide1(keyed(1, "a", 5), &facts(5), false).outcomes,
            vec![InsertOutcome::Deduplicated(JobId(9), JobState::InFlight)]
        );
        let plan = decide1(keyed(1, "a", 6), &facts(5), true);
        assert_eq!(
            plan.outcomes,
            vec![InsertOutcome::KeyConflict { original: JobId(9) }]
        );
        assert!(
            !plan.write,
            "an atomic batch with a conflict writes nothing"
        );
        // A record without a fingerprint (written while conflicts were ignored) matches.
        assert_eq!(
            decide1(keyed(1, "a", 6), &facts(0), false).outcomes,
            vec![InsertOutcome::Deduplicated(JobId(9), JobState::InFlight)]
        );
    }

    #[test]
    fn repeats_in_a_batch_are_compared_with_what_the_key_holds() {
        let jobs = [
            keyed(1, "a", 5),
            keyed(2, "a", 5),
            keyed(3, "a", 6),
            keyed(4, "b", 7),
        ];
        let no_records = Facts {
            records: vec![],
            depth: 0,
        };
        let plan = decide(&jobs, &prepass(&jobs), &no_records, &NO_CAP, false, 0);
        assert_eq!(
            plan.outcomes,
            vec![
                InsertOutcome::Created(JobId(1)),
                InsertOutcome::Deduplicated(JobId(1), JobState::Ready),
                InsertOutcome::KeyConflict { original: JobId(1) },
                InsertOutcome::Created(JobId(4)),
            ]
        );
        assert!(plan.write, "best effort writes the jobs it accepts");
        // The first job conflicts with a record: a repeat with its contents conflicts too, a
        // repeat with the record's contents is a hit.
        let jobs = [keyed(1, "a", 6), keyed(2, "a", 6), keyed(3, "a", 5)];
        let record = Facts {
            records: vec![Some(KeyRecord {
                job_id: JobId(9),
                created_at: 0,
                expires_at: 100,
                fingerprint: Fingerprint::new(5),
            })],
            depth: 0,
        };
        assert_eq!(
            decide(&jobs, &prepass(&jobs), &record, &NO_CAP, false, 0).outcomes,
            vec![
                InsertOutcome::KeyConflict { original: JobId(9) },
                InsertOutcome::KeyConflict { original: JobId(9) },
                InsertOutcome::Deduplicated(JobId(9), JobState::InFlight),
            ]
        );
    }

    #[test]
    fn a_hit_on_a_pending_job_replaces_it_and_on_any_other_keeps_it() {
        struct At(Option<Stage>);
        impl EnqueueFacts for At {
            fn record(&self, _: usize) -> Option<KeyRecord> {
                record(9, 100)
            }
            fn depth(&self, _: &str) -> u64 {
                0
            }
            fn queue_exists(&self, _: &str) -> bool {
                true
            }
            fn queue_count(&self) -> u64 {
                1
            }
            fn stage(&self, _: JobId) -> Option<Stage> {
                self.0
            }
        }
        let replacing = |placement| {
            let mut j = job(1, Some("a"), None);
            if let Some(d) = j.dedup.as_mut() {
                d.replace = Some(Replacement {
                    placement,
                    reply_bytes: 1,
                });
            }
            j
        };
        let one = |j: NewJob, stage| {
            let jobs = [j];
            decide(&jobs, &prepass(&jobs), &At(stage), &NO_CAP, false, 0).outcomes[0]
        };
        let later = Placement::Scheduled { due: 50 };
        assert_eq!(
            one(replacing(None), Some(Stage::Ready)),
            InsertOutcome::Replaced(JobId(9), Placement::Ready)
        );
        assert_eq!(
            one(replacing(None), Some(Stage::Scheduled { due: 50 })),
            InsertOutcome::Replaced(JobId(9), later),
            "no scheduled_at sent: the job stays where it is"
        );
        assert_eq!(
            one(
                replacing(Some(Placement::Ready)),
                Some(Stage::Scheduled { due: 50 })
            ),
            InsertOutcome::Replaced(JobId(9), Placement::Ready)
        );
        assert_eq!(
            one(replacing(Some(later)), Some(Stage::Ready)),
            InsertOutcome::Replaced(JobId(9), later)
        );
        assert_eq!(
            one(replacing(None), Some(Stage::InFlight { expires: 5 })),
            InsertOutcome::Deduplicated(JobId(9), JobState::InFlight)
        );
        let acked = Stage::Tombstone {
            finished_at: 1,
            until: 100,
            dead: None,
        };
        assert_eq!(
            one(replacing(None), Some(acked)),
            InsertOutcome::Deduplicated(JobId(9), JobState::Acked)
        );
        assert_eq!(
            one(replacing(None), None),
            InsertOutcome::Deduplicated(JobId(9), JobState::Deleted)
        );
        assert_eq!(
            one(job(1, Some("a"), None), Some(Stage::Ready)),
            InsertOutcome::Deduplicated(JobId(9), JobState::Ready),
            "keep (the default) replaces nothing"
        );
        // In one batch only the first job with the key replaces; a repeat is a hit of it.
        let jobs = [replacing(None), replacing(None)];
        assert_eq!(
            decide(
                &jobs,
                &prepass(&jobs),
                &At(Some(Stage::Ready)),
                &NO_CAP,
                true,
                0
            )
            .outcomes,
            vec![
                InsertOutcome::Replaced(JobId(9), Placement::Ready),
                InsertOutcome::Deduplicated(JobId(9), JobState::Ready),
            ]
        );
    }

    /// Queues `a` and `b` exist; the store holds `held` queues.
    struct Held(u64);

    impl EnqueueFacts for Held {
        fn record(&self, _: usize) -> Option<KeyRecord> {
            None
        }
        fn depth(&self, _: &str) -> u64 {
            0
        }
        fn queue_exists(&self, queue: &str) -> bool {
            queue == "a" || queue == "b"
        }
        fn queue_count(&self) -> u64 {
            self.0
        }
        fn stage(&self, _: JobId) -> Option<Stage> {
            None
        }
    }

    #[test]
    fn a_new_undeclared_queue_past_max_queues_is_refused_and_existing_ones_work() {
        let on = |id, queue: &str, key| {
            let mut j = job(id, key, None);
            j.queue = Arc::from(queue);
            j
        };
        let declared = |q: &str| q == "d";
        let cap = QueueCap {
            max: 3,
            exempt: &declared,
        };
        // Two queues held, room for one more: the first new queue takes it, and its later jobs
        // go in; a second new queue is refused, a declared one is not, existing ones work.
        let jobs = [
            on(1, "x", None),
            on(2, "y", Some("k")),
            on(3, "x", None),
            on(4, "y", Some("k")),
            on(5, "d", None),
            on(6, "a", None),
        ];
        let plan = decide(&jobs, &prepass(&jobs), &Held(2), &cap, false, 0);
        assert_eq!(
            plan.outcomes,
            vec![
                InsertOutcome::Created(JobId(1)),
                InsertOutcome::TooManyQueues { limit: 3 },
                InsertOutcome::Created(JobId(3)),
                InsertOutcome::TooManyQueues { limit: 3 },
                InsertOutcome::Created(JobId(5)),
                InsertOutcome::Created(JobId(6)),
            ]
        );
        assert!(plan.write, "best effort writes the jobs it accepts");
        let atomic = decide(&jobs, &prepass(&jobs), &Held(2), &cap, true, 0);
        assert!(
            !atomic.write,
            "an atomic batch with a refusal writes nothing"
        );
        // At the cap (or past it, after the cap was lowered), only existing queues take jobs.
        let jobs = [on(1, "b", None), on(2, "z", None)];
        assert_eq!(
            decide(&jobs, &prepass(&jobs), &Held(5), &cap, false, 0).outcomes,
            vec![
                InsertOutcome::Created(JobId(1)),
                InsertOutcome::TooManyQueues { limit: 3 },
            ]
        );
    }
}
