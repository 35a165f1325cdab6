//! sepp-engine-bench: fjall vs redb on the write pattern of the sepp server.
//!
//! sepp persists through one committer thread that does group commit: it
//! collects every operation that producers have submitted so far, writes them
//! all in a single atomic batch (fjall) or write transaction (redb), makes that
//! durable with one fsync, and only then answers every producer. Each producer
//! submits one operation and blocks on the answer before sending the next, the
//! way a client connection waits for its enqueue to be acknowledged.
//!
//! Every measurement is taken for both engines in the same process, one right
//! after the other on a fresh database, and the whole set is repeated `--runs`
//! times (the engine that goes first alternates between rounds). The machine
//! is small and shared, so absolute numbers drift; the fjall/redb ratio within
//! a round is the figure to trust most.
//!
//! Usage: sepp-engine-bench [--quick] [--runs N] [--dir PATH]

use std::error::Error;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

// ---------------------------------------------------------------------------
// Records. Sizes follow the brief: job value ~300 B with a 256 B payload,
// state value ~40 B, dedup key = queue name + 32 B idempotency key with a
// 16 B job id + 8 B expiry as value.
// ---------------------------------------------------------------------------

type Id = [u8; 16];

const QUEUE: &[u8] = b"default";
const PAYLOAD_LEN: usize = 256;
const JOB_HEADER_LEN: usize = 44; // queue, attempts, timestamps, ... (opaque here)
const STATE_LEN: usize = 40;
const STATE_READY: u8 = 1;
const STATE_LEASED: u8 = 2;

/// One unit of work sent to the committer.
enum Op {
    /// New job: job record + "ready" state record + dedup record.
    Enqueue {
        id: Id,
        dedup_key: Vec<u8>,
        job: Vec<u8>,
    },
    /// Reserve: overwrite the state record with a lease.
    Lease { id: Id },
    /// Ack: delete the job record and its state record.
    Ack { id: Id },
    /// A bare dedup record with a 32-byte key (disk-usage test only).
    DedupPut { key: [u8; 32] },
    /// Deletes such a record.
    DedupDel { key: [u8; 32] },
}

fn state_value(state: u8) -> [u8; STATE_LEN] {
    let mut v = [0u8; STATE_LEN];
    v[0] = state;
    v[1..9].copy_from_slice(&now_millis().to_be_bytes()); // lease deadline / run-at
    v
}

fn dedup_value(id: &Id) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[..16].copy_from_slice(id);
    v[16..].copy_from_slice(&(now_millis() + 86_400_000).to_be_bytes()); // expiry
    v
}

fn now_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Small xorshift generator so the crate needs no `rand`. Payloads and
/// idempotency keys are random bytes, so LZ4 in fjall gets no free wins.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let x = self.next().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
    }
}

/// Job ids are time-ordered like a ULID: a global sequence (big-endian, so
/// newer ids sort last) followed by 8 random bytes.
static SEQ: AtomicU64 = AtomicU64::new(1);

fn new_id(rng: &mut Rng) -> Id {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&SEQ.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    rng.fill(&mut id[8..]);
    id
}

fn new_enqueue(rng: &mut Rng) -> Op {
    let id = new_id(rng);
    let mut dedup_key = QUEUE.to_vec();
    dedup_key.extend_from_slice(&[0u8; 32]);
    rng.fill(&mut dedup_key[QUEUE.len()..]);
    let mut job = vec![0u8; JOB_HEADER_LEN + PAYLOAD_LEN];
    job[..QUEUE.len()].copy_from_slice(QUEUE);
    rng.fill(&mut job[JOB_HEADER_LEN..]);
    Op::Enqueue { id, dedup_key, job }
}

// ---------------------------------------------------------------------------
// The two engines behind one small trait.
// ---------------------------------------------------------------------------

trait Engine: Send {
    /// Applies `ops` atomically in one batch / transaction. With `durable`
    /// the data is on disk (one fsync) when this returns.
    fn commit(&mut self, ops: &[Op], durable: bool) -> Res<()>;
    /// Runs the space reclaim the engine offers after mass deletes.
    fn reclaim(&mut self) -> Res<()>;
}

struct Fjall {
    db: fjall::Database,
    jobs: fjall::Keyspace,
    state: fjall::Keyspace,
    dedup: fjall::Keyspace,
}

impl Fjall {
    fn open(dir: &Path) -> Res<Self> {
        // Library defaults throughout, as sepp would start out.
        let db = fjall::Database::builder(dir).open()?;
        let opts = fjall::KeyspaceCreateOptions::default;
        Ok(Fjall {
            jobs: db.keyspace("jobs", opts)?,
            state: db.keyspace("state", opts)?,
            dedup: db.keyspace("dedup", opts)?,
            db,
        })
    }
}

impl Engine for Fjall {
    fn commit(&mut self, ops: &[Op], durable: bool) -> Res<()> {
        let mut batch = self.db.batch();
        for op in ops {
            match op {
                Op::Enqueue { id, dedup_key, job } => {
                    batch.insert(&self.jobs, id, job.as_slice());
                    batch.insert(&self.state, id, state_value(STATE_READY));
                    batch.insert(&self.dedup, dedup_key.as_slice(), dedup_value(id));
                }
                Op::Lease { id } => batch.insert(&self.state, id, state_value(STATE_LEASED)),
                Op::Ack { id } => {
                    batch.remove(&self.jobs, id);
                    batch.remove(&self.state, id);
                }
                Op::DedupPut { key } => batch.insert(&self.dedup, key, dedup_value(&[7; 16])),
                Op::DedupDel { key } => batch.remove(&self.dedup, key),
            }
        }
        // The batch goes to the journal (OS buffers) atomically; one
        // persist call then fsyncs the journal for the whole group.
        batch.commit()?;
        if durable {
            self.db.persist(fjall::PersistMode::SyncAll)?;
        }
        Ok(())
    }

    fn reclaim(&mut self) -> Res<()> {
        // Tombstones only free space once they meet the data in a disk
        // table and fall off the last level, so: flush each memtable, then
        // run a major compaction. Both calls are public but #[doc(hidden)]
        // in fjall 3.1; in normal use background compaction does this over
        // time. Old journal files are dropped once their memtables are flushed.
        for ks in [&self.jobs, &self.state, &self.dedup] {
            ks.rotate_memtable_and_wait()?;
            ks.major_compact()?;
        }
        Ok(())
    }
}

const JOBS: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("jobs");
const STATE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("state");
const DEDUP: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("dedup");

struct Redb {
    db: redb::Database,
}

impl Redb {
    fn open(dir: &Path) -> Res<Self> {
        std::fs::create_dir_all(dir)?;
        let db = redb::Database::create(dir.join("sepp.redb"))?;
        Ok(Redb { db })
    }
}

impl Engine for Redb {
    fn commit(&mut self, ops: &[Op], durable: bool) -> Res<()> {
        let mut tx = self.db.begin_write()?;
        // Immediate = fsync inside commit(); None = in memory / OS buffers only.
        tx.set_durability(if durable {
            redb::Durability::Immediate
        } else {
            redb::Durability::None
        })?;
        {
            let mut jobs = tx.open_table(JOBS)?;
            let mut state = tx.open_table(STATE)?;
            let mut dedup = tx.open_table(DEDUP)?;
            for op in ops {
                match op {
                    Op::Enqueue { id, dedup_key, job } => {
                        jobs.insert(id.as_slice(), job.as_slice())?;
                        state.insert(id.as_slice(), state_value(STATE_READY).as_slice())?;
                        dedup.insert(dedup_key.as_slice(), dedup_value(id).as_slice())?;
                    }
                    Op::Lease { id } => {
                        state.insert(id.as_slice(), state_value(STATE_LEASED).as_slice())?;
                    }
                    Op::Ack { id } => {
                        jobs.remove(id.as_slice())?;
                        state.remove(id.as_slice())?;
                    }
                    Op::DedupPut { key } => {
                        dedup.insert(key.as_slice(), dedup_value(&[7; 16]).as_slice())?;
                    }
                    Op::DedupDel { key } => {
                        dedup.remove(key.as_slice())?;
                    }
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn reclaim(&mut self) -> Res<()> {
        // compact() moves pages toward the start of the file and truncates
        // it; it reports whether another pass could do more.
        while self.db.compact()? {}
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Fjall,
    Redb,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Fjall => "fjall",
            Kind::Redb => "redb",
        }
    }

    fn open(self, dir: &Path) -> Res<Box<dyn Engine>> {
        Ok(match self {
            Kind::Fjall => Box::new(Fjall::open(dir)?),
            Kind::Redb => Box::new(Redb::open(dir)?),
        })
    }
}

// ---------------------------------------------------------------------------
// Group-commit harness.
// ---------------------------------------------------------------------------

struct Request {
    op: Op,
    reply: SyncSender<()>,
}

/// What each producer does in a loop until the deadline.
#[derive(Clone)]
enum Work {
    /// Submit one enqueue, wait, repeat. One unit = one enqueue.
    Enqueue,
    /// Take the next preloaded job, submit a lease, wait, submit an ack,
    /// wait. One unit = one job reserved and acked (two commits).
    ReserveAck {
        ids: Arc<Vec<Id>>,
        next: Arc<AtomicUsize>,
    },
}

struct GroupResult {
    units_per_sec: f64,
    ops_per_commit: f64,
    ran_out: bool,
}

/// The committer: block for the first request, then drain everything else
/// already queued, commit it as one group, and wake all its producers.
fn committer(
    mut engine: Box<dyn Engine>,
    rx: Receiver<Request>,
    durable: bool,
) -> Res<(Box<dyn Engine>, u64, u64)> {
    let (mut commits, mut ops_total) = (0u64, 0u64);
    let mut ops = Vec::new();
    let mut replies = Vec::new();
    while let Ok(first) = rx.recv() {
        for req in std::iter::once(first).chain(rx.try_iter()) {
            ops.push(req.op);
            replies.push(req.reply);
        }
        engine.commit(&ops, durable)?;
        commits += 1;
        ops_total += ops.len() as u64;
        ops.clear();
        for r in replies.drain(..) {
            let _ = r.send(());
        }
    }
    Ok((engine, commits, ops_total))
}

fn group_commit(
    engine: Box<dyn Engine>,
    producers: usize,
    secs: f64,
    durable: bool,
    work: Work,
) -> Res<(Box<dyn Engine>, GroupResult)> {
    let (tx, rx) = mpsc::channel::<Request>();
    let committer = thread::spawn(move || committer(engine, rx, durable));

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..producers)
        .map(|p| {
            let tx: Sender<Request> = tx.clone();
            let work = work.clone();
            thread::spawn(move || {
                let mut rng = Rng::new(p as u64 + 1);
                let (reply_tx, reply_rx) = mpsc::sync_channel(1);
                let submit = |op: Op| {
                    tx.send(Request {
                        op,
                        reply: reply_tx.clone(),
                    })
                    .expect("committer gone");
                    reply_rx.recv().expect("committer gone");
                };
                let (mut units, mut ran_out) = (0u64, false);
                while Instant::now() < deadline {
                    match &work {
                        Work::Enqueue => submit(new_enqueue(&mut rng)),
                        Work::ReserveAck { ids, next } => {
                            let Some(id) = ids.get(next.fetch_add(1, Ordering::Relaxed)) else {
                                ran_out = true;
                                break;
                            };
                            submit(Op::Lease { id: *id });
                            submit(Op::Ack { id: *id });
                        }
                    }
                    units += 1;
                }
                (units, ran_out)
            })
        })
        .collect();
    drop(tx); // the committer stops once every producer has hung up

    let (mut units, mut ran_out) = (0u64, false);
    for h in handles {
        let (u, r) = h.join().expect("producer panicked");
        units += u;
        ran_out |= r;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (engine, commits, ops) = committer.join().expect("committer panicked")?;
    Ok((
        engine,
        GroupResult {
            units_per_sec: units as f64 / elapsed,
            ops_per_commit: ops as f64 / commits.max(1) as f64,
            ran_out,
        },
    ))
}

/// Loads `n` jobs (ready state) in large durable transactions for the
/// reserve+ack test, and returns their ids in enqueue order.
fn preload(engine: &mut dyn Engine, n: usize) -> Res<Vec<Id>> {
    let mut rng = Rng::new(999);
    let mut ids = Vec::with_capacity(n);
    let mut batch = Vec::new();
    for _ in 0..n {
        let op = new_enqueue(&mut rng);
        if let Op::Enqueue { id, .. } = &op {
            ids.push(*id);
        }
        batch.push(op);
        if batch.len() == 5_000 {
            engine.commit(&batch, true)?;
            batch.clear();
        }
    }
    engine.commit(&batch, true)?;
    Ok(ids)
}

// ---------------------------------------------------------------------------
// Disk-usage test.
// ---------------------------------------------------------------------------

struct DiskResult {
    after_insert: u64,
    after_delete: u64,
    after_reclaim: u64,
    after_reopen: u64,
    insert_secs: f64,
    reclaim_secs: f64,
}

/// Bytes actually allocated on disk under `dir` (what `du` reports).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => total += disk_bytes(&e.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

/// Inserts `n` dedup records with random 32-byte keys, deletes them all,
/// then reclaims, and finally closes and reopens the database (some
/// engines only drop dead files at open). Writes go in durable batches of
/// 10,000 records.
fn disk_test(kind: Kind, dir: &Path, n: usize) -> Res<DiskResult> {
    let mut boxed = kind.open(dir)?;
    let engine = boxed.as_mut();
    const BATCH: usize = 10_000;
    let keys = |seed| {
        let mut rng = Rng::new(seed);
        (0..n).map(move |_| {
            let mut k = [0u8; 32];
            rng.fill(&mut k);
            k
        })
    };
    let mut ops = Vec::with_capacity(BATCH);
    let flush = |ops: &mut Vec<Op>, engine: &mut dyn Engine, last: bool| -> Res<()> {
        if ops.len() == BATCH || (last && !ops.is_empty()) {
            engine.commit(ops, true)?;
            ops.clear();
        }
        Ok(())
    };

    let t = Instant::now();
    for key in keys(42) {
        ops.push(Op::DedupPut { key });
        flush(&mut ops, engine, false)?;
    }
    flush(&mut ops, engine, true)?;
    let insert_secs = t.elapsed().as_secs_f64();
    let after_insert = disk_bytes(dir);

    for key in keys(42) {
        ops.push(Op::DedupDel { key });
        flush(&mut ops, engine, false)?;
    }
    flush(&mut ops, engine, true)?;
    let after_delete = disk_bytes(dir);

    let t = Instant::now();
    engine.reclaim()?;
    let reclaim_secs = t.elapsed().as_secs_f64();
    let after_reclaim = disk_bytes(dir);

    drop(boxed);
    drop(kind.open(dir)?);
    let after_reopen = disk_bytes(dir);
    Ok(DiskResult {
        after_insert,
        after_delete,
        after_reclaim,
        after_reopen,
        insert_secs,
        reclaim_secs,
    })
}

// ---------------------------------------------------------------------------
// Results table: one row per measurement, one sample per round per engine.
// ---------------------------------------------------------------------------

struct Row {
    label: String,
    fmt: fn(f64) -> String,
    fjall: Vec<f64>,
    redb: Vec<f64>,
}

#[derive(Default)]
struct Table {
    rows: Vec<Row>,
    quiet: bool, // don't echo each sample to stderr
}

impl Table {
    fn add(&mut self, label: &str, fmt: fn(f64) -> String, kind: Kind, v: f64) {
        let i = match self.rows.iter().position(|r| r.label == label) {
            Some(i) => i,
            None => {
                self.rows.push(Row {
                    label: label.into(),
                    fmt,
                    fjall: vec![],
                    redb: vec![],
                });
                self.rows.len() - 1
            }
        };
        match kind {
            Kind::Fjall => self.rows[i].fjall.push(v),
            Kind::Redb => self.rows[i].redb.push(v),
        }
        if !self.quiet {
            eprintln!("  {:5} {label}: {}", kind.name(), fmt(v)); // progress
        }
    }

    fn print(&self) {
        println!("| measurement | fjall | redb | fjall ÷ redb |");
        println!("|---|---:|---:|---:|");
        for r in &self.rows {
            // Ratios are taken per round (both engines measured back to back)
            // and then summarised, which cancels slow drift of the machine.
            let ratios: Vec<f64> = r
                .fjall
                .iter()
                .zip(&r.redb)
                .map(|(f, d)| f / d.max(1e-9))
                .collect();
            println!(
                "| {} | {} | {} | {} |",
                r.label,
                summary(&r.fjall, r.fmt),
                summary(&r.redb, r.fmt),
                summary(&ratios, fmt_ratio),
            );
        }
    }
}

/// "median (min–max)", or just the value for a single sample.
fn summary(v: &[f64], fmt: fn(f64) -> String) -> String {
    if v.is_empty() {
        return "–".into();
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let median = if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0
    };
    if s.len() == 1 {
        fmt(median)
    } else {
        format!("{} ({}–{})", fmt(median), fmt(s[0]), fmt(s[s.len() - 1]))
    }
}

fn fmt_rate(x: f64) -> String {
    format!("{x:.0}")
}
fn fmt_mib(bytes: f64) -> String {
    let mib = bytes / (1024.0 * 1024.0);
    if mib < 1.0 {
        format!("{mib:.2}")
    } else {
        format!("{mib:.1}")
    }
}
fn fmt_secs(x: f64) -> String {
    format!("{x:.2}")
}
fn fmt_group(x: f64) -> String {
    format!("{x:.1}")
}
fn fmt_ratio(x: f64) -> String {
    if x >= 100.0 {
        ">100".into()
    } else {
        format!("{x:.2}")
    }
}

// ---------------------------------------------------------------------------

struct Config {
    runs: usize,
    secs: f64,
    sustained_secs: f64,
    preload: usize,
    dedup_records: usize,
    dir: PathBuf,
}

fn parse_args() -> Config {
    let mut cfg = Config {
        runs: 3,
        secs: 3.0,
        sustained_secs: 10.0,
        preload: 200_000,
        dedup_records: 1_000_000,
        dir: std::env::temp_dir().join("sepp-engine-bench"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => {
                cfg.secs = 1.0;
                cfg.sustained_secs = 3.0;
                cfg.preload = 100_000;
                cfg.dedup_records = 100_000;
            }
            "--runs" => cfg.runs = args.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--dir" => cfg.dir = args.next().expect("--dir PATH").into(),
            _ => {
                eprintln!("usage: sepp-engine-bench [--quick] [--runs N] [--dir PATH]");
                std::process::exit(2);
            }
        }
    }
    cfg
}

/// Gives each measurement a fresh, empty directory.
fn fresh_dir(base: &Path, name: &str) -> Res<PathBuf> {
    let dir = base.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The 1-minute load average, printed with the results: anything well
/// above the core count means the figures were taken on a busy machine.
fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn main() -> Res<()> {
    let cfg = parse_args();
    let load_before = load_avg();
    let mut table = Table::default();
    // Mean ops per commit, printed as context below the main table.
    let mut groups = Table {
        quiet: true,
        ..Table::default()
    };
    eprintln!(
        "runs={} secs/measurement={} preload={} dedup_records={} dir={}",
        cfg.runs,
        cfg.secs,
        cfg.preload,
        cfg.dedup_records,
        cfg.dir.display()
    );

    for round in 0..cfg.runs {
        eprintln!("round {}/{}", round + 1, cfg.runs);
        // Alternate which engine goes first so neither always gets the
        // "warmer" or "quieter" slot.
        let order = if round % 2 == 0 {
            [Kind::Fjall, Kind::Redb]
        } else {
            [Kind::Redb, Kind::Fjall]
        };

        // (a) durable enqueue with 1, 8, 32, 64 producers; then N=32 again
        // for longer, so that fjall has to flush memtables and compact
        // inside the timed window (the short runs mostly fit in memory);
        // then buffered (no fsync at all) with 32.
        let short = cfg.secs;
        let long = cfg.sustained_secs;
        let cases = [
            (1, true, short, ""),
            (8, true, short, ""),
            (32, true, short, ""),
            (64, true, short, ""),
            (32, true, long, ", sustained"),
            (32, false, short, ""),
        ];
        for (n, durable, secs, note) in cases {
            let mode = if durable {
                "durable"
            } else {
                "buffered (no fsync)"
            };
            for kind in order {
                let dir = fresh_dir(&cfg.dir, kind.name())?;
                let (_, r) = group_commit(kind.open(&dir)?, n, secs, durable, Work::Enqueue)?;
                let label = format!("enqueue, {mode}, N={n}{note}");
                let unit = if note.is_empty() {
                    "ops/s".to_string()
                } else {
                    format!("ops/s over {secs} s")
                };
                table.add(
                    &format!("{label} ({unit})"),
                    fmt_rate,
                    kind,
                    r.units_per_sec,
                );
                groups.add(&label, fmt_group, kind, r.ops_per_commit);
            }
        }

        // (b) reserve + ack over a preloaded backlog, N=32.
        for kind in order {
            let dir = fresh_dir(&cfg.dir, kind.name())?;
            let mut engine = kind.open(&dir)?;
            let ids = Arc::new(preload(engine.as_mut(), cfg.preload)?);
            let next = Arc::new(AtomicUsize::new(0));
            let (_, r) = group_commit(engine, 32, cfg.secs, true, Work::ReserveAck { ids, next })?;
            if r.ran_out {
                eprintln!(
                    "  warning: {} used up all preloaded jobs; raise the preload",
                    kind.name()
                );
            }
            let label = "reserve+ack, durable, N=32";
            table.add(
                &format!("{label} (jobs/s, 2 commits each)"),
                fmt_rate,
                kind,
                r.units_per_sec,
            );
            groups.add(label, fmt_group, kind, r.ops_per_commit);
        }

        // Disk usage for many dedup records, then after deleting them all.
        let k = cfg.dedup_records / 1000;
        for kind in order {
            let dir = fresh_dir(&cfg.dir, kind.name())?;
            let d = disk_test(kind, &dir, cfg.dedup_records)?;
            let mut add = |what: &str, fmt: fn(f64) -> String, v: f64| {
                table.add(&format!("{k}k dedup records: {what}"), fmt, kind, v)
            };
            add("insert time (s)", fmt_secs, d.insert_secs);
            add("disk after insert (MiB)", fmt_mib, d.after_insert as f64);
            add("disk after delete (MiB)", fmt_mib, d.after_delete as f64);
            add("reclaim time (s)", fmt_secs, d.reclaim_secs);
            add("disk after reclaim (MiB)", fmt_mib, d.after_reclaim as f64);
            add("disk after reopen (MiB)", fmt_mib, d.after_reopen as f64);
        }
    }
    let _ = std::fs::remove_dir_all(&cfg.dir);

    println!(
        "\nfjall {} / redb {}; {} round(s); median (min–max) per cell; ratio = fjall ÷ redb per round; \
         load average {load_before} before, {} after\n",
        locked_version("fjall"),
        locked_version("redb"),
        cfg.runs,
        load_avg()
    );
    table.print();
    println!("\nMean operations per commit (group size):\n");
    groups.print();
    Ok(())
}

/// The version of `krate` pinned in this crate's Cargo.lock, so the printed
/// table says exactly what it measured.
fn locked_version(krate: &str) -> &'static str {
    let lock = include_str!("../Cargo.lock");
    let needle = format!("name = \"{krate}\"\nversion = \"");
    lock.find(&needle)
        .and_then(|i| lock[i + needle.len()..].split('"').next())
        .unwrap_or("?")
}
