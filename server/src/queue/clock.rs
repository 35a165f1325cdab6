//! The one clock of the queue layer. Every transition gets its time from here, as a parameter:
//! no backend and no other module reads a clock of its own, so that a [`ManualClock`] drives
//! the rules, the sweeper and every storage backend alike in tests (time advances; nothing
//! sleeps).
//!
//! Only deadlines of *waiting* (a Reserve's wait timeout, the sweeper's pause between passes)
//! use tokio's monotonic timer: they bound how long a task sleeps, they never decide a rule.

use crate::domain::UnixMs;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of the current time, in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> UnixMs;
}

/// The wall clock: the production clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixMs {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A clock that moves only when told to: for tests that cross deadlines without waiting.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    /// A clock reading `at`.
    pub fn new(at: UnixMs) -> Self {
        ManualClock {
            now: AtomicI64::new(at),
        }
    }

    /// Moves the clock `ms` milliseconds forward (backward when negative) and returns the new
    /// time.
    pub fn advance(&self, ms: i64) -> UnixMs {
        self.now.fetch_add(ms, Ordering::SeqCst) + ms
    }

    /// Sets the clock to `at`.
    pub fn set(&self, at: UnixMs) {
        self.now.store(at, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixMs {
        self.now.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now(), 1_000);
        assert_eq!(c.advance(250), 1_250);
        assert_eq!(c.now(), 1_250);
        c.set(5);
        assert_eq!(c.now(), 5);
    }

    #[test]
    fn the_system_clock_reads_the_wall_clock() {
        // 2020-01-01 as a floor: a clock reading 0 (the error fallback) would fail.
        assert!(SystemClock.now() > 1_577_836_800_000);
    }
}
