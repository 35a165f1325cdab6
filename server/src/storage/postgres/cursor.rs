//! Where the last Reserve of each queue on this server stopped: a hint for the next one.
//!
//! A Reserve leases the first ready jobs of a queue in `sepp_jobs_ready (queue, priority DESC,
//! seq) WHERE stage = 0`. Each lease moves a row out of that partial index, but the index entry
//! of its old version stays until vacuum, and each later scan from the start of the queue walks
//! past the entries of every job leased before it (visiting the heap for those not yet known
//! dead to every transaction). So a Reserve first scans from the cursor on:
//! `priority = <cursor's> AND seq > <cursor's>`, an index range that starts there, and falls back
//! to the scan from the start when that returns fewer jobs than asked.
//!
//! The cursor is only a hint: jobs can become ready before it (a retry, a redelivery, a
//! promotion keep their old `seq`; a new job of a higher priority; a concurrent enqueue whose
//! `seq` is lower but whose `COMMIT` came later; another server's work). So it is forgotten
//! whenever this server makes old jobs of the queue ready (retry, redelivery, promotion,
//! requeue, resume, a `replace_pending` hit) or enqueues a job of a higher priority, whenever
//! another server says it made jobs of the queue ready (`NOTIFY`, and at every fallback poll),
//! after a failed Reserve, and [`TTL`] after it was set. A job made ready before the cursor in a way none of these see is passed over at most
//! until then, or until the jobs after the cursor run out, never lost.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a cursor is used after it was set.
pub(crate) const TTL: Duration = Duration::from_millis(250);

/// The cursors of one store, by queue.
#[derive(Default)]
pub(crate) struct Cursors {
    map: Mutex<HashMap<String, (i16, i64, Instant)>>,
}

impl Cursors {
    /// The priority and `seq` of the last job the last Reserve of `queue` took, if set less than
    /// [`TTL`] ago.
    pub(crate) fn get(&self, queue: &str) -> Option<(i16, i64)> {
        let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.get(queue)
            .filter(|(_, _, at)| at.elapsed() < TTL)
            .map(|(p, s, _)| (*p, *s))
    }

    /// A Reserve of `queue` took jobs up to this one (and the queue had more after it).
    pub(crate) fn set(&self, queue: &str, priority: i16, seq: i64) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        match map.get_mut(queue) {
            Some(c) => *c = (priority, seq, Instant::now()),
            None => {
                map.insert(queue.to_string(), (priority, seq, Instant::now()));
            }
        }
    }

    /// Jobs of `queue` may be ready before its cursor.
    pub(crate) fn forget(&self, queue: &str) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.remove(queue);
    }

    /// A new job of `queue` with this priority is ready: it sorts before the cursor when its
    /// priority is higher (a new job of the cursor's priority has a higher `seq`, after it).
    pub(crate) fn new_job(&self, queue: &str, priority: i16) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.get(queue).is_some_and(|(p, _, _)| priority > *p) {
            map.remove(queue);
        }
    }

    /// Jobs of any queue may be ready before its cursor.
    pub(crate) fn forget_all(&self) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_is_kept_until_forgotten() {
        let c = Cursors::default();
        assert_eq!(c.get("q"), None);
        c.set("q", 3, 10);
        c.set("r", 0, 5);
        assert_eq!(c.get("q"), Some((3, 10)));
        c.forget("q");
        assert_eq!(c.get("q"), None);
        assert_eq!(c.get("r"), Some((0, 5)));
        c.new_job("r", 0);
        assert_eq!(
            c.get("r"),
            Some((0, 5)),
            "a new job of its priority comes after it"
        );
        c.new_job("r", 1);
        assert_eq!(
            c.get("r"),
            None,
            "a new job of a higher priority comes before it"
        );
        c.set("r", 0, 5);
        c.forget_all();
        assert_eq!(c.get("r"), None);
    }
}
