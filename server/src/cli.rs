//! The operator CLI: `sepp queues`, `sepp schedules`, `sepp jobs`, `sepp job`, `sepp key
//! [forget]`, `sepp cancel`, `sepp dlq list|requeue|delete`, `sepp pause`, `sepp resume`,
//! `sepp purge`, `sepp queue delete`, `sepp backup`. Each is one or a
//! few calls of `sepp.admin.v1.AdminService` on a running server, printed as a table or, with
//! `--output json`, as one JSON document on standard output. `sepp enqueue` bulk-enqueues a JSON
//! Lines file through the client core ([`enqueue`]). Errors go to standard error with exit code
//! 1 (the server's refusal) or 2 (bad flags, from clap).

mod enqueue;

use clap::{Args, Subcommand, ValueEnum};
use sepp_proto::admin::v1 as pb;
use sepp_proto::admin::v1::admin_service_client::AdminServiceClient;
use serde_json::{Value, json};
use std::path::PathBuf;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// How a server is reached (every operator subcommand).
#[derive(Args, Clone, Debug)]
pub(crate) struct Conn {
    /// The server's gRPC address. Without it (and without SEPP_SERVER), the config file's
    /// server.listen_addr when it sets one, else http://127.0.0.1:50051.
    #[arg(
        long,
        global = true,
        env = "SEPP_SERVER",
        default_value = "http://127.0.0.1:50051",
        value_name = "URL"
    )]
    server: String,
    /// Where `server` came from when the config gave it (for the messages).
    #[arg(skip)]
    server_from: Option<String>,
    /// An API key (sent as `authorization: Bearer KEY`), when the server has `[auth] api_keys`.
    #[arg(
        long,
        global = true,
        env = "SEPP_API_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// A PEM file of the CA that signed the server's certificate (use an https:// URL).
    #[arg(long, global = true, env = "SEPP_CA_CERT", value_name = "PATH")]
    ca_cert: Option<PathBuf>,
    /// `table` for people, `json` for scripts (read commands and results).
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    Table,
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub(crate) enum StateArg {
    Ready,
    Scheduled,
    InFlight,
    Dead,
}

/// The operator subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum Op {
    /// Every queue with its depth by state, its rates per minute (enqueued, acked, nacked,
    /// dead-lettered in the last complete minute, summed over every server) and whether it is
    /// paused.
    Queues,
    /// The server's `[[schedules]]` (recurring jobs) with their next and last ticks.
    Schedules,
    /// A queue's jobs in one state, a page at a time.
    Jobs {
        /// The queue.
        queue: String,
        /// Which state.
        #[arg(long, value_enum, default_value_t = StateArg::Ready)]
        state: StateArg,
        /// Jobs per page (at most 1000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// The `next page` token a previous call printed.
        #[arg(long, default_value = "")]
        page_token: String,
    },
    /// Everything known about one job.
    Job {
        /// The job id.
        id: String,
    },
    /// What happened to the job an idempotency key created (while its dedup record lives);
    /// `sepp key forget QUEUE KEY` deletes the key's dedup record. (A queue named `forget`:
    /// `sepp key -- forget KEY`.)
    #[command(args_conflicts_with_subcommands = true)]
    Key {
        #[command(subcommand)]
        command: Option<KeyCommand>,
        /// The queue.
        #[arg(required = true)]
        queue: Option<String>,
        /// The idempotency key.
        #[arg(required = true)]
        key: Option<String>,
    },
    /// Enqueues one job per line of a JSON Lines file, keyed by a field of each line, so that
    /// running it again creates nothing twice.
    Enqueue(enqueue::EnqueueArgs),
    /// Cancels a ready or scheduled job (by id, or by --queue and --key). Its dedup record
    /// stays: a retried enqueue of the key answers the cancelled job's id.
    Cancel {
        /// The job id.
        #[arg(required_unless_present = "key", conflicts_with_all = ["queue", "key"])]
        id: Option<String>,
        /// The queue of --key.
        #[arg(long, requires = "key")]
        queue: Option<String>,
        /// An idempotency key instead of an id.
        #[arg(long, requires = "queue")]
        key: Option<String>,
    },
    /// Dead letters: list, requeue or delete.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Stops Reserve from handing out a queue's jobs (enqueues are still accepted).
    Pause {
        /// The queue.
        queue: String,
    },
    /// Undoes `pause`.
    Resume {
        /// The queue.
        queue: String,
    },
    /// Cancels every ready and scheduled job of a queue (in-flight jobs and dead letters stay).
    Purge {
        /// The queue.
        queue: String,
        /// Confirms the purge (it cannot be undone).
        #[arg(long)]
        yes: bool,
    },
    /// One queue's lifecycle: `sepp queue delete QUEUE`.
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
    },
    /// Asks a running server for an online backup: a consistent copy of its whole store, taken
    /// at one instant, written into DIR on the server's host (a new or empty directory). To
    /// restore, start a server with server.db_path = DIR. Needs an API key with the admin role
    /// when auth is on.
    Backup {
        /// The backup directory, on the server's host (a relative path is taken from this
        /// command's working directory).
        dir: PathBuf,
        /// Deprecated: the same as --server.
        #[arg(long, hide = true, value_name = "URL")]
        addr: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum QueueCommand {
    /// Deletes a queue that holds no job in any state, freeing its place under
    /// `limits.max_queues`; its paused flag goes with it, its live dedup records stay until
    /// their window ends. Refused, naming the counts, while it holds jobs.
    Delete {
        /// The queue.
        queue: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum KeyCommand {
    /// Deletes a key's dedup record: the next enqueue with this key creates a new job. The job
    /// the key created is left as it is.
    Forget {
        /// The queue.
        queue: String,
        /// The idempotency key.
        key: String,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum DlqCommand {
    /// Dead letters oldest first, with cause and last reason.
    List {
        /// One queue (default: every queue).
        queue: Option<String>,
        /// Records per page (at most 1000).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        /// The `next page` token a previous call printed.
        #[arg(long, default_value = "")]
        page_token: String,
    },
    /// Puts dead letters back on their queue: same id, attempt 1, enqueued now.
    Requeue(Selection),
    /// Deletes dead letters for good.
    Delete(Selection),
}

#[derive(Args, Debug)]
pub(crate) struct Selection {
    /// The queue.
    queue: String,
    /// Every dead letter of the queue (in batches of 1000).
    #[arg(long, conflicts_with = "ids")]
    all: bool,
    /// These job ids (or --all; one of the two is needed).
    ids: Vec<String>,
}

impl Selection {
    /// Ids or `--all`: a bare `sepp dlq requeue QUEUE` names both ways out (clap's own message
    /// for a required group put the ids before the queue in its usage line).
    fn check(&self, verb: &str) -> Result<(), Failure> {
        if self.all || !self.ids.is_empty() {
            return Ok(());
        }
        if uuid::Uuid::try_parse(&self.queue).is_ok() {
            // `sepp dlq requeue ID`: the id was read as the queue.
            return Err(Failure(format!(
                "{q} looks like a job id, not a queue: the queue comes first (sepp dlq {verb} \
                 QUEUE {q}); `sepp dlq list` shows each dead letter's queue",
                q = self.queue
            )));
        }
        Err(Failure(format!(
            "which dead letters? give their job ids (sepp dlq {verb} {q} ID...), or --all for \
             every dead letter of {q} (sepp dlq {verb} {q} --all); `sepp dlq list {q}` lists them",
            q = self.queue
        )))
    }
}

/// A failure to report: what went wrong and what to do.
struct Failure(String);

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        let hint = match s.code() {
            tonic::Code::Unauthenticated => {
                " (pass --api-key or set SEPP_API_KEY to a key of the server's [auth] api_keys)"
            }
            tonic::Code::Unavailable => {
                " (is the server running at --server / SEPP_SERVER, and is it the right scheme?)"
            }
            tonic::Code::Unimplemented => " (the server is older than this CLI)",
            _ => "",
        };
        Failure(format!("{:?}: {}{hint}", s.code(), s.message()))
    }
}

impl Conn {
    /// Takes the server's address from the config when neither `--server` nor `SEPP_SERVER`
    /// gave one: a client subcommand run beside the server's `sepp.toml` (or with its
    /// `--config`, `SEPP_CONFIG` or `SEPP_SERVER__LISTEN_ADDR`) talks to that server. A listen
    /// address on every interface (0.0.0.0, ::) is reached on loopback; a server with a TLS
    /// certificate through https://. Nothing changes when the config keeps the default address
    /// or cannot be read (the connection's own error then says where it tried).
    pub(crate) fn server_from_config(&mut self, loaded: Option<&crate::config::Loaded>) {
        let Some(loaded) = loaded else { return };
        let server = &loaded.config.server;
        let default = crate::config::Config::default().server.listen_addr;
        if server.listen_addr == default {
            return;
        }
        let mut addr = server.listen_addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr.ip() {
                std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let scheme = if server.tls_cert_path.is_some() {
            "https"
        } else {
            "http"
        };
        self.server = format!("{scheme}://{addr}");
        let from = match (&loaded.path, std::env::var_os("SEPP_SERVER__LISTEN_ADDR")) {
            (_, Some(_)) => "SEPP_SERVER__LISTEN_ADDR".to_string(),
            (Some(p), None) => format!("server.listen_addr of {}", p.display()),
            (None, None) => "server.listen_addr".to_string(),
        };
        self.server_from = Some(from);
    }

    /// How the messages name the address tried: `--server`'s value, and where it came from
    /// when the config gave it.
    fn server_named(&self) -> String {
        match &self.server_from {
            Some(from) => format!("{} (from {from})", self.server),
            None => self.server.clone(),
        }
    }
}

/// Adds the API key to every call.
type AuthFn =
    Box<dyn FnMut(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Send>;
type Admin = AdminServiceClient<tonic::service::interceptor::InterceptedService<Channel, AuthFn>>;

async fn connect(conn: &Conn) -> Result<Admin, Failure> {
    let (channel, auth) = channel(conn).await?;
    // A GetJob reply carries the job's payload, as large as the server's limits let it be:
    // no smaller cap here than the server's own.
    Ok(AdminServiceClient::with_interceptor(channel, auth).max_decoding_message_size(usize::MAX))
}

/// Whether the server keeps dead letters (`GetServerInfo.dead_letter_retention_enabled`, over a
/// connection of its own); `None` when the call failed. A server that does not set the field
/// answers false.
async fn keeps_dead_letters(conn: &Conn) -> Option<bool> {
    use sepp_proto::v1 as qpb;
    let (channel, auth) = channel(conn).await.ok()?;
    let mut q = qpb::queue_service_client::QueueServiceClient::with_interceptor(channel, auth);
    let info = q.get_server_info(qpb::GetServerInfoRequest {}).await.ok()?;
    Some(info.into_inner().dead_letter_retention_enabled)
}

/// A channel to `--server` and the interceptor that adds `--api-key` to every call.
async fn channel(conn: &Conn) -> Result<(Channel, AuthFn), Failure> {
    // `host:port` is taken as the clients take it: `http://host:port`.
    let (url, _) = sepp_rs::client::normalize_addr(&conn.server)
        .map_err(|e| Failure(format!("--server {:?}: {e}", conn.server)))?;
    let mut ep = Endpoint::from_shared(url).map_err(|e| {
        Failure(format!(
            "--server {:?} is not a URL ({e}): use e.g. http://127.0.0.1:50051",
            conn.server
        ))
    })?;
    if let Some(path) = &conn.ca_cert {
        let pem = std::fs::read(path)
            .map_err(|e| Failure(format!("cannot read --ca-cert {}: {e}", path.display())))?;
        ep = ep
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
            .map_err(|e| Failure(format!("--ca-cert {}: {e}", path.display())))?;
    }
    let channel = ep.connect().await.map_err(|e| {
        Failure(format!(
            "cannot connect to {} ({e}): is the server running there? (--server / SEPP_SERVER)",
            conn.server_named()
        ))
    })?;
    let header = match &conn.api_key {
        Some(k) => Some(
            MetadataValue::try_from(format!("Bearer {k}"))
                .map_err(|_| Failure("--api-key holds characters a header cannot carry".into()))?,
        ),
        None => None,
    };
    let auth: AuthFn = Box::new(move |mut req: tonic::Request<()>| {
        if let Some(h) = &header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    });
    Ok((channel, auth))
}

/// Every queue the server holds, all pages.
async fn all_queues(admin: &mut Admin) -> Result<Vec<pb::GetQueueStatsResponse>, Failure> {
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = admin
            .list_queues(pb::ListQueuesRequest {
                page_size: Some(1000),
                page_token: token,
            })
            .await?
            .into_inner();
        all.extend(page.queues);
        if page.next_page_token.is_empty() {
            return Ok(all);
        }
        token = page.next_page_token;
    }
}

/// Whether the server holds queue `name` ([`all_queues`]).
async fn queue_exists(admin: &mut Admin, name: &str) -> Result<bool, Failure> {
    Ok(all_queues(admin).await?.iter().any(|q| q.queue == name))
}

/// Runs one operator subcommand; returns the process exit code.
pub(crate) fn run(mut conn: Conn, op: Op) -> std::process::ExitCode {
    if let Op::Backup { addr, .. } = &op
        && let Err(Failure(msg)) = backup_server(&mut conn, addr.as_deref())
    {
        eprintln!("sepp: {msg}");
        return std::process::ExitCode::FAILURE;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sepp: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(exec(&conn, op)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!("sepp: {msg}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `sepp backup` once took its server from its own `--addr` / `SEPP_ADDR` and ignored
/// `--server`. `--addr` still works (hidden, with a warning); `SEPP_ADDR` is no longer read, and a
/// `SEPP_ADDR` naming another server than the one chosen is refused rather than backing up a
/// server the operator did not mean.
fn backup_server(conn: &mut Conn, addr: Option<&str>) -> Result<(), Failure> {
    if let Some(a) = addr {
        eprintln!("sepp: warning: backup --addr is deprecated; use --server (or SEPP_SERVER)");
        conn.server = a.to_string();
    }
    match std::env::var("SEPP_ADDR") {
        Ok(old) if old != conn.server => Err(Failure(format!(
            "SEPP_ADDR={old} is no longer read: sepp backup talks to --server / SEPP_SERVER \
             ({}), like every other subcommand; set SEPP_SERVER instead and unset SEPP_ADDR",
            conn.server
        ))),
        _ => Ok(()),
    }
}

fn print_json(v: &Value) {
    emit(serde_json::to_string_pretty(v).unwrap_or_default());
}

/// Writes one line (or block) to standard output. A reader that went away (`sepp jobs Q | head`)
/// ends the command quietly, as it ends other Unix tools, where `println!` would panic.
/// `n` and the noun in its number: "1 job", "2 jobs", "0 jobs".
pub(crate) fn counted(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

fn emit(text: impl std::fmt::Display) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("sepp: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

/// Prints `rows` under `header` in aligned columns.
fn print_table(header: &[&str], rows: &[Vec<String>]) {
    for line in table_lines(header, rows) {
        emit(&line);
    }
}

/// The lines of a table: each column as wide as its widest cell on a terminal (an emoji or a
/// CJK character takes two columns, a combining mark none), two spaces between columns.
fn table_lines(header: &[&str], rows: &[Vec<String>]) -> Vec<String> {
    use unicode_width::UnicodeWidthStr;
    let mut widths: Vec<usize> = header.iter().map(|h| h.width()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.width());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            s.push_str(c);
            if i + 1 < cells.len() {
                s.extend(std::iter::repeat_n(' ', w.saturating_sub(c.width()) + 2));
            }
        }
        s.trim_end().to_string()
    };
    std::iter::once(line(header.to_vec()))
        .chain(
            rows.iter()
                .map(|r| line(r.iter().map(String::as_str).collect())),
        )
        .collect()
}

/// A timestamp as RFC 3339 UTC with milliseconds.
pub(crate) fn ts(t: Option<&prost_types::Timestamp>) -> String {
    let Some(t) = t else {
        return String::new();
    };
    let ms = t.seconds * 1000 + i64::from(t.nanos / 1_000_000);
    rfc3339(ms)
}

use sepp_server::time_fmt::rfc3339;

/// The short name of a job state.
pub(crate) fn state_name(s: i32) -> &'static str {
    match pb::JobState::try_from(s) {
        Ok(pb::JobState::Scheduled) => "scheduled",
        Ok(pb::JobState::Ready) => "ready",
        Ok(pb::JobState::InFlight) => "in_flight",
        Ok(pb::JobState::DeadLettered) => "dead_lettered",
        Ok(pb::JobState::Completed) => "completed",
        Ok(pb::JobState::Unknown) => "unknown",
        _ => "unspecified",
    }
}

/// The short name of a dead-letter cause.
pub(crate) fn cause_name(c: i32) -> &'static str {
    use sepp_proto::v1::DeadLetterCause as C;
    match C::try_from(c) {
        Ok(C::AttemptsExhausted) => "attempts_exhausted",
        Ok(C::Rejected) => "rejected",
        Ok(C::LeaseExpired) => "lease_expired",
        Ok(C::Admin) => "admin",
        _ => "",
    }
}

/// The characters of a payload (or a custom string) `sepp job` shows in its table; `--output
/// json` has all of it.
const PREVIEW_CHARS: usize = 100;

/// A job as JSON: every field of `j`, and with `content` (a GetJob reply) what it carries:
/// `payload` (`encoding`, `bytes`, `data_base64`: the whole payload), `custom` and
/// `trace_context`, null or empty when the job has none or only its tombstone is left.
fn job_json(j: &pb::JobInfo, content: bool) -> Value {
    let mut v = json!({
        "job_id": j.job_id,
        "state": state_name(j.state),
        "queue": j.queue,
        "job_type": j.job_type,
        "attempt": j.attempt,
        "max_attempts": j.max_attempts,
        "priority": j.priority,
        "enqueued_at": ts(j.enqueued_at.as_ref()),
        "scheduled_at": j.scheduled_at.as_ref().map(|t| ts(Some(t))),
        "lease_expires_at": j.lease_expires_at.as_ref().map(|t| ts(Some(t))),
        "finished_at": j.finished_at.as_ref().map(|t| ts(Some(t))),
        "dead_letter_cause": (j.dead_letter_cause != 0).then(|| cause_name(j.dead_letter_cause)),
        "last_reason": j.last_reason,
        "idempotency_key": j.idempotency_key,
        "worker_id": j.worker_id,
    });
    if content && let Value::Object(m) = &mut v {
        use base64::Engine as _;
        m.insert(
            "payload".into(),
            j.payload.as_ref().map_or(Value::Null, |p| {
                json!({
                    "encoding": p.encoding,
                    "bytes": p.data.len(),
                    "data_base64": base64::engine::general_purpose::STANDARD.encode(&p.data),
                })
            }),
        );
        let custom: serde_json::Map<String, Value> = j
            .custom
            .iter()
            .map(|(k, v)| (k.clone(), primitive_json(v)))
            .collect();
        m.insert("custom".into(), Value::Object(custom));
        m.insert(
            "trace_context".into(),
            j.trace_context.as_ref().map_or(
                Value::Null,
                |t| json!({"traceparent": t.traceparent, "tracestate": t.tracestate}),
            ),
        );
    }
    v
}

/// A custom entry's value as JSON (a double that is not finite reads as null).
fn primitive_json(v: &sepp_proto::v1::PrimitiveValue) -> Value {
    use sepp_proto::v1::primitive_value::Value as V;
    match &v.value {
        Some(V::StringValue(s)) => json!(s),
        Some(V::DoubleValue(d)) => json!(d),
        Some(V::IntValue(i)) => json!(i),
        Some(V::BoolValue(b)) => json!(b),
        None => Value::Null,
    }
}

/// The rows of `sepp job`'s table: the job's fields by name (those it has), then what it
/// carries: the payload's encoding and a preview of it ([`sepp_server::payload_fmt::preview`]:
/// UTF-8 text cut at [`PREVIEW_CHARS`] characters with its full size, other bytes as their
/// size and the first ones in hex), each custom entry and the trace context.
fn job_rows(j: &pb::JobInfo) -> Vec<Vec<String>> {
    let Value::Object(m) = job_json(j, false) else {
        return Vec::new();
    };
    let mut rows: Vec<Vec<String>> = m
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| {
            vec![
                k.clone(),
                match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                },
            ]
        })
        .collect();
    let preview = |data: &[u8]| sepp_server::payload_fmt::preview(data, PREVIEW_CHARS);
    if let Some(p) = &j.payload {
        rows.push(vec!["payload_encoding".into(), p.encoding.clone()]);
        rows.push(vec!["payload".into(), preview(&p.data)]);
    }
    let mut custom: Vec<_> = j.custom.iter().collect();
    custom.sort_by(|a, b| a.0.cmp(b.0));
    for (k, v) in custom {
        let value = match primitive_json(v) {
            Value::String(s) => preview(s.as_bytes()),
            other => other.to_string(),
        };
        rows.push(vec![format!("custom.{k}"), value]);
    }
    if let Some(t) = &j.trace_context {
        rows.push(vec!["traceparent".into(), t.traceparent.clone()]);
        if let Some(state) = &t.tracestate {
            rows.push(vec!["tracestate".into(), state.clone()]);
        }
    }
    rows
}

fn print_job(conn: &Conn, j: &pb::JobInfo) {
    if conn.output == Output::Json {
        print_json(&job_json(j, true));
        return;
    }
    print_table(&["field", "value"], &job_rows(j));
}

fn selection(sel: &Selection) -> pb::DeadLetterSelector {
    if sel.all {
        pb::DeadLetterSelector {
            job_ids: vec![],
            queue: Some(sel.queue.clone()),
            max: Some(1000),
        }
    } else {
        pb::DeadLetterSelector {
            job_ids: sel.ids.clone(),
            queue: None,
            max: None,
        }
    }
}

/// How a schedule ticks, as the CLI shows it: the cron expression, or `every N ms`.
fn schedule_spec(s: &pb::ScheduleInfo) -> (Option<String>, Option<u64>) {
    use pb::schedule_info::Spec;
    match &s.spec {
        Some(Spec::Cron(c)) => (Some(c.clone()), None),
        Some(Spec::Every(d)) => (
            None,
            Some(
                u64::try_from(d.seconds).unwrap_or(0) * 1000
                    + u64::try_from(d.nanos / 1_000_000).unwrap_or(0),
            ),
        ),
        None => (None, None),
    }
}

fn print_schedules(conn: &Conn, all: &[pb::ScheduleInfo]) {
    if conn.output == Output::Json {
        let v: Vec<Value> = all
            .iter()
            .map(|s| {
                let (cron, every_ms) = schedule_spec(s);
                json!({
                    "name": s.name,
                    "queue": s.queue,
                    "job_type": s.job_type,
                    "cron": cron,
                    "every_ms": every_ms,
                    "timezone": s.timezone,
                    "catch_up": s.catch_up,
                    "next_tick": s.next_tick.as_ref().map(|t| ts(Some(t))),
                    "last_tick": s.last_tick.as_ref().map(|t| ts(Some(t))),
                    "last_job_id": (!s.last_job_id.is_empty()).then_some(&s.last_job_id),
                    "last_enqueued_at": s.last_enqueued_at.as_ref().map(|t| ts(Some(t))),
                })
            })
            .collect();
        print_json(&json!({ "schedules": v }));
        return;
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|s| {
            let spec = match schedule_spec(s) {
                (Some(c), _) => c,
                (_, Some(ms)) => format!("every {ms} ms"),
                _ => String::new(),
            };
            vec![
                s.name.clone(),
                s.queue.clone(),
                spec,
                s.timezone.clone(),
                if s.catch_up { "yes" } else { "no" }.to_string(),
                ts(s.next_tick.as_ref()),
                ts(s.last_tick.as_ref()),
                s.last_job_id.clone(),
            ]
        })
        .collect();
    print_table(
        &[
            "NAME",
            "QUEUE",
            "SPEC",
            "TIMEZONE",
            "CATCH_UP",
            "NEXT_TICK",
            "LAST_TICK",
            "LAST_JOB",
        ],
        &rows,
    );
}

/// Prints the result of a write command.
fn done(conn: &Conn, v: Value, text: String) {
    if conn.output == Output::Json {
        print_json(&v);
    } else {
        emit(text);
    }
}

async fn exec(conn: &Conn, op: Op) -> Result<(), Failure> {
    if let Op::Enqueue(args) = op {
        return enqueue::run(conn, args).await;
    }
    let mut admin = connect(conn).await?;
    match op {
        Op::Schedules => {
            let all = admin
                .list_schedules(pb::ListSchedulesRequest {})
                .await?
                .into_inner()
                .schedules;
            print_schedules(conn, &all);
        }
        Op::Queues => {
            let all = all_queues(&mut admin).await?;
            // The last complete minute's counts of each queue (a server without the call: none).
            let mut rates: std::collections::HashMap<String, [u64; 4]> = Default::default();
            let mut token = String::new();
            loop {
                let page = match admin
                    .get_queue_rates(pb::GetQueueRatesRequest {
                        queue: None,
                        page_size: None,
                        page_token: token,
                    })
                    .await
                {
                    Ok(r) => r.into_inner(),
                    Err(s) if s.code() == tonic::Code::Unimplemented => break,
                    Err(s) => return Err(s.into()),
                };
                let last = |v: &[u64]| v.len().checked_sub(2).map_or(0, |i| v[i]);
                for q in page.queues {
                    let counts = [
                        last(&q.enqueued),
                        last(&q.acked),
                        last(&q.nacked),
                        last(&q.dead_lettered),
                    ];
                    rates.insert(q.queue, counts);
                }
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            let rate = |q: &str| rates.get(q).copied().unwrap_or_default();
            if conn.output == Output::Json {
                let qs: Vec<Value> = all
                    .iter()
                    .map(|q| {
                        let r = rate(&q.queue);
                        json!({"queue": q.queue, "ready": q.ready, "scheduled": q.scheduled,
                        "in_flight": q.in_flight, "dead_lettered": q.dead_lettered,
                        "dedup_records": q.dedup_records, "paused": q.paused,
                        "per_minute": {"enqueued": r[0], "acked": r[1], "nacked": r[2],
                        "dead_lettered": r[3]}})
                    })
                    .collect();
                print_json(&json!({ "queues": qs }));
            } else {
                let rows: Vec<Vec<String>> = all
                    .iter()
                    .map(|q| {
                        let r = rate(&q.queue);
                        vec![
                            q.queue.clone(),
                            q.ready.to_string(),
                            q.scheduled.to_string(),
                            q.in_flight.to_string(),
                            q.dead_lettered.to_string(),
                            q.dedup_records.to_string(),
                            r[0].to_string(),
                            r[1].to_string(),
                            r[2].to_string(),
                            r[3].to_string(),
                            if q.paused { "yes" } else { "no" }.to_string(),
                        ]
                    })
                    .collect();
                print_table(
                    &[
                        "QUEUE",
                        "READY",
                        "SCHEDULED",
                        "IN_FLIGHT",
                        "DEAD",
                        "KEYS",
                        "ENQ/MIN",
                        "ACK/MIN",
                        "NACK/MIN",
                        "DLQ/MIN",
                        "PAUSED",
                    ],
                    &rows,
                );
                if all.is_empty() {
                    eprintln!(
                        "sepp: no queues yet: a queue exists from its first enqueued job (or a \
                         pause, or a [[queues]] entry of the server's config)"
                    );
                }
                // DLQ/MIN above DEAD 0 reads like a lost job; say where they went.
                let gone: Vec<&str> = all
                    .iter()
                    .filter(|q| q.dead_lettered == 0 && rate(&q.queue)[3] > 0)
                    .map(|q| q.queue.as_str())
                    .collect();
                if !gone.is_empty() {
                    let why = match keeps_dead_letters(conn).await {
                        Some(false) => {
                            "this server deletes a dead letter at once \
                             (storage.dead_letter_retention_ms = 0, the default; above 0 keeps them)"
                        }
                        Some(true) => "they were drained, requeued or deleted since",
                        None => {
                            "with storage.dead_letter_retention_ms = 0 (the default) a dead \
                             letter is deleted at once; otherwise they were drained, requeued or \
                             deleted since"
                        }
                    };
                    eprintln!(
                        "sepp: {} {} dead-lettered jobs in the last minute and {} none: {why}",
                        if gone.len() == 1 { "queue" } else { "queues" },
                        gone.join(", "),
                        if gone.len() == 1 { "keeps" } else { "keep" }
                    );
                }
            }
        }
        Op::Jobs {
            queue,
            state,
            limit,
            page_token,
        } => {
            let (state, label) = match state {
                StateArg::Ready => (pb::JobState::Ready, "ready"),
                StateArg::Scheduled => (pb::JobState::Scheduled, "scheduled"),
                StateArg::InFlight => (pb::JobState::InFlight, "in-flight"),
                StateArg::Dead => (pb::JobState::DeadLettered, "dead-lettered"),
            };
            let page = admin
                .list_jobs(pb::ListJobsRequest {
                    queue: queue.clone(),
                    state: state as i32,
                    page_size: Some(limit),
                    page_token,
                })
                .await?
                .into_inner();
            if conn.output == Output::Table && page.jobs.is_empty() {
                // An empty table alone does not say whether the queue exists.
                if queue_exists(&mut admin, &queue).await? {
                    eprintln!("no {label} jobs in queue {queue:?}");
                } else {
                    eprintln!(
                        "queue {queue:?} does not exist (no job, pause or [[queues]] entry has \
                         made it); `sepp queues` lists the queues that do"
                    );
                }
            }
            if conn.output == Output::Json {
                print_json(&json!({
                    "jobs": page.jobs.iter().map(|j| job_json(j, false)).collect::<Vec<_>>(),
                    "next_page_token": page.next_page_token,
                }));
            } else {
                let rows: Vec<Vec<String>> = page
                    .jobs
                    .iter()
                    .map(|j| {
                        vec![
                            j.job_id.clone(),
                            j.job_type.clone(),
                            j.priority.to_string(),
                            format!("{}/{}", j.attempt, j.max_attempts),
                            ts(j.enqueued_at.as_ref()),
                            j.idempotency_key.clone().unwrap_or_default(),
                            j.last_reason.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                print_table(
                    &[
                        "JOB_ID", "TYPE", "PRIO", "ATTEMPT", "ENQUEUED", "KEY", "REASON",
                    ],
                    &rows,
                );
                if !page.next_page_token.is_empty() {
                    emit(format_args!(
                        "next page: --page-token {}",
                        page.next_page_token
                    ));
                }
            }
        }
        Op::Job { id } => {
            if uuid::Uuid::try_parse(&id).is_err() {
                return Err(Failure(format!(
                    "{id:?} is not a job id: job ids are UUIDs (e.g. \
                     0b7e5c1a-3f2d-4c8e-9a61-5d2f4e8b7c90)"
                )));
            }
            let j = admin
                .get_job(pb::GetJobRequest { job_id: id.clone() })
                .await?
                .into_inner()
                .job
                .unwrap_or_default();
            if j.state == pb::JobState::Unknown as i32 {
                return Err(Failure(format!(
                    "job {id} is not known: it never existed, or it finished and its record is \
                     gone"
                )));
            }
            print_job(conn, &j);
        }
        Op::Key {
            command: Some(KeyCommand::Forget { queue, key }),
            ..
        } => {
            let r = admin
                .forget_idempotency_key(pb::ForgetIdempotencyKeyRequest {
                    queue: queue.clone(),
                    idempotency_key: key.clone(),
                })
                .await?
                .into_inner();
            if !r.forgotten {
                return Err(Failure(format!(
                    "no live dedup record for key {key:?} on queue {queue:?}: nothing to forget \
                     (never used, already forgotten, or its dedup window has passed)"
                )));
            }
            done(
                conn,
                json!({"queue": queue, "idempotency_key": key, "forgotten": true, "job_id": r.job_id}),
                format!(
                    "forgot key {key:?} on {queue:?} (it named job {}); the next enqueue with it \
                     creates a new job",
                    r.job_id
                ),
            );
        }
        Op::Key {
            command: None,
            queue: Some(queue),
            key: Some(key),
        } => {
            let r = admin
                .lookup_idempotency_key(pb::LookupIdempotencyKeyRequest {
                    queue: queue.clone(),
                    idempotency_key: key.clone(),
                })
                .await?
                .into_inner();
            if !r.found {
                return Err(Failure(format!(
                    "no live dedup record for key {key:?} on queue {queue:?}: never used, or its \
                     dedup window has passed"
                )));
            }
            let j = admin
                .get_job(pb::GetJobRequest {
                    job_id: r.job_id.clone(),
                })
                .await?
                .into_inner()
                .job
                .unwrap_or_default();
            if conn.output == Output::Json {
                print_json(&json!({
                    "job_id": r.job_id,
                    "key_created_at": ts(r.created_at.as_ref()),
                    "key_expires_at": ts(r.expires_at.as_ref()),
                    "job": job_json(&j, true),
                }));
            } else {
                emit(format_args!(
                    "key {key:?} on {queue:?} names job {} (record written {}, expires {})",
                    r.job_id,
                    ts(r.created_at.as_ref()),
                    ts(r.expires_at.as_ref())
                ));
                print_job(conn, &j);
            }
        }
        Op::Cancel { id, queue, key } => {
            let r = admin
                .cancel_job(pb::CancelJobRequest {
                    job_id: id.clone().unwrap_or_default(),
                    queue: queue.unwrap_or_default(),
                    idempotency_key: key.unwrap_or_default(),
                })
                .await?
                .into_inner();
            let j = r.job.unwrap_or_default();
            if !r.cancelled {
                return Err(Failure(if j.state == pb::JobState::Unknown as i32 {
                    "no such job (for a key: no live dedup record)".to_string()
                } else {
                    format!(
                        "job {} is {}: only ready or scheduled jobs can be cancelled",
                        j.job_id,
                        state_name(j.state)
                    )
                }));
            }
            done(
                conn,
                json!({"cancelled": true, "job": job_json(&j, false)}),
                format!("cancelled job {}", j.job_id),
            );
        }
        Op::Key { .. } => {
            return Err(Failure(
                "give QUEUE and KEY to look a key up, or `forget QUEUE KEY`".into(),
            ));
        }
        Op::Enqueue(_) => unreachable!("sepp enqueue is run before connecting the admin client"),
        Op::Dlq { command } => dlq(conn, &mut admin, command).await?,
        Op::Pause { queue } => {
            // A pause creates a queue that does not exist yet: a mistyped name must not pass
            // for the queue meant.
            let existed = queue_exists(&mut admin, &queue).await?;
            admin
                .pause_queue(pb::PauseQueueRequest {
                    queue: queue.clone(),
                })
                .await?;
            done(
                conn,
                json!({"queue": queue, "paused": true, "created": !existed}),
                if existed {
                    format!("paused {queue}")
                } else {
                    format!(
                        "paused {queue}, a new queue: it did not exist (`sepp queues` lists \
                         those that did; `sepp queue delete {queue}` undoes it)"
                    )
                },
            );
        }
        Op::Resume { queue } => {
            admin
                .resume_queue(pb::ResumeQueueRequest {
                    queue: queue.clone(),
                })
                .await?;
            done(
                conn,
                json!({"queue": queue, "paused": false}),
                format!("resumed {queue}"),
            );
        }
        Op::Purge { queue, yes } => {
            if !yes {
                return Err(Failure(format!(
                    "purge cancels every ready and scheduled job of {queue:?} and cannot be \
                     undone: add --yes to confirm"
                )));
            }
            let mut total = 0u64;
            loop {
                let r = admin
                    .purge_queue(pb::PurgeQueueRequest {
                        queue: queue.clone(),
                        max: None,
                    })
                    .await?
                    .into_inner();
                total += u64::from(r.purged);
                // `more` with nothing purged: jobs are being enqueued as fast as we purge.
                if !r.more || r.purged == 0 {
                    break;
                }
            }
            done(
                conn,
                json!({"queue": queue, "purged": total}),
                format!("purged {} from {queue}", counted(total, "job", "jobs")),
            );
        }
        Op::Queue {
            command: QueueCommand::Delete { queue },
        } => {
            let r = admin
                .delete_queue(pb::DeleteQueueRequest {
                    queue: queue.clone(),
                })
                .await?
                .into_inner();
            let keys = match r.dedup_records {
                0 => String::new(),
                n => format!(" ({n} dedup records stay until their window ends)"),
            };
            done(
                conn,
                json!({
                    "queue": queue,
                    "deleted": true,
                    "dedup_records": r.dedup_records,
                    "was_paused": r.was_paused,
                }),
                format!("deleted queue {queue}{keys}"),
            );
        }
        Op::Backup { dir, addr: _ } => {
            let dir = std::path::absolute(&dir)
                .map_err(|e| Failure(format!("backup: cannot resolve {}: {e}", dir.display())))?;
            let dir = dir
                .to_str()
                .ok_or_else(|| Failure(format!("backup: {} is not UTF-8", dir.display())))?
                .to_string();
            let r = admin
                .backup(pb::BackupRequest { dir: dir.clone() })
                .await?
                .into_inner();
            done(
                conn,
                json!({"dir": dir, "records": r.records, "bytes": r.bytes}),
                format!(
                    "backup written to {dir}: {} records, {} bytes",
                    r.records, r.bytes
                ),
            );
        }
    }
    Ok(())
}

async fn dlq(conn: &Conn, admin: &mut Admin, command: DlqCommand) -> Result<(), Failure> {
    match command {
        DlqCommand::List {
            queue,
            limit,
            page_token,
        } => {
            let first_page = page_token.is_empty();
            let page = admin
                .list_dead_letters(pb::ListDeadLettersRequest {
                    queue,
                    page_size: Some(limit),
                    page_token,
                })
                .await?
                .into_inner();
            if conn.output == Output::Json {
                let recs: Vec<Value> = page
                    .records
                    .iter()
                    .map(|r| {
                        let j = r.job.clone().unwrap_or_default();
                        json!({
                            "job_id": j.id, "queue": j.queue, "job_type": j.job_type,
                            "cause": cause_name(r.cause), "failed_at": ts(r.failed_at.as_ref()),
                            "final_attempt": r.final_attempt, "last_reason": r.last_reason,
                        })
                    })
                    .collect();
                print_json(&json!({"records": recs, "next_page_token": page.next_page_token}));
            } else {
                let rows: Vec<Vec<String>> = page
                    .records
                    .iter()
                    .map(|r| {
                        let j = r.job.clone().unwrap_or_default();
                        vec![
                            j.id,
                            j.queue,
                            j.job_type,
                            cause_name(r.cause).to_string(),
                            ts(r.failed_at.as_ref()),
                            r.final_attempt.to_string(),
                            r.last_reason.clone().unwrap_or_default(),
                        ]
                    })
                    .collect();
                print_table(
                    &[
                        "JOB_ID",
                        "QUEUE",
                        "TYPE",
                        "CAUSE",
                        "FAILED_AT",
                        "ATTEMPT",
                        "REASON",
                    ],
                    &rows,
                );
                // An empty first page reads like a lost job under the default retention, as
                // in `sepp queues`: say where dead letters go. (An empty later page is only
                // the end of the list.)
                if page.records.is_empty() && first_page {
                    let why = match keeps_dead_letters(conn).await {
                        Some(false) => {
                            "this server deletes a dead-lettered job at once \
                             (storage.dead_letter_retention_ms = 0, the default; above 0 keeps \
                             them)"
                        }
                        Some(true) => {
                            "none are kept now: none failed for good, or they were requeued, \
                             deleted or expired since"
                        }
                        None => {
                            "with storage.dead_letter_retention_ms = 0 (the default) a \
                             dead-lettered job is deleted at once; otherwise none are kept now \
                             (none failed for good, or they were requeued, deleted or expired \
                             since)"
                        }
                    };
                    eprintln!("sepp: no dead letters: {why}");
                }
                if !page.next_page_token.is_empty() {
                    emit(format_args!(
                        "next page: --page-token {}",
                        page.next_page_token
                    ));
                }
            }
        }
        DlqCommand::Requeue(sel) => {
            sel.check("requeue")?;
            let mut ids = Vec::new();
            loop {
                let got = admin
                    .requeue_dead_letters(pb::RequeueDeadLettersRequest {
                        selector: Some(selection(&sel)),
                    })
                    .await?
                    .into_inner()
                    .job_ids;
                let n = got.len();
                ids.extend(got);
                if !sel.all || n == 0 {
                    break;
                }
            }
            report_ids(conn, "requeued", &sel, &ids)?;
        }
        DlqCommand::Delete(sel) => {
            sel.check("delete")?;
            let mut ids = Vec::new();
            loop {
                let got = admin
                    .delete_dead_letters(pb::DeleteDeadLettersRequest {
                        selector: Some(selection(&sel)),
                    })
                    .await?
                    .into_inner()
                    .job_ids;
                let n = got.len();
                ids.extend(got);
                if !sel.all || n == 0 {
                    break;
                }
            }
            report_ids(conn, "deleted", &sel, &ids)?;
        }
    }
    Ok(())
}

fn report_ids(conn: &Conn, verb: &str, sel: &Selection, ids: &[String]) -> Result<(), Failure> {
    let missing: Vec<&String> = sel.ids.iter().filter(|i| !ids.contains(i)).collect();
    done(
        conn,
        json!({ verb: ids, "not_dead_letters": missing }),
        format!(
            "{verb} {} of {}",
            counted(ids.len() as u64, "dead letter", "dead letters"),
            sel.queue
        ),
    );
    if !missing.is_empty() {
        return Err(Failure(format!(
            "{} of the ids given {} (already {verb}, another state, or unknown): {}",
            missing.len(),
            if missing.len() == 1 {
                "is not a dead letter"
            } else {
                "are not dead letters"
            },
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sepp_proto::v1 as v1pb;

    #[test]
    fn table_columns_line_up_on_a_terminal_with_wide_and_combining_characters() {
        let rows = vec![
            vec!["mail".to_string(), "1".into(), "no".into()],
            vec!["📬-inbox".to_string(), "22".into(), "yes".into()],
            vec!["cafe\u{301}".to_string(), "333".into(), "no".into()],
        ];
        assert_eq!(
            table_lines(&["QUEUE", "READY", "PAUSED"], &rows),
            [
                "QUEUE     READY  PAUSED",
                "mail      1      no",
                "📬-inbox  22     yes",
                "cafe\u{301}      333    no",
            ]
        );
    }

    fn carrying(data: &[u8]) -> pb::JobInfo {
        pb::JobInfo {
            job_id: "0b7e5c1a-3f2d-4c8e-9a61-5d2f4e8b7c90".into(),
            state: pb::JobState::Ready as i32,
            queue: "mail".into(),
            job_type: "send".into(),
            payload: Some(v1pb::Payload {
                data: data.to_vec(),
                encoding: "application/json".into(),
            }),
            custom: [
                (
                    "tenant".to_string(),
                    v1pb::PrimitiveValue {
                        value: Some(v1pb::primitive_value::Value::StringValue("acme".into())),
                    },
                ),
                (
                    "n".to_string(),
                    v1pb::PrimitiveValue {
                        value: Some(v1pb::primitive_value::Value::IntValue(7)),
                    },
                ),
            ]
            .into_iter()
            .collect(),
            trace_context: Some(v1pb::TraceContext {
                traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
                tracestate: None,
            }),
            ..Default::default()
        }
    }

    fn row<'a>(rows: &'a [Vec<String>], field: &str) -> Option<&'a str> {
        rows.iter().find(|r| r[0] == field).map(|r| r[1].as_str())
    }

    #[test]
    fn the_table_shows_a_text_payload_cut_with_its_size_and_what_else_the_job_carries() {
        let body = format!("{{\"items\": [{}]}}", "1, ".repeat(100));
        let rows = job_rows(&carrying(body.as_bytes()));
        assert_eq!(row(&rows, "payload_encoding"), Some("application/json"));
        let shown = row(&rows, "payload").unwrap();
        assert!(shown.starts_with("{\"items\": [1, 1, "), "{shown}");
        let size = format!("… ({} bytes in all)", body.len());
        assert!(shown.ends_with(&size), "{shown}");
        assert_eq!(
            shown.chars().count(),
            PREVIEW_CHARS + size.chars().count(),
            "{shown}"
        );
        assert_eq!(row(&rows, "custom.n"), Some("7"));
        assert_eq!(row(&rows, "custom.tenant"), Some("acme"));
        assert_eq!(
            row(&rows, "traceparent"),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        assert_eq!(row(&rows, "tracestate"), None);
        assert_eq!(row(&rows, "queue"), Some("mail"));
    }

    #[test]
    fn the_table_shows_other_bytes_as_their_size_and_hex() {
        let rows = job_rows(&carrying(&[0xde, 0xad, 0xbe, 0xef]));
        assert_eq!(
            row(&rows, "payload"),
            Some("4 bytes, not UTF-8, hex: deadbeef")
        );
    }

    #[test]
    fn json_has_the_whole_payload_in_base64_only_for_a_get_job_reply() {
        let data: Vec<u8> = (0..=255).collect();
        let j = carrying(&data);
        let v = job_json(&j, true);
        assert_eq!(v["payload"]["encoding"], "application/json");
        assert_eq!(v["payload"]["bytes"], 256);
        use base64::Engine as _;
        let back = base64::engine::general_purpose::STANDARD
            .decode(v["payload"]["data_base64"].as_str().unwrap())
            .unwrap();
        assert_eq!(back, data);
        assert_eq!(v["custom"]["n"], 7);
        assert_eq!(v["custom"]["tenant"], "acme");
        assert_eq!(
            v["trace_context"]["traceparent"],
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
        let listed = job_json(&j, false);
        assert!(listed.get("payload").is_none(), "{listed}");
        assert!(listed.get("custom").is_none(), "{listed}");
        let none = job_json(&pb::JobInfo::default(), true);
        assert!(none["payload"].is_null(), "{none}");
        assert_eq!(none["custom"], json!({}));
    }
}
