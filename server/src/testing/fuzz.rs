//! Entry points of the fuzz targets (`fuzz/`, run with `cargo +nightly fuzz`; see
//! `docs/reliability.md`). Each takes the fuzzer's bytes and panics only on a bug: a panic in
//! the code under test, or a broken property the function asserts.
//!
//! - [`request`]: one RPC's request message decoded from arbitrary bytes, then handled by the
//!   gRPC edge exactly as a call is (the handler converts it and the queue layer validates it),
//!   over a store that holds nothing ([`EmptyStore`]), so that no disk is touched.
//! - [`config`]: a TOML file and `SEPP_*` environment variables, loaded and checked as at start.
//! - [`codec_bytes`], [`codec_values`]: the embedded store's on-disk records.
//! - [`recovery`]: a data directory with arbitrary bytes in one record, opened and used.

use crate::api::admin_service::AdminApi;
use crate::api::queue_service::QueueApi;
use crate::config::Config;
use crate::domain::{
    DeadLetter, DeadLetterCursor, DeadLetterSelector, InsertOutcome, Job, JobId, KeyRecord,
    LastReason, NewJob, QueueStats, Requeue, ReserveSpec, StoredJob, UnixMs,
};
use crate::queue::Queue;
use crate::queue::clock::ManualClock;
use crate::queue::limits::Limits;
use crate::queue::model::EnqueueInput;
use crate::storage::embedded::fuzz::{KEYSPACES, RawRecord, insert_record, read_records};
use crate::storage::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::storage::{
    EnqueueFacts, EnqueueRule, FitRule, Maintenance, ReadyJobs, ReadyListener, RemovalRule,
    SettleRule, Settled, StorageError, StorageHealth, Store, SweepPass,
};
use crate::testing::TempDir;
use sepp_proto::admin::v1 as admin_pb;
use sepp_proto::admin::v1::admin_service_server::AdminService;
use sepp_proto::v1 as pb;
use sepp_proto::v1::queue_service_server::QueueService;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker};

/// The time of every fuzzed call (2024-01-01T00:00:00Z).
pub const T0: UnixMs = 1_704_067_200_000;

/// A store that holds nothing: an enqueue runs the queue's rule over no dedup records and
/// empty queues and writes nothing, a settlement runs its rule on "no such job", every read
/// finds nothing. Every method answers at once.
pub struct EmptyStore {
    health: tokio::sync::watch::Sender<StorageHealth>,
}

impl Default for EmptyStore {
    fn default() -> Self {
        EmptyStore {
            health: tokio::sync::watch::channel(StorageHealth::Serving).0,
        }
    }
}

struct NoFacts;

impl EnqueueFacts for NoFacts {
    fn record(&self, _: usize) -> Option<KeyRecord> {
        None
    }
    fn depth(&self, _: &str) -> u64 {
        0
    }
    fn queue_exists(&self, _: &str) -> bool {
        true
    }
    fn queue_count(&self) -> u64 {
        0
    }
    fn stage(&self, _: JobId) -> Option<crate::domain::Stage> {
        None
    }
}

#[async_trait::async_trait]
impl Store for EmptyStore {
    async fn enqueue(
        &self,
        jobs: Vec<NewJob>,
        rule: &EnqueueRule<'_>,
        _now: UnixMs,
    ) -> Result<Vec<InsertOutcome>, StorageError> {
        let plan = rule(&jobs, &NoFacts);
        assert_eq!(plan.outcomes.len(), jobs.len(), "one outcome per job");
        Ok(plan.outcomes)
    }
    async fn reserve(
        &self,
        _: &ReserveSpec,
        _: &crate::storage::ReserveFitRule<'_>,
        _: UnixMs,
    ) -> Result<Vec<Job>, StorageError> {
        Ok(Vec::new())
    }
    async fn release_leases(
        &self,
        _: &str,
        _: &crate::storage::ExpiryRule<'_>,
        _: UnixMs,
    ) -> Result<(Vec<JobId>, ReadyJobs), StorageError> {
        Ok((Vec::new(), Vec::new()))
    }
    async fn forget_key(&self, _: &str, _: &str) -> Result<Option<KeyRecord>, StorageError> {
        Ok(None)
    }
    async fn create_queues(&self, _: &[String]) -> Result<(), StorageError> {
        Ok(())
    }
    async fn add_rates(
        &self,
        _: &[crate::storage::RateBucket],
        _: i64,
    ) -> Result<(), StorageError> {
        Ok(())
    }
    async fn rates(&self, _: i64) -> Result<Vec<crate::storage::RateBucket>, StorageError> {
        Ok(Vec::new())
    }
    async fn delete_queue(
        &self,
        _: &str,
        _: &crate::storage::DeleteQueueRule<'_>,
    ) -> Result<crate::storage::QueueDeletion, StorageError> {
        Ok(crate::storage::QueueDeletion::NotFound)
    }
    async fn list_queues(
        &self,
        _: Option<&str>,
        _: u32,
    ) -> Result<(Vec<(String, QueueStats)>, bool), StorageError> {
        Ok((Vec::new(), false))
    }
    async fn list_jobs(
        &self,
        _: &str,
        _: crate::domain::ListState,
        _: Option<crate::domain::JobCursor>,
        _: u32,
    ) -> Result<(Vec<(crate::domain::JobCursor, StoredJob)>, bool), StorageError> {
        Ok((Vec::new(), false))
    }
    async fn cancel_jobs(
        &self,
        _: &crate::domain::CancelSelector,
        _: &RemovalRule<'_>,
        _: &str,
        _: UnixMs,
    ) -> Result<Vec<JobId>, StorageError> {
        Ok(Vec::new())
    }
    async fn gauges(&self) -> Result<crate::storage::StoreGauges, StorageError> {
        Ok(crate::storage::StoreGauges::default())
    }
    async fn backup(
        &self,
        _: &std::path::Path,
    ) -> Result<crate::storage::BackupReport, StorageError> {
        Err(StorageError::Io(
            "the fuzz store holds nothing to back up".into(),
        ))
    }
    async fn settle(
        &self,
        _: JobId,
        rule: &SettleRule<'_>,
        _: LastReason,
        _: UnixMs,
    ) -> Result<Result<Settled, crate::domain::SettleRefusal>, StorageError> {
        match rule(None) {
            Err(refusal) => Ok(Err(refusal)),
            Ok(plan) => panic!("a settlement of no job was planned: {plan:?}"),
        }
    }
    async fn drain_dead_letters(
        &self,
        _: Option<&str>,
        _: u32,
        _: &FitRule<'_>,
        _: &RemovalRule<'_>,
        _: UnixMs,
    ) -> Result<Vec<DeadLetter>, StorageError> {
        Ok(Vec::new())
    }
    async fn maintain(&self, _: &SweepPass<'_>) -> Result<Maintenance, StorageError> {
        Ok(Maintenance::default())
    }
    async fn get_job(&self, _: JobId) -> Result<Option<StoredJob>, StorageError> {
        Ok(None)
    }
    async fn lookup_key(&self, _: &str, _: &str) -> Result<Option<KeyRecord>, StorageError> {
        Ok(None)
    }
    async fn list_dead_letters(
        &self,
        _: Option<&str>,
        _: Option<DeadLetterCursor>,
        _: u32,
        _: &FitRule<'_>,
    ) -> Result<(Vec<DeadLetter>, Option<DeadLetterCursor>), StorageError> {
        Ok((Vec::new(), None))
    }
    async fn requeue_dead_letters(
        &self,
        _: &DeadLetterSelector,
        _: Requeue,
        _: UnixMs,
    ) -> Result<(Vec<JobId>, ReadyJobs), StorageError> {
        Ok((Vec::new(), Vec::new()))
    }
    async fn delete_dead_letters(
        &self,
        _: &DeadLetterSelector,
        _: &RemovalRule<'_>,
        _: UnixMs,
    ) -> Result<Vec<JobId>, StorageError> {
        Ok(Vec::new())
    }
    async fn set_paused(
        &self,
        _: &str,
        _: bool,
        _: &crate::storage::CreateQueueRule<'_>,
    ) -> Result<crate::storage::PauseOutcome, StorageError> {
        Ok(crate::storage::PauseOutcome::Set { ready: 0 })
    }
    async fn queue_stats(&self, _: &str) -> Result<QueueStats, StorageError> {
        Ok(QueueStats::default())
    }
    fn listen(&self, _: Arc<dyn ReadyListener>) {}
    fn health(&self) -> tokio::sync::watch::Receiver<StorageHealth> {
        self.health.subscribe()
    }
    async fn close(&self) -> Result<(), StorageError> {
        Ok(())
    }
}

/// A configuration with every per-queue restriction in use, strict queues on: the second
/// set of limits [`request`] checks calls against.
const STRICT: &str = r#"
[server]
strict_queues = true
[storage]
dedup_window_ms = 1000
[limits]
max_enqueue_batch = 8
max_reserve_batch = 4
max_reserve_queues = 3
max_queue_name_bytes = 16
max_job_type_bytes = 8
max_idempotency_key_bytes = 8
max_payload_bytes = 64
allowed_encodings = ["json", "raw"]
max_custom_entries = 3
max_custom_total_bytes = 48
max_custom_key_bytes = 6
max_trace_context_bytes = 64
max_encoding_bytes = 8
max_worker_id_bytes = 8
max_reason_bytes = 8
max_schedule_horizon_ms = 60000
max_wait_timeout_ms = 1000
max_lease_duration_ms = 5000
max_reserve_reply_bytes = 65536
[[queues]]
name = "a"
allowed_job_types = ["t", "u"]
max_attempts_ceiling = 2
default_max_attempts = 2
max_queue_depth = 1
retry_backoff = "exponential"
retry_delay_ms = 10
[[queues]]
name = "b"
allowed_encodings = ["raw"]
max_payload_bytes = 4
"#;

struct Edge {
    runtime: tokio::runtime::Runtime,
    apis: [(QueueApi, AdminApi); 2],
}

fn edge() -> &'static Edge {
    static EDGE: OnceLock<Edge> = OnceLock::new();
    EDGE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let strict = Config::from_toml_with_env(STRICT, &[])
            .expect("the strict config loads")
            .config;
        let apis = [Config::default(), strict].map(|config| {
            let queue = Arc::new(Queue::new(
                Arc::new(EmptyStore::default()),
                Arc::new(Limits::from_config(&config).expect("valid limits")),
                Arc::new(ManualClock::new(T0)),
                tokio_util::sync::CancellationToken::new(),
            ));
            (
                QueueApi {
                    queue: queue.clone(),
                },
                AdminApi {
                    queue,
                    auth: crate::api::auth::ApiKeyAuth::from_config(&config.auth)
                        .expect("valid auth"),
                },
            )
        });
        Edge { runtime, apis }
    })
}

/// The number of RPCs [`request`] selects from: the 8 of `sepp.v1.QueueService`, then the 8
/// of `sepp.admin.v1.AdminService`.
pub const RPCS: u8 = 16;

/// Polls `call` once: every path of a handler over [`EmptyStore`] finishes in one poll except
/// a Reserve that waits for a job (validation passed; it would wait for its timeout). Returns
/// the call's status code, `None` while it waits.
fn poll_once<T>(call: impl Future<Output = Result<T, tonic::Status>>) -> Option<tonic::Code> {
    let mut call = std::pin::pin!(call);
    match call.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(_)) => Some(tonic::Code::Ok),
        Poll::Ready(Err(s)) => Some(s.code()),
        Poll::Pending => None,
    }
}

/// Decodes `body` as the request of RPC `rpc % RPCS` as the server's codec does (prost), and
/// hands it to that RPC's handler under one of two configurations (`rpc / RPCS` odd: the
/// strict one). Returns the status code (`None`: a Reserve that passed validation and waits).
///
/// # Panics
/// On a bug: a panic in conversion or validation, or a status other than `OK`,
/// `INVALID_ARGUMENT`, `NOT_FOUND` or `FAILED_PRECONDITION` (the store underneath never fails,
/// so `INTERNAL` or `UNAVAILABLE` would be the queue layer's own fault).
pub fn request(rpc: u8, body: &[u8]) -> Option<tonic::Code> {
    let edge = edge();
    let _entered = edge.runtime.enter();
    let (q, a) = &edge.apis[usize::from((rpc / RPCS) % 2)];
    fn msg<M: prost::Message + Default>(body: &[u8]) -> Result<tonic::Request<M>, tonic::Code> {
        M::decode(body)
            .map(tonic::Request::new)
            .map_err(|_| tonic::Code::InvalidArgument)
    }
    macro_rules! call {
        ($api:expr, $method:ident, $ty:ty) => {
            match msg::<$ty>(body) {
                Ok(req) => poll_once($api.$method(req)),
                Err(code) => Some(code),
            }
        };
    }
    let code = match rpc % RPCS {
        0 => call!(q, enqueue_batch, pb::EnqueueBatchRequest),
        1 => call!(q, enqueue_atomic, pb::EnqueueBatchRequest),
        2 => call!(q, reserve, pb::ReserveRequest),
        3 => call!(q, ack, pb::AckRequest),
        4 => call!(q, nack, pb::NackRequest),
        5 => call!(q, extend, pb::ExtendRequest),
        6 => call!(q, drain_dead_letters, pb::DrainDeadLettersRequest),
        7 => call!(q, get_server_info, pb::GetServerInfoRequest),
        8 => call!(a, get_job, admin_pb::GetJobRequest),
        9 => call!(
            a,
            lookup_idempotency_key,
            admin_pb::LookupIdempotencyKeyRequest
        ),
        10 => call!(a, list_dead_letters, admin_pb::ListDeadLettersRequest),
        11 => call!(a, requeue_dead_letters, admin_pb::RequeueDeadLettersRequest),
        12 => call!(a, delete_dead_letters, admin_pb::DeleteDeadLettersRequest),
        13 => call!(a, pause_queue, admin_pb::PauseQueueRequest),
        14 => call!(a, resume_queue, admin_pb::ResumeQueueRequest),
        _ => call!(a, get_queue_stats, admin_pb::GetQueueStatsRequest),
    };
    if let Some(c) = code {
        use tonic::Code as C;
        assert!(
            matches!(
                c,
                C::Ok | C::InvalidArgument | C::NotFound | C::FailedPrecondition
            ),
            "RPC {} answered {c:?}",
            rpc % RPCS
        );
    }
    code
}

/// Loads a configuration as `sepp` does at start ([`crate::load_config`]): `toml` as the file,
/// `env` as the environment. A configuration that loads prints back ([`Config::to_toml`]) to
/// TOML that loads to the same configuration.
///
/// # Panics
/// On a bug: a panic while loading, or a loaded configuration that does not print back to
/// itself.
pub fn config(toml: &str, env: &[(String, String)]) {
    let Ok(loaded) = Config::from_toml_with_env(toml, env) else {
        return;
    };
    if Limits::from_config(&loaded.config).is_err() {
        return;
    }
    let printed = loaded.config.to_toml().expect("a loaded config prints");
    let again = Config::from_toml_with_env(&printed, &[])
        .unwrap_or_else(|e| panic!("the printed config does not load: {e}\n{printed}"))
        .config;
    assert_eq!(again, loaded.config, "printed as:\n{printed}");
    Limits::from_config(&again).expect("its limits still hold");
}

pub use crate::storage::embedded::fuzz::{codec_bytes, codec_values};

/// What a fuzz target runs on the fuzzer's bytes; it panics only on a bug.
pub type Target = fn(&[u8]);

/// The fuzz targets (`fuzz/fuzz_targets/<name>.rs`), each with the function it runs on the
/// fuzzer's bytes: what the targets run and what the corpus replay test feeds the committed
/// corpus (`fuzz/corpus/<name>/`) to.
pub const TARGETS: [(&str, Target); 4] = [
    ("request", request_target),
    ("config", config_target),
    ("codec", codec_target),
    ("recovery", recovery),
];

/// The `request` target: `data[0]` picks the RPC and configuration ([`request`]), the rest is
/// the request message.
///
/// # Panics
/// As [`request`].
pub fn request_target(data: &[u8]) {
    if let Some((&rpc, body)) = data.split_first() {
        request(rpc, body);
    }
}

/// The `config` target: the bytes up to the first zero byte are the TOML file, the lines after
/// it `KEY=VALUE` pairs set as `SEPP_KEY` ([`config`]).
///
/// # Panics
/// As [`config`].
pub fn config_target(data: &[u8]) {
    let (toml, env) = match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let toml = String::from_utf8_lossy(toml);
    let env: Vec<(String, String)> = String::from_utf8_lossy(env)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("SEPP_{k}"), v.to_string()))
        .collect();
    config(&toml, &env);
}

/// The `codec` target: `data[0]` even runs [`codec_bytes`] on the rest, odd [`codec_values`].
///
/// # Panics
/// As [`codec_bytes`] and [`codec_values`].
pub fn codec_target(data: &[u8]) {
    if let Some((&mode, rest)) = data.split_first() {
        if mode % 2 == 0 {
            codec_bytes(rest);
        } else {
            codec_values(rest);
        }
    }
}

/// A configuration for [`recovery`]'s stores: dead letters kept for a day.
fn recovery_config() -> Config {
    let mut c = Config::default();
    c.storage.dead_letter_retention_ms = crate::config::DAY_MS;
    c
}

/// The name of the threads of [`recovery`]'s runtimes (its blocking pool: the store's close
/// joins its flusher from `spawn_blocking`).
const RECOVERY_THREADS: &str = "sepp-fuzz-rt";

/// Runs `f` to completion on a current-thread runtime made for it, and drops that runtime
/// before returning, which shuts its blocking pool down and joins its threads: nothing
/// [`recovery`] starts outlives the input. (A process-wide runtime kept the blocking thread
/// that `EmbeddedStore::close`'s `spawn_blocking` started alive and idle after the input, for
/// tokio's 10 s keep-alive; LeakSanitizer reported its allocation, 72 bytes, as a leak.)
fn block_on<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .thread_name(RECOVERY_THREADS)
        .build()
        .expect("a runtime");
    let out = rt.block_on(f);
    drop(rt);
    out
}

/// Where [`recovery`] puts its data directories: `FUZZ_TMPDIR`, else `/dev/shm` where it is a
/// directory (tmpfs: the target tests recovery, not the disk, and an fsync there costs
/// nothing), else the system temp directory.
fn scratch_parent() -> &'static std::path::Path {
    static PARENT: OnceLock<std::path::PathBuf> = OnceLock::new();
    PARENT.get_or_init(|| match std::env::var_os("FUZZ_TMPDIR") {
        Some(dir) => dir.into(),
        None if std::path::Path::new("/dev/shm").is_dir() => "/dev/shm".into(),
        None => std::env::temp_dir(),
    })
}

fn open_store(path: &std::path::Path, now: UnixMs) -> Result<EmbeddedStore, StorageError> {
    EmbeddedStore::open(
        EmbeddedOptions {
            path: path.to_path_buf(),
            persist_mode: crate::domain::PersistMode::Buffer,
            min_free_bytes: 0,
        },
        now,
    )
}

fn queue_over(store: Arc<dyn Store>, clock: Arc<ManualClock>) -> Queue {
    Queue::new(
        store,
        Arc::new(Limits::from_config(&recovery_config()).expect("valid limits")),
        clock,
        tokio_util::sync::CancellationToken::new(),
    )
}

fn reserve_input(queues: &[&str]) -> crate::queue::ReserveInput {
    crate::queue::ReserveInput {
        queues: queues.iter().map(|q| q.to_string()).collect(),
        lease_ms: Some(30_000),
        max_jobs: Some(16),
        worker_id: Some("w".into()),
        wait_timeout_ms: None,
    }
}

/// The data directory [`recovery`] puts arbitrary bytes into: a job in every stage, on two
/// queues (one paused), keyed and unkeyed, with payloads, custom values and trace contexts.
/// Written once, by a real store, and kept in memory: each input gets a copy of its files.
struct Template {
    /// Its records, sentinels left out.
    records: Vec<RawRecord>,
    /// Its directories, relative to it, each after its parent.
    dirs: Vec<std::path::PathBuf>,
    /// Its files: path relative to it, and contents.
    files: Vec<(std::path::PathBuf, Vec<u8>)>,
}

fn template() -> &'static Template {
    static TEMPLATE: OnceLock<Template> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let dir = TempDir::new_in(scratch_parent());
        let path = dir.path().join("data");
        let clock = Arc::new(ManualClock::new(T0));
        block_on(async {
            let store: Arc<dyn Store> = Arc::new(open_store(&path, T0).expect("open"));
            let q = queue_over(store.clone(), clock.clone());
            let job = |queue: &str, key: Option<&str>, priority: u32| EnqueueInput {
                queue: queue.into(),
                job_type: "t".into(),
                idempotency_key: key.map(str::to_string),
                priority: Some(priority),
                max_attempts: Some(2),
                payload: Some(crate::domain::Payload {
                    data: vec![1, 2, 3],
                    encoding: "raw".into(),
                }),
                trace_context: Some(crate::domain::TraceContext {
                    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
                    tracestate: Some("a=b".into()),
                }),
                custom: vec![
                    ("s".into(), Some(crate::domain::Value::String("x".into()))),
                    ("d".into(), Some(crate::domain::Value::Double(0.5))),
                    ("i".into(), Some(crate::domain::Value::Int(-1))),
                    ("b".into(), Some(crate::domain::Value::Bool(true))),
                ],
                scheduled_at: None,
            };
            let mut scheduled = job("r", Some("k3"), 0);
            scheduled.scheduled_at = Some(Ok(T0 + 60_000));
            let jobs = vec![
                job("q", Some("k1"), 1),
                job("q", Some("k2"), 2),
                job("q", None, 3),
                job("q", None, 4),
                scheduled,
                job("r", None, 0),
            ];
            q.enqueue_batch(jobs).await.expect("enqueue");
            // Highest priority first: the unkeyed 4 and 3, then k2.
            let got = q.reserve(reserve_input(&["q"])).await.expect("reserve");
            let by_prio = |p: u8| got.iter().find(|j| j.priority == p).expect("reserved");
            let dead = by_prio(4);
            q.nack(
                &dead.id.to_string(),
                1,
                crate::queue::NackStrategy::DeadLetter,
                Some("no".into()),
            )
            .await
            .expect("nack");
            let acked = by_prio(2);
            q.ack(&acked.id.to_string(), 1).await.expect("ack");
            let retried = by_prio(1);
            q.nack(
                &retried.id.to_string(),
                1,
                crate::queue::NackStrategy::Delay(5_000),
                None,
            )
            .await
            .expect("nack");
            // The job of priority 3 stays in flight.
            q.set_paused("r", true).await.expect("pause");
            store.close().await.expect("close");
        });
        let records = read_records(&path).expect("read the template");
        let (mut dirs, mut files) = (Vec::new(), Vec::new());
        let mut todo = vec![std::path::PathBuf::new()];
        while let Some(rel) = todo.pop() {
            for entry in std::fs::read_dir(path.join(&rel)).expect("list the template") {
                let entry = entry.expect("a template entry");
                let rel = rel.join(entry.file_name());
                if entry.file_type().expect("a file type").is_dir() {
                    dirs.push(rel.clone());
                    todo.push(rel);
                } else {
                    let bytes = std::fs::read(entry.path()).expect("read a template file");
                    files.push((rel, bytes));
                }
            }
        }
        Template {
            records,
            dirs,
            files,
        }
    })
}

/// The records of [`recovery`]'s template data directory (sentinels left out): the records it
/// puts arbitrary bytes into.
pub fn recovery_template() -> &'static [RawRecord] {
    &template().records
}

impl Template {
    /// Writes a copy of the template at `path`.
    fn copy_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir(path)?;
        for d in &self.dirs {
            std::fs::create_dir(path.join(d))?;
        }
        for (f, bytes) in &self.files {
            std::fs::write(path.join(f), bytes)?;
        }
        Ok(())
    }
}

/// Copies [`recovery_template`]'s data directory (under `FUZZ_TMPDIR`), writes arbitrary bytes
/// into one record, opens a store on it and uses it: `data[0]` picks the keyspace, `data[1]` one of its records (255: a new record
/// whose key is the next `data[2]` bytes), the rest is the record's value. The store either
/// refuses to open (a clear error) or opens and serves sweeps, reserves, settlements, reads
/// and admin calls, which may fail with errors but never panic, and closes.
///
/// # Panics
/// On a bug: a panic while recovering or serving.
pub fn recovery(data: &[u8]) {
    let _one_at_a_time = RECOVERY.lock().unwrap_or_else(PoisonError::into_inner);
    recover_and_use(data);
}

/// Held by each [`recovery`] input: one at a time in a process (libFuzzer runs one at a time
/// anyway), so that a test can tell that an input left none of its runtime's threads behind.
static RECOVERY: Mutex<()> = Mutex::new(());

fn recover_and_use(data: &[u8]) {
    let [ks, pick, rest @ ..] = data else {
        return;
    };
    let ks = usize::from(*ks) % KEYSPACES.len();
    let mut records = recovery_template().to_vec();
    let (key, value) = if *pick == 255 {
        let (n, tail) = rest.split_first().unwrap_or((&0, &[]));
        let (key, value) = tail.split_at(usize::from(*n).min(tail.len()));
        (key.to_vec(), value.to_vec())
    } else {
        let same: Vec<usize> = (0..records.len()).filter(|i| records[*i].0 == ks).collect();
        if same.is_empty() {
            return;
        }
        let i = same[usize::from(*pick) % same.len()];
        (records[i].1.clone(), rest.to_vec())
    };
    if key.is_empty() || key.as_slice() == [0u8].as_slice() {
        // No key (fjall refuses one), or the sentinel, which the store never reads.
        return;
    }
    let record = (ks, key, value);
    let dir = TempDir::new_in(scratch_parent());
    let path = dir.path().join("data");
    template()
        .copy_to(&path)
        .expect("copy the template data directory");
    insert_record(&path, &record).expect("write the record");
    records.push(record);
    let now = T0 + 1_000;
    let Ok(store) = open_store(&path, now) else {
        return;
    };
    let store: Arc<dyn Store> = Arc::new(store);
    let clock = Arc::new(ManualClock::new(now));
    let q = queue_over(store.clone(), clock.clone());
    block_on(async {
        let mut queues: Vec<String> = records
            .iter()
            .filter(|r| r.0 == 3)
            .map(|r| String::from_utf8_lossy(&r.1).into_owned())
            .collect();
        queues.extend(["q".to_string(), "r".to_string()]);
        for step in 0..3 {
            let _ = q.sweep(1000).await;
            for name in &queues {
                let _ = q.queue_stats(name).await;
                let _ = q.set_paused(name, step == 1).await;
                let got = q.reserve(reserve_input(&[name.as_str()])).await;
                for (i, j) in got.into_iter().flatten().enumerate() {
                    let id = j.id.to_string();
                    let _ = match i % 3 {
                        0 => q.ack(&id, j.attempt).await.map(|_| false),
                        1 => {
                            q.nack(&id, j.attempt, crate::queue::NackStrategy::Default, None)
                                .await
                        }
                        _ => q.extend(&id, j.attempt, Some(1_000)).await.map(|_| false),
                    };
                }
                let _ = q.lookup_idempotency_key(name, "k1").await;
                let _ = q.list_dead_letters(Some(name.clone()), Some(10), "").await;
            }
            for r in records.iter().filter(|r| r.0 == 1) {
                if let Ok(id) = <[u8; 16]>::try_from(r.1.as_slice()) {
                    let _ = q.get_job(&JobId::from_bytes(id).to_string()).await;
                }
            }
            let selector = |max| crate::queue::admin::SelectorInput {
                job_ids: Vec::new(),
                queue: None,
                max: Some(max),
            };
            let _ = q.requeue_dead_letters(selector(1)).await;
            let _ = q.drain_dead_letters(None, Some(1)).await;
            let _ = q.delete_dead_letters(selector(1)).await;
            clock.advance(crate::config::DAY_MS as i64);
        }
        let _ = store.close().await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs that once crashed the fuzz targets through a fault of the harness itself.
    #[test]
    fn the_fuzz_entry_points_take_their_edge_cases() {
        // The strict configuration must load (it once had a reply budget below the minimum).
        for rpc in 0..2 * RPCS {
            request(rpc, &[]);
        }
        // A new record whose key is empty or missing (once an out-of-range slice).
        for input in [&[0x9a, 0xff][..], &[0, 255, 0], &[1, 255, 5, 1]] {
            recovery(input);
        }
        recovery(&[1, 255, 2, 1, 2, 3]);
        config("", &[]);
        codec_bytes(&[]);
        codec_values(&[]);
    }

    /// The names of this process's threads.
    #[cfg(target_os = "linux")]
    fn thread_names() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .expect("list /proc/self/task")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim_end().to_string())
            .collect()
    }

    /// The input of the LeakSanitizer report (`AHJq`): its store opens, so its close joins
    /// the flusher through `spawn_blocking`, which starts a blocking-pool thread. That thread
    /// is gone once the input returns (a process-wide runtime kept it for 10 s).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_recovery_input_leaves_no_thread_of_its_runtime_behind() {
        let _one_at_a_time = RECOVERY.lock().unwrap_or_else(PoisonError::into_inner);
        recover_and_use(&[0x00, 0x72, 0x6a]);
        // A joined thread leaves /proc/self/task a moment after its join returns.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let left = thread_names()
                .into_iter()
                .filter(|n| n == RECOVERY_THREADS)
                .count();
            if left == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{left} thread(s) of the input's runtime still running 2 s after it returned"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Feeds every committed corpus input of `target` (`fuzz/corpus/<target>/`) to the
    /// function its fuzz target runs: a panic there (a crash of the target) fails the test,
    /// naming the input. A replay of what fuzzing found, not new fuzzing.
    fn replay_the_corpus_of(target: &str) {
        let run = TARGETS
            .iter()
            .find(|(name, _)| *name == target)
            .map(|(_, run)| *run)
            .expect("a fuzz target of that name");
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/corpus")
            .join(target);
        let mut inputs: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .collect();
        inputs.sort();
        assert!(!inputs.is_empty(), "no corpus in {}", dir.display());
        let started = std::time::Instant::now();
        for input in &inputs {
            let data = std::fs::read(input).expect("read a corpus input");
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                panic!("fuzz target {target} crashed on {}", input.display());
            }
        }
        let secs = started.elapsed().as_secs_f64();
        eprintln!(
            "{target}: {} inputs in {secs:.2} s ({:.0} executions/s)",
            inputs.len(),
            inputs.len() as f64 / secs
        );
    }

    #[test]
    fn the_request_corpus_passes() {
        replay_the_corpus_of("request");
    }

    #[test]
    fn the_config_corpus_passes() {
        replay_the_corpus_of("config");
    }

    #[test]
    fn the_codec_corpus_passes() {
        replay_the_corpus_of("codec");
    }

    #[test]
    fn the_recovery_corpus_passes() {
        replay_the_corpus_of("recovery");
    }
}
