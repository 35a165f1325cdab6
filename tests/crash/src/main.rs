//! `sepp-crash`: the crash loop and the disk-fault scenarios of docs/reliability.md.
//!
//! `sepp-crash loop --cycles 100` runs mixed load against the real `sepp` binary, kills it
//! with SIGKILL at a random moment (or cuts the power of its data directory with
//! `--fault power`), restarts it on the same data directory, and checks the client's view
//! after every restart and at the end. `sepp-crash disk-full` and `sepp-crash io-errors` run
//! the same load through a full disk and through failing or slow fsyncs.

use clap::{Parser, Subcommand, ValueEnum};
use rand::RngExt;
use sepp_crash::faultfs::{self, FaultFs};
use sepp_crash::load::{Load, Mix};
use sepp_crash::model::{self, Model};
use sepp_crash::server::{self, Server, ServerSpec};
use sepp_rs::SeppClient;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

#[derive(Parser)]
#[command(about = "Crash loop, power cuts and disk faults against the real sepp binary")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum Fault {
    /// SIGKILL of the server: the page cache survives.
    Kill,
    /// SIGKILL, then everything not fsynced is dropped (faultfs, a FUSE layer; root only).
    Power,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// The `sepp` binary.
    #[arg(long, default_value = "target/debug/sepp")]
    sepp: PathBuf,
    /// A server config template instead of the built-in one (embedded backend). Placeholders:
    /// @DATA_DIR@, @PERSIST_MODE@, @MIN_FREE_BYTES@. A PostgreSQL-backed server is tested by
    /// passing its config here (with `--fault kill`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// storage.persist_mode: sync_all, sync_data or buffer.
    #[arg(long, default_value = "sync_all")]
    persist_mode: String,
    /// Where the data directory, config and server log go (default: a new temporary
    /// directory, removed after a passing run).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Load: keyed producers, keyed batch producers, unkeyed producers, workers.
    #[arg(long, default_value_t = 3)]
    keyed: usize,
    #[arg(long, default_value_t = 1)]
    batches: usize,
    #[arg(long, default_value_t = 1)]
    unkeyed: usize,
    /// Debouncers (the debounce queue, `on_duplicate = "replace_pending"` in the built-in
    /// config; with a `--config` template, configure the queue there or its hits keep).
    #[arg(long, default_value_t = 1)]
    debouncers: usize,
    #[arg(long, default_value_t = 4)]
    workers: usize,
}

#[derive(Subcommand)]
enum Cmd {
    /// Kill (or cut the power of) the server at random moments under mixed load.
    Loop {
        #[command(flatten)]
        common: Common,
        /// How many kills.
        #[arg(long, default_value_t = 10)]
        cycles: u32,
        #[arg(long, value_enum, default_value = "kill")]
        fault: Fault,
        /// Load runs for a random time in [min, max] ms before each kill.
        #[arg(long, default_value_t = 200)]
        min_run_ms: u64,
        #[arg(long, default_value_t = 2500)]
        max_run_ms: u64,
        /// With --fault power: each 16 KiB chunk not yet fsynced reaches the disk or not, at
        /// random (torn and reordered writes), instead of none of them.
        #[arg(long)]
        torn: bool,
        /// Every fsync of the data directory takes this long (ms; needs --fault power's
        /// filesystem, which this option mounts also with --fault kill).
        #[arg(long, default_value_t = 0)]
        slow_fsync_ms: u64,
    },
    /// A full disk under load: the data directory on a small tmpfs (root only), filled by
    /// another file until writes are refused, then freed; every other round the server is
    /// killed while the disk is full.
    DiskFull {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 4)]
        rounds: u32,
        /// Size of the tmpfs (MiB).
        #[arg(long, default_value_t = 96)]
        tmpfs_mib: u64,
        /// storage.min_free_bytes (MiB); 0 turns the mark off, so that writes really fail
        /// with ENOSPC.
        #[arg(long, default_value_t = 16)]
        min_free_mib: u64,
    },
    /// Failed writes and fsyncs under load (faultfs; root only): one fsync fails with EIO, or
    /// writes fail with EIO for a moment; the server must refuse writes until restarted, and
    /// a power cut and restart must keep everything acknowledged.
    IoErrors {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 4)]
        rounds: u32,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let needs = match &cli.cmd {
        Cmd::Loop {
            fault,
            slow_fsync_ms,
            ..
        } => (*fault == Fault::Power || *slow_fsync_ms > 0).then_some(true),
        Cmd::DiskFull { .. } => Some(false),
        Cmd::IoErrors { .. } => Some(true),
    };
    if let Some(fuse) = needs
        && let Some(why) = cannot_mount(fuse)
    {
        // CI must run them; elsewhere (a developer without root) they are skipped, loudly.
        if std::env::var_os("CI").is_some() {
            eprintln!("sepp-crash: {why} (CI is set: this check must run)");
            return ExitCode::from(2);
        }
        println!("SKIPPED: {why}");
        return ExitCode::SUCCESS;
    }
    let r = match cli.cmd {
        Cmd::Loop {
            common,
            cycles,
            fault,
            min_run_ms,
            max_run_ms,
            slow_fsync_ms,
            torn,
        } => rt.block_on(crash_loop(
            common,
            cycles,
            fault,
            (min_run_ms, max_run_ms),
            slow_fsync_ms,
            torn,
        )),
        Cmd::DiskFull {
            common,
            rounds,
            tmpfs_mib,
            min_free_mib,
        } => rt.block_on(disk_full(common, rounds, tmpfs_mib, min_free_mib)),
        Cmd::IoErrors { common, rounds } => rt.block_on(io_errors(common, rounds)),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("sepp-crash: {e}");
            ExitCode::from(2)
        }
    }
}

/// Why this process cannot mount what the scenario needs (root for mount(2); /dev/fuse for
/// faultfs), if it cannot.
fn cannot_mount(fuse: bool) -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("needs root (it mounts a filesystem)".into());
    }
    if fuse && !Path::new("/dev/fuse").exists() {
        return Some("needs /dev/fuse (faultfs is a FUSE filesystem)".into());
    }
    None
}

/// The working directory: given, or a fresh one under the system's temporary directory.
struct Work {
    path: PathBuf,
    keep: bool,
}

impl Work {
    fn new(given: Option<PathBuf>) -> Result<Work, String> {
        let (path, keep) = match given {
            Some(p) => (p, true),
            None => (
                std::env::temp_dir().join(format!(
                    "sepp-crash-{}-{}",
                    std::process::id(),
                    SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .unwrap_or_default()
                        .as_millis()
                )),
                false,
            ),
        };
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Work { path, keep })
    }

    fn finish(self, passed: bool) {
        if passed && !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        } else {
            eprintln!("work directory kept: {}", self.path.display());
        }
    }
}

/// faultfs mounted on a directory; remounted after each power cut.
struct Mounted {
    fs: FaultFs,
    at: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl Mounted {
    fn mount(at: &Path) -> Result<Mounted, String> {
        std::fs::create_dir_all(at).map_err(|e| format!("{}: {e}", at.display()))?;
        let fs = FaultFs::new();
        let session = fs.mount(at).map_err(|e| {
            format!(
                "mounting faultfs on {} (needs root and /dev/fuse): {e}",
                at.display()
            )
        })?;
        Ok(Mounted {
            fs,
            at: at.to_path_buf(),
            session: Some(session),
        })
    }

    /// Unmounts, drops what was not fsynced, mounts again (the server must be dead).
    fn power_cut(&mut self, torn: bool) -> Result<faultfs::CutReport, String> {
        if let Some(s) = self.session.take() {
            unmount(s, &self.at)?;
        }
        let report = self.fs.power_cut(torn);
        self.session = Some(
            self.fs
                .mount(&self.at)
                .map_err(|e| format!("remounting {}: {e}", self.at.display()))?,
        );
        Ok(report)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = unmount(s, &self.at);
        }
    }
}

/// Unmounts faultfs and waits for its session thread. The kernel may end the session's read of
/// /dev/fuse with ECONNABORTED instead of ENODEV when the unmount tears the connection down, and
/// fuser passes that on as the session's error; once /proc/mounts no longer lists `at`, the
/// unmount happened, and that error says nothing more.
fn unmount(s: fuser::BackgroundSession, at: &Path) -> Result<(), String> {
    match s.umount_and_join() {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionAborted && !is_mounted(at) => Ok(()),
        Err(e) => Err(format!("unmounting {}: {e}", at.display())),
    }
}

/// Whether /proc/mounts lists `at` as a mount point (octal escapes as the kernel writes them).
fn is_mounted(at: &Path) -> bool {
    let want = at
        .to_string_lossy()
        .replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012");
    std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
        })
        .unwrap_or(true)
}

fn client(url: &str) -> Result<SeppClient, String> {
    SeppClient::builder(url)
        .rpc_timeout(Some(Duration::from_secs(10)))
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy()
        .map_err(|e| e.to_string())
}

fn spec(c: &Common, work: &Path, data: &Path, min_free: u64) -> Result<ServerSpec, String> {
    let template = match &c.config {
        Some(p) => std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?,
        None => server::DEFAULT_TEMPLATE.to_string(),
    };
    let bin = std::fs::canonicalize(&c.sepp)
        .map_err(|e| format!("the sepp binary {}: {e}", c.sepp.display()))?;
    Ok(ServerSpec {
        bin,
        config: server::render(&template, data, &c.persist_mode, min_free),
        work: work.to_path_buf(),
    })
}

fn mix(c: &Common) -> Mix {
    Mix {
        keyed: c.keyed,
        batches: c.batches,
        unkeyed: c.unkeyed,
        debouncers: c.debouncers,
        workers: c.workers,
    }
}

/// A server started for a scenario, with its client, the checker and the load running.
struct Run {
    spec: ServerSpec,
    model: Arc<Model>,
    server: Server,
    addr: String,
    url: String,
    client: SeppClient,
    load: Load,
}

impl Run {
    fn start(
        c: &Common,
        work: &Work,
        data: &Path,
        min_free: u64,
        lossy: bool,
    ) -> Result<Run, String> {
        let spec = spec(c, &work.path, data, min_free)?;
        let model = Arc::new(Model::new(lossy));
        let server = spec.start("127.0.0.1:0")?;
        let (addr, url) = (server.addr.clone(), server.url());
        let client = client(&url)?;
        let load = Load::start(&client, &model, mix(c));
        Ok(Run {
            spec,
            model,
            server,
            addr,
            url,
            client,
            load,
        })
    }
}

/// After the load: stop the producers, let the workers drain the queue, stop them, restart
/// the server cleanly and check everything.
async fn finish(
    load: &mut Load,
    model: &Model,
    spec: &ServerSpec,
    server: Server,
    client: &SeppClient,
) -> Result<Server, String> {
    load.stop_producers().await;
    let t = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut pending = 0;
        let mut stats = Vec::new();
        for q in [model::QUEUE, model::DEBOUNCE_QUEUE] {
            let s = client
                .get_queue_stats(q)
                .await
                .map_err(|e| format!("GetQueueStats {q}: {e}"))?;
            pending += s.ready + s.scheduled + s.in_flight;
            stats.push(s);
        }
        if pending == 0 {
            break;
        }
        let s = stats;
        if Instant::now() > deadline {
            return Err(format!("the queue did not drain within 120 s: {s:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    load.stop_workers().await;
    println!("drained in {} ms", t.elapsed().as_millis());
    let addr = server.addr.clone();
    server.stop()?;
    let server = spec.start(&addr)?;
    model.verify(client, true, 0, None).await?;
    model.verify_end(client).await?;
    Ok(server)
}

async fn crash_loop(
    c: Common,
    cycles: u32,
    fault: Fault,
    (min_run, max_run): (u64, u64),
    slow_fsync_ms: u64,
    torn: bool,
) -> Result<bool, String> {
    let work = Work::new(c.work_dir.clone())?;
    let mut mounted = if fault == Fault::Power || slow_fsync_ms > 0 {
        let m = Mounted::mount(&work.path.join("mnt"))?;
        m.fs.faults
            .fsync_delay_ms
            .store(slow_fsync_ms, std::sync::atomic::Ordering::Relaxed);
        Some(m)
    } else {
        None
    };
    let data = match &mounted {
        Some(m) => m.at.join("data"),
        None => work.path.join("data"),
    };
    let lossy = fault == Fault::Power && c.persist_mode == "buffer";
    let Run {
        spec,
        model,
        mut server,
        addr,
        url: _,
        client,
        mut load,
    } = Run::start(&c, &work, &data, 0, lossy)?;
    let started = Instant::now();
    let mut rng = crate::model::new_rng();
    let mut cut_chunks = 0u64;
    let mut cut_nodes = 0u64;
    let mut torn_kept = 0u64;
    let mut per_cut_losses = Vec::new();
    println!(
        "crash loop: {cycles} cycles, fault {fault:?}{}, persist_mode {}, data {}",
        if torn { " (torn writes)" } else { "" },
        c.persist_mode,
        data.display()
    );
    for cycle in 1..=cycles {
        tokio::time::sleep(Duration::from_millis(rng.random_range(min_run..=max_run))).await;
        let cut_at = SystemTime::now();
        server.kill9();
        // Nothing in flight from here until the restart is verified.
        let pause = load.gate.clone();
        let _pause = pause.write().await;
        if fault == Fault::Power {
            let m = mounted.as_mut().expect("mounted for power cuts");
            let r = m.power_cut(torn)?;
            cut_chunks += r.dirty_chunks;
            torn_kept += r.torn_chunks_kept;
            cut_nodes += r.nodes_dropped;
        }
        model.set_cycle(cycle);
        let t = Instant::now();
        server = spec.start(&addr)?;
        let restart = t.elapsed();
        if lossy {
            model.forget_leases();
        }
        let lost_before = model.losses().enqueues.len();
        let t = Instant::now();
        model.verify(&client, false, 200, Some(cut_at)).await?;
        let verified = t.elapsed();
        let lost = model.losses().enqueues.len() - lost_before;
        per_cut_losses.push(lost);
        let cnt = model.counts();
        println!(
            "cycle {cycle}/{cycles}: restart {} ms, verify {} ms; {} enqueues, {} acks, {} nacks, {} deliveries acknowledged so far; {}violations {}",
            restart.as_millis(),
            verified.as_millis(),
            cnt.enqueues,
            cnt.acks,
            cnt.nacks,
            cnt.deliveries,
            if lossy {
                format!("lost at this cut {lost}; ")
            } else {
                String::new()
            },
            model.violations()
        );
    }
    let server = finish(&mut load, &model, &spec, server, &client).await?;
    drop(server);
    drop(mounted.take());
    let cnt = model.counts();
    let (jobs, keys) = model.sizes();
    let violations = model.violations();
    println!(
        "crash loop done in {:.0} s: persist_mode {}, fault {fault:?}",
        started.elapsed().as_secs_f64(),
        c.persist_mode
    );
    println!("cycles: {cycles}");
    println!(
        "acknowledged writes checked: {} ({} enqueues of which {} dedup hits ({} replaced a pending job's payload), {} acks, {} nacks, {} extends); {} jobs, {} keys",
        cnt.enqueues + cnt.acks + cnt.nacks + cnt.extends,
        cnt.enqueues,
        cnt.dedup_hits,
        cnt.replaced,
        cnt.acks,
        cnt.nacks,
        cnt.extends,
        jobs,
        keys
    );
    println!(
        "deliveries: {}; lease-lost answers: {}; failed calls: {}; unkeyed enqueues of unknown outcome: {}; server look-ups by the checker: {}",
        cnt.deliveries, cnt.lease_lost, cnt.errors, cnt.enqueues_unknown, cnt.checks
    );
    if fault == Fault::Power {
        println!(
            "power cuts: {cycles} (dropped: {cut_chunks} chunks of 16 KiB not fsynced, {cut_nodes} files or directories whose entries were not fsynced){}",
            if torn {
                format!("; torn: {torn_kept} unsynced chunks kept at random")
            } else {
                String::new()
            }
        );
    }
    if lossy {
        let l = model.losses();
        let mut ages = l.enqueues.clone();
        ages.sort();
        let cuts_with_loss = per_cut_losses.iter().filter(|n| **n > 0).count();
        println!(
            "buffer-mode loss: {} acknowledged enqueues lost over {cycles} cuts ({cuts_with_loss} cuts lost any; at most {} at one cut); age at the cut: median {:?}, max {:?}; acks undone: {}; attempt counts gone back: {}",
            ages.len(),
            per_cut_losses.iter().max().copied().unwrap_or(0),
            ages.get(ages.len() / 2).copied().unwrap_or_default(),
            ages.last().copied().unwrap_or_default(),
            l.acks,
            l.attempts
        );
    }
    println!("failed calls by status: {}", by_status(&model));
    println!("violations: {violations}");
    let passed = violations == 0;
    work.finish(passed);
    Ok(passed)
}

/// The failed calls counted by gRPC status ("no reply": the server was down or went away).
fn by_status(model: &Model) -> String {
    let mut counts = std::collections::BTreeMap::<String, u64>::new();
    for f in model.failures_since(0) {
        let name = match f.code {
            None => "no reply".to_string(),
            Some(c) => format!("{:?}", tonic::Code::from_i32(c)),
        };
        *counts.entry(name).or_default() += 1;
    }
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

const UNAVAILABLE: i32 = 14;

/// Health of `""` and `sepp.v1.QueueService`: true when both are SERVING.
async fn serving(url: &str) -> Result<(bool, bool), String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let ch = tonic::transport::Channel::from_shared(url.to_string())
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("health: {e}"))?;
    let mut h = HealthClient::new(ch);
    let mut out = [false; 2];
    for (i, service) in ["", "sepp.v1.QueueService"].into_iter().enumerate() {
        let st = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .map_err(|e| format!("health check of {service:?}: {e}"))?
            .into_inner()
            .status;
        out[i] = st == ServingStatus::Serving as i32;
    }
    Ok((out[0], out[1]))
}

/// Polls `cond` every 50 ms for up to `secs`.
async fn wait_until<F: AsyncFnMut() -> Result<bool, String>>(
    what: &str,
    secs: u64,
    mut cond: F,
) -> Result<Duration, String> {
    let t = Instant::now();
    while !cond().await? {
        if t.elapsed() > Duration::from_secs(secs) {
            return Err(format!("{what}: not within {secs} s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(t.elapsed())
}

/// Bytes free for an unprivileged writer on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64, String> {
    let st = rustix::fs::statvfs(dir).map_err(|e| format!("statvfs {}: {e}", dir.display()))?;
    Ok(st.f_bavail * st.f_frsize)
}

/// Writes `path` until at most `leave` bytes are free on its filesystem (0: until ENOSPC).
fn fill(path: &Path, leave: u64) -> Result<(), String> {
    use std::io::Write;
    let dir = path.parent().expect("a parent");
    let mut f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    for chunk in [1usize << 20, 4096] {
        let buf = vec![0x5a_u8; chunk];
        loop {
            if leave > 0 && free_bytes(dir)? <= leave + chunk as u64 {
                break;
            }
            if f.write_all(&buf).and_then(|()| f.flush()).is_err() {
                break;
            }
        }
    }
    Ok(())
}

/// A tmpfs mounted for the scenario, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, mib: u64) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(at).map_err(|e| format!("{}: {e}", at.display()))?;
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(at)
            .status()
            .map_err(|e| format!("running mount: {e}"))?;
        if !st.success() {
            return Err(format!(
                "mount -t tmpfs on {} failed ({st}): needs root",
                at.display()
            ));
        }
        Ok(Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = std::process::Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
}

/// What the server answered while a fault lasted: the failures recorded since `since`, each
/// UNAVAILABLE with a message holding every one of `needles`; returns how many there were.
fn check_refusals(model: &Model, since: u64, needles: &[&str]) -> Result<usize, String> {
    let f = model.failures_since(since);
    let refusals: Vec<_> = f
        .iter()
        .filter(|f| f.code == Some(UNAVAILABLE) && needles.iter().all(|n| f.message.contains(n)))
        .collect();
    if refusals.is_empty() {
        return Err(format!(
            "no UNAVAILABLE naming {needles:?} among {} failed calls; first: {:?}",
            f.len(),
            f.first()
        ));
    }
    for x in &f {
        if x.code != Some(UNAVAILABLE) {
            model.violation(format!(
                "while the fault lasted, a call failed with code {:?}, not UNAVAILABLE: {}",
                x.code, x.message
            ));
        }
    }
    Ok(refusals.len())
}

/// Reads every job and key the model knows: true where the server knows it.
async fn existence(model: &Model, client: &SeppClient) -> Result<Vec<(String, bool)>, String> {
    model.existence(client).await
}

async fn disk_full(
    c: Common,
    rounds: u32,
    tmpfs_mib: u64,
    min_free_mib: u64,
) -> Result<bool, String> {
    let work = Work::new(c.work_dir.clone())?;
    let tmpfs = Tmpfs::mount(&work.path.join("tmpfs"), tmpfs_mib)?;
    let data = tmpfs.0.join("data");
    let filler = tmpfs.0.join("filler");
    let min_free = min_free_mib << 20;
    let Run {
        spec,
        model,
        mut server,
        addr,
        url,
        client,
        mut load,
    } = Run::start(&c, &work, &data, min_free, false)?;
    let dir = data.display().to_string();
    let started = Instant::now();
    println!(
        "disk full: {rounds} rounds, tmpfs {tmpfs_mib} MiB, storage.min_free_bytes {min_free}, persist_mode {}",
        c.persist_mode
    );
    for round in 1..=rounds {
        let before = model.counts();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let since = model.counts().errors;
        // Below the mark when it is on (writes refused before the disk is full); to ENOSPC
        // when it is off.
        let leave = if min_free > 0 { min_free / 3 } else { 0 };
        let f = filler.clone();
        tokio::task::spawn_blocking(move || fill(&f, leave))
            .await
            .map_err(|e| e.to_string())??;
        let free_full = free_bytes(&tmpfs.0)?;
        let not_serving = wait_until("health NOT_SERVING", 20, async || {
            Ok(serving(&url).await? == (false, false))
        })
        .await?;
        // Let the load meet the refusals for a while.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let pause = load.gate.clone();
        let g = pause.write().await;
        let refused = check_refusals(&model, since, &["no space left", &dir])?;
        // Reads while writes are refused: they show what was acknowledged. (With the mark off
        // the store is closed and reopened after the ENOSPC, and reads are refused with
        // UNAVAILABLE until the reopen succeeds, which needs some free space.)
        let reads = match model.verify(&client, false, 200, None).await {
            Ok(()) => "reads worked".to_string(),
            Err(e) if min_free == 0 && e.contains("being reopened") => {
                format!("reads refused while the store is reopened ({e})")
            }
            Err(e) => return Err(e),
        };
        let reads_ok = reads == "reads worked";
        let kill = round % 2 == 0;
        if kill {
            // Memory equals disk: what the server shows now is what it shows after a kill -9
            // and a restart on the still full disk.
            let seen = if reads_ok {
                Some(existence(&model, &client).await?)
            } else {
                None
            };
            server.kill9();
            model.set_cycle(round);
            server = spec.start(&addr)?;
            if let Some(seen) = seen {
                let again = existence(&model, &client).await?;
                for ((id, a), (_, b)) in seen.iter().zip(&again) {
                    if a != b {
                        model.violation(format!(
                            "{id}: known = {a} before the kill on a full disk, {b} after the \
                             restart"
                        ));
                    }
                }
            }
        }
        std::fs::remove_file(&filler).map_err(|e| format!("removing the filler: {e}"))?;
        let serving_again = wait_until("health SERVING after freeing space", 30, async || {
            Ok(serving(&url).await? == (true, true))
        })
        .await?;
        model.verify(&client, false, 200, None).await?;
        drop(g);
        let acks_then = model.counts().acks;
        wait_until("acks after freeing space", 30, async || {
            Ok(model.counts().acks > acks_then + 20)
        })
        .await?;
        let after = model.counts();
        println!(
            "round {round}/{rounds}: {} enqueues and {} acks acknowledged so far; filled to {} KiB free; NOT_SERVING after {} ms; {refused} calls refused with UNAVAILABLE naming the directory; {reads}; {}SERVING {} ms after freeing; acks resumed; violations {}",
            before.enqueues,
            before.acks,
            free_full / 1024,
            not_serving.as_millis(),
            if kill {
                "killed and restarted on the full disk; "
            } else {
                ""
            },
            serving_again.as_millis(),
            model.violations()
        );
        let _ = after;
    }
    let server = finish(&mut load, &model, &spec, server, &client).await?;
    drop(server);
    report("disk full", &model, started, rounds);
    drop(tmpfs);
    let passed = model.violations() == 0;
    work.finish(passed);
    Ok(passed)
}

async fn io_errors(c: Common, rounds: u32) -> Result<bool, String> {
    let work = Work::new(c.work_dir.clone())?;
    let mut mounted = Mounted::mount(&work.path.join("mnt"))?;
    let data = mounted.at.join("data");
    let Run {
        spec,
        model,
        mut server,
        addr,
        url,
        client,
        mut load,
    } = Run::start(&c, &work, &data, 0, false)?;
    let dir = data.display().to_string();
    let faults = mounted.fs.faults.clone();
    let started = Instant::now();
    println!(
        "I/O errors: {rounds} rounds, persist_mode {}",
        c.persist_mode
    );
    for round in 1..=rounds {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let since = model.counts().errors;
        let fsync = round % 2 == 1;
        if fsync {
            faults
                .fail_fsyncs
                .store(1, std::sync::atomic::Ordering::Relaxed);
        } else {
            faults
                .fail_writes
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let not_serving = wait_until("health NOT_SERVING", 20, async || {
            Ok(serving(&url).await? == (false, false))
        })
        .await?;
        faults
            .fail_writes
            .store(false, std::sync::atomic::Ordering::Relaxed);
        // The fault is gone, but writes stay refused until a restart.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        if serving(&url).await? != (false, false) {
            model.violation(format!(
                "round {round}: health back to SERVING after a failed {} without a restart",
                if fsync { "fsync" } else { "write" }
            ));
        }
        let pause = load.gate.clone();
        let g = pause.write().await;
        let refused = check_refusals(&model, since, &["failed to write", "restarted", &dir])?;
        // Reads work, and show what was acknowledged.
        model.verify(&client, false, 200, None).await?;
        // A power cut and restart: everything acknowledged is on disk.
        server.kill9();
        let cut = mounted.power_cut(false)?;
        model.set_cycle(round);
        server = spec.start(&addr)?;
        model.verify(&client, false, 200, None).await?;
        let healthy = serving(&url).await? == (true, true);
        if !healthy {
            model.violation(format!("round {round}: not SERVING after the restart"));
        }
        drop(g);
        let acks_then = model.counts().acks;
        wait_until("acks after the restart", 30, async || {
            Ok(model.counts().acks > acks_then + 20)
        })
        .await?;
        println!(
            "round {round}/{rounds}: {} failed; NOT_SERVING after {} ms and still 1 s after the fault ended; {refused} calls refused with UNAVAILABLE naming the directory; power cut ({} chunks dropped) and restart: all acknowledged there, SERVING; violations {}",
            if fsync { "one fsync" } else { "writes" },
            not_serving.as_millis(),
            cut.dirty_chunks,
            model.violations()
        );
    }
    let server = finish(&mut load, &model, &spec, server, &client).await?;
    drop(server);
    drop(mounted);
    report("I/O errors", &model, started, rounds);
    let passed = model.violations() == 0;
    work.finish(passed);
    Ok(passed)
}

fn report(what: &str, model: &Model, started: Instant, rounds: u32) {
    let cnt = model.counts();
    println!(
        "{what} done in {:.0} s: rounds: {rounds}; acknowledged writes checked: {} ({} enqueues, {} acks, {} nacks, {} extends); failed calls: {}; server look-ups by the checker: {}",
        started.elapsed().as_secs_f64(),
        cnt.enqueues + cnt.acks + cnt.nacks + cnt.extends,
        cnt.enqueues,
        cnt.acks,
        cnt.nacks,
        cnt.extends,
        cnt.errors,
        cnt.checks
    );
    println!("failed calls by status: {}", by_status(model));
    println!("violations: {}", model.violations());
}
