//! Coalescing of concurrent enqueues: the `enqueue` calls made on one client while its
//! batches in flight are busy wait here and leave together, as one `EnqueueBatch`.
//!
//! There is no timer. A call that finds fewer than `max_batches_in_flight` batches in flight
//! (and nobody waiting) leaves at once, alone, from its own task, so one caller on an idle
//! client waits no longer than with one RPC per call. Only when every slot is busy do calls
//! wait; when a batch comes back, its slot takes everything that waited (up to the batch
//! limits) in the next batch, which runs in a task of its own.
//!
//! Each caller gets its own result, as if it had called alone:
//! - `EnqueueBatch` is best effort, one `JobResult` per job in order, so a rejected job
//!   rejects only its own caller; a failure of the call as a whole (transport, auth, a server
//!   fault) fails only the callers of that batch.
//! - Keyed and unkeyed jobs never share a batch, so the retry table of the protocol applies
//!   to each batch as it would to each call: a batch of keyed jobs is retried as a keyed
//!   enqueue, a batch of unkeyed jobs as an unkeyed one.
//! - Every call of one client carries the same request metadata (the API key is the client's,
//!   and so is the deadline budget): a client's calls form one metadata group, and the calls
//!   of two clients never share a batch.
//! - A batch's deadline is the earliest of its callers' (each caller's `rpc_timeout` counts
//!   from its own call, waiting included); a caller whose deadline passed while it waited
//!   fails with a transport error and is not sent.
//! - A caller that gives up (drops its future, or cancels the [`EnqueueHandle`] of
//!   `enqueue_with`) before its batch is formed is left out of it.
//!   Once its batch has left, the job may be committed, as with a lost reply to a unary call.
//!
//! Batch limits: at most the server's `max_enqueue_batch` jobs
//! ([`DEFAULT_COALESCED_BATCH_JOBS`] until the server advertised it) and at most
//! [`MAX_COALESCED_BATCH_BYTES`] of encoded jobs, the gRPC default message limit, so that a
//! batch fits any server that a single job fits (a job larger than that leaves alone).

use crate::admin::JobState;
use crate::client::{SeppClient, rejection_from_proto};
use crate::error::{ClientError, EnqueueError, ErrorCode};
use crate::job::EnqueueAck;
use crate::retry::RetryClass;
use prost::Message;
use sepp_proto::v1 as pb;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The default of `max_batches_in_flight`: coalesced batches one client sends at once.
/// Chosen by measurement (docs/benchmarks.md, "One client shared by 32 tasks"): with 32 tasks
/// on one client, 1 and 2 gave the most enqueues per second and 4 and 8 fewer (more slots
/// make smaller batches); 2 keeps the server busy while one reply travels back.
pub const DEFAULT_MAX_BATCHES_IN_FLIGHT: usize = 2;

/// Most jobs in one coalesced batch until the server advertised its `max_enqueue_batch`
/// (a server without `GetServerInfo`): 100, well below the 256 a sepp server allows by
/// default (`limits.max_enqueue_batch`).
pub const DEFAULT_COALESCED_BATCH_JOBS: usize = 100;

/// Most encoded bytes of the jobs in one coalesced batch: 4 MiB, the gRPC default limit of a
/// received message, less 64 KiB for the batch's own framing.
pub const MAX_COALESCED_BATCH_BYTES: usize = 4 * 1024 * 1024 - 64 * 1024;

/// A caller's answer: its own ack, rejection or failure.
type Reply = Result<EnqueueAck, EnqueueError>;

/// The callback of [`SeppClient::enqueue_with`](crate::SeppClient::enqueue_with).
pub(crate) type OnReply = Box<dyn FnOnce(Reply) + Send>;

/// How a waiting caller is answered.
enum Answer {
    /// An `enqueue` future, through a channel: closed when the caller dropped its future.
    Channel(oneshot::Sender<Reply>),
    /// A callback of `enqueue_with`: given up once its [`EnqueueHandle`] was cancelled.
    Callback(Callback),
}

impl Answer {
    /// Whether the caller gave up.
    fn is_closed(&self) -> bool {
        match self {
            Answer::Channel(tx) => tx.is_closed(),
            Answer::Callback(cb) => cb.cancelled.load(Ordering::Acquire),
        }
    }

    /// Drops a caller that gave up, unanswered.
    fn give_up(self) {
        if let Answer::Callback(cb) = self {
            cb.forget();
        }
    }

    /// Answers the caller (a channel whose caller gave up drops the answer).
    fn send(self, reply: Reply) {
        match self {
            Answer::Channel(tx) => {
                let _ = tx.send(reply);
            }
            Answer::Callback(cb) => cb.call(reply),
        }
    }
}

/// A callback that is called at most once: with the caller's answer, or, if it is dropped
/// unanswered (its task dropped as the runtime shut down, or a panic in it), with a transport
/// error. A caller that gave up and is skipped drops it uncalled ([`Callback::forget`]); one
/// that gave up after its batch left may still be called.
struct Callback {
    f: Option<OnReply>,
    cancelled: Arc<AtomicBool>,
}

impl Callback {
    /// Calls the callback with `reply`.
    fn call(mut self, reply: Reply) {
        if let Some(f) = self.f.take() {
            f(reply);
        }
    }

    /// Drops the callback without calling it (its caller gave up).
    fn forget(mut self) {
        self.f = None;
    }
}

impl Drop for Callback {
    fn drop(&mut self) {
        if let Some(f) = self.f.take() {
            f(Err(runtime_stopped()));
        }
    }
}

/// The answer of a caller whose batch's task ended unanswered.
fn runtime_stopped() -> EnqueueError {
    EnqueueError::Client(ClientError::new(
        ErrorCode::Transport,
        "the enqueue's task ended before it was answered (its runtime stopped, or it panicked)",
    ))
}

/// Cancels an enqueue made with [`SeppClient::enqueue_with`](crate::SeppClient::enqueue_with):
/// if its job has not left in a batch yet, it never will and its callback is not called. Once
/// its batch left, the job may be committed (as with a unary call cut off) and the callback
/// may still be called.
#[derive(Debug, Clone, Default)]
pub struct EnqueueHandle {
    cancelled: Arc<AtomicBool>,
    task: Option<tokio::task::AbortHandle>,
}

impl EnqueueHandle {
    /// Gives up the enqueue (see the type's docs). Idempotent; harmless after the answer.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        if let Some(t) = &self.task {
            t.abort();
        }
    }

    /// Runs `call` in a task of `runtime` and answers `on_reply` with its result (the enqueue of
    /// a client without coalescing); the handle aborts the task. A task that ends unanswered
    /// (aborted, panicked, its runtime stopped) answers with a transport error.
    pub(crate) fn spawn(
        runtime: &tokio::runtime::Handle,
        call: impl std::future::Future<Output = Reply> + Send + 'static,
        on_reply: OnReply,
    ) -> Self {
        let cancelled = Arc::<AtomicBool>::default();
        let callback = Callback {
            f: Some(on_reply),
            cancelled: cancelled.clone(),
        };
        let task = runtime.spawn(async move { callback.call(call.await) });
        EnqueueHandle {
            cancelled,
            task: Some(task.abort_handle()),
        }
    }
}

/// One caller waiting for a batch.
struct Waiter {
    /// Order of arrival across both queues, so the older queue goes first.
    seq: u64,
    job: pb::EnqueueRequest,
    /// The job's share of the batch message: its encoding with tag and length.
    bytes: usize,
    /// When the caller's `rpc_timeout` runs out; `None` without a timeout.
    deadline: Option<Instant>,
    /// Owned by the batch that takes the waiter, which sends exactly one reply. Closed when
    /// the caller gave up: the waiter is then skipped.
    reply: Answer,
}

/// Callers waiting and slots taken. Calls that may share a batch wait in the same queue.
#[derive(Default)]
struct State {
    /// Batches in flight, at most `max_batches_in_flight`.
    in_flight: usize,
    next_seq: u64,
    /// Unkeyed jobs (index 0) and keyed jobs (index 1) wait apart: they never share a batch.
    waiting: [VecDeque<Waiter>; 2],
}

/// The coalescer of one client; shared by its clones.
pub(crate) struct Coalescer {
    max_in_flight: usize,
    state: Mutex<State>,
}

/// A batch taken from a queue, with the callers it answers.
struct Batch {
    keyed: bool,
    waiters: Vec<Waiter>,
}

/// A slot in flight. Dropping it (when its batch is answered, or its task is dropped)
/// frees the slot and sends what waited.
struct Slot(SeppClient);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(c) = self.0.inner.coalescer.as_ref() {
            c.lock().in_flight -= 1;
            c.dispatch(&self.0);
        }
    }
}

impl Coalescer {
    pub(crate) fn new(max_in_flight: usize) -> Self {
        Coalescer {
            max_in_flight: max_in_flight.max(1),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Enqueues one job that passed the checks before sending: it joins the queue of its
    /// kind and leaves with the next batch that has room.
    pub(crate) async fn enqueue(&self, client: &SeppClient, job: pb::EnqueueRequest) -> Reply {
        let keyed = job.idempotency_key.is_some();
        let deadline = client.rpc_timeout().map(|t| Instant::now() + t);
        // Nobody waits and a slot is free: the job leaves at once as a batch of its own, and
        // it is sent from the caller's own task. No other caller's job is in that batch, so
        // if this caller gives up, only its own call is cut off (as with a unary call), and
        // its slot, dropped with its future, sends whatever waits by then. Against a task and
        // a channel per call, this saves a task spawn and a cross-thread wake-up on every
        // enqueue of an uncontended client.
        let slot = {
            let mut s = self.lock();
            let idle = s.waiting.iter().all(VecDeque::is_empty);
            if idle && s.in_flight < self.max_in_flight {
                s.in_flight += 1;
                true
            } else {
                false
            }
        };
        if slot {
            let slot = Slot(client.clone());
            let reply = match call(&slot.0, keyed, vec![job], timeout_of([deadline])).await {
                Ok(mut results) => results.pop().map_or_else(no_result, job_result),
                Err(e) => Err(EnqueueError::Client(e)),
            };
            drop(slot);
            return reply;
        }
        let (reply, answer) = oneshot::channel();
        self.wait(client, job, deadline, Answer::Channel(reply));
        // An error: the batch's task was dropped before it answered (the runtime is stopping).
        answer.await.unwrap_or_else(|_| Err(runtime_stopped()))
    }

    /// Enqueues one job that passed the checks before sending, answering through `on_reply`
    /// instead of a future: the job joins the queue of its kind, and the batch that takes it
    /// calls `on_reply` from its task. Unlike [`Coalescer::enqueue`], a caller on an idle
    /// client leaves in a batch task of its own (there is no caller's task to send from).
    /// Must run in the client's tokio runtime context.
    pub(crate) fn enqueue_with(
        &self,
        client: &SeppClient,
        job: pb::EnqueueRequest,
        on_reply: OnReply,
    ) -> EnqueueHandle {
        let handle = EnqueueHandle::default();
        let deadline = client.rpc_timeout().map(|t| Instant::now() + t);
        let callback = Callback {
            f: Some(on_reply),
            cancelled: handle.cancelled.clone(),
        };
        self.wait(client, job, deadline, Answer::Callback(callback));
        handle
    }

    /// Puts a caller in the queue of its kind and sends what a free slot can take.
    fn wait(
        &self,
        client: &SeppClient,
        job: pb::EnqueueRequest,
        deadline: Option<Instant>,
        reply: Answer,
    ) {
        let keyed = job.idempotency_key.is_some();
        let len = job.encoded_len();
        {
            let mut s = self.lock();
            let seq = s.next_seq;
            s.next_seq += 1;
            s.waiting[usize::from(keyed)].push_back(Waiter {
                seq,
                bytes: len + prost::length_delimiter_len(len) + 1,
                job,
                deadline,
                reply,
            });
        }
        self.dispatch(client);
    }

    /// Sends batches while a slot is free and callers wait.
    fn dispatch(&self, client: &SeppClient) {
        // Outside a tokio runtime (a slot dropped after its runtime went away) nothing can be
        // sent, as no tonic call can run; spawning would panic.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let max_jobs = client
            .max_enqueue_batch()
            .map_or(DEFAULT_COALESCED_BATCH_JOBS, |n| n as usize);
        loop {
            // Callers left out (gave up, or out of time) are answered after the lock is
            // released: a callback may enqueue again, which takes the lock.
            let mut left_out = Vec::new();
            let batch = {
                let mut s = self.lock();
                if s.in_flight >= self.max_in_flight {
                    return;
                }
                let batch = take_batch(&mut s, max_jobs, Instant::now(), &mut left_out);
                if batch.is_some() {
                    s.in_flight += 1;
                }
                batch
            };
            answer_left_out(left_out);
            let Some(batch) = batch else { return };
            let slot = Slot(client.clone());
            // The batch runs in its own task so that no caller's future carries it: a caller
            // that gives up does not cut off the others' call.
            runtime.spawn(async move {
                send(&slot.0, batch).await;
                drop(slot);
            });
        }
    }
}

/// Takes the next batch: from the queue whose oldest caller came first, callers in order while
/// the batch has room. Callers that gave up and those whose deadline passed are moved to
/// `left_out`, for [`answer_left_out`], and not sent.
fn take_batch(
    s: &mut State,
    max_jobs: usize,
    now: Instant,
    left_out: &mut Vec<Waiter>,
) -> Option<Batch> {
    for q in &mut s.waiting {
        drop_given_up(q, now, left_out);
    }
    let idx = match (s.waiting[0].front(), s.waiting[1].front()) {
        (Some(a), Some(b)) => usize::from(b.seq < a.seq),
        (Some(_), None) => 0,
        (None, Some(_)) => 1,
        (None, None) => return None,
    };
    let q = &mut s.waiting[idx];
    let mut waiters = Vec::new();
    let mut bytes = 0;
    while waiters.len() < max_jobs {
        drop_given_up(q, now, left_out);
        let Some(w) = q.front() else { break };
        if !waiters.is_empty() && bytes + w.bytes > MAX_COALESCED_BATCH_BYTES {
            break;
        }
        bytes += w.bytes;
        waiters.extend(q.pop_front());
    }
    Some(Batch {
        keyed: idx == 1,
        waiters,
    })
}

/// Moves, from the front of `q` to `left_out`, the callers that gave up and those whose
/// deadline passed.
fn drop_given_up(q: &mut VecDeque<Waiter>, now: Instant, left_out: &mut Vec<Waiter>) {
    while let Some(w) = q.front() {
        let expired = w.deadline.is_some_and(|d| d <= now);
        if !w.reply.is_closed() && !expired {
            return;
        }
        left_out.extend(q.pop_front());
    }
}

/// Answers the callers [`take_batch`] left out, outside the coalescer's lock: those that gave
/// up get nothing, the others (whose deadline passed) a transport error.
fn answer_left_out(left_out: Vec<Waiter>) {
    for w in left_out {
        if w.reply.is_closed() {
            w.reply.give_up();
        } else {
            w.reply.send(Err(EnqueueError::Client(ClientError::new(
                ErrorCode::Transport,
                "rpc_timeout passed while the enqueue waited for a batch",
            ))));
        }
    }
}

/// The deadline of a batch: the earliest of its callers' (at least 1 ms), `None` if none has one.
fn timeout_of(deadlines: impl IntoIterator<Item = Option<Instant>>) -> Option<Duration> {
    deadlines.into_iter().flatten().min().map(|d| {
        d.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    })
}

/// Sends one batch and answers each of its callers.
async fn send(client: &SeppClient, batch: Batch) {
    let Batch { keyed, waiters } = batch;
    let timeout = timeout_of(waiters.iter().map(|w| w.deadline));
    let (jobs, replies): (Vec<_>, Vec<_>) = waiters.into_iter().map(|w| (w.job, w.reply)).unzip();
    match call(client, keyed, jobs, timeout).await {
        Ok(results) => {
            for (reply, r) in replies.into_iter().zip(results) {
                reply.send(job_result(r));
            }
        }
        Err(e) => {
            for reply in replies {
                reply.send(Err(EnqueueError::Client(e.clone())));
            }
        }
    }
}

/// Sends `jobs` as one `EnqueueBatch` under the retry policy of their kind; the results, one
/// per job in order, or the error of the call as a whole.
async fn call(
    client: &SeppClient,
    keyed: bool,
    jobs: Vec<pb::EnqueueRequest>,
    timeout: Option<Duration>,
) -> Result<Vec<pb::JobResult>, ClientError> {
    let n = jobs.len();
    let msg = pb::EnqueueBatchRequest { jobs };
    let class = if keyed {
        RetryClass::KeyedEnqueue
    } else {
        RetryClass::UnkeyedEnqueue
    };
    let resp = client
        .with_retries(class, || {
            let mut c = client.inner.grpc.clone();
            let req = client.request_with_timeout(msg.clone(), timeout);
            async move { c.enqueue_batch(req).await }
        })
        .await;
    match resp {
        Ok(r) if r.results.len() == n => Ok(r.results),
        Ok(r) => Err(ClientError::new(
            ErrorCode::ServerFault,
            format!(
                "the server returned {} results for {n} jobs",
                r.results.len()
            ),
        )),
        Err(s) => Err(ClientError::from_status(&s, false)),
    }
}

/// The answer when the server's reply holds no result for a job.
fn no_result() -> Reply {
    Err(EnqueueError::Client(ClientError::new(
        ErrorCode::ServerFault,
        "the server returned no result for the job",
    )))
}

/// One job's result as its caller's answer.
pub(crate) fn job_result(r: pb::JobResult) -> Reply {
    match r.outcome {
        Some(pb::job_result::Outcome::Success(s)) => Ok(EnqueueAck {
            original_state: s.original_state.map(JobState::from_proto),
            job_id: s.job_id,
            deduplicated: s.deduplicated,
            replaced: s.replaced,
        }),
        Some(pb::job_result::Outcome::Rejection(r)) => {
            Err(EnqueueError::Rejected(rejection_from_proto(r)))
        }
        None => no_result(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(seq: u64, bytes: usize) -> (Waiter, oneshot::Receiver<Reply>) {
        let (reply, rx) = oneshot::channel();
        (
            Waiter {
                seq,
                job: pb::EnqueueRequest::default(),
                bytes,
                deadline: None,
                reply: Answer::Channel(reply),
            },
            rx,
        )
    }

    #[test]
    fn the_older_queue_goes_first_and_kinds_never_mix() {
        let mut s = State::default();
        let (a, _ra) = waiter(1, 10);
        let (b, _rb) = waiter(0, 10);
        let (c, _rc) = waiter(2, 10);
        s.waiting[0].push_back(a);
        s.waiting[1].push_back(b);
        s.waiting[1].push_back(c);
        let first = take_batch(&mut s, 10, Instant::now(), &mut Vec::new()).unwrap();
        assert!(first.keyed);
        assert_eq!(
            first.waiters.iter().map(|w| w.seq).collect::<Vec<_>>(),
            [0, 2]
        );
        let second = take_batch(&mut s, 10, Instant::now(), &mut Vec::new()).unwrap();
        assert!(!second.keyed);
        assert_eq!(second.waiters.len(), 1);
        assert!(take_batch(&mut s, 10, Instant::now(), &mut Vec::new()).is_none());
    }

    #[test]
    fn a_batch_stops_at_the_job_count_and_the_byte_limit() {
        let mut s = State::default();
        let mut rx = Vec::new();
        for seq in 0..5 {
            let (w, r) = waiter(seq, MAX_COALESCED_BATCH_BYTES / 2);
            s.waiting[0].push_back(w);
            rx.push(r);
        }
        // Two halves fill a batch; the third waits.
        assert_eq!(
            take_batch(&mut s, 10, Instant::now(), &mut Vec::new())
                .unwrap()
                .waiters
                .len(),
            2
        );
        // A count limit of 1 stops before the bytes do.
        assert_eq!(
            take_batch(&mut s, 1, Instant::now(), &mut Vec::new())
                .unwrap()
                .waiters
                .len(),
            1
        );
        // A job larger than the limit still leaves, alone.
        let (big, _r) = waiter(9, MAX_COALESCED_BATCH_BYTES * 2);
        let mut s = State::default();
        s.waiting[0].push_back(big);
        assert_eq!(
            take_batch(&mut s, 10, Instant::now(), &mut Vec::new())
                .unwrap()
                .waiters
                .len(),
            1
        );
    }

    #[test]
    fn callers_that_gave_up_or_ran_out_of_time_are_not_sent() {
        let mut s = State::default();
        let (gone, rx_gone) = waiter(0, 10);
        drop(rx_gone);
        let (late, mut rx_late) = waiter(1, 10);
        let late = Waiter {
            deadline: Some(Instant::now()),
            ..late
        };
        let (kept, _rx_kept) = waiter(2, 10);
        s.waiting[0].extend([gone, late, kept]);
        let mut left_out = Vec::new();
        let batch = take_batch(&mut s, 10, Instant::now(), &mut left_out).unwrap();
        assert_eq!(batch.waiters.iter().map(|w| w.seq).collect::<Vec<_>>(), [2]);
        assert_eq!(left_out.iter().map(|w| w.seq).collect::<Vec<_>>(), [0, 1]);
        // Answered only once outside the lock.
        assert!(rx_late.try_recv().is_err());
        answer_left_out(left_out);
        let e = rx_late.try_recv().unwrap().unwrap_err();
        assert_eq!(e.code(), ErrorCode::Transport);
    }
}
