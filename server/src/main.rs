//! `sepp`: the job-queue server binary. Flags, config, logging and signals; then
//! [`sepp_server::serve`].

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod cli;

/// mimalloc: much less time in the allocator than glibc's under many small, short-lived
/// allocations across threads (measured with `perf record` under `bench/run`), and less
/// fragmentation as indexes grow and shrink.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` is set (then
/// mimalloc's own handling of that variable decides).
///
/// mimalloc asks for huge pages on its arenas, so the first touch of each fresh 2 MiB region
/// faulted in a huge page that the kernel zeroed whole: 11 % of the server's CPU under batches
/// of 100 (`perf`, `clear_page_erms`, mostly in the group commit's growing vectors), and a
/// thread stalled for each fault. With 4 KiB pages the zeroing is under 1 %, and p99 fell to
/// 0.77 (batches of 100) and 0.65 (unique-key calls) of before (docs/benchmarks.md,
/// "Transparent huge pages"). The flag is the process's, whichever thread sets it.
fn without_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // An error (a kernel without the call) leaves huge pages as they were: only speed.
        let _ = rustix::thread::disable_transparent_huge_pages(true);
    }
}

use sepp_server::config;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Shown at the end of `sepp --help`.
const ENV_HELP: &str = "\
Environment:
  SEPP_CONFIG=PATH          the config file, when --config is not given
  SEPP_<SECTION>__<KEY>=V   overrides one config key, e.g. SEPP_SERVER__LISTEN_ADDR=0.0.0.0:50051
                            or SEPP_STORAGE__PERSIST_MODE=buffer (`sepp config example` lists keys)
  SEPP_LOG=FILTER           log level and filter, e.g. debug or info,sepp_server=debug
                            (default: [logging] level, info; logs go to standard error)

Without a subcommand, sepp runs the server. The operator subcommands (queues, jobs, job, key,
cancel, dlq, pause, resume, purge, enqueue, backup) talk to a running server: --server / SEPP_SERVER,
--api-key / SEPP_API_KEY, --ca-cert / SEPP_CA_CERT, --output table|json.";

/// sepp: a durable job queue with idempotent enqueue.
#[derive(Parser)]
#[command(name = "sepp", version, about, long_about = None, after_help = ENV_HELP)]
struct Cli {
    /// Config file (TOML) of the server and of `sepp config check`, before or after the
    /// subcommand. Default: $SEPP_CONFIG, else ./sepp.toml if present, else built-in defaults.
    #[arg(long, short = 'c', global = true, value_name = "PATH")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    conn: cli::Conn,
}

#[derive(Subcommand)]
enum Command {
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    #[command(flatten)]
    Op(cli::Op),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Prints a commented example config whose values are the defaults.
    Example,
    /// Loads the config (file + environment), validates it and prints the effective result.
    Check,
}

fn main() -> ExitCode {
    without_transparent_huge_pages();
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => with_server_setting_tip(e).exit(),
    };
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    if cli.command.is_none()
        && let Some(msg) = client_flag_in_server_mode(&matches)
    {
        eprintln!("sepp: {msg}");
        return ExitCode::from(2);
    }
    let env: Vec<(String, String)> = std::env::vars().collect();
    let unknown_variables = config::unknown_variables(&env, &cli_variables());
    match cli.command {
        Some(Command::Config {
            command: ConfigCommand::Example,
        }) => {
            print!("{}", config::EXAMPLE);
            return ExitCode::SUCCESS;
        }
        Some(Command::Config {
            command: ConfigCommand::Check,
        }) => {
            return match sepp_server::load_config(cli.config.as_deref(), env) {
                Ok(l) => match l.config.to_toml() {
                    Ok(t) => {
                        // Where the values came from, on stderr so that stdout stays TOML.
                        match &l.path {
                            Some(p) => eprintln!("sepp: config file: {}", p.display()),
                            None => eprintln!(
                                "sepp: no config file (no --config, no SEPP_CONFIG, no \
                                 ./sepp.toml): the defaults and the environment"
                            ),
                        }
                        for (key, var) in &l.env_overrides {
                            eprintln!("sepp: {key} set by {var}");
                        }
                        // What a server started with this config would warn about, so that
                        // the check shows it before a start does.
                        for w in l.warnings() {
                            eprintln!("sepp: warning: {w}");
                        }
                        for v in &unknown_variables {
                            eprintln!("sepp: warning: {v}");
                        }
                        print!("{t}");
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("sepp: {e}");
                        ExitCode::FAILURE
                    }
                },
                Err(e) => {
                    eprintln!("sepp: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Op(op)) => {
            let mut conn = cli.conn;
            if matches.value_source("server") == Some(ValueSource::DefaultValue) {
                let loaded = sepp_server::config::Config::load(cli.config.as_deref(), env).ok();
                conn.server_from_config(loaded.as_ref());
            }
            return cli::run(conn, op);
        }
        None => {}
    }

    let loaded = match sepp_server::load_config(cli.config.as_deref(), env) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sepp: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sepp: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Logs and traces ([logging], [tracing]); the trace exporter runs on the runtime.
    let telemetry = match rt.block_on(async { sepp_server::telemetry::init(&loaded.config) }) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sepp: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !loaded.ignored_sections.is_empty() {
        tracing::warn!(
            sections = loaded.ignored_sections.join(", "),
            "config sections not implemented by this server are ignored"
        );
    }
    if !loaded.ignored_keys.is_empty() {
        tracing::warn!(
            keys = loaded.ignored_keys.join(", "),
            "config keys not implemented by this server are ignored"
        );
    }
    for v in &unknown_variables {
        tracing::warn!(
            variable = %v.name,
            did_you_mean = v.did_you_mean.as_deref(),
            "environment variable not read by sepp is ignored"
        );
    }
    let code = rt.block_on(async move {
        let config = loaded.config;
        let listener = match sepp_server::bind(&config).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("sepp: {e}");
                return ExitCode::FAILURE;
            }
        };
        if let Some(p) = &loaded.path {
            tracing::info!(path = %p.display(), "config loaded");
        }
        let result = sepp_server::serve(listener, config, shutdown_signal(), |addr| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "sepp listening on {addr}");
            let _ = out.flush();
            tracing::info!(%addr, "listening");
        })
        .await;
        match result {
            Ok(stopped) => {
                // Everything is durable and the process exits next: let the OS free the
                // storage's memory at once rather than fjall entry by entry (see `Stopped`).
                stopped.leak_for_exit();
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sepp: {e}");
                ExitCode::FAILURE
            }
        }
    });
    // Spans still buffered go to the collector before the runtime stops.
    rt.block_on(async move { tokio::task::spawn_blocking(move || telemetry.shutdown()).await })
        .ok();
    // Storage is flushed and every connection closed. What the runtime still holds (measured:
    // 1–7 ms to shut down) is not waited for past 100 ms: a handler still running after the
    // grace period, or a blocking task, must not hold the exit.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

/// The `SEPP_*` variables the command line reads: every `env =` of the clap definitions, and
/// `SEPP_ADDR`, which `sepp backup` reads only to refuse a stale one (`cli::run`).
fn cli_variables() -> Vec<String> {
    fn walk(cmd: &clap::Command, out: &mut Vec<String>) {
        out.extend(
            cmd.get_arguments()
                .filter_map(|a| a.get_env())
                .map(|e| e.to_string_lossy().into_owned()),
        );
        for sub in cmd.get_subcommands() {
            walk(sub, out);
        }
    }
    let mut out = vec!["SEPP_ADDR".to_string()];
    walk(&Cli::command(), &mut out);
    out
}

/// A client flag given on the command line without a subcommand, where sepp runs a server that
/// has no use for it: `sepp --server URL` would otherwise start a server on the configured
/// listen address and leave the user believing it was told where to listen. Only the flags are
/// refused: SEPP_SERVER and its siblings may well be set in an operator's environment for the
/// client subcommands.
fn client_flag_in_server_mode(m: &clap::ArgMatches) -> Option<String> {
    let given = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    if given("server") {
        return Some(
            "--server names the server that the client subcommands (queues, jobs, enqueue, \
             backup, ...) talk to; without a subcommand sepp runs a server, which listens on \
             server.listen_addr (set it in the config file or with SEPP_SERVER__LISTEN_ADDR)"
                .into(),
        );
    }
    let flag = [
        ("api_key", "--api-key"),
        ("ca_cert", "--ca-cert"),
        ("output", "--output"),
    ]
    .into_iter()
    .find(|(id, _)| given(id))?
    .1;
    Some(format!(
        "{flag} is an option of the client subcommands (queues, jobs, enqueue, backup, ...); \
         without a subcommand sepp runs a server, which has no use for it"
    ))
}

/// What a flag sepp does not have is most likely meant as, with how to say it: `sepp --port
/// 50061` (the server's listen address, a config key) and the like; with a client subcommand,
/// an address flag means the server to talk to (`--server`). `None` for every other flag.
fn server_setting_for(flag: &str, subcommand: bool) -> Option<&'static str> {
    let name = flag.trim_start_matches('-');
    let name = name.split_once('=').map_or(name, |(n, _)| n);
    Some(match name {
        "port" | "p" | "listen" | "listen-addr" | "listen_addr" | "addr" | "address" | "bind"
        | "host" => {
            if subcommand {
                "the server to talk to is --server URL (or SEPP_SERVER), e.g. --server \
                 http://127.0.0.1:50061"
            } else {
                "the server's address is the config key server.listen_addr: \
                 SEPP_SERVER__LISTEN_ADDR=127.0.0.1:50061 sepp, or listen_addr under [server] \
                 in sepp.toml"
            }
        }
        "data" | "data-dir" | "dir" | "db" | "db-path" | "db_path" | "path" if !subcommand => {
            "the data directory is the config key server.db_path: SEPP_SERVER__DB_PATH=./data \
             sepp, or db_path under [server] in sepp.toml"
        }
        _ => return None,
    })
}

/// Adds a tip to clap's "unexpected argument" error when the flag names a server setting,
/// which sepp takes from its config file and `SEPP_*` variables, not from flags.
fn with_server_setting_tip(mut e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let cmd = Cli::command();
    let subcommand = std::env::args()
        .skip(1)
        .any(|a| cmd.get_subcommands().any(|s| s.get_name() == a));
    let tip = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(flag)) => server_setting_for(flag, subcommand),
        _ => None,
    };
    if let Some(tip) = tip {
        e.insert(
            ContextKind::Suggested,
            ContextValue::StyledStrs(vec![tip.into()]),
        );
    }
    e
}

/// Installs the SIGTERM and SIGINT handlers now (before the readiness line is printed, so a
/// signal right after it stops the server cleanly instead of killing it), and returns a future
/// that resolves on the first of them.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            let (Ok(mut term), Ok(mut int)) = (term, int) else {
                let _ = tokio::signal::ctrl_c().await;
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
