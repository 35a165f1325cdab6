//! The operator calls of `sepp.admin.v1` (sepp servers only; a server without them answers
//! [`ErrorCode::Unsupported`]): job inspection, idempotency-key lookup, non-destructive
//! dead-letter listing, requeue and delete, pause/resume, queue stats.

use crate::client::SeppClient;
use crate::error::ClientError;
#[allow(unused_imports)]
use crate::error::ErrorCode;
use crate::job::{
    DeadLetterCause, DeadLetterRecord, Payload, TraceContext, Value, custom_from_proto,
    proto_to_system_time,
};
use crate::retry::RetryClass;
use sepp_proto::admin::v1 as pb;
use sepp_proto::prost_types;
use std::collections::BTreeMap;
use std::time::SystemTime;

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    /// Acked (a tombstone kept while its idempotency key's dedup record lives).
    Acked,
    /// Cancelled before it ran (reserved: no server produces it yet).
    Cancelled,
    /// Gone while its idempotency key's record lives: a dead letter drained, deleted or past
    /// its retention (reported by a dedup hit).
    Deleted,
}

impl JobState {
    /// The former name of [`JobState::Acked`] ("ack", not "complete", is the word).
    #[deprecated(note = "renamed `JobState::Acked`")]
    #[allow(non_upper_case_globals)]
    pub const Completed: JobState = JobState::Acked;

    /// From `sepp.v1.JobState` (which `sepp.admin.v1.JobInfo.state` uses too, with the same
    /// numbers as the older `sepp.admin.v1.JobState`).
    pub(crate) fn from_proto(v: i32) -> Self {
        use sepp_proto::v1::JobState as W;
        match W::try_from(v) {
            Ok(W::Scheduled) => JobState::Scheduled,
            Ok(W::Ready) => JobState::Ready,
            Ok(W::InFlight) => JobState::InFlight,
            Ok(W::DeadLettered) => JobState::DeadLettered,
            Ok(W::Acked) => JobState::Acked,
            Ok(W::Cancelled) => JobState::Cancelled,
            Ok(W::Deleted) => JobState::Deleted,
            _ => JobState::Unknown,
        }
    }

    /// The stable SCREAMING_SNAKE name, e.g. `IN_FLIGHT` (Python's state strings).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Unknown => "UNKNOWN",
            JobState::Scheduled => "SCHEDULED",
            JobState::Ready => "READY",
            JobState::InFlight => "IN_FLIGHT",
            JobState::DeadLettered => "DEAD_LETTERED",
            JobState::Acked => "ACKED",
            JobState::Cancelled => "CANCELLED",
            JobState::Deleted => "DELETED",
        }
    }
}

/// What the server knows about one job.
#[derive(Debug, Clone, PartialEq)]
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
    /// 0–9.
    pub priority: u32,
    /// When it was enqueued.
    pub enqueued_at: Option<SystemTime>,
    /// When it becomes ready, while scheduled.
    pub scheduled_at: Option<SystemTime>,
    /// When its lease ends, while in flight.
    pub lease_expires_at: Option<SystemTime>,
    /// The reason of its last nack.
    pub last_reason: Option<String>,
    /// When it was acked or dead-lettered.
    pub finished_at: Option<SystemTime>,
    /// Why it was dead-lettered.
    pub dead_letter_cause: Option<DeadLetterCause>,
    /// Its idempotency key, while its body is kept.
    pub idempotency_key: Option<String>,
    /// The worker label of its current lease.
    pub worker_id: Option<String>,
    /// Its data, as enqueued (or as a dedup hit replaced it). `None` when it has none, and
    /// once only a tombstone is left of the job (acked, cancelled, a dead letter past its
    /// retention).
    pub payload: Option<Payload>,
    /// Its custom entries; empty when it has none, or only a tombstone is left.
    pub custom: BTreeMap<String, Value>,
    /// Its trace context; `None` when it has none, or only a tombstone is left.
    pub trace_context: Option<TraceContext>,
}

/// A live dedup record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// The job the key names.
    pub job_id: String,
    /// When the record was written (the first accepted enqueue).
    pub created_at: Option<SystemTime>,
    /// When it stops deduplicating.
    pub expires_at: Option<SystemTime>,
}

/// One page of dead letters.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetterPage {
    /// Records, oldest first.
    pub records: Vec<DeadLetterRecord>,
    /// Pass to the next call to continue; `None` on the last page.
    pub next_page_token: Option<String>,
}

/// Which dead letters a requeue or delete applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadLetterSelector {
    /// Exactly these jobs (ids that are not dead letters are skipped).
    Ids(Vec<String>),
    /// The oldest `max` (at least 1) of one queue, or of all.
    Oldest {
        /// One queue, or all.
        queue: Option<String>,
        /// How many.
        max: u32,
    },
}

impl DeadLetterSelector {
    fn to_proto(&self) -> pb::DeadLetterSelector {
        match self {
            DeadLetterSelector::Ids(ids) => pb::DeadLetterSelector {
                job_ids: ids.clone(),
                ..Default::default()
            },
            DeadLetterSelector::Oldest { queue, max } => pb::DeadLetterSelector {
                job_ids: vec![],
                queue: queue.clone(),
                max: Some(*max),
            },
        }
    }
}

/// A queue's job counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Ready jobs.
    pub ready: u64,
    /// Scheduled jobs (including retry delays).
    pub scheduled: u64,
    /// Leased jobs.
    pub in_flight: u64,
    /// Dead letters kept.
    pub dead_lettered: u64,
    /// Dedup records held, including expired ones the sweeper has not removed yet (an expired record already counts as absent).
    pub dedup_records: u64,
    /// Whether Reserve skips the queue.
    pub paused: bool,
}

fn ts(t: Option<&prost_types::Timestamp>) -> Option<SystemTime> {
    t.map(proto_to_system_time)
}

impl SeppClient {
    async fn admin_call<T, F, Fut>(&self, class: RetryClass, mut call: F) -> Result<T, ClientError>
    where
        F: FnMut(
            sepp_proto::admin::v1::admin_service_client::AdminServiceClient<
                tonic::transport::Channel,
            >,
        ) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.with_retries(class, || call(self.inner.admin.clone()))
            .await
            .map_err(|s| ClientError::from_status(&s, false))
    }

    /// Everything the server knows about job `job_id` ([`JobState::Unknown`] if nothing).
    ///
    /// # Errors
    /// [`ClientError`] for transport, auth and server failures; [`ErrorCode::Unsupported`]
    /// from a server without the admin service.
    pub async fn get_job(&self, job_id: &str) -> Result<JobInfo, ClientError> {
        let msg = pb::GetJobRequest {
            job_id: job_id.to_string(),
        };
        let r = self
            .admin_call(RetryClass::Read, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.get_job(req).await }
            })
            .await?;
        let j = r.job.unwrap_or_default();
        Ok(JobInfo {
            job_id: if j.job_id.is_empty() {
                job_id.to_string()
            } else {
                j.job_id
            },
            state: JobState::from_proto(j.state),
            queue: j.queue,
            job_type: j.job_type,
            attempt: j.attempt,
            max_attempts: j.max_attempts,
            priority: j.priority,
            enqueued_at: ts(j.enqueued_at.as_ref()),
            scheduled_at: ts(j.scheduled_at.as_ref()),
            lease_expires_at: ts(j.lease_expires_at.as_ref()),
            last_reason: j.last_reason,
            finished_at: ts(j.finished_at.as_ref()),
            dead_letter_cause: (j.dead_letter_cause != 0)
                .then(|| DeadLetterCause::from_proto(j.dead_letter_cause)),
            idempotency_key: j.idempotency_key,
            worker_id: j.worker_id,
            payload: j.payload.map(Payload::from_proto),
            custom: custom_from_proto(j.custom),
            trace_context: j.trace_context.map(TraceContext::from_proto),
        })
    }

    /// The live dedup record of `key` on `queue`, or `None`.
    ///
    /// # Errors
    /// As [`SeppClient::get_job`]; [`ErrorCode::InvalidArgument`] for an empty queue or key.
    pub async fn lookup_idempotency_key(
        &self,
        queue: &str,
        key: &str,
    ) -> Result<Option<KeyRecord>, ClientError> {
        let msg = pb::LookupIdempotencyKeyRequest {
            queue: queue.to_string(),
            idempotency_key: key.to_string(),
        };
        let r = self
            .admin_call(RetryClass::Read, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.lookup_idempotency_key(req).await }
            })
            .await?;
        Ok(r.found.then(|| KeyRecord {
            job_id: r.job_id,
            created_at: ts(r.created_at.as_ref()),
            expires_at: ts(r.expires_at.as_ref()),
        }))
    }

    /// Ends every lease `worker_id` holds, now, as if each had expired (redelivered, or on its
    /// last attempt dead-lettered with `LEASE_EXPIRED`): for a supervisor that knows the worker
    /// died. Returns the ids released. Not retried (a retry after a lost reply would release
    /// leases the worker took in between, were it alive after all).
    ///
    /// # Errors
    /// As [`SeppClient::get_job`]; [`ErrorCode::InvalidArgument`] for an empty worker id.
    pub async fn release_leases(&self, worker_id: &str) -> Result<Vec<String>, ClientError> {
        let msg = pb::ReleaseLeasesRequest {
            worker_id: worker_id.to_string(),
        };
        let r = self
            .admin_call(RetryClass::Never, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.release_leases(req).await }
            })
            .await?;
        Ok(r.job_ids)
    }

    /// Forgets an idempotency key: deletes its live dedup record, so that the next enqueue with
    /// the key creates a new job. Returns the id of the job the record named, or `None` when
    /// there was no live record. The job itself is not touched. Not retried (a retry after a
    /// lost reply could forget a record written in between). The server logs who did it.
    ///
    /// # Errors
    /// As [`SeppClient::lookup_idempotency_key`].
    pub async fn forget_idempotency_key(
        &self,
        queue: &str,
        key: &str,
    ) -> Result<Option<String>, ClientError> {
        let msg = pb::ForgetIdempotencyKeyRequest {
            queue: queue.to_string(),
            idempotency_key: key.to_string(),
        };
        let r = self
            .admin_call(RetryClass::Never, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.forget_idempotency_key(req).await }
            })
            .await?;
        Ok(r.forgotten.then_some(r.job_id))
    }

    /// One page (default 100, at most 1000 records) of dead letters, oldest first, without
    /// removing them. Pass the returned token back for the next page.
    ///
    /// # Errors
    /// As [`SeppClient::get_job`]; [`ErrorCode::InvalidArgument`] for `page_size = 0` or a
    /// token the server did not issue.
    pub async fn list_dead_letters(
        &self,
        queue: Option<&str>,
        page_size: Option<u32>,
        page_token: Option<&str>,
    ) -> Result<DeadLetterPage, ClientError> {
        let msg = pb::ListDeadLettersRequest {
            queue: queue.map(str::to_string),
            page_size,
            page_token: page_token.unwrap_or_default().to_string(),
        };
        let r = self
            .admin_call(RetryClass::Read, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.list_dead_letters(req).await }
            })
            .await?;
        Ok(DeadLetterPage {
            records: r
                .records
                .into_iter()
                .map(DeadLetterRecord::from_proto)
                .collect(),
            next_page_token: (!r.next_page_token.is_empty()).then_some(r.next_page_token),
        })
    }

    /// Puts the selected dead letters back on their queues (same id, attempt 1, enqueued
    /// now; their idempotency keys still name them). Returns the ids requeued. Never retried
    /// automatically.
    ///
    /// # Errors
    /// As [`SeppClient::get_job`]; [`ErrorCode::InvalidArgument`] for `max = 0`.
    pub async fn requeue_dead_letters(
        &self,
        selector: &DeadLetterSelector,
    ) -> Result<Vec<String>, ClientError> {
        let msg = pb::RequeueDeadLettersRequest {
            selector: Some(selector.to_proto()),
        };
        let r = self
            .admin_call(RetryClass::Never, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.requeue_dead_letters(req).await }
            })
            .await?;
        Ok(r.job_ids)
    }

    /// Deletes the selected dead letters for good. Returns the ids deleted.
    ///
    /// # Errors
    /// As [`SeppClient::requeue_dead_letters`].
    pub async fn delete_dead_letters(
        &self,
        selector: &DeadLetterSelector,
    ) -> Result<Vec<String>, ClientError> {
        let msg = pb::DeleteDeadLettersRequest {
            selector: Some(selector.to_proto()),
        };
        let r = self
            .admin_call(RetryClass::Never, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.delete_dead_letters(req).await }
            })
            .await?;
        Ok(r.job_ids)
    }

    /// Pauses `queue`: Reserve skips it, enqueues are still accepted. Survives restarts.
    ///
    /// # Errors
    /// As [`SeppClient::get_job`].
    pub async fn pause_queue(&self, queue: &str) -> Result<(), ClientError> {
        let msg = pb::PauseQueueRequest {
            queue: queue.to_string(),
        };
        self.admin_call(RetryClass::Read, |mut c| {
            let req = self.request(msg.clone(), None);
            async move { c.pause_queue(req).await }
        })
        .await?;
        Ok(())
    }

    /// Resumes a paused queue.
    ///
    /// # Errors
    /// As [`SeppClient::get_job`].
    pub async fn resume_queue(&self, queue: &str) -> Result<(), ClientError> {
        let msg = pb::ResumeQueueRequest {
            queue: queue.to_string(),
        };
        self.admin_call(RetryClass::Read, |mut c| {
            let req = self.request(msg.clone(), None);
            async move { c.resume_queue(req).await }
        })
        .await?;
        Ok(())
    }

    /// Counts of `queue`'s jobs by state.
    ///
    /// # Errors
    /// As [`SeppClient::get_job`].
    pub async fn get_queue_stats(&self, queue: &str) -> Result<QueueStats, ClientError> {
        let msg = pb::GetQueueStatsRequest {
            queue: queue.to_string(),
        };
        let r = self
            .admin_call(RetryClass::Read, |mut c| {
                let req = self.request(msg.clone(), None);
                async move { c.get_queue_stats(req).await }
            })
            .await?;
        Ok(QueueStats {
            ready: r.ready,
            scheduled: r.scheduled,
            in_flight: r.in_flight,
            dead_lettered: r.dead_lettered,
            dedup_records: r.dedup_records,
            paused: r.paused,
        })
    }
}
