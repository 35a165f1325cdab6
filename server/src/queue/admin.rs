//! Inspection and repair without destroying anything: the operator calls behind
//! `sepp.admin.v1.AdminService`. None of them consults or writes the dedup index, except the
//! read-only key lookup.

use super::Queue;
use super::validate::{NameUse, check_length, check_queue_name};
use super::{dedup, lifecycle, reply};
use crate::domain::{
    CancelSelector, DeadLetter, DeadLetterCursor, DeadLetterSelector, JobCursor, JobFacts, JobId,
    JobInfo, JobState, KeyRecord, ListState, QueueStats, Stage, StoredJob,
};
use crate::error::QueueError;
use crate::storage::{PauseOutcome, QueueDeletion};

/// Default and largest page of `list_dead_letters`.
pub const DEFAULT_PAGE: u32 = 100;
/// Largest page of `list_dead_letters`, and most jobs one selector may name.
pub const MAX_PAGE: u32 = 1000;

/// Default page of `list_jobs` and `list_queues`.
pub const DEFAULT_LISTING_PAGE: u32 = 50;
/// Most jobs `purge_queue` cancels in one call (the caller repeats while `more`).
pub const MAX_PURGE: u32 = 1000;

/// A page of queues, by name, and the token of the next one (empty on the last page).
#[derive(Debug, Clone, PartialEq)]
pub struct QueuePage {
    /// Each queue's name and counts.
    pub queues: Vec<(String, QueueStats)>,
    /// Pass back to get the next page; empty when this is the last.
    pub next_page_token: String,
}

/// A page of jobs in one state, and the token of the next one (empty on the last page).
#[derive(Debug, Clone, PartialEq)]
pub struct JobPage {
    /// The jobs, in the state's order.
    pub jobs: Vec<JobInfo>,
    /// Pass back to get the next page; empty when this is the last.
    pub next_page_token: String,
}

/// A page of dead letters and the token of the next one (empty on the last page).
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterPage {
    /// Records, oldest first.
    pub records: Vec<DeadLetter>,
    /// Pass back to get the next page; empty when this is the last.
    pub next_page_token: String,
}

/// A dead-letter selection as received.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SelectorInput {
    /// Exactly these jobs, when non-empty.
    pub job_ids: Vec<String>,
    /// Else: the oldest of this queue (or of all).
    pub queue: Option<String>,
    /// How many (default 1; 0 is refused).
    pub max: Option<u32>,
}

fn encode_cursor(c: DeadLetterCursor) -> String {
    format!("{:016x}{:032x}", c.0 as u64, c.1.0)
}

fn decode_cursor(token: &str) -> Result<Option<DeadLetterCursor>, QueueError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        QueueError::InvalidArgument(if token.len() <= 64 {
            format!("page_token {token:?} is not a token this server issued")
        } else {
            format!(
                "page_token ({} bytes) is not a token this server issued",
                token.len()
            )
        })
    };
    // ASCII first: the fields are cut by byte offsets, which must fall between characters.
    if token.len() != 48 || !token.is_ascii() {
        return Err(bad());
    }
    let at = u64::from_str_radix(&token[..16], 16).map_err(|_| bad())?;
    let id = u128::from_str_radix(&token[16..], 16).map_err(|_| bad())?;
    Ok(Some((at as i64, JobId(id))))
}

fn state_letter(s: ListState) -> char {
    match s {
        ListState::Ready => 'r',
        ListState::Scheduled => 's',
        ListState::InFlight => 'f',
        ListState::DeadLettered => 'd',
    }
}

/// A job listing's token: the state's letter, then the cursor in hex (65 characters).
fn encode_job_cursor(state: ListState, c: JobCursor) -> String {
    format!(
        "{}{:016x}{:016x}{:032x}",
        state_letter(state),
        c.0 as u64,
        c.1,
        c.2.0
    )
}

fn decode_job_cursor(state: ListState, token: &str) -> Result<Option<JobCursor>, QueueError> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        QueueError::InvalidArgument(if token.len() <= 80 {
            format!("page_token {token:?} is not a token of this listing (queue and state)")
        } else {
            format!(
                "page_token ({} bytes) is not a token of this listing (queue and state)",
                token.len()
            )
        })
    };
    if token.len() != 65 || !token.is_ascii() || !token.starts_with(state_letter(state)) {
        return Err(bad());
    }
    let a = u64::from_str_radix(&token[1..17], 16).map_err(|_| bad())?;
    let b = u64::from_str_radix(&token[17..33], 16).map_err(|_| bad())?;
    let id = u128::from_str_radix(&token[33..], 16).map_err(|_| bad())?;
    Ok(Some((a as i64, b, JobId(id))))
}

fn page_limit(page_size: Option<u32>, default: u32) -> Result<u32, QueueError> {
    match page_size {
        Some(0) => Err(QueueError::InvalidArgument(
            "page_size is 0: ask for at least 1 record".into(),
        )),
        Some(n) => Ok(n.min(MAX_PAGE)),
        None => Ok(default),
    }
}

impl Queue {
    pub(super) fn check_queue_name(
        &self,
        field: &str,
        queue: &str,
        use_: NameUse,
    ) -> Result<(), QueueError> {
        check_queue_name(field, queue, &self.limits, use_)?;
        if self.limits.strict_queues && !self.limits.is_declared(queue) {
            return Err(QueueError::UnknownQueues(vec![queue.to_string()]));
        }
        Ok(())
    }

    /// Everything known about a job, with what it carries while it has a body
    /// ([`JobInfo::content`]); `None` when the id is unknown (or not a UUID).
    ///
    /// # Errors
    /// [`QueueError::Storage`].
    pub async fn get_job(&self, job_id: &str) -> Result<Option<JobInfo>, QueueError> {
        let Some(id) = JobId::parse(job_id) else {
            return Ok(None);
        };
        Ok(self.store.get_job(id).await?.map(job_info))
    }

    /// Ends every lease `worker_id` holds, now, exactly as if each had expired
    /// ([`super::lifecycle::lease_expired`]: redelivered with the next attempt, or on the last
    /// attempt dead-lettered with cause `LEASE_EXPIRED`), for a supervisor that knows the
    /// worker died. The worker's late acks, nacks and extends are then refused by the fence.
    /// Returns the ids released.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for an empty or over-long worker id;
    /// [`QueueError::Storage`].
    pub async fn release_leases(&self, worker_id: &str) -> Result<Vec<JobId>, QueueError> {
        if worker_id.is_empty() {
            return Err(QueueError::InvalidArgument(
                "worker_id is empty: name the worker whose leases to release".into(),
            ));
        }
        check_length(
            "worker_id",
            worker_id,
            "max_worker_id_bytes",
            self.limits.max_worker_id_bytes,
        )?;
        let now = self.clock.now();
        let retention = self.limits.dead_letter_retention_ms;
        let rule = |job: JobFacts<'_>| super::lifecycle::lease_expired(job, retention, now);
        let (ids, ready) = self.store.release_leases(worker_id, &rule, now).await?;
        for (queue, n) in &ready {
            self.signals.job_ready(queue, *n);
        }
        Ok(ids)
    }

    /// Forgets `key` on `queue`: deletes its dedup record, so that the next enqueue with the
    /// key creates a new job (the one admin action that writes the dedup index). Returns the
    /// record if it was live; an expired one not yet swept is deleted too, and `None` returned.
    /// The job the key named is not touched.
    ///
    /// # Errors
    /// As [`Queue::lookup_idempotency_key`].
    pub async fn forget_idempotency_key(
        &self,
        queue: &str,
        key: &str,
    ) -> Result<Option<KeyRecord>, QueueError> {
        self.check_key_argument(queue, key)?;
        let now = self.clock.now();
        Ok(self
            .store
            .forget_key(queue, key)
            .await?
            .filter(|r| super::dedup::is_live(r.expires_at, now)))
    }

    /// The queue and key of an admin call that names a dedup record: a readable queue name and
    /// a key of 1..=`max_idempotency_key_bytes` bytes.
    fn check_key_argument(&self, queue: &str, key: &str) -> Result<(), QueueError> {
        self.check_queue_name("queue", queue, NameUse::Read)?;
        if key.is_empty() {
            return Err(QueueError::InvalidArgument(
                "idempotency_key is empty".into(),
            ));
        }
        check_length(
            "idempotency_key",
            key,
            "max_idempotency_key_bytes",
            self.limits.max_idempotency_key_bytes,
        )?;
        Ok(())
    }

    /// The live dedup record of `key` on `queue`.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for an empty queue or key; [`QueueError::Storage`].
    pub async fn lookup_idempotency_key(
        &self,
        queue: &str,
        key: &str,
    ) -> Result<Option<KeyRecord>, QueueError> {
        self.check_key_argument(queue, key)?;
        let now = self.clock.now();
        Ok(self
            .store
            .lookup_key(queue, key)
            .await?
            .filter(|r| dedup::is_live(r.expires_at, now)))
    }

    /// One page of dead letters, oldest first, not removed; shorter than `page_size` (with a
    /// token for the rest) when more would pass the reply budget (`max_reserve_reply_bytes`).
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for `page_size = 0` or a foreign token.
    pub async fn list_dead_letters(
        &self,
        queue: Option<String>,
        page_size: Option<u32>,
        page_token: &str,
    ) -> Result<DeadLetterPage, QueueError> {
        if let Some(q) = &queue {
            self.check_queue_name("queue", q, NameUse::Read)?;
        }
        let limit = match page_size {
            Some(0) => {
                return Err(QueueError::InvalidArgument(
                    "page_size is 0: ask for at least 1 record".into(),
                ));
            }
            Some(n) => n.min(MAX_PAGE),
            None => DEFAULT_PAGE,
        };
        let after = decode_cursor(page_token)?;
        let budget = self.limits.max_reserve_reply_bytes;
        let fit = |d: &DeadLetter, used, taken| reply::list_fit(d, used, taken, budget);
        let (records, next) = self
            .store
            .list_dead_letters(queue.as_deref(), after, limit, &fit)
            .await?;
        Ok(DeadLetterPage {
            records,
            next_page_token: next.map(encode_cursor).unwrap_or_default(),
        })
    }

    fn selector(&self, s: SelectorInput) -> Result<DeadLetterSelector, QueueError> {
        if !s.job_ids.is_empty() {
            if s.job_ids.len() > MAX_PAGE as usize {
                return Err(QueueError::InvalidArgument(format!(
                    "selector.job_ids has {} entries, the limit is {MAX_PAGE}",
                    s.job_ids.len()
                )));
            }
            // Ids that are not UUIDs cannot name a dead letter; they are skipped like any
            // other id that is not one. An id named twice selects its record once (and the
            // reply names it once).
            let mut seen = std::collections::HashSet::with_capacity(s.job_ids.len());
            return Ok(DeadLetterSelector::Ids(
                s.job_ids
                    .iter()
                    .filter_map(|i| JobId::parse(i))
                    .filter(|id| seen.insert(*id))
                    .collect(),
            ));
        }
        if let Some(q) = &s.queue {
            self.check_queue_name("selector.queue", q, NameUse::Read)?;
        }
        let max = match s.max {
            Some(0) => {
                return Err(QueueError::InvalidArgument(
                    "selector.max is 0: select at least 1 record".into(),
                ));
            }
            Some(n) => n.min(MAX_PAGE),
            None => 1,
        };
        Ok(DeadLetterSelector::Oldest {
            queue: s.queue,
            max,
        })
    }

    /// Requeues dead letters (same id, attempt 1, enqueued now). Returns the ids requeued.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for a bad selector; [`QueueError::Storage`].
    pub async fn requeue_dead_letters(&self, s: SelectorInput) -> Result<Vec<JobId>, QueueError> {
        let sel = self.selector(s)?;
        let now = self.clock.now();
        let (ids, ready) = self
            .store
            .requeue_dead_letters(&sel, lifecycle::requeue(now), now)
            .await?;
        for (queue, n) in ready {
            self.signals.job_ready(&queue, n);
        }
        Ok(ids)
    }

    /// Deletes dead letters. Returns the ids deleted.
    ///
    /// # Errors
    /// As [`Queue::requeue_dead_letters`].
    pub async fn delete_dead_letters(&self, s: SelectorInput) -> Result<Vec<JobId>, QueueError> {
        let sel = self.selector(s)?;
        let now = self.clock.now();
        let rule = |job: JobFacts<'_>| lifecycle::dead_letter_removed(job, now);
        Ok(self.store.delete_dead_letters(&sel, &rule, now).await?)
    }

    /// Pauses or resumes `queue`. A pause of a queue the store does not hold creates it,
    /// under the same cap as an enqueue ([`super::enqueue::QueueCap::admits`]); a resume of
    /// one does nothing.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for a malformed name; [`QueueError::UnknownQueues`] in
    /// strict mode; [`QueueError::TooManyQueues`]; [`QueueError::Storage`].
    pub async fn set_paused(&self, queue: &str, paused: bool) -> Result<(), QueueError> {
        // Pausing can create a queue record, so it is a write; resuming only lets out what is
        // stored, so a queue paused under a name the rule now refuses can still be resumed.
        let use_ = if paused {
            NameUse::Write
        } else {
            NameUse::Read
        };
        self.check_queue_name("queue", queue, use_)?;
        let limits = &*self.limits;
        let declared = |q: &str| limits.is_declared(q);
        let cap = super::enqueue::QueueCap {
            max: limits.max_queues,
            exempt: &declared,
        };
        let may_create = |held: u64| cap.admits(queue, held);
        match self.store.set_paused(queue, paused, &may_create).await? {
            PauseOutcome::Set { ready } => {
                if !paused {
                    self.signals
                        .job_ready(queue, usize::try_from(ready).unwrap_or(usize::MAX));
                }
                Ok(())
            }
            PauseOutcome::Absent => Ok(()),
            PauseOutcome::TooManyQueues => Err(QueueError::TooManyQueues {
                queue: queue.to_string(),
                limit: limits.max_queues,
            }),
        }
    }

    /// Deletes `queue` if it holds no job in any state ([`lifecycle::queue_deletable`]), with
    /// its paused flag; its dedup records (and the tombstones they name) stay until their
    /// window ends. Returns the queue's counts just before (its dedup records and paused flag).
    /// An enqueue after it creates the queue anew (counted against `limits.max_queues`).
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for a malformed name; [`QueueError::QueueNotFound`];
    /// [`QueueError::QueueNotEmpty`] naming the counts; [`QueueError::Storage`].
    pub async fn delete_queue(&self, queue: &str) -> Result<QueueStats, QueueError> {
        // The name's shape only: in strict mode an undeclared queue left from before can still
        // be deleted (that is how it goes away).
        check_queue_name("queue", queue, &self.limits, NameUse::Read)?;
        match self
            .store
            .delete_queue(queue, &lifecycle::queue_deletable)
            .await?
        {
            QueueDeletion::Deleted(stats) => Ok(stats),
            QueueDeletion::NotFound => Err(QueueError::QueueNotFound(queue.to_string())),
            QueueDeletion::Refused(s) => Err(QueueError::QueueNotEmpty {
                queue: queue.to_string(),
                ready: s.ready,
                scheduled: s.scheduled,
                in_flight: s.in_flight,
                dead_lettered: s.dead_lettered,
            }),
        }
    }

    /// Creates every declared queue (`[[queues]]`) the store does not hold, so that each counts
    /// against `limits.max_queues` from the start. Called once by `serve`.
    ///
    /// # Errors
    /// The store's failure.
    pub async fn create_declared_queues(&self) -> Result<(), crate::storage::StorageError> {
        let mut names: Vec<String> = self.limits.declared_names().map(str::to_string).collect();
        if names.is_empty() {
            return Ok(());
        }
        names.sort_unstable();
        self.store.create_queues(&names).await
    }

    /// Counts of `queue`'s jobs by state.
    ///
    /// # Errors
    /// As [`Queue::set_paused`].
    pub async fn queue_stats(&self, queue: &str) -> Result<QueueStats, QueueError> {
        self.check_queue_name("queue", queue, NameUse::Read)?;
        Ok(self.store.queue_stats(queue).await?)
    }

    /// The store-wide gauges of a metrics scrape ([`crate::storage::Store::gauges`]) and the
    /// time they were read at; sets the gauge of this server's waiting Reserves on the way.
    ///
    /// # Errors
    /// [`QueueError::Storage`].
    pub async fn store_gauges(
        &self,
    ) -> Result<(crate::storage::StoreGauges, crate::domain::UnixMs), QueueError> {
        let g = self.store.gauges().await?;
        self.metrics
            .set_reserves_waiting(self.signals.reserves_waiting());
        Ok((g, self.clock.now()))
    }
}

impl Queue {
    /// One page of the queues the store knows, by name, with their counts; the token is the
    /// last name of the page. Shorter than `page_size` when more would pass the reply budget.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for `page_size = 0` or a token longer than a queue
    /// name may be; [`QueueError::Storage`].
    pub async fn list_queues(
        &self,
        page_size: Option<u32>,
        page_token: &str,
    ) -> Result<QueuePage, QueueError> {
        let limit = page_limit(page_size, DEFAULT_LISTING_PAGE)?;
        if page_token.len() > self.limits.max_queue_name_bytes as usize {
            return Err(QueueError::InvalidArgument(format!(
                "page_token ({} bytes) is not a token this server issued (a queue name of at most \
                 max_queue_name_bytes = {})",
                page_token.len(),
                self.limits.max_queue_name_bytes
            )));
        }
        let after = (!page_token.is_empty()).then_some(page_token);
        let (mut queues, mut more) = self.store.list_queues(after, limit).await?;
        let budget = self.limits.max_reserve_reply_bytes;
        let token_bytes = u64::from(self.limits.max_queue_name_bytes);
        let fit = reply::listing_fit(
            queues
                .iter()
                .map(|(n, _)| reply::QUEUE_SUMMARY_FIXED + n.len() as u64),
            token_bytes,
            budget,
        );
        if fit < queues.len() {
            queues.truncate(fit);
            more = true;
        }
        let next_page_token = match (more, queues.last()) {
            (true, Some((n, _))) => n.clone(),
            _ => String::new(),
        };
        Ok(QueuePage {
            queues,
            next_page_token,
        })
    }

    /// One page of `queue`'s jobs in `state`, in that state's order, without payloads.
    /// Shorter than `page_size` when more would pass the reply budget
    /// (`max_reserve_reply_bytes`).
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for a bad queue name, `page_size = 0` or a token of
    /// another listing; [`QueueError::Storage`].
    pub async fn list_jobs(
        &self,
        queue: &str,
        state: ListState,
        page_size: Option<u32>,
        page_token: &str,
    ) -> Result<JobPage, QueueError> {
        self.check_queue_name("queue", queue, NameUse::Read)?;
        let limit = page_limit(page_size, DEFAULT_LISTING_PAGE)?;
        let after = decode_job_cursor(state, page_token)?;
        let (page, mut more) = self.store.list_jobs(queue, state, after, limit).await?;
        let mut page: Vec<(JobCursor, JobInfo)> =
            page.into_iter().map(|(c, j)| (c, job_info(j))).collect();
        let fit = reply::listing_fit(
            page.iter().map(|(_, j)| reply::job_info_bytes(j)),
            65,
            self.limits.max_reserve_reply_bytes,
        );
        if fit < page.len() {
            page.truncate(fit);
            more = true;
        }
        let next_page_token = match (more, page.last()) {
            (true, Some((c, _))) => encode_job_cursor(state, *c),
            _ => String::new(),
        };
        Ok(JobPage {
            jobs: page.into_iter().map(|(_, j)| j).collect(),
            next_page_token,
        })
    }

    /// Cancels one ready or scheduled job, named by id or by `(queue, idempotency key)`. Its
    /// dedup record stays, so a retried enqueue of the key still answers the job's id. Returns
    /// whether it was cancelled and the job as it is after the call (`None`: not known).
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for neither or both of id and key, a bad queue or key;
    /// [`QueueError::Storage`].
    pub async fn cancel_job(
        &self,
        job_id: Option<&str>,
        by_key: Option<(&str, &str)>,
    ) -> Result<(bool, Option<JobInfo>), QueueError> {
        let id = match (job_id, by_key) {
            (Some(id), None) => JobId::parse(id),
            (None, Some((queue, key))) => self
                .lookup_idempotency_key(queue, key)
                .await?
                .map(|r| r.job_id),
            _ => {
                return Err(QueueError::InvalidArgument(
                    "name the job by job_id or by queue and idempotency_key, not both or neither"
                        .into(),
                ));
            }
        };
        let Some(id) = id else {
            return Ok((false, None));
        };
        let now = self.clock.now();
        let rule = |job: JobFacts<'_>| lifecycle::cancelled(job, now);
        let done = self
            .store
            .cancel_jobs(
                &CancelSelector::Ids(vec![id]),
                &rule,
                lifecycle::CANCELLED_REASON,
                now,
            )
            .await?;
        let info = self.store.get_job(id).await?.map(job_info);
        Ok((!done.is_empty(), info))
    }

    /// Cancels up to `max` (default and at most [`MAX_PURGE`]) of `queue`'s ready and
    /// scheduled jobs, ready ones first, as [`Queue::cancel_job`] does one. In-flight jobs and
    /// dead letters are untouched. Returns the ids cancelled and whether any ready or
    /// scheduled job is left (call again).
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] for a bad queue name or `max = 0`;
    /// [`QueueError::Storage`].
    pub async fn purge_queue(
        &self,
        queue: &str,
        max: Option<u32>,
    ) -> Result<(Vec<JobId>, bool), QueueError> {
        self.check_queue_name("queue", queue, NameUse::Read)?;
        let max = match max {
            Some(0) => {
                return Err(QueueError::InvalidArgument(
                    "max is 0: purge at least 1 job".into(),
                ));
            }
            Some(n) => n.min(MAX_PURGE),
            None => MAX_PURGE,
        };
        let now = self.clock.now();
        let rule = |job: JobFacts<'_>| lifecycle::cancelled(job, now);
        let sel = CancelSelector::Queue {
            queue: queue.to_string(),
            max,
        };
        let ids = self
            .store
            .cancel_jobs(&sel, &rule, lifecycle::CANCELLED_REASON, now)
            .await?;
        let left = self.store.queue_stats(queue).await?;
        Ok((ids, left.ready + left.scheduled > 0))
    }
}

/// What job inspection reports, from what the store holds.
fn job_info(j: StoredJob) -> JobInfo {
    let (state, scheduled_at, lease_expires_at, finished_at, cause) = match j.stage {
        Stage::Ready => (JobState::Ready, None, None, None, None),
        Stage::Scheduled { due } => (JobState::Scheduled, Some(due), None, None, None),
        Stage::InFlight { expires } => (JobState::InFlight, None, Some(expires), None, None),
        Stage::Dead { cause, failed_at } => (
            JobState::DeadLettered,
            None,
            None,
            Some(failed_at),
            Some(cause),
        ),
        Stage::Tombstone {
            finished_at,
            dead: Some(c),
            ..
        } => (
            JobState::DeadLettered,
            None,
            None,
            Some(finished_at),
            Some(c),
        ),
        Stage::Tombstone {
            finished_at,
            dead: None,
            ..
        } => (JobState::Acked, None, None, Some(finished_at), None),
    };
    JobInfo {
        id: j.id,
        state,
        queue: j.queue,
        job_type: j.job_type,
        attempt: j.attempt,
        max_attempts: j.max_attempts,
        priority: j.priority,
        enqueued_at: j.enqueued_at,
        scheduled_at,
        lease_expires_at,
        last_reason: j.last_reason,
        finished_at,
        dead_letter_cause: cause,
        idempotency_key: j.idempotency_key,
        worker_id: j.worker_id,
        content: j.content,
    }
}

impl Queue {
    /// Writes a consistent copy of the store into `dir` ([`crate::storage::Store::backup`]):
    /// `dir` must be an absolute path that does not exist or is an empty directory.
    ///
    /// # Errors
    /// [`QueueError::InvalidArgument`] naming `dir` and what is wrong with it; storage
    /// failures.
    pub async fn backup(&self, dir: &str) -> Result<crate::storage::BackupReport, QueueError> {
        let path = std::path::Path::new(dir);
        if dir.is_empty() || !path.is_absolute() {
            return Err(QueueError::InvalidArgument(format!(
                "dir {dir:?} is not an absolute path: the backup is written on the server's \
                 host, so name the directory in full"
            )));
        }
        match std::fs::read_dir(path) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(QueueError::InvalidArgument(format!(
                        "dir {dir:?} exists and is not empty: back up into a new directory"
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(QueueError::InvalidArgument(format!(
                    "dir {dir:?} cannot be used: {e}"
                )));
            }
        }
        Ok(self.store.backup(path).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_tokens_are_refused() {
        let c = (1_700_000_000_123, JobId(u128::MAX - 5));
        assert_eq!(decode_cursor(&encode_cursor(c)).unwrap(), Some(c));
        assert_eq!(decode_cursor("").unwrap(), None);
        assert!(decode_cursor("zz").is_err());
        // 48 bytes with a two-byte character across the first field's end: refused, no panic.
        let split = format!("{}é{}", "a".repeat(15), "b".repeat(31));
        assert_eq!(split.len(), 48);
        assert!(decode_cursor(&split).is_err());
    }

    #[test]
    fn job_cursors_round_trip_and_belong_to_their_state() {
        let c = (-3, u64::MAX, JobId(7));
        let t = encode_job_cursor(ListState::Scheduled, c);
        assert_eq!(t.len(), 65);
        assert_eq!(
            decode_job_cursor(ListState::Scheduled, &t).unwrap(),
            Some(c)
        );
        assert!(decode_job_cursor(ListState::Ready, &t).is_err());
        assert!(decode_job_cursor(ListState::Ready, "r").is_err());
        let split = format!("r{}é{}", "a".repeat(15), "b".repeat(47));
        assert_eq!(split.len(), 65);
        assert!(decode_job_cursor(ListState::Ready, &split).is_err());
        assert_eq!(decode_job_cursor(ListState::Ready, "").unwrap(), None);
    }
}
