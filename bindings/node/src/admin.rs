//! The operator calls of [`SeppClient`] (`sepp.admin.v1`, sepp servers only): job inspection,
//! idempotency-key lookup, dead-letter listing, requeue and delete, pause/resume, queue
//! stats. The core's `admin` module, in its order.

use crate::client::SeppClient;
use crate::error::{Failure, SeppFailure, settle};
use crate::job::{DeadLetterCause, DeadLetterRecord, Payload, TraceContext};
use crate::read::{self, BadInput, Fields};
use crate::value::{self, CustomValue, Date};
use napi::Env;
use napi::bindgen_prelude::{PromiseRaw, Unknown};
use napi_derive::napi;
use sepp_rs::ErrorCode;
use sepp_rs::admin as core;
use std::collections::HashMap;

/// Where a job is.
#[napi(string_enum = "camelCase")]
pub enum JobState {
    /// Not known: never existed, or finished and forgotten.
    Unknown,
    /// Waiting for its scheduled time or a retry delay.
    Scheduled,
    /// Ready to be reserved.
    Ready,
    /// Leased to a worker.
    InFlight,
    /// Dead-lettered.
    DeadLettered,
    /// Acked (kept while its idempotency key's dedup record lives). Earlier releases said
    /// `'completed'`.
    Acked,
    /// Cancelled before it ran (reserved: no server produces it yet).
    Cancelled,
    /// Gone (a dead letter drained, deleted or past its retention) while its key's record
    /// lives; reported by a dedup hit.
    Deleted,
}

impl From<core::JobState> for JobState {
    fn from(s: core::JobState) -> Self {
        match s {
            core::JobState::Unknown => JobState::Unknown,
            core::JobState::Scheduled => JobState::Scheduled,
            core::JobState::Ready => JobState::Ready,
            core::JobState::InFlight => JobState::InFlight,
            core::JobState::DeadLettered => JobState::DeadLettered,
            core::JobState::Acked => JobState::Acked,
            core::JobState::Cancelled => JobState::Cancelled,
            core::JobState::Deleted => JobState::Deleted,
        }
    }
}

/// What the server knows about one job.
#[napi(object, object_from_js = false)]
pub struct JobInfo {
    /// The id asked about.
    pub job_id: String,
    /// Where it is.
    pub state: JobState,
    /// Its queue (empty when unknown).
    pub queue: String,
    /// Its type.
    pub job_type: String,
    /// The attempt in flight or the last one made (0 before the first delivery).
    pub attempt: u32,
    /// Deliveries allowed.
    pub max_attempts: u32,
    /// 0 (lowest) to 9 (highest).
    pub priority: u32,
    /// When it was enqueued.
    pub enqueued_at: Option<Date>,
    /// When it becomes ready, while scheduled.
    pub scheduled_at: Option<Date>,
    /// When its lease ends, while in flight.
    pub lease_expires_at: Option<Date>,
    /// The reason of its last nack.
    pub last_reason: Option<String>,
    /// When it was acked or dead-lettered.
    pub finished_at: Option<Date>,
    /// Why it was dead-lettered.
    pub dead_letter_cause: Option<DeadLetterCause>,
    /// Its idempotency key, while its body is kept.
    pub idempotency_key: Option<String>,
    /// The worker label of its current lease.
    pub worker_id: Option<String>,
    /// Its data, as enqueued (or as a dedup hit replaced it). Unset when it has none, and once
    /// only a tombstone is left of the job (acked, cancelled, a dead letter past its retention).
    pub payload: Option<Payload>,
    /// Its custom entries; empty when it has none, or only a tombstone is left. An int64
    /// beyond ±(2^53 − 1) is a `bigint`, any other number a `number`.
    pub custom: HashMap<String, CustomValue>,
    /// Its W3C trace context; unset when it has none, or only a tombstone is left.
    pub trace_context: Option<TraceContext>,
}

impl From<core::JobInfo> for JobInfo {
    fn from(j: core::JobInfo) -> Self {
        JobInfo {
            job_id: j.job_id,
            state: j.state.into(),
            queue: j.queue,
            job_type: j.job_type,
            attempt: j.attempt,
            max_attempts: j.max_attempts,
            priority: j.priority,
            enqueued_at: j.enqueued_at.map(Date::from),
            scheduled_at: j.scheduled_at.map(Date::from),
            lease_expires_at: j.lease_expires_at.map(Date::from),
            last_reason: j.last_reason,
            finished_at: j.finished_at.map(Date::from),
            dead_letter_cause: j.dead_letter_cause.map(DeadLetterCause::from),
            idempotency_key: j.idempotency_key,
            worker_id: j.worker_id,
            payload: j.payload.map(Payload::from),
            custom: j
                .custom
                .into_iter()
                .map(|(k, v)| (k, value::custom_from_core(v)))
                .collect(),
            trace_context: j.trace_context.map(TraceContext::from),
        }
    }
}

/// A live dedup record.
#[napi(object, object_from_js = false)]
pub struct KeyRecord {
    /// The job the key names.
    pub job_id: String,
    /// When the record was written (the first accepted enqueue with the key).
    pub created_at: Option<Date>,
    /// When it stops deduplicating.
    pub expires_at: Option<Date>,
}

impl From<core::KeyRecord> for KeyRecord {
    fn from(k: core::KeyRecord) -> Self {
        KeyRecord {
            job_id: k.job_id,
            created_at: k.created_at.map(Date::from),
            expires_at: k.expires_at.map(Date::from),
        }
    }
}

/// Options of `listDeadLetters`.
#[napi(object, object_to_js = false, object_from_js = false)]
pub struct ListDeadLettersOptions {
    /// Only this queue's dead letters; unset: every queue's.
    pub queue: Option<String>,
    /// Records per page, 1 to 1000.
    /// @default 100
    pub page_size: Option<f64>,
    /// The `nextPageToken` of the previous page; unset: the first page.
    pub page_token: Option<String>,
}

/// One page of dead letters.
#[napi(object, object_from_js = false)]
pub struct DeadLetterPage {
    /// Records, oldest first.
    pub records: Vec<DeadLetterRecord>,
    /// Pass to the next call to continue; unset on the last page.
    pub next_page_token: Option<String>,
}

impl From<core::DeadLetterPage> for DeadLetterPage {
    fn from(p: core::DeadLetterPage) -> Self {
        DeadLetterPage {
            records: p.records.into_iter().map(DeadLetterRecord::from).collect(),
            next_page_token: p.next_page_token,
        }
    }
}

/// Reads the `selector` argument of `requeueDeadLetters` and `deleteDeadLetters`:
/// `{ jobIds }` (exactly these jobs; ids that are not dead letters are skipped) or
/// `{ queue?, max }` (the oldest `max`, at least 1, of one queue or of all).
fn read_selector(value: Option<Unknown<'_>>) -> Result<core::DeadLetterSelector, BadInput> {
    let f = Fields::required(value, "selector")?;
    if f.get("jobIds")?.is_some() {
        return Ok(core::DeadLetterSelector::Ids(f.required_strings("jobIds")?));
    }
    let queue = f.string("queue")?;
    let max = f.required_number("max")?;
    let max = value::uint32("selector.max", max).map_err(BadInput::Value)?;
    Ok(core::DeadLetterSelector::Oldest { queue, max })
}

/// A queue's job counts.
#[napi(object, object_from_js = false)]
pub struct QueueStats {
    /// Ready jobs.
    pub ready: f64,
    /// Scheduled jobs (including retry delays).
    pub scheduled: f64,
    /// Leased jobs.
    pub in_flight: f64,
    /// Dead letters kept.
    pub dead_lettered: f64,
    /// Dedup records held, including expired ones the sweeper has not removed yet (an expired record already counts as absent).
    pub dedup_records: f64,
    /// Whether reserve skips the queue.
    pub paused: bool,
}

impl From<core::QueueStats> for QueueStats {
    fn from(s: core::QueueStats) -> Self {
        QueueStats {
            ready: s.ready as f64,
            scheduled: s.scheduled as f64,
            in_flight: s.in_flight as f64,
            dead_lettered: s.dead_lettered as f64,
            dedup_records: s.dedup_records as f64,
            paused: s.paused,
        }
    }
}

/// The error of an admin call for an argument value that cannot be used.
fn invalid_argument(message: String) -> SeppFailure {
    SeppFailure::new(ErrorCode::InvalidArgument, message)
}

#[napi]
impl SeppClient {
    /// Everything the server knows about job `jobId` (`state: 'unknown'` if nothing).
    ///
    /// Rejects with `UnsupportedError` from a server without the admin service, otherwise as
    /// `getServerInfo`.
    #[napi(ts_args_type = "jobId: string", ts_return_type = "Promise<JobInfo>")]
    pub fn get_job<'env>(
        &self,
        env: &'env Env,
        job_id: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, JobInfo>> {
        let call = (|| -> Result<_, Failure> {
            let job_id =
                read::string(job_id, "jobId").map_err(|e| e.into_failure(invalid_argument))?;
            Ok((self.core()?, job_id))
        })();
        settle(
            env,
            async move {
                let (client, job_id) = call?;
                Ok(client.get_job(&job_id).await?)
            },
            JobInfo::from,
        )
    }

    /// The live dedup record of idempotency key `key` on `queue`, or `null` when none (never
    /// used, or its dedup window has passed).
    ///
    /// Rejects with `InvalidArgumentError` for an empty queue or key, otherwise as `getJob`.
    #[napi(
        ts_args_type = "queue: string, key: string",
        ts_return_type = "Promise<KeyRecord | null>"
    )]
    pub fn lookup_idempotency_key<'env>(
        &self,
        env: &'env Env,
        queue: Option<Unknown<'env>>,
        key: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, Option<KeyRecord>>> {
        let call = (|| -> Result<_, Failure> {
            let queue =
                read::string(queue, "queue").map_err(|e| e.into_failure(invalid_argument))?;
            let key = read::string(key, "key").map_err(|e| e.into_failure(invalid_argument))?;
            Ok((self.core()?, queue, key))
        })();
        settle(
            env,
            async move {
                let (client, queue, key) = call?;
                Ok(client.lookup_idempotency_key(&queue, &key).await?)
            },
            |record| record.map(KeyRecord::from),
        )
    }

    /// One page of dead letters, oldest first, without removing them. Pass `nextPageToken`
    /// back as `pageToken` for the next page.
    ///
    /// Rejects with `InvalidArgumentError` for `pageSize` 0 or a token the server did not issue,
    /// otherwise as `getJob`.
    #[napi(
        ts_args_type = "options?: ListDeadLettersOptions",
        ts_return_type = "Promise<DeadLetterPage>"
    )]
    pub fn list_dead_letters<'env>(
        &self,
        env: &'env Env,
        options: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, DeadLetterPage>> {
        let call = (|| -> Result<_, Failure> {
            let options = (|| -> Result<_, BadInput> {
                let Some(f) = Fields::optional(options, "options")? else {
                    return Ok(ListDeadLettersOptions {
                        queue: None,
                        page_size: None,
                        page_token: None,
                    });
                };
                Ok(ListDeadLettersOptions {
                    queue: f.string("queue")?,
                    page_size: f.number("pageSize")?,
                    page_token: f.string("pageToken")?,
                })
            })()
            .map_err(|e| e.into_failure(invalid_argument))?;
            let page_size = options
                .page_size
                .map(|n| value::uint32("options.pageSize", n))
                .transpose()
                .map_err(invalid_argument)?;
            Ok((self.core()?, options.queue, page_size, options.page_token))
        })();
        settle(
            env,
            async move {
                let (client, queue, page_size, token) = call?;
                Ok(client
                    .list_dead_letters(queue.as_deref(), page_size, token.as_deref())
                    .await?)
            },
            DeadLetterPage::from,
        )
    }

    /// Puts the selected dead letters back on their queues: same id, attempt 1, enqueued
    /// now; their idempotency keys still name them. `selector` is `{ jobIds }` (exactly these
    /// jobs; ids that are not dead letters are skipped) or `{ queue?, max }` (the oldest
    /// `max`, at least 1, of one queue or of all). Resolves to the ids requeued. Never
    /// retried automatically.
    ///
    /// Rejects with `InvalidArgumentError` for `max` 0, otherwise as `getJob`.
    #[napi(
        ts_args_type = "selector: { jobIds: string[] } | { queue?: string; max: number }",
        ts_return_type = "Promise<string[]>"
    )]
    pub fn requeue_dead_letters<'env>(
        &self,
        env: &'env Env,
        selector: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, Vec<String>>> {
        let call = (|| -> Result<_, Failure> {
            let selector = read_selector(selector).map_err(|e| e.into_failure(invalid_argument))?;
            Ok((self.core()?, selector))
        })();
        settle(
            env,
            async move {
                let (client, selector) = call?;
                Ok(client.requeue_dead_letters(&selector).await?)
            },
            |ids| ids,
        )
    }

    /// Deletes the selected dead letters for good. Resolves to the ids deleted.
    ///
    /// Rejects as `requeueDeadLetters`.
    #[napi(
        ts_args_type = "selector: { jobIds: string[] } | { queue?: string; max: number }",
        ts_return_type = "Promise<string[]>"
    )]
    pub fn delete_dead_letters<'env>(
        &self,
        env: &'env Env,
        selector: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, Vec<String>>> {
        let call = (|| -> Result<_, Failure> {
            let selector = read_selector(selector).map_err(|e| e.into_failure(invalid_argument))?;
            Ok((self.core()?, selector))
        })();
        settle(
            env,
            async move {
                let (client, selector) = call?;
                Ok(client.delete_dead_letters(&selector).await?)
            },
            |ids| ids,
        )
    }

    /// Pauses `queue`: reserve skips it while enqueues are still accepted. Survives server
    /// restarts.
    ///
    /// Rejects as `getJob`.
    #[napi(ts_args_type = "queue: string", ts_return_type = "Promise<void>")]
    pub fn pause_queue<'env>(
        &self,
        env: &'env Env,
        queue: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, ()>> {
        let call = self.queue_call(queue);
        settle(
            env,
            async move {
                let (client, queue) = call?;
                Ok(client.pause_queue(&queue).await?)
            },
            |()| (),
        )
    }

    /// Resumes a paused `queue`.
    ///
    /// Rejects as `getJob`.
    #[napi(ts_args_type = "queue: string", ts_return_type = "Promise<void>")]
    pub fn resume_queue<'env>(
        &self,
        env: &'env Env,
        queue: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, ()>> {
        let call = self.queue_call(queue);
        settle(
            env,
            async move {
                let (client, queue) = call?;
                Ok(client.resume_queue(&queue).await?)
            },
            |()| (),
        )
    }

    /// Counts of `queue`'s jobs by state, and whether it is paused.
    ///
    /// Rejects as `getJob`.
    #[napi(ts_args_type = "queue: string", ts_return_type = "Promise<QueueStats>")]
    pub fn get_queue_stats<'env>(
        &self,
        env: &'env Env,
        queue: Option<Unknown<'env>>,
    ) -> napi::Result<PromiseRaw<'env, QueueStats>> {
        let call = self.queue_call(queue);
        settle(
            env,
            async move {
                let (client, queue) = call?;
                Ok(client.get_queue_stats(&queue).await?)
            },
            QueueStats::from,
        )
    }

    /// The client and the `queue` argument of the queue calls.
    fn queue_call(
        &self,
        queue: Option<Unknown<'_>>,
    ) -> Result<(sepp_rs::SeppClient, String), Failure> {
        let queue = read::string(queue, "queue").map_err(|e| e.into_failure(invalid_argument))?;
        Ok((self.core()?, queue))
    }
}
