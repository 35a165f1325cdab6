//! The domain layer: the types every other module speaks, and nothing else.
//!
//! It sits at the bottom of the server: it imports nothing of `queue/`, `storage/`, `api/` or
//! `config`, so the queue's rules (`queue/`) and every storage backend (`storage/`) can share
//! these types without depending on each other. It holds data, not rules: what a job is, what a
//! transition is told and what it answers, what inspection reads.
//!
//! Times are milliseconds since the Unix epoch ([`UnixMs`]); durations are milliseconds in
//! fields whose names end in `_ms`.

mod inspect;
mod job;
mod transition;

pub use inspect::{
    CancelSelector, DeadLetter, DeadLetterCursor, DeadLetterSelector, JobContent, JobCursor,
    JobInfo, JobState, KeyRecord, ListState, QueueStats, StoredJob,
};
pub use job::{
    DedupClaim, Fingerprint, Job, JobId, NewJob, Payload, Replacement, TraceContext, Value,
};
pub use transition::{
    DeadLetterCause, EnqueuePlan, Expiry, Finish, Fit, InsertOutcome, JobFacts, LastReason,
    Placement, Requeue, ReserveSpec, Settle, SettleRefusal, Stage, reached,
};

use serde::{Deserialize, Serialize};

/// Milliseconds since the Unix epoch, UTC.
pub type UnixMs = i64;

/// How durable a write is before the server answers "accepted" (`storage.persist_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PersistMode {
    /// `fsync` before replying (data and metadata). The default.
    #[default]
    SyncAll,
    /// `fdatasync` before replying.
    SyncData,
    /// Written to the OS before replying; survives a process crash, not a power loss.
    Buffer,
}

impl PersistMode {
    /// The config spelling (`sync_all`, `sync_data`, `buffer`).
    pub fn as_str(self) -> &'static str {
        match self {
            PersistMode::SyncAll => "sync_all",
            PersistMode::SyncData => "sync_data",
            PersistMode::Buffer => "buffer",
        }
    }
}
