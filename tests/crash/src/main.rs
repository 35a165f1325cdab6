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
        /// Every fsync of the data directory takes this long (ms; needs --fault power's
        /// filesystem, which this option mounts also with --fault kill).
        #[arg(long, default_value_t = 0)]
        slow_fsync_ms: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let r = match cli.cmd {
        Cmd::Loop {
            common,
            cycles,
            fault,
            min_run_ms,
            max_run_ms,
            slow_fsync_ms,
        } => rt.block_on(crash_loop(
            common,
            cycles,
            fault,
            (min_run_ms, max_run_ms),
            slow_fsync_ms,
        )),
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
    fn power_cut(&mut self) -> Result<faultfs::CutReport, String> {
        if let Some(s) = self.session.take() {
            s.umount_and_join()
                .map_err(|e| format!("unmounting {}: {e}", self.at.display()))?;
        }
        let report = self.fs.power_cut();
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
            let _ = s.umount_and_join();
        }
    }
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
        workers: c.workers,
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
        let s = client
            .get_queue_stats(model::QUEUE)
            .await
            .map_err(|e| format!("GetQueueStats: {e}"))?;
        if s.ready + s.scheduled + s.in_flight == 0 {
            break;
        }
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
    let spec = spec(&c, &work.path, &data, 0)?;
    let model = Arc::new(Model::new(lossy));
    let mut server = spec.start("127.0.0.1:0")?;
    let addr = server.addr.clone();
    let client = client(&server.url())?;
    let mut load = Load::start(&client, &model, mix(&c));
    let started = Instant::now();
    let mut rng = crate::model::new_rng();
    let mut cut_chunks = 0u64;
    let mut cut_nodes = 0u64;
    let mut per_cut_losses = Vec::new();
    println!(
        "crash loop: {cycles} cycles, fault {fault:?}, persist_mode {}, data {}",
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
            let r = m.power_cut()?;
            cut_chunks += r.dirty_chunks;
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
        "acknowledged writes checked: {} ({} enqueues of which {} dedup hits, {} acks, {} nacks, {} extends); {} jobs, {} keys",
        cnt.enqueues + cnt.acks + cnt.nacks + cnt.extends,
        cnt.enqueues,
        cnt.dedup_hits,
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
            "power cuts: {cycles} (dropped: {cut_chunks} chunks of 16 KiB not fsynced, {cut_nodes} files or directories whose entries were not fsynced)"
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
    println!("violations: {violations}");
    let passed = violations == 0;
    work.finish(passed);
    Ok(passed)
}
