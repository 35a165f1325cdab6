//! What the key-conflict fingerprint costs in memory, counted exactly: the heap bytes the
//! embedded store holds per keyed job, with `key_conflict = "ignore"` and `"reject"`.
//!
//! RSS (`dedup_fingerprint`) moves by tens of bytes per record between two runs of one mode
//! (allocator fragmentation, when fjall frees its memtables), more than the few bytes a
//! fingerprint can cost. This counts live heap bytes instead, through a counting global
//! allocator, in one process: for each mode, opens the embedded store (`testing::open_store`,
//! `persist_mode = "buffer"`) in a fresh directory under a queue layer with a manual clock,
//! reads the live heap, enqueues RECORDS keyed jobs (32-byte keys, no payload, batches of 250)
//! and reads it again. Small enough that no memtable is flushed during the fill, so the count
//! holds the in-memory indexes (job and dedup) and fjall's memtables of the jobs' and the
//! records' writes; the difference between the modes is the fingerprint's.
//!
//! ```text
//! dedup_fingerprint_heap [RECORDS]
//! ```

use sepp_server::config::{Config, KeyConflict, QueueConfig};
use sepp_server::queue::Queue;
use sepp_server::queue::clock::ManualClock;
use sepp_server::queue::limits::Limits;
use sepp_server::queue::model::EnqueueInput;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts the bytes allocated and not yet freed.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const QUEUE: &str = "fp";
const T0: i64 = 1_704_067_200_000;

async fn measure(mode: KeyConflict, records: usize) -> f64 {
    let dir = sepp_server::testing::TempDir::new();
    let store = sepp_server::testing::open_store(&dir, T0).await;
    let mut config = Config::default();
    config.queues.push(QueueConfig {
        name: QUEUE.into(),
        key_conflict: Some(mode),
        ..Default::default()
    });
    let queue = Queue::new(
        store.clone(),
        Arc::new(Limits::from_config(&config).expect("valid limits")),
        Arc::new(ManualClock::new(T0)),
        tokio_util::sync::CancellationToken::new(),
    );
    let before = LIVE.load(Ordering::Relaxed);
    for start in (0..records).step_by(250) {
        let batch = (start..(start + 250).min(records))
            .map(|n| EnqueueInput {
                queue: QUEUE.into(),
                job_type: "t".into(),
                idempotency_key: Some(format!("{n:032x}")),
                ..Default::default()
            })
            .collect();
        for o in queue.enqueue_batch(batch).await.expect("enqueue") {
            assert!(!o.expect("accepted").deduplicated, "fresh keys");
        }
    }
    let after = LIVE.load(Ordering::Relaxed);
    store.close().await.expect("close");
    (after - before) as f64 / records as f64
}

#[tokio::main]
async fn main() {
    let records: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(50_000);
    println!("| key_conflict | records | heap bytes per keyed job |");
    println!("|---|--:|--:|");
    let mut per = Vec::new();
    for (name, mode) in [
        ("ignore", KeyConflict::Ignore),
        ("reject", KeyConflict::Reject),
        ("ignore", KeyConflict::Ignore),
        ("reject", KeyConflict::Reject),
    ] {
        let b = measure(mode, records).await;
        println!("| {name} | {records} | {b:.1} |");
        per.push(b);
    }
    println!(
        "difference (reject − ignore): {:.1} and {:.1} bytes per record",
        per[1] - per[0],
        per[3] - per[2]
    );
}
