//! Long-poll Reserve: look for ready jobs across the listed queues; if there are none, wait
//! until a job becomes ready on one of them, the wait runs out, or the server shuts down.
//!
//! A waiter registers on each queue's ready signal *before* it looks, so a job that becomes
//! ready between the look and the wait still wakes it: no polling interval, no lost wake-up.
//! A Reserve whose client goes away is dropped by the gRPC stack while it waits; the lease is
//! only taken inside one storage transition, so a cancelled wait leases nothing. A waiter that
//! is woken yields once before it looks: the transport notices a cancel only when the handler
//! is pending, and a wake-up caused by the cancelling client's own next call (on the same
//! connection, so read after the cancel) must not lease into the cancelled reply. A waiter
//! dropped in that turn passes its wake-up on to the queue's next waiter.
//!
//! Wake-ups come from one place, [`ReadySignals`]: the queue layer raises them after its own
//! transitions (enqueue, nack retry, sweeper, requeue, resume) report ready jobs, and a backend
//! feeds the ones it learns of elsewhere through [`ReadyListener`].

use super::clock::Clock;
use crate::domain::{Job, ReserveSpec};
use crate::error::QueueError;
use crate::storage::{ReadyListener, Store};
use futures_util::future::select_all;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Leases jobs per `spec`, waiting up to `wait_ms` for the first one. Each look takes its time
/// from `clock`, and the lease runs `lease_ms` from that time. At most `max_waiting` Reserves
/// wait at once: past that, a Reserve looks once and, finding nothing, does not wait. Each
/// job's reply bytes are taken from `room` as it is leased; a Reserve that finds a ready job
/// but no room for it passes its wake-up on and looks again once its connection wrote some
/// of its replies (or answers empty at its deadline).
///
/// # Errors
/// [`QueueError::TooManyWaitingReserves`] for a Reserve that found nothing and could not wait;
/// [`QueueError::Storage`] from the store.
#[allow(clippy::too_many_arguments)]
pub async fn reserve_with_wait(
    store: &dyn Store,
    clock: &dyn Clock,
    signals: &ReadySignals,
    mut spec: ReserveSpec,
    lease_ms: u64,
    wait_ms: u64,
    max_waiting: u64,
    room: &dyn ReplyRoom,
    shutdown: &CancellationToken,
) -> Result<Vec<Job>, QueueError> {
    let lease_ms = i64::try_from(lease_ms).unwrap_or(i64::MAX);
    let no_room = std::sync::atomic::AtomicBool::new(false);
    let fit = fit_within_room(spec.max_reply_bytes, room, &no_room);
    let look = |spec: &mut ReserveSpec| {
        let now = clock.now();
        spec.lease_expires_at = now.saturating_add(lease_ms);
        now
    };
    if wait_ms == 0 {
        let now = look(&mut spec);
        return Ok(store.reserve(&spec, &fit, now).await?);
    }
    // Each waiting Reserve holds its request, its registrations and a stream: bounded
    // server-wide, whoever sends them.
    let Some(_seat) = signals.seat(max_waiting) else {
        let now = look(&mut spec);
        let jobs = store.reserve(&spec, &fit, now).await?;
        if jobs.is_empty() && !shutdown.is_cancelled() {
            return Err(QueueError::TooManyWaitingReserves { limit: max_waiting });
        }
        return Ok(jobs);
    };
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let waits: Vec<Waiting<'_>> = spec.queues.iter().map(|q| signals.wait_on(q)).collect();
    loop {
        let mut wakeups: Vec<_> = waits
            .iter()
            .map(|w| Box::pin(w.notify.notified()))
            .collect();
        for w in &mut wakeups {
            w.as_mut().enable();
        }
        let freed = room.freed();
        let now = look(&mut spec);
        let jobs = store.reserve(&spec, &fit, now).await?;
        if !jobs.is_empty() || shutdown.is_cancelled() || Instant::now() >= deadline {
            return Ok(jobs);
        }
        if no_room.swap(false, std::sync::atomic::Ordering::Relaxed) {
            // A job is ready but this call's reply has no room: its connection's replies are
            // still on their way (or its client does not read them). The wake-up goes to
            // another waiter; this one looks again once some of them were written. It stops
            // listening for wake-ups meanwhile (any it got go on to other waiters), so that
            // Reserves without room never bounce a wake-up between them.
            drop(wakeups);
            for w in &waits {
                w.notify.notify_one();
            }
            tokio::select! {
                () = freed => continue,
                _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
                _ = shutdown.cancelled() => return Ok(Vec::new()),
            }
        }
        drop(freed);
        tracing::debug!(queues = spec.queues.len(), wait_ms, "reserve waiting");
        let parked = signals.park(waits.len());
        let fired = tokio::select! {
            (_, i, _) = select_all(wakeups) => i,
            _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
            _ = shutdown.cancelled() => return Ok(Vec::new()),
        };
        drop(parked);
        // Woken: give the transport one turn before leasing. hyper polls a call's handler
        // before it looks for the client's RST_STREAM, so a client that cancelled its wait and
        // then, on the same connection, made a job ready (a stopping worker nacks what it holds)
        // would otherwise get that job leased into a reply nobody reads. Returning `Pending`
        // once lets hyper see the cancel and drop this Reserve first; the wake-up it took is
        // then passed on to the next waiter of that queue, so no one sleeps through the job.
        let pass_on = PassOn(Some(&waits[fired].notify));
        tokio::task::yield_now().await;
        pass_on.disarm();
    }
}

/// Room for a call's reply in the memory the transport lets replies hold while they are sent
/// (`server.reply_buffer_bytes`, see `crate::net`). A lease (a Reserve, an ack's
/// `then_reserve`) takes each job's reply bytes from it as it decides to lease the job, so a
/// client that does not read its replies cannot make leases pile up in memory: what does not
/// fit is not leased. The transport gives the room back once the reply is made and charged.
pub trait ReplyRoom: Send + Sync {
    /// Takes `bytes` of room for this call's reply; false (nothing taken) when they do not fit.
    fn try_take(&self, bytes: u64) -> bool;

    /// Resolves once some reply bytes of this call's connection were written out after this
    /// was called (room may have freed), even if it is first polled later.
    fn freed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;
}

/// A call's [`ReplyRoom`], as the transport hands it to the handler (in the request's
/// extensions).
#[derive(Clone)]
pub struct RoomHandle(pub Arc<dyn ReplyRoom>);

impl std::fmt::Debug for RoomHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoomHandle")
    }
}

/// Room without a bound: calls from inside the server and tests.
pub struct Unbounded;

impl ReplyRoom for Unbounded {
    fn try_take(&self, _bytes: u64) -> bool {
        true
    }

    fn freed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::pending())
    }
}

/// The reply budget of a lease: [`super::reply::reserve_fit`] within `budget` bytes, each job's
/// bytes also taken from `room`; a job whose bytes do not fit there is not leased (the reply
/// stops before it) and `refused` is set.
pub(crate) fn fit_within_room<'a>(
    budget: u64,
    room: &'a dyn ReplyRoom,
    refused: &'a std::sync::atomic::AtomicBool,
) -> impl Fn(u32, u64, usize) -> crate::domain::Fit + 'a {
    use crate::domain::Fit;
    move |size, used, taken| match super::reply::reserve_fit(size, used, taken, budget) {
        Fit::Take(n) => {
            // A job of unknown size counts as a whole reply.
            let need = if size == 0 { budget } else { n };
            if room.try_take(need) {
                Fit::Take(n)
            } else {
                refused.store(true, std::sync::atomic::Ordering::Relaxed);
                Fit::Stop
            }
        }
        other => other,
    }
}

/// One queue's signal and how many Reserves wait on it.
#[derive(Debug)]
struct Entry {
    /// The map's key, shared with each [`Waiting`] (one copy of the name).
    name: Arc<str>,
    notify: Arc<Notify>,
    waiters: usize,
}

/// Wake-ups for long-polling Reserves: one [`Notify`] per queue that somebody waits on *now*.
///
/// An entry exists only while a Reserve waits on its queue: the last waiter to leave removes
/// it, so long polls on ever new queue names cannot grow the map (or server memory) without
/// bound. Jobs made ready on a queue nobody waits on cost one map lookup.
#[derive(Debug)]
pub struct ReadySignals {
    queues: Mutex<HashMap<Arc<str>, Entry>>,
    /// Registrations of Reserves alive (a Reserve on two queues counts two), from before their
    /// first look until they end ([`ReadySignals::waiting_at_most`]).
    registered: watch::Sender<usize>,
    /// Registrations of Reserves that looked, found nothing and now sleep until a wake-up, for
    /// tests that must act only once a Reserve waits ([`ReadySignals::waiting`]).
    parked: watch::Sender<usize>,
    /// Reserves in their wait, each counted once ([`ReadySignals::seat`]).
    seated: AtomicU64,
}

impl Default for ReadySignals {
    fn default() -> Self {
        ReadySignals {
            queues: Mutex::new(HashMap::new()),
            registered: watch::Sender::new(0),
            parked: watch::Sender::new(0),
            seated: AtomicU64::new(0),
        }
    }
}

/// One of the `limits.max_waiting_reserves` places of waiting Reserves; dropping it frees it.
pub struct Seat<'a>(&'a AtomicU64);

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A Reserve's registration on one queue; dropping it leaves the queue's waiters.
pub struct Waiting<'a> {
    signals: &'a ReadySignals,
    /// The map's own key (one copy of the name, however many wait on it).
    queue: Arc<str>,
    notify: Arc<Notify>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut map = self.signals.lock();
        if let Some(e) = map.get_mut(&self.queue) {
            e.waiters -= 1;
            if e.waiters == 0 {
                map.remove(&self.queue);
                // A burst of waits on many queues leaves a large table behind; give it back.
                if map.capacity() > 64 && map.capacity() > map.len() * 4 {
                    map.shrink_to_fit();
                }
            }
        }
        drop(map);
        self.signals.registered.send_modify(|n| *n -= 1);
    }
}

/// A wake-up taken by a Reserve that has not looked yet: if the Reserve is dropped first (its
/// client cancelled it), the wake-up goes to the queue's next waiter.
struct PassOn<'a>(Option<&'a Notify>);

impl PassOn<'_> {
    /// The Reserve looks now: the wake-up was used.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for PassOn<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.0 {
            n.notify_one();
        }
    }
}

/// A Reserve's `n` registrations asleep until a wake-up; dropping it wakes them in the count.
struct Parked<'a> {
    signals: &'a ReadySignals,
    n: usize,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.signals.parked.send_modify(|p| *p -= self.n);
    }
}

impl ReadySignals {
    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Entry>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a waiter on `queue` until the returned guard is dropped.
    pub fn wait_on(&self, queue: &str) -> Waiting<'_> {
        let (queue, notify) = {
            let mut map = self.lock();
            let e = match map.get_mut(queue) {
                Some(e) => e,
                None => {
                    let name: Arc<str> = Arc::from(queue);
                    map.entry(name.clone()).or_insert(Entry {
                        name,
                        notify: Arc::new(Notify::new()),
                        waiters: 0,
                    })
                }
            };
            e.waiters += 1;
            (e.name.clone(), e.notify.clone())
        };
        self.registered.send_modify(|n| *n += 1);
        Waiting {
            signals: self,
            queue,
            notify,
        }
    }

    /// A place for one more waiting Reserve, if fewer than `max` hold one.
    pub fn seat(&self, max: u64) -> Option<Seat<'_>> {
        self.seated
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Seat(&self.seated))
    }

    /// Reserves in their wait now (each holds a [`Seat`]).
    pub fn reserves_waiting(&self) -> u64 {
        self.seated.load(Ordering::Relaxed)
    }

    /// Wakes up to `n` waiters of `queue` (a no-op when nobody waits on it).
    pub fn job_ready(&self, queue: &str, n: usize) {
        let map = self.lock();
        if let Some(e) = map.get(queue) {
            for _ in 0..n.min(e.waiters) {
                e.notify.notify_one();
            }
        }
    }

    /// Wakes every waiter of every queue.
    pub fn wake_all(&self) {
        let map = self.lock();
        for e in map.values() {
            e.notify.notify_waiters();
        }
    }

    /// Queues with at least one waiter (the size of the map).
    pub fn queues_waited_on(&self) -> usize {
        self.lock().len()
    }

    /// Counts `n` registrations as asleep until the guard is dropped.
    fn park(&self, n: usize) -> Parked<'_> {
        self.parked.send_modify(|p| *p += n);
        Parked { signals: self, n }
    }

    /// Resolves once at least `n` registrations (a Reserve waiting on two queues counts two)
    /// are asleep: their Reserves looked, found nothing and wait for a wake-up. For tests that
    /// must act only once a Reserve waits.
    pub async fn waiting(&self, n: usize) {
        let mut rx = self.parked.subscribe();
        let _ = rx.wait_for(|w| *w >= n).await;
    }

    /// Resolves once at most `n` registrations are left, asleep or not: the other Reserves
    /// ended (answered, or dropped by the transport).
    pub async fn waiting_at_most(&self, n: usize) {
        let mut rx = self.registered.subscribe();
        let _ = rx.wait_for(|w| *w <= n).await;
    }
}

impl ReadyListener for ReadySignals {
    fn jobs_ready(&self, queue: &str, n: usize) {
        self.job_ready(queue, n);
    }

    fn all_may_be_ready(&self) {
        self.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_lives_only_while_someone_waits() {
        let s = ReadySignals::default();
        {
            let a = s.wait_on("a");
            let a2 = s.wait_on("a");
            let _b = s.wait_on("b");
            assert_eq!(s.queues_waited_on(), 2);
            drop(a);
            assert_eq!(s.queues_waited_on(), 2, "a still has a waiter");
            drop(a2);
            assert_eq!(s.queues_waited_on(), 1);
        }
        assert_eq!(s.queues_waited_on(), 0);
        // Many distinct names, one after another, leave nothing behind.
        for i in 0..10_000 {
            let name = format!("q{i}");
            let _w = s.wait_on(&name);
        }
        assert_eq!(s.queues_waited_on(), 0);
        assert!(s.lock().capacity() < 64, "{}", s.lock().capacity());
    }

    #[tokio::test]
    async fn a_ready_job_wakes_a_registered_waiter() {
        let s = ReadySignals::default();
        let w = s.wait_on("q");
        let woken = w.notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        s.job_ready("q", 1);
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .expect("woken");
    }
}
