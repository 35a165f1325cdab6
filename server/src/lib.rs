//! The sepp server as a library, so tests can run it in-process.
//!
//! Dependencies point one way: `main` → [`serve`] → [`api`] (gRPC edge) → [`queue`] (what a
//! durable job queue means: every rule, decided once) → [`storage`] (the [`storage::Store`]
//! trait, a transition engine that applies the queue's plans, implemented by
//! [`storage::embedded`]) → [`domain`] (the types they all speak). [`config`] is plain data
//! the layers read; it imports none of them.
//!
//! | module | holds |
//! |---|---|
//! | [`config`] | defaults ← `sepp.toml` ← `SEPP_*` environment |
//! | [`api`] | one short handler per RPC, status mapping, API keys |
//! | [`net`] | accepting, TLS, HTTP/2, connection limits and timeouts, bounded shutdown |
//! | [`queue::validate`] | the per-job validation order |
//! | [`queue::dedup`], [`queue::enqueue`] | idempotency key and dedup window; dedup hits and depth at commit |
//! | [`queue::lease`], [`queue::lifecycle`], [`queue::backoff`] | lease clamping and fencing; where a job goes next; retry delays |
//! | [`queue::reserve`] | long-poll Reserve and its ready signals |
//! | [`queue::sweeper`] | lease expiry, scheduled promotion, dedup and record purge |
//! | [`queue::clock`] | the one clock every transition reads |
//! | [`storage`] | the `Store` trait and its conformance suite |
//! | [`storage::embedded`] | the fjall backend: job index, dedup index, group commit, recovery |
//! | [`domain`] | jobs, facts, plans, refusals, inspection records |

pub mod admin_ui;
pub mod api;
pub mod config;
pub mod domain;
pub mod error;
pub mod metrics;
pub mod net;
pub mod payload_fmt;
pub mod queue;
pub mod storage;
pub mod telemetry;
pub mod testing;
pub mod time_fmt;

use crate::config::Config;
use crate::queue::Queue;
use crate::queue::clock::{Clock, SystemClock};
use crate::queue::limits::Limits;
use crate::storage::Store;
use crate::storage::embedded::{EmbeddedOptions, EmbeddedStore};
use crate::storage::postgres::{PostgresOptions, PostgresStore};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Storage could not be opened or flushed.
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    /// The gRPC edge could not be built.
    #[error(transparent)]
    Api(#[from] api::ApiError),
    /// The transport failed.
    #[error("transport: {0}")]
    Transport(String),
    /// The configuration's limits are out of range or inconsistent.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
}

/// Loads the configuration ([`Config::load`]: defaults, file, environment) and checks what the
/// queue layer resolves from it ([`Limits::from_config`]), so that a bad value fails start-up
/// (and `sepp config check`) with one line naming the key, the value and the rule.
///
/// # Errors
/// The first [`config::ConfigError`].
pub fn load_config(
    path: Option<&std::path::Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<config::Loaded, config::ConfigError> {
    let loaded = Config::load(path, env)?;
    let limits = Limits::from_config(&loaded.config).map_err(|e| loaded.attribute(e))?;
    queue::schedule::Schedules::from_config(&loaded.config, &limits, SystemClock.now())
        .map_err(|e| loaded.attribute(e))?;
    Ok(loaded)
}

/// Binds `config.server.listen_addr`.
///
/// # Errors
/// The bind error, naming the address.
pub async fn bind(config: &Config) -> std::io::Result<TcpListener> {
    let addr = config.server.listen_addr;
    TcpListener::bind(addr).await.map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
            " (another process holds that port; choose another address with `server.listen_addr` \
             in the config file or the environment variable SEPP_SERVER__LISTEN_ADDR, \
             e.g. SEPP_SERVER__LISTEN_ADDR=127.0.0.1:50061)"
        } else {
            ""
        };
        std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}{hint}"))
    })
}

/// What a stopped server still holds: its closed storage, everything already durable. Dropping
/// it frees the storage's memory (the engine's memtables, the job and dedup indexes) and
/// releases the data directory's lock.
///
/// Freeing takes a while with a large store: fjall frees its memtables entry by entry, and with
/// 100,000 jobs just written that took 85–230 ms with a release build (nearly all of the time
/// between "storage flushed; stopped" and the process exit, which an outside report put at
/// 1.7–2.1 s). A process that exits next skips it with [`Stopped::leak_for_exit`]: the
/// operating system takes the memory and the lock back at once.
#[must_use = "dropping frees the storage; a process about to exit calls leak_for_exit"]
pub struct Stopped {
    store: Arc<dyn Store>,
}

impl Stopped {
    /// Leaves the storage's memory and its directory lock to the operating system instead of
    /// freeing them. Only for a process that exits right after: the data directory stays
    /// locked until it does.
    pub fn leak_for_exit(self) {
        std::mem::forget(self.store);
    }
}

/// Serves sepp on `listener` until `shutdown` resolves.
///
/// Opens the storage under `config`, starts the sweeper, serves gRPC, and at shutdown stops
/// accepting, answers waiting Reserves with an empty result, lets other in-flight RPCs finish,
/// stops the sweeper and flushes storage. `on_ready` is called with the bound address once the
/// server accepts connections. Returns the closed storage ([`Stopped`]).
///
/// # Errors
/// [`ServeError`] when storage cannot be opened or the transport fails.
pub async fn serve(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<Stopped, ServeError> {
    serve_with(
        listener,
        config,
        Arc::new(SystemClock),
        shutdown,
        |r: &Running| on_ready(r.addr),
    )
    .await
}

/// What a server that accepts connections hands to [`serve_with`]'s `on_ready`.
pub struct Running {
    /// The bound address.
    pub addr: SocketAddr,
    /// The queue layer it serves (tests wait on its ready signals, or run a sweeper pass).
    pub queue: Arc<Queue>,
    /// Where `GET /metrics` is served, when `[metrics] enabled`.
    pub metrics_addr: Option<SocketAddr>,
    /// Where the admin web UI listens, when `[admin_ui] enabled`.
    pub admin_ui_addr: Option<SocketAddr>,
}

/// [`serve`] with the clock every transition reads (a [`queue::clock::ManualClock`] in tests)
/// and the running server handed to `on_ready`.
///
/// # Errors
/// As [`serve`].
pub async fn serve_with(
    listener: TcpListener,
    config: Config,
    clock: Arc<dyn Clock>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    on_ready: impl FnOnce(&Running),
) -> Result<Stopped, ServeError> {
    let addr = listener
        .local_addr()
        .map_err(|e| ServeError::Transport(e.to_string()))?;
    let limits = Arc::new(Limits::from_config(&config)?);
    let schedules = Arc::new(queue::schedule::Schedules::from_config(
        &config,
        &limits,
        clock.now(),
    )?);
    let store = open_store(&config, clock.now()).await?;
    warn_of_dead_letters_to_delete(&config, &*store).await;
    let stopping = CancellationToken::new();
    let metrics = Arc::new(metrics::Metrics::new(
        config.metrics.enabled,
        config.queues.iter().map(|q| q.name.clone()),
        config.metrics.max_queue_labels as usize,
    ));
    store.observe_commits(metrics.clone());
    let queue = Arc::new(
        Queue::new(store.clone(), limits, clock, stopping.clone())
            .with_metrics(metrics.clone())
            .with_schedules(schedules),
    );
    // A store that refuses writes for now (a full disk below `storage.min_free_bytes`, a
    // database that is down) does not stop the start: the server serves reads and takes
    // writes again once the store does, and a declared queue not created here is created by
    // its first job (the queue cap never refuses a declared queue).
    match queue.create_declared_queues().await {
        Ok(()) => {}
        Err(crate::storage::StorageError::Unavailable(why)) => {
            tracing::warn!(error = %why, "the [[queues]] entries could not be created at start; their first jobs create them");
        }
        Err(e) => return Err(e.into()),
    }
    let net_opts = net::NetOptions::from_config(&config);
    let budgets = net::Budgets::new(&net_opts);
    let metrics_addr = if config.metrics.enabled {
        let at = config.metrics.listen_addr;
        let listener = TcpListener::bind(at).await.map_err(|e| {
            ServeError::Transport(format!(
                "cannot listen for metrics on {at} (metrics.listen_addr): {e}"
            ))
        })?;
        let bound = listener
            .local_addr()
            .map_err(|e| ServeError::Transport(e.to_string()))?;
        let q = queue.clone();
        let (m, b) = (metrics.clone(), budgets.clone());
        tokio::spawn(metrics::serve(
            listener,
            metrics,
            move || {
                m.set_buffers(&metrics::Buffers {
                    request_held: b.request.held(),
                    request_refused: b.request.refused(),
                    reply_held: b.reply.held(),
                    reply_refused: b.reply.refused(),
                });
                let q = q.clone();
                async move { q.store_gauges().await.map_err(|e| e.to_string()) }
            },
            stopping.clone(),
        ));
        tracing::info!(addr = %bound, "metrics on http://{bound}/metrics");
        Some(bound)
    } else {
        None
    };
    let sweeper = tokio::spawn(queue::sweeper::run(
        queue.clone(),
        config.storage.sweep_interval_ms,
        stopping.clone(),
    ));
    // One scheduler per server. Its first pass runs before the server accepts calls, so that a
    // catch-up tick is enqueued (or found enqueued) by the time the server is ready.
    let scheduler = if queue.schedules().is_empty() {
        None
    } else {
        let mut s = queue::schedule::Scheduler::new(queue.clone());
        s.run_due().await;
        Some(tokio::spawn(queue::schedule::run(s, stopping.clone())))
    };
    // Adds this server's per-minute counts to the store every few seconds; awaited with the
    // sweeper, before the store closes, so its last flush lands.
    let rates = tokio::spawn(queue::rates::run(queue.clone(), stopping.clone()));
    let edge = api::build(&config, queue.clone()).await?;
    let health = edge.health.clone();
    // SIGHUP reloads `auth.api_keys_file` (and does not stop the server).
    tokio::spawn(api::auth::reload_on_sighup(
        edge.auth.clone(),
        stopping.clone(),
    ));
    // Storage health (no space left, a failed write) drives the health service.
    tokio::spawn(api::forward_storage_health(
        store.health(),
        edge.health.clone(),
        stopping.clone(),
    ));

    let net_stop = CancellationToken::new();
    let stop = stopping.clone();
    {
        let net_stop = net_stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => {}
                () = net_stop.cancelled() => return,
            }
            tracing::info!("shutting down: no new connections; waiting requests get empty results");
            api::set_not_serving(&health).await;
            stop.cancel();
            net_stop.cancel();
        });
    }
    let admin_ui_addr = if config.admin_ui.enabled {
        let l = TcpListener::bind(config.admin_ui.listen_addr)
            .await
            .map_err(|e| {
                ServeError::Transport(format!(
                    "cannot listen on {} for the admin UI (admin_ui.listen_addr, \
                     SEPP_ADMIN_UI__LISTEN_ADDR): {e}",
                    config.admin_ui.listen_addr
                ))
            })?;
        let ui_addr = l
            .local_addr()
            .map_err(|e| ServeError::Transport(e.to_string()))?;
        let app = admin_ui::router(queue.clone(), &config.admin_ui, edge.auth.clone());
        let stop = stopping.clone();
        tokio::spawn(async move {
            let r = axum::serve(l, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(e) = r {
                tracing::error!(error = %e, "admin UI stopped");
            }
        });
        tracing::info!(addr = %ui_addr, "admin UI listening");
        Some(ui_addr)
    } else {
        None
    };
    on_ready(&Running {
        addr,
        queue,
        metrics_addr,
        admin_ui_addr,
    });
    net::serve(
        listener,
        edge.tls,
        edge.routes,
        edge.admit,
        net_opts,
        budgets,
        net_stop,
    )
    .await;
    stopping.cancel();
    let _ = sweeper.await;
    if let Some(s) = scheduler {
        let _ = s.await;
    }
    let _ = rates.await;
    store.close().await?;
    tracing::info!("storage flushed; stopped");
    Ok(Stopped { store })
}

/// With `storage.dead_letter_retention_ms = 0`, dead letters that an earlier start kept (with
/// retention on) are deleted by the first sweep: say so, and how many, before it happens. A
/// start that merely forgot the setting would otherwise lose them without a word.
async fn warn_of_dead_letters_to_delete(config: &Config, store: &dyn Store) {
    if config.storage.dead_letter_retention_ms > 0 {
        return;
    }
    let Ok(gauges) = store.gauges().await else {
        return;
    };
    let dead: u64 = gauges.queues.iter().map(|q| q.stats.dead_lettered).sum();
    if dead > 0 {
        tracing::warn!(
            dead_letters = dead,
            "storage.dead_letter_retention_ms is 0 (the default): the first sweep deletes the \
             {dead} dead letters stored, in the next seconds; to keep dead letters, set it above \
             0 on every start (in sepp.toml, or SEPP_STORAGE__DEAD_LETTER_RETENTION_MS)"
        );
    }
}

/// Opens the storage backend `config.storage.backend` names, and logs what it found.
async fn open_store(config: &Config, now: i64) -> Result<Arc<dyn Store>, ServeError> {
    match config.storage.backend {
        config::StorageBackend::Embedded => {
            let opts = EmbeddedOptions {
                path: config.server.db_path.clone(),
                persist_mode: config.storage.persist_mode,
                min_free_bytes: config.storage.min_free_bytes,
            };
            let store = tokio::task::spawn_blocking(move || EmbeddedStore::open(opts, now))
                .await
                .map_err(|e| ServeError::Transport(e.to_string()))??;
            let report = store.recovery_report();
            tracing::info!(
                backend = "embedded",
                path = %config.server.db_path.display(),
                persist_mode = config.storage.persist_mode.as_str(),
                jobs = report.jobs,
                dedup_records = report.dedup_records,
                dedup_expired = report.dedup_expired,
                "storage opened"
            );
            Ok(Arc::new(store))
        }
        config::StorageBackend::Postgres => {
            let st = &config.storage;
            let Some(url) = &st.postgres_url else {
                return Err(ServeError::Config(config::ConfigError(
                    "config key storage.backend = \"postgres\" needs storage.postgres_url".into(),
                )));
            };
            let store = PostgresStore::open(PostgresOptions {
                url: url.expose().to_string(),
                pool_size: st.postgres_pool_size,
                statement_timeout_ms: st.postgres_statement_timeout_ms,
                poll_interval_ms: st.postgres_poll_interval_ms,
                ca_file: st.postgres_ca_file.clone(),
            })
            .await?;
            tracing::info!(
                backend = "postgres",
                database = store.place(),
                "storage opened"
            );
            Ok(Arc::new(store))
        }
    }
}

/// Raises the soft limit on open files to the hard limit, so that many client connections do
/// not run the server out of file descriptors. Returns the limit in force.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    let (soft, hard) = rlimit::Resource::NOFILE.get()?;
    if soft < hard {
        rlimit::Resource::NOFILE.set(hard, hard)?;
        return Ok(hard);
    }
    Ok(soft)
}
