//! Server configuration: compiled defaults, then `sepp.toml`, then `SEPP_SECTION__FIELD`
//! environment variables.
//!
//! Every key, its unit, range and default is listed in `docs/configuration.md` and printed by
//! `sepp config example`; the defaults match the public sepp so that a config file written for it
//! means the same thing here. Loading fails with one line naming the key, the value and what is
//! allowed ([`ConfigError`]).
//!
//! This module is plain data: serde structs, the file/environment overlay, and the checks of
//! the sections the queue layer does not own (`[server]`, `[auth]`, the durability keys of
//! `[storage]`). It imports nothing of `queue/`: the checks of `[limits]`, the per-queue
//! policies and `[[queues]]` live with the rules they feed, in
//! `queue::limits::Limits::from_config`; [`crate::load_config`] runs both.

pub use crate::domain::PersistMode;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Sections of the public sepp's config that this server accepts but does not implement yet.
/// They are ignored with one warning so that the public sepp's config files still start sepp.
pub const IGNORED_SECTIONS: &[&str] = &["admin", "cluster"];

/// The operations sections and the keys this server gives a meaning. Any other key in them (one
/// the public sepp's config files may carry) is accepted and ignored with one warning, so that
/// those files still start sepp.
const OPERATIONS_KEYS: &[(&str, &[&str])] = &[
    ("metrics", &["enabled", "listen_addr", "max_queue_labels"]),
    ("logging", &["level", "format"]),
    (
        "tracing",
        &["enabled", "otlp_endpoint", "service_name", "sample_ratio"],
    ),
];

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[server]`: listening, TLS, strict mode, data directory.
    pub server: ServerConfig,
    /// `[auth]`: API keys.
    pub auth: AuthConfig,
    /// `[limits]`: request limits and the per-queue defaults they carry.
    pub limits: LimitsConfig,
    /// `[storage]`: durability, retention, the dedup window default.
    pub storage: StorageConfig,
    /// `[[queues]]`: declared queues and their overrides.
    pub queues: Vec<QueueConfig>,
    /// `[[schedules]]`: recurring jobs (`queue::schedule`).
    pub schedules: Vec<ScheduleConfig>,
    /// `[metrics]`: the Prometheus endpoint.
    pub metrics: MetricsConfig,
    /// `[logging]`: log level and format.
    pub logging: LoggingConfig,
    /// `[tracing]`: OpenTelemetry trace export.
    pub tracing: TracingConfig,
    /// `[admin_ui]`: the admin web UI.
    pub admin_ui: AdminUiConfig,
}

/// `[metrics]`: a Prometheus scrape endpoint (`docs/operations.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `GET /metrics` on `listen_addr`. Default false.
    pub enabled: bool,
    /// Address of the metrics endpoint; port 0 lets the OS pick one. Default `127.0.0.1:9464`
    /// (loopback: expose it on purpose).
    #[serde(deserialize_with = "socket_addr")]
    pub listen_addr: SocketAddr,
    /// Most distinct values of the `queue` label: declared `[[queues]]` always get their own,
    /// then the first queues seen, until this many; the rest are counted under
    /// `queue="_other"`. 1–10 000, default 100.
    pub max_queue_labels: u32,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 9464)),
            max_queue_labels: 100,
        }
    }
}

/// The format of log lines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object a line, with the fields of the current spans (and so `trace_id`).
    Json,
}

/// `[logging]`. Logs go to standard error; `SEPP_LOG` (a filter) wins over `level`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoggingConfig {
    /// A level (`error`, `warn`, `info`, `debug`, `trace`) or a filter such as
    /// `info,sepp_server=debug`. Default `info`.
    pub level: String,
    /// `text` or `json`. Default `text`.
    pub format: LogFormat,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
            format: LogFormat::Text,
        }
    }
}

/// `[tracing]`: OpenTelemetry spans exported over OTLP/gRPC (`docs/operations.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// Export spans. Default false; setting `otlp_endpoint` turns it on too.
    pub enabled: bool,
    /// The OTLP/gRPC collector, e.g. `http://127.0.0.1:4317`. Unset: `http://127.0.0.1:4317`
    /// when `enabled`, no export otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans. Default `sepp`.
    pub service_name: String,
    /// Share of new traces sampled, 0.0–1.0; a call that carries a sampled parent (a job's
    /// trace context) follows its parent's decision. Default 1.0.
    pub sample_ratio: f64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            otlp_endpoint: None,
            service_name: "sepp".into(),
            sample_ratio: 1.0,
        }
    }
}

impl TracingConfig {
    /// Where spans are exported, if anywhere.
    pub fn endpoint(&self) -> Option<String> {
        match &self.otlp_endpoint {
            Some(e) => Some(e.clone()),
            None if self.enabled => Some("http://127.0.0.1:4317".into()),
            None => None,
        }
    }
}

/// `[admin_ui]`: the admin web UI (docs/operations.md, "Admin web UI").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminUiConfig {
    /// Serve the UI. Default false.
    pub enabled: bool,
    /// Its own HTTP address (port 0: the OS picks one). Default `127.0.0.1:50052`: loopback,
    /// put a TLS proxy in front to reach it from elsewhere.
    #[serde(deserialize_with = "socket_addr")]
    pub listen_addr: SocketAddr,
    /// The HMAC-SHA256 key that signs session cookies, 32–1024 bytes. Give every server behind
    /// one load balancer the same secret and each accepts the others' sessions (there is no
    /// session table). Unset (the default): a random secret per start, so sessions end at a
    /// restart and only the server that issued one accepts it. Never printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_secret: Option<SessionSecret>,
    /// How long a session lasts after its login, in milliseconds. 60 000 – 604 800 000 (7
    /// days), default 28 800 000 (8 hours).
    pub session_ttl_ms: u64,
}

impl Default for AdminUiConfig {
    fn default() -> Self {
        AdminUiConfig {
            enabled: false,
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 50052)),
            session_secret: None,
            session_ttl_ms: 8 * 3_600_000,
        }
    }
}

/// `admin_ui.session_secret`. Its `Debug` and its serialization show `***`; only
/// [`SessionSecret::expose`] gives the bytes, to sign with.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SessionSecret(String);

impl SessionSecret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        SessionSecret(s.into())
    }

    /// The secret, to sign with. Never log it.
    pub fn expose(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

impl Serialize for SessionSecret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("***")
    }
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on; port 0 lets the OS pick one. Default `127.0.0.1:50051` (the public
    /// sepp binds `0.0.0.0`; sepp stays on loopback unless told otherwise).
    #[serde(deserialize_with = "socket_addr")]
    pub listen_addr: SocketAddr,
    /// Directory of the embedded storage. Default `./sepp-data`.
    pub db_path: PathBuf,
    /// PEM certificate chain for TLS. Set together with `tls_key_path`, or neither.
    pub tls_cert_path: Option<PathBuf>,
    /// PEM private key for TLS.
    pub tls_key_path: Option<PathBuf>,
    /// PEM certificates of the CAs that sign client certificates: when set, every client must
    /// present a certificate signed by one of them (mutual TLS), or its TLS handshake fails.
    /// Needs `tls_cert_path`. Default unset (no client certificates asked for).
    pub tls_client_ca_path: Option<PathBuf>,
    /// When true, only queues declared in `[[queues]]` exist. Default false.
    pub strict_queues: bool,
    // Connection hardening (issue 11): see docs/security.md, "Connections and streams".
    /// Most HTTP/2 streams (concurrent calls) one connection may have open; more are refused
    /// with `REFUSED_STREAM`. 1–10 000, default 256.
    pub max_concurrent_streams: u32,
    /// Most client connections served at once; further ones wait in the listen backlog until
    /// a slot frees. 1–1 000 000, default 4096.
    pub max_connections: u32,
    /// Time a new connection has to finish TLS and send the HTTP/2 preface, and a request to
    /// deliver its whole message after its headers, in milliseconds. 100–600 000, default
    /// 10 000.
    pub handshake_timeout_ms: u64,
    /// A connection with no call in flight for this long is closed with GOAWAY, in
    /// milliseconds; HTTP/2 keepalive pings (every half of it, at most 60 s) close dead peers
    /// sooner. 1 000–86 400 000, default 300 000.
    pub idle_timeout_ms: u64,
    /// After SIGTERM, how long calls in flight may still finish before every connection is
    /// dropped, in milliseconds. 0–3 600 000, default 5 000.
    pub shutdown_grace_ms: u64,
    /// Most bytes all partly received request messages may hold together, across every
    /// stream and connection; a request that would pass it is refused with
    /// `RESOURCE_EXHAUSTED` before any handler runs. At least `limits.max_message_bytes` + 5
    /// (one largest message) and at most 2^40; default 67 108 864 (64 MiB: four largest
    /// messages, a quarter of the 256 MiB the stalled-stream soak allows the whole server).
    pub request_buffer_bytes: u64,
    /// Most bytes of replies the server has produced and not yet written to their connections
    /// (a client that does not read its answers leaves them there), across every stream and
    /// connection. While they hold this much, or one connection holds an eighth of it (at
    /// least one largest message), calls that can return large replies (every call but the
    /// enqueues, Ack, Nack, Extend, GetServerInfo, health and admin calls with small replies)
    /// are refused with `RESOURCE_EXHAUSTED` before any handler runs, and leases take only
    /// jobs whose reply bytes fit. At least `limits.max_message_bytes` + 5
    /// and at most 2^40; default 268 435 456 (256 MiB).
    pub reply_buffer_bytes: u64,
    /// A connection whose replies hold bytes waiting to be written, none of which was written
    /// for this long, is dropped (its client does not read them; what they hold goes back to
    /// `reply_buffer_bytes`), in milliseconds. 1 000–86 400 000, default 60 000.
    pub reply_stall_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
            db_path: PathBuf::from("./sepp-data"),
            tls_cert_path: None,
            tls_key_path: None,
            tls_client_ca_path: None,
            strict_queues: false,
            max_concurrent_streams: 256,
            max_connections: 4096,
            handshake_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            shutdown_grace_ms: 5_000,
            request_buffer_bytes: 64 * 1024 * 1024,
            reply_buffer_bytes: 256 * 1024 * 1024,
            reply_stall_timeout_ms: 60_000,
        }
    }
}

/// `[auth]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Accepted API keys, sent as `authorization: Bearer <key>`. Unset (and no
    /// `api_keys_file`): auth is off. An empty list: every request is refused.
    pub api_keys: Option<Vec<ApiKey>>,
    /// A TOML file of further API keys (`[[api_keys]]` entries of the same shape), read at
    /// start and again on SIGHUP, so keys and their roles change without a restart. Setting
    /// it turns auth on. Default unset.
    pub api_keys_file: Option<PathBuf>,
    /// How long a key that a reload of `api_keys_file` removed is still accepted (with the
    /// roles it had), in milliseconds, so clients can move to the new key. 0–86 400 000,
    /// default 60 000.
    pub rotation_overlap_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            api_keys: None,
            api_keys_file: None,
            rotation_overlap_ms: 60_000,
        }
    }
}

/// One API key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// A label for logs; never sent by clients.
    pub name: String,
    /// The secret the client sends.
    pub key: String,
    /// What the key may do. Default all three, so that configs written before roles keep
    /// working.
    #[serde(default = "Role::all")]
    pub roles: Vec<Role>,
}

impl ApiKey {
    /// A key with every role.
    pub fn new(name: impl Into<String>, key: impl Into<String>) -> Self {
        ApiKey {
            name: name.into(),
            key: key.into(),
            roles: Role::all(),
        }
    }
}

/// What an API key may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Enqueue, EnqueueBatch, EnqueueAtomic.
    Producer,
    /// Reserve, Ack, Nack, Extend.
    Worker,
    /// The admin service and DrainDeadLetters.
    Admin,
}

impl Role {
    /// Every role (the default of a key).
    pub fn all() -> Vec<Role> {
        vec![Role::Producer, Role::Worker, Role::Admin]
    }

    /// The name used in config files and error messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Producer => "producer",
            Role::Worker => "worker",
            Role::Admin => "admin",
        }
    }
}

/// The file named by `auth.api_keys_file`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiKeysFile {
    /// The keys, `[[api_keys]]` entries of `{ name, key, roles }`.
    pub api_keys: Vec<ApiKey>,
}

impl ApiKeysFile {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file and the key at fault.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            ConfigError(format!(
                "config key auth.api_keys_file: cannot read {}: {e}",
                path.display()
            ))
        })?;
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            ConfigError(format!(
                "{} (auth.api_keys_file)",
                toml_syntax_error(Some(path), &text, &e)
            ))
        })?;
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            ConfigError(format!(
                "auth.api_keys_file {}: key {}: {}",
                path.display(),
                e.path(),
                e.inner().message()
            ))
        })
    }
}

/// Checks a list of keys: non-empty, unique secrets. `what` names the list in errors.
///
/// # Errors
/// [`ConfigError`] naming the entry.
pub fn check_api_keys<'a>(
    what: &str,
    keys: impl IntoIterator<Item = &'a ApiKey>,
) -> Result<(), ConfigError> {
    let mut seen = HashSet::new();
    for (i, k) in keys.into_iter().enumerate() {
        if k.key.is_empty() {
            return Err(ConfigError(format!(
                "config key {what}[{i}].key is empty: expected a non-empty secret"
            )));
        }
        if !seen.insert(&k.key) {
            return Err(ConfigError(format!(
                "config key {what}[{i}].key repeats an earlier key (name {:?}): keys must be unique",
                k.name
            )));
        }
    }
    Ok(())
}

/// The delay curve of the default retry policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryBackoff {
    /// Every retry waits `retry_delay_ms`.
    #[default]
    None,
    /// The retry after delivery `n` waits `retry_delay_ms × 2^(n−1)`.
    Exponential,
}

/// What an enqueue that hits a live dedup record with different contents gets
/// (`[[queues]] key_conflict`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyConflict {
    /// A hit, whatever the new request holds (the founding rule).
    #[default]
    Ignore,
    /// Rejected with `IDEMPOTENCY_KEY_CONFLICT` naming the original job, when the job type,
    /// payload, encoding, priority or custom map differ from the original's.
    Reject,
}

/// What an enqueue that hits a live dedup record does to the job the record names
/// (`[[queues]] on_duplicate`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDuplicate {
    /// Nothing: a hit answers the original job's id (the founding rule).
    #[default]
    Keep,
    /// Debounce: a hit on a job still ready or scheduled replaces its payload, encoding,
    /// custom map and trace context and, when the hit sends one, its `scheduled_at`; its id,
    /// job type, priority, attempt and place in line stay, and the dedup window does not
    /// restart. A hit on a job in flight or settled is as `keep`.
    ReplacePending,
}

/// `[storage]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StorageConfig {
    /// Durability before a reply. Default `sync_all`.
    pub persist_mode: PersistMode,
    /// How long dead-letter records are kept, in milliseconds; 0 deletes dead jobs at once.
    /// Default 0.
    pub dead_letter_retention_ms: u64,
    /// Longest pause between two maintenance passes of the sweeper, in milliseconds.
    /// Default 1000.
    pub sweep_interval_ms: u64,
    /// How long an idempotency key is remembered, in milliseconds, counted from the first
    /// accepted enqueue. Default 86 400 000 (24 hours). Per-queue override in `[[queues]]`.
    pub dedup_window_ms: u64,
    /// Free space, in bytes, kept on the data directory's filesystem: below it new writes are
    /// refused with `UNAVAILABLE` ("no space left") before the disk is full, so that fjall's
    /// flushes, compactions and a recovery can still run; writes resume on their own once free
    /// space is back above it. 0 turns the check off (a full disk is still handled). Default
    /// 268 435 456 (256 MiB).
    pub min_free_bytes: u64,
    /// Where jobs are kept: `embedded` (default: fjall in `server.db_path`) or `postgres` (a
    /// PostgreSQL database named by `postgres_url`, shared by any number of sepp servers).
    pub backend: StorageBackend,
    /// The PostgreSQL connection string (`backend = "postgres"`), libpq style: a URL
    /// `postgres://user:password@host1:5432,host2:5432/db?target_session_attrs=read-write` or
    /// `key=value` pairs. Unset by default. Never printed with its password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_url: Option<PostgresUrl>,
    /// Most connections each sepp server opens to PostgreSQL. 2–1000, default 16.
    pub postgres_pool_size: u32,
    /// Longest a PostgreSQL statement may run before the server cancels it (`statement_timeout`),
    /// in milliseconds; the request gets `UNAVAILABLE`. 100–3 600 000, default 30 000.
    pub postgres_statement_timeout_ms: u64,
    /// Longest a waiting Reserve goes without looking at the database for ready jobs when no
    /// `NOTIFY` arrived (a lost notification costs at most this much latency), in milliseconds.
    /// 10–60 000, default 1000.
    pub postgres_poll_interval_ms: u64,
    /// PEM file with the certificate(s) of the CA that signed PostgreSQL's server certificate.
    /// Needed by `sslmode=verify-ca` and `verify-full` in `postgres_url`; with `require` or
    /// `prefer` it makes sepp verify the chain (as libpq with a root certificate). Unset by
    /// default: `require`/`prefer` then encrypt without verifying the server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres_ca_file: Option<PathBuf>,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            persist_mode: PersistMode::SyncAll,
            dead_letter_retention_ms: 0,
            sweep_interval_ms: 1000,
            dedup_window_ms: 86_400_000,
            min_free_bytes: 256 * 1024 * 1024,
            backend: StorageBackend::Embedded,
            postgres_url: None,
            postgres_pool_size: 16,
            postgres_statement_timeout_ms: 30_000,
            postgres_poll_interval_ms: 1000,
            postgres_ca_file: None,
        }
    }
}

/// `storage.backend`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageBackend {
    /// fjall on local disk (`server.db_path`).
    #[default]
    Embedded,
    /// A PostgreSQL database (`storage.postgres_url`).
    Postgres,
}

/// `storage.postgres_url`: a connection string holding a password. Its `Debug` and its
/// serialization (`sepp config check`) show `***` in place of the password; only
/// [`PostgresUrl::expose`] gives the real string, to connect with.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct PostgresUrl(String);

impl PostgresUrl {
    /// Wraps a connection string.
    pub fn new(s: impl Into<String>) -> Self {
        PostgresUrl(s.into())
    }

    /// The connection string with its password, to connect with. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The connection string with any password replaced by `***`: in a URL's user info
    /// (`user:password@`), in a `password=` pair, and in a `password=` query parameter.
    pub fn redacted(&self) -> String {
        redact_password(&self.0)
    }
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl Serialize for PostgresUrl {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.redacted())
    }
}

/// Replaces every password in a libpq connection string (URL or `key=value` form) with `***`.
fn redact_password(s: &str) -> String {
    let mut out = s.to_string();
    // URL user info: scheme://user:password@hosts...
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                out.replace_range(rest_start + colon + 1..rest_start + at, "***");
            }
        }
    }
    // `password=...` as a query parameter (up to `&`) or a key=value pair (up to a space, or a
    // quoted value).
    let lower = out.to_ascii_lowercase();
    let mut result = String::with_capacity(out.len());
    let mut i = 0;
    while let Some(found) = lower[i..].find("password=") {
        let start = i + found;
        let before_ok =
            start == 0 || matches!(lower.as_bytes()[start - 1], b' ' | b'?' | b'&' | b'\t');
        let value_start = start + "password=".len();
        result.push_str(&out[i..value_start]);
        if !before_ok {
            i = value_start;
            continue;
        }
        let bytes = out.as_bytes();
        let value_end = if bytes.get(value_start) == Some(&b'\'') {
            let mut j = value_start + 1;
            while j < bytes.len() && bytes[j] != b'\'' {
                if bytes[j] == b'\\' {
                    j += 1;
                }
                j += 1;
            }
            (j + 1).min(bytes.len())
        } else {
            out[value_start..]
                .find([' ', '&', '\t'])
                .map_or(out.len(), |k| value_start + k)
        };
        result.push_str("***");
        i = value_end;
    }
    result.push_str(&out[i..]);
    result
}

/// `[limits]`. The keys from `max_lease_duration_ms` on are per-queue defaults that a
/// `[[queues]]` entry may override.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Longest idempotency key, in UTF-8 bytes. Global only. Default 256.
    pub max_idempotency_key_bytes: u32,
    /// Most jobs in one EnqueueBatch / EnqueueAtomic. Default 256.
    pub max_enqueue_batch: u32,
    /// Most jobs one Reserve returns. Default 256.
    pub max_reserve_batch: u32,
    /// Most queues one Reserve may list. Default 32.
    pub max_reserve_queues: u32,
    /// Most distinct queues the store holds (declared `[[queues]]` included), 1 – 1 000 000,
    /// at least the number of `[[queues]]` entries. An enqueue that would create an undeclared
    /// queue past it is rejected (`TooManyQueues`). Default 10 000.
    pub max_queues: u64,
    /// Longest Reserve wait, in milliseconds; longer waits are clamped. Default 300 000.
    pub max_wait_timeout_ms: u64,
    /// Most Reserves waiting for a job at once, server-wide, 1 – 1 000 000. A Reserve that
    /// finds no job while this many wait is answered `RESOURCE_EXHAUSTED` instead of waiting.
    /// Default 10 000.
    pub max_waiting_reserves: u64,
    /// Largest request message, in bytes. Default 16 777 216 (16 MiB).
    pub max_message_bytes: u64,
    /// Longest queue name, in UTF-8 bytes. Default 512.
    pub max_queue_name_bytes: u32,
    /// Longest job type, in UTF-8 bytes. Default 256.
    pub max_job_type_bytes: u32,
    /// Longest lease, in milliseconds; longer leases are clamped. Default 300 000.
    pub max_lease_duration_ms: u64,
    /// `max_attempts` of a job that sets none. Default 3.
    pub default_max_attempts: u32,
    /// Largest `max_attempts`; larger values are clamped. Default 100.
    pub max_attempts_ceiling: u32,
    /// Priority of a job that sets none, 0–9. Default 0.
    pub default_priority: u32,
    /// Base delay of the default retry policy, in milliseconds. Default 0 (retry at once).
    pub retry_delay_ms: u64,
    /// `none` or `exponential`. Default `none`.
    pub retry_backoff: RetryBackoff,
    /// Cap on a retry delay, in milliseconds. Default 3 600 000.
    pub retry_delay_max_ms: u64,
    /// Largest payload, in bytes. Default 1 048 576.
    pub max_payload_bytes: u64,
    /// Allowed payload encodings. Unset: any; `[]`: no payloads at all.
    pub allowed_encodings: Option<Vec<String>>,
    /// Furthest `scheduled_at` from now, in milliseconds; also caps nack delays. Default
    /// 2 592 000 000 (30 days).
    pub max_schedule_horizon_ms: u64,
    /// Most entries in a job's custom map. Default 64.
    pub max_custom_entries: u32,
    /// Largest custom map, in bytes (key bytes + value bytes: strings their length, numbers 8,
    /// booleans 1). Default 16 384.
    pub max_custom_total_bytes: u64,
    /// Longest custom key, in UTF-8 bytes. Default 256.
    pub max_custom_key_bytes: u32,
    /// Most jobs (ready + scheduled + in flight) a queue holds. Unset: unlimited.
    pub max_queue_depth: Option<u64>,

    // Field sizes and the reply budget (global only; docs/security.md).
    /// Largest Reserve reply, in bytes (an upper bound of its protobuf encoding): Reserve stops
    /// adding jobs before a reply would pass it. Default 4 194 304 (4 MiB, the smallest default
    /// receive limit among the clients in use).
    pub max_reserve_reply_bytes: u64,
    /// Longest `trace_context.traceparent` and longest `trace_context.tracestate`, each, in
    /// bytes. Default 4096.
    pub max_trace_context_bytes: u32,
    /// Longest `payload.encoding`, in bytes. Default 256.
    pub max_encoding_bytes: u32,
    /// Longest Reserve `worker_id`, in bytes. Default 256.
    pub max_worker_id_bytes: u32,
    /// Longest nack `reason` kept, in bytes; longer reasons are truncated. Default 4096.
    pub max_reason_bytes: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_idempotency_key_bytes: 256,
            max_enqueue_batch: 256,
            max_reserve_batch: 256,
            max_reserve_queues: 32,
            max_queues: 10_000,
            max_wait_timeout_ms: 300_000,
            max_waiting_reserves: 10_000,
            max_message_bytes: 16_777_216,
            max_queue_name_bytes: 512,
            max_job_type_bytes: 256,
            max_lease_duration_ms: 300_000,
            default_max_attempts: 3,
            max_attempts_ceiling: 100,
            default_priority: 0,
            retry_delay_ms: 0,
            retry_backoff: RetryBackoff::None,
            retry_delay_max_ms: 3_600_000,
            max_payload_bytes: 1_048_576,
            allowed_encodings: None,
            max_schedule_horizon_ms: 2_592_000_000,
            max_custom_entries: 64,
            max_custom_total_bytes: 16_384,
            max_custom_key_bytes: 256,
            max_queue_depth: None,
            max_reserve_reply_bytes: 4_194_304,
            max_trace_context_bytes: 4096,
            max_encoding_bytes: 256,
            max_worker_id_bytes: 256,
            max_reason_bytes: 4096,
        }
    }
}

/// One `[[queues]]` entry: a declared queue and its overrides of the per-queue defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueConfig {
    /// The queue's name; required and unique.
    pub name: String,
    /// Only these job types may be enqueued; a non-empty list when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_job_types: Option<Vec<String>>,
    /// Overrides `[storage] dedup_window_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dedup_window_ms: Option<u64>,
    /// Overrides `[limits] max_lease_duration_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lease_duration_ms: Option<u64>,
    /// Overrides `[limits] default_max_attempts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_max_attempts: Option<u32>,
    /// Overrides `[limits] max_attempts_ceiling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts_ceiling: Option<u32>,
    /// Overrides `[limits] default_priority`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_priority: Option<u32>,
    /// Overrides `[limits] retry_delay_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_delay_ms: Option<u64>,
    /// Overrides `[limits] retry_backoff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_backoff: Option<RetryBackoff>,
    /// Overrides `[limits] retry_delay_max_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_delay_max_ms: Option<u64>,
    /// Overrides `[limits] max_payload_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_payload_bytes: Option<u64>,
    /// Overrides `[limits] allowed_encodings`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_encodings: Option<Vec<String>>,
    /// Overrides `[limits] max_schedule_horizon_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_schedule_horizon_ms: Option<u64>,
    /// Overrides `[limits] max_custom_entries`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_custom_entries: Option<u32>,
    /// Overrides `[limits] max_custom_total_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_custom_total_bytes: Option<u64>,
    /// Overrides `[limits] max_custom_key_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_custom_key_bytes: Option<u32>,
    /// Overrides `[limits] max_queue_depth`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_queue_depth: Option<u64>,
    /// `ignore` (default) or `reject`: see [`KeyConflict`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_conflict: Option<KeyConflict>,
    /// `keep` (default) or `replace_pending`: see [`OnDuplicate`]. Not with
    /// `key_conflict = "reject"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_duplicate: Option<OnDuplicate>,
}

/// One `[[schedules]]` entry: a recurring job the server enqueues once per tick, with the
/// idempotency key `schedule:<name>:<tick time>`. Checked, and its tick rule resolved, by
/// `queue::schedule::Schedules::from_config`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleConfig {
    /// The schedule's name: 1 to 64 bytes of `A-Z a-z 0-9 _ . -`, unique.
    pub name: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// The job type of its jobs.
    pub job_type: String,
    /// A cron expression (5 fields, or 6 with seconds first), read in `timezone`. Exactly one
    /// of `cron` and `every_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<String>,
    /// A fixed interval in milliseconds, ticks at whole multiples of it since the Unix epoch.
    /// Exactly one of `cron` and `every_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_ms: Option<u64>,
    /// The IANA time zone `cron` is read in. Default `UTC`. Only with `cron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// The payload as text (UTF-8 bytes). At most one of `payload` and `payload_base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The payload as standard base64 (with padding), for bytes that are not text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_base64: Option<String>,
    /// The payload's content type. Default `application/json`. Only with a payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// 0–9; unset takes the queue's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// At least 1; unset takes the queue's default; clamped to the queue's ceiling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// On start, enqueue the most recent tick missed while no server ran (true), or skip to
    /// the next tick (false, the default).
    #[serde(default)]
    pub catch_up: bool,
}

/// A configuration that could not be loaded. The message is one line naming the key, the value
/// and what is allowed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Where the configuration came from, for the start-up log.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// The effective configuration.
    pub config: Config,
    /// The file read, if any.
    pub path: Option<PathBuf>,
    /// Sections that were present but are not implemented (logged once as a warning).
    pub ignored_sections: Vec<String>,
    /// Keys of `[metrics]`, `[logging]` and `[tracing]` that this server does not implement,
    /// as `section.key` (logged once as a warning).
    pub ignored_keys: Vec<String>,
    /// The keys set by `SEPP_SECTION__FIELD` variables, as (`section.field`, variable name),
    /// so that an error about one of them names the variable ([`Loaded::attribute`]).
    pub env_overrides: Vec<(String, String)>,
}

impl Loaded {
    /// `e`, with ` (from VARIABLE)` appended when the key it names first was set by an
    /// environment variable: the value at fault is then in no file.
    pub fn attribute(&self, e: ConfigError) -> ConfigError {
        attribute_to_env(e, &self.env_overrides)
    }

    /// What the server warns about at start, one line each, for `sepp config check`: the
    /// ignored sections, then the ignored keys.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.ignored_sections.is_empty() {
            out.push(format!(
                "config sections not implemented by this server are ignored: {}",
                self.ignored_sections.join(", ")
            ));
        }
        if !self.ignored_keys.is_empty() {
            out.push(format!(
                "config keys not implemented by this server are ignored: {}",
                self.ignored_keys.join(", ")
            ));
        }
        out
    }
}

/// A day in milliseconds, for the ranges of time keys.
pub const DAY_MS: u64 = 86_400_000;

impl Config {
    /// Checks that the byte budget `key` = `bytes` holds one `what` message of
    /// `limits.max_message_bytes` plus its 5-byte gRPC header.
    fn holds_one_message(&self, key: &str, bytes: u64, what: &str) -> Result<(), ConfigError> {
        let need = self.limits.max_message_bytes.saturating_add(5);
        if bytes < need {
            return Err(ConfigError(format!(
                "config key {key} = {bytes} cannot hold one {what} message of \
                 limits.max_message_bytes = {} bytes plus its 5-byte header: raise it to at \
                 least {need} or lower limits.max_message_bytes",
                self.limits.max_message_bytes,
            )));
        }
        Ok(())
    }

    /// Loads the configuration: `path` if given, else `$SEPP_CONFIG`, else `./sepp.toml` if it
    /// exists, else the compiled defaults; then applies `SEPP_SECTION__FIELD` environment
    /// overrides from `env`, then validates.
    ///
    /// # Errors
    /// [`ConfigError`] for an unreadable file, bad TOML, an unknown key, a wrong type, an
    /// out-of-range value or inconsistent keys.
    pub fn load(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Loaded, ConfigError> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let path = path.map(Path::to_path_buf).or_else(|| {
            env.iter()
                .find(|(k, _)| k == "SEPP_CONFIG")
                .map(|(_, v)| PathBuf::from(v))
                .or_else(|| {
                    let p = PathBuf::from("sepp.toml");
                    p.exists().then_some(p)
                })
        });
        let text = match &path {
            Some(p) => std::fs::read_to_string(p).map_err(|e| {
                ConfigError(format!("cannot read config file {}: {e}", p.display()))
            })?,
            None => String::new(),
        };
        let mut loaded = Self::from_toml_at(&text, path.as_deref(), &env)?;
        loaded.path = path;
        Ok(loaded)
    }

    /// Parses `text` as TOML, applies the `SEPP_*` overrides in `env` and validates.
    ///
    /// # Errors
    /// As [`Config::load`].
    pub fn from_toml_with_env(text: &str, env: &[(String, String)]) -> Result<Loaded, ConfigError> {
        Self::from_toml_at(text, None, env)
    }

    /// As [`Config::from_toml_with_env`], naming `path` (the file `text` was read from) in a
    /// TOML syntax error.
    fn from_toml_at(
        text: &str,
        path: Option<&Path>,
        env: &[(String, String)],
    ) -> Result<Loaded, ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError(toml_syntax_error(path, text, &e)))?;
        let mut ignored_sections = Vec::new();
        for section in IGNORED_SECTIONS {
            if table.remove(*section).is_some() {
                ignored_sections.push((*section).to_string());
            }
        }
        let mut ignored_keys = Vec::new();
        for (section, known) in OPERATIONS_KEYS {
            if let Some(toml::Value::Table(t)) = table.get_mut(*section) {
                let unknown: Vec<String> = t
                    .keys()
                    .filter(|k| !known.contains(&k.as_str()))
                    .cloned()
                    .collect();
                for k in unknown {
                    t.remove(&k);
                    ignored_keys.push(format!("{section}.{k}"));
                }
            }
        }
        let env_overrides = apply_env(&mut table, env)?;
        let table = toml::Value::Table(table);
        let config: Config = serde_path_to_error::deserialize(table.clone())
            .map_err(|e| {
                let path = e.path().to_string();
                let message = expected_in_key_terms(e.path(), e.inner().message(), &table)
                    .or_else(|| variant_in_key_terms(e.path(), e.inner().message(), &table))
                    .or_else(|| unknown_key_in_key_terms(e.inner().message()))
                    .unwrap_or_else(|| e.inner().message().to_string());
                ConfigError(format!("config key {path}: {message}"))
            })
            .map_err(|e| attribute_to_env(e, &env_overrides))?;
        config
            .validate()
            .map_err(|e| attribute_to_env(e, &env_overrides))?;
        Ok(Loaded {
            config,
            path: None,
            ignored_sections,
            ignored_keys,
            env_overrides,
        })
    }

    /// Checks the ranges and consistency of `[server]`, `[auth]` and the durability keys of
    /// `[storage]` (the rest: `queue::limits::Limits::from_config`).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first offending key, its value and the allowed range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let s = &self.server;
        if s.tls_cert_path.is_some() != s.tls_key_path.is_some() {
            let (set, missing) = if s.tls_cert_path.is_some() {
                ("server.tls_cert_path", "server.tls_key_path")
            } else {
                ("server.tls_key_path", "server.tls_cert_path")
            };
            return Err(ConfigError(format!(
                "config key {set} is set but {missing} is not: set both or neither"
            )));
        }
        if s.tls_client_ca_path.is_some() && s.tls_cert_path.is_none() {
            return Err(ConfigError(
                "config key server.tls_client_ca_path is set but server.tls_cert_path is not: \
                 client certificates need TLS"
                    .into(),
            ));
        }
        if s.db_path.as_os_str().is_empty() {
            return Err(ConfigError(
                "config key server.db_path is empty: expected a directory path".into(),
            ));
        }
        check_range(
            "server.max_concurrent_streams",
            s.max_concurrent_streams,
            1,
            10_000,
        )?;
        check_range("server.max_connections", s.max_connections, 1, 1_000_000)?;
        check_range(
            "server.handshake_timeout_ms",
            s.handshake_timeout_ms,
            100,
            600_000,
        )?;
        check_range("server.idle_timeout_ms", s.idle_timeout_ms, 1_000, DAY_MS)?;
        check_range(
            "server.reply_stall_timeout_ms",
            s.reply_stall_timeout_ms,
            1_000,
            DAY_MS,
        )?;
        check_range(
            "server.shutdown_grace_ms",
            s.shutdown_grace_ms,
            0,
            3_600_000,
        )?;
        check_range(
            "server.request_buffer_bytes",
            s.request_buffer_bytes,
            1024 + 5,
            1 << 40,
        )?;
        self.holds_one_message(
            "server.request_buffer_bytes",
            s.request_buffer_bytes,
            "request",
        )?;
        check_range(
            "server.reply_buffer_bytes",
            s.reply_buffer_bytes,
            1024 + 5,
            1 << 40,
        )?;
        self.holds_one_message("server.reply_buffer_bytes", s.reply_buffer_bytes, "reply")?;
        if let Some(keys) = &self.auth.api_keys {
            check_api_keys("auth.api_keys", keys)?;
        }
        if let Some(p) = &self.auth.api_keys_file
            && p.as_os_str().is_empty()
        {
            return Err(ConfigError(
                "config key auth.api_keys_file is empty: expected a file path".into(),
            ));
        }
        check_range(
            "auth.rotation_overlap_ms",
            self.auth.rotation_overlap_ms,
            0,
            DAY_MS,
        )?;
        let st = &self.storage;
        check_range(
            "storage.dead_letter_retention_ms",
            st.dead_letter_retention_ms,
            0,
            3650 * DAY_MS,
        )?;
        check_range("storage.min_free_bytes", st.min_free_bytes, 0, 1 << 50)?;
        check_range(
            "storage.sweep_interval_ms",
            st.sweep_interval_ms,
            10,
            3_600_000,
        )?;
        check_range("storage.postgres_pool_size", st.postgres_pool_size, 2, 1000)?;
        check_range(
            "storage.postgres_statement_timeout_ms",
            st.postgres_statement_timeout_ms,
            100,
            3_600_000,
        )?;
        check_range(
            "storage.postgres_poll_interval_ms",
            st.postgres_poll_interval_ms,
            10,
            60_000,
        )?;
        match (&st.backend, &st.postgres_url) {
            (StorageBackend::Postgres, None) => {
                return Err(ConfigError(
                    "config key storage.backend = \"postgres\" needs storage.postgres_url (or \
                     SEPP_STORAGE__POSTGRES_URL), e.g. \
                     postgres://sepp@db1:5432,db2:5432/sepp?target_session_attrs=read-write"
                        .into(),
                ));
            }
            (_, Some(url)) => {
                if let Err(e) = parse_postgres_url(url.expose()) {
                    return Err(ConfigError(format!(
                        "config key storage.postgres_url = {:?} is not a valid PostgreSQL \
                         connection string: {e}",
                        url.redacted()
                    )));
                }
            }
            _ => {}
        }
        check_range(
            "metrics.max_queue_labels",
            self.metrics.max_queue_labels,
            1,
            10_000,
        )?;
        let ui = &self.admin_ui;
        if let Some(secret) = &ui.session_secret {
            let n = secret.expose().len();
            if !(32..=1024).contains(&n) {
                return Err(ConfigError(format!(
                    "config key admin_ui.session_secret is {n} bytes: allowed 32 to 1024 \
                     (e.g. the output of `openssl rand -hex 32`)"
                )));
            }
        }
        check_range(
            "admin_ui.session_ttl_ms",
            ui.session_ttl_ms,
            60_000,
            7 * DAY_MS,
        )?;
        if self.logging.level.trim().is_empty() {
            return Err(ConfigError(
                "config key logging.level is empty: expected a level such as info or a filter such as info,sepp_server=debug".into(),
            ));
        }
        let ratio = self.tracing.sample_ratio;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(ConfigError(format!(
                "config key tracing.sample_ratio = {ratio} is out of range: allowed 0.0 to 1.0"
            )));
        }
        if let Some(e) = &self.tracing.otlp_endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            return Err(ConfigError(format!(
                "config key tracing.otlp_endpoint = {e:?} is not a URL: expected http://HOST:PORT or https://HOST:PORT"
            )));
        }

        Ok(())
    }

    /// The configuration as TOML, every key present (used by `sepp config example`'s test).
    ///
    /// # Errors
    /// Never in practice; serialization of these plain types cannot fail.
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError(e.to_string()))
    }
}

/// One line for a TOML syntax error: `PATH:LINE:COLUMN: not valid TOML: MESSAGE`, as compilers
/// put it, so that editors and terminals can jump to the spot. Without a path (text that came
/// from no file), `config line LINE, column COLUMN: ...`. The `toml` crate's own `Display` spans
/// several lines (it draws the line and a caret); its span gives the place instead. Lines and
/// columns count from 1, columns in characters.
fn toml_syntax_error(path: Option<&Path>, text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    let Some(span) = e.span() else {
        return match path {
            Some(p) => format!("{}: not valid TOML: {message}", p.display()),
            None => format!("config is not valid TOML: {message}"),
        };
    };
    let at = text.floor_char_boundary(span.start.min(text.len()));
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before[before.rfind('\n').map_or(0, |i| i + 1)..]
        .chars()
        .count()
        + 1;
    match path {
        Some(p) => format!("{}:{line}:{column}: not valid TOML: {message}", p.display()),
        None => format!("config line {line}, column {column}: not valid TOML: {message}"),
    }
}

/// Refuses `v` outside `lo..=hi`, naming the key, the value and the range.
///
/// # Errors
/// [`ConfigError`]: `config key KEY = V is out of range: allowed LO to HI`.
pub fn check_range<T: PartialOrd + std::fmt::Display + Copy>(
    key: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError(format!(
            "config key {key} = {v} is out of range: allowed {lo} to {hi}"
        )));
    }
    Ok(())
}

/// Serde's message for a value of the wrong type or out of its type's range (`invalid type:
/// string "1MB", expected u64`) restated in the key's terms, which its name's suffix gives:
/// `"1MB" is not a number of bytes (an integer, e.g. 1048576 for 1 MiB)`. `_bytes` keys are
/// bytes, `_ms` keys milliseconds, `_secs` keys seconds, other integer keys counts; float and
/// boolean keys say so. `None` for any other message (unknown keys, enum variants, addresses),
/// which is kept as serde gives it.
fn expected_in_key_terms(
    path: &serde_path_to_error::Path,
    message: &str,
    root: &toml::Value,
) -> Option<String> {
    let rest = message
        .strip_prefix("invalid type: ")
        .or_else(|| message.strip_prefix("invalid value: "))?;
    let (_, expected) = rest.rsplit_once(", expected ")?;
    let (value, key) = written_at(root, path)?;
    let max = match expected {
        "u8" => u64::from(u8::MAX),
        "u16" => u64::from(u16::MAX),
        "u32" => u64::from(u32::MAX),
        "u64" => i64::MAX as u64,
        "f32" | "f64" => return Some(format!("{value} is not a number (e.g. 0.5)")),
        "a boolean" => return Some(format!("{value} is not true or false")),
        _ => return None,
    };
    let (what, example) = if key.ends_with("_bytes") {
        ("a number of bytes", "1048576 for 1 MiB")
    } else if key.ends_with("_ms") {
        ("a number of milliseconds", "30000 for 30 seconds")
    } else if key.ends_with("_secs") {
        ("a number of seconds", "30")
    } else {
        ("a whole number", "10")
    };
    Some(match value {
        // An integer of the right type but out of its range: negative, or too large.
        toml::Value::Integer(_) => format!("{value} is not {what} (an integer from 0 to {max})"),
        _ => format!("{value} is not {what} (an integer, e.g. {example})"),
    })
}

/// The value as it was written at `path` in the table deserialized, and the name of the last
/// key on the way (the key itself, or the list holding the value).
fn written_at<'a>(
    root: &'a toml::Value,
    path: &'a serde_path_to_error::Path,
) -> Option<(&'a toml::Value, &'a str)> {
    use serde_path_to_error::Segment;
    let mut value = root;
    let mut key = "";
    for segment in path.iter() {
        value = match segment {
            Segment::Map { key: k } => {
                key = k;
                value.get(k.as_str())?
            }
            Segment::Seq { index } => value.get(*index)?,
            _ => return None,
        };
    }
    Some((value, key))
}

/// The value at `path` in `root`, to change.
fn written_at_mut<'a>(
    root: &'a mut toml::Value,
    path: &serde_path_to_error::Path,
) -> Option<&'a mut toml::Value> {
    use serde_path_to_error::Segment;
    let mut value = root;
    for segment in path.iter() {
        value = match segment {
            Segment::Map { key } => value.get_mut(key.as_str())?,
            Segment::Seq { index } => value.get_mut(*index)?,
            _ => return None,
        };
    }
    Some(value)
}

/// The values an enum key allows, from serde's message for a string that is none of them:
/// ``unknown variant `X`, expected one of `a`, `b`, `c` `` (or `` `a` or `b` ``, or `` `a` ``).
fn variants_in(message: &str, given: &str) -> Option<Vec<String>> {
    let allowed = message.strip_prefix(&format!("unknown variant `{given}`, expected "))?;
    let allowed = allowed.strip_prefix("one of ").unwrap_or(allowed);
    let names: Vec<String> = allowed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect();
    (!names.is_empty()).then_some(names)
}

/// Serde's message for a key its section does not have (``unknown field `persist_mod`, expected
/// one of `persist_mode`, ...``) restated with the nearest key when one is close (a typo):
/// ``unknown key `persist_mod`: did you mean `persist_mode`? This section's keys: ...``. `None`
/// for any other message.
fn unknown_key_in_key_terms(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (given, _) = rest.split_once('`')?;
    let allowed = rest.strip_prefix(&format!("{given}`, expected "))?;
    let allowed = allowed.strip_prefix("one of ").unwrap_or(allowed);
    let names: Vec<&str> = allowed.split('`').skip(1).step_by(2).collect();
    let listed = names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    // The threshold clap uses for its own suggestions of mistyped arguments.
    let nearest = names
        .iter()
        .map(|n| (strsim::jaro(given, n), *n))
        .filter(|(score, _)| *score > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    Some(match nearest {
        Some((_, n)) => {
            format!("unknown key `{given}`: did you mean `{n}`? This section's keys: {listed}")
        }
        None => format!("unknown key `{given}`. This section's keys: {listed}"),
    })
}

/// Serde's message for a wrong value of an enum key (`persist_mode`, `backend`, `format`,
/// `key_conflict`, ...) restated with the key's allowed values: a string that is none of them
/// (``unknown variant `sometimes`, expected one of ...``) gives `"sometimes" is not one of
/// "sync_all", "sync_data", "buffer"`; a value that is not a string (the toml crate's `invalid
/// type: unit variant, expected string only`, which names no value) gives `3 is not one of
/// "sync_all", "sync_data", "buffer"` alike, the values read from the error of the same table
/// with an empty string in that place. `None` for any other message.
fn variant_in_key_terms(
    path: &serde_path_to_error::Path,
    message: &str,
    root: &toml::Value,
) -> Option<String> {
    let (value, _) = written_at(root, path)?;
    let quoted = |names: Vec<String>| {
        names
            .iter()
            .map(|n| format!("{n:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let names = if let toml::Value::String(given) = value {
        variants_in(message, given)?
    } else {
        if !message.starts_with("invalid type: ") || !message.ends_with(", expected string only") {
            return None;
        }
        let mut probe = root.clone();
        *written_at_mut(&mut probe, path)? = toml::Value::String(String::new());
        let e = serde_path_to_error::deserialize::<_, Config>(probe).err()?;
        if e.path().to_string() != path.to_string() {
            return None;
        }
        variants_in(e.inner().message(), "")?
    };
    Some(format!("{value} is not one of {}", quoted(names)))
}

/// Appends ` (from VARIABLE)` to `e` when the first key it names (`config key KEY...`) is one
/// that `overrides` (`section.field`, variable) says came from the environment. Errors naming
/// several keys are attributed by their first only.
fn attribute_to_env(e: ConfigError, overrides: &[(String, String)]) -> ConfigError {
    let Some(rest) = e.0.strip_prefix("config key ") else {
        return e;
    };
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .unwrap_or(rest.len());
    let key = &rest[..end];
    match overrides.iter().find(|(k, _)| k == key) {
        Some((_, var)) => ConfigError(format!("{} (from {var})", e.0)),
        None => e,
    }
}

/// The sections `SEPP_SECTION__FIELD` variables may set.
const ENV_SECTIONS: &[&str] = &[
    "server", "auth", "limits", "storage", "metrics", "logging", "tracing", "admin_ui",
];

/// The `SEPP_*` variables the configuration itself reads, besides the overrides.
const CONFIG_VARIABLES: &[&str] = &["SEPP_CONFIG", "SEPP_LOG"];

/// Variables under these prefixes belong to the project's test rigs (`SEPP_TEST_`) and bench
/// scripts (`SEPP_BENCH_`): sepp reads none of them and never warns about them.
const SKIPPED_VARIABLE_PREFIXES: &[&str] = &["SEPP_TEST_", "SEPP_BENCH_"];

/// A `SEPP_*` environment variable that sepp does not read: neither a `SEPP_SECTION__FIELD`
/// override nor one of its own variables. Most often a typo (one underscore for two), so it is
/// warned about rather than ignored in silence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownVariable {
    /// The variable's name.
    pub name: String,
    /// The nearest name sepp reads, when one is close.
    pub did_you_mean: Option<String>,
}

impl std::fmt::Display for UnknownVariable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "environment variable {} is not one sepp reads and is ignored",
            self.name
        )?;
        match &self.did_you_mean {
            Some(n) => write!(f, "; did you mean {n}?"),
            None => write!(
                f,
                " (config overrides are SEPP_<SECTION>__<KEY>, with two underscores)"
            ),
        }
    }
}

/// The `SEPP_*` variables in `env` that sepp does not read, each with the nearest name it does
/// read when one is close. Known: the `SEPP_SECTION__FIELD` overrides (those with `__` are
/// judged, and refused when wrong, by [`Config::load`]), `SEPP_CONFIG`, `SEPP_LOG`, the
/// `other_known` names (the command line's variables), and those of test rigs and bench
/// scripts (`SEPP_TEST_*`, `SEPP_BENCH_*`).
pub fn unknown_variables(env: &[(String, String)], other_known: &[String]) -> Vec<UnknownVariable> {
    let known: Vec<String> = override_names()
        .chain(CONFIG_VARIABLES.iter().map(|s| (*s).to_string()))
        .chain(other_known.iter().cloned())
        .collect();
    env.iter()
        .map(|(name, _)| name)
        .filter(|name| {
            name.strip_prefix("SEPP_")
                .is_some_and(|rest| !rest.contains("__"))
                && !SKIPPED_VARIABLE_PREFIXES
                    .iter()
                    .any(|p| name.starts_with(p))
                && !known.contains(name)
        })
        .map(|name| UnknownVariable {
            name: name.clone(),
            did_you_mean: nearest(name, &known),
        })
        .collect()
}

/// Every `SEPP_SECTION__FIELD` name, from the fields of the section structs.
fn override_names() -> impl Iterator<Item = String> {
    let sections: [(&str, &[&str]); 8] = [
        ("server", field_names::<ServerConfig>()),
        ("auth", field_names::<AuthConfig>()),
        ("limits", field_names::<LimitsConfig>()),
        ("storage", field_names::<StorageConfig>()),
        ("metrics", field_names::<MetricsConfig>()),
        ("logging", field_names::<LoggingConfig>()),
        ("tracing", field_names::<TracingConfig>()),
        ("admin_ui", field_names::<AdminUiConfig>()),
    ];
    debug_assert!(
        sections
            .iter()
            .map(|(s, _)| *s)
            .eq(ENV_SECTIONS.iter().copied())
    );
    sections.into_iter().flat_map(|(section, fields)| {
        fields.iter().map(move |f| {
            format!(
                "SEPP_{}__{}",
                section.to_ascii_uppercase(),
                f.to_ascii_uppercase()
            )
        })
    })
}

/// The field names serde's derive gives a struct, asked of the struct itself so the list cannot
/// drift from it: a deserializer that records the names `deserialize_struct` is handed, then
/// stops.
fn field_names<T: serde::de::DeserializeOwned>() -> &'static [&'static str] {
    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field names recorded")
        }
    }
    impl std::error::Error for Stop {}
    impl serde::de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = Stop;
        fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            *self.0 = fields;
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

/// The name in `known` nearest to `name` by edit distance, if it is close: at most 3 edits and
/// fewer than a third of the name.
fn nearest(name: &str, known: &[String]) -> Option<String> {
    known
        .iter()
        .map(|k| (edit_distance(name, k), k))
        .filter(|(d, _)| *d <= 3 && *d * 3 < name.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.clone())
}

/// Levenshtein distance between two names, by bytes.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = if ca == cb {
                diag
            } else {
                1 + diag.min(up).min(row[j])
            };
            diag = up;
        }
    }
    row[b.len()]
}

/// Applies `SEPP_SECTION__FIELD=value` overrides. The value is read as a TOML value when it
/// parses as one (numbers, booleans, quoted strings), otherwise as a bare string. Only scalar keys
/// of the fixed sections can be overridden. Returns the keys set, as (`section.field`,
/// variable name).
fn apply_env(
    table: &mut toml::Table,
    env: &[(String, String)],
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut set = Vec::new();
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("SEPP_") else {
            continue;
        };
        if rest == "CONFIG" || rest == "LOG" {
            continue;
        }
        // Only SEPP_SECTION__FIELD names are overrides; the other SEPP_* variables do not
        // change the config (`unknown_variables` names those sepp does not read, for a warning).
        let Some((section, field)) = rest.split_once("__") else {
            continue;
        };
        let section = section.to_ascii_lowercase();
        let field = field.to_ascii_lowercase();
        if !ENV_SECTIONS.contains(&section.as_str()) {
            return Err(ConfigError(format!(
                "environment variable {name}: unknown section {section:?}, expected one of {}",
                ENV_SECTIONS.join(", ")
            )));
        }
        let value = parse_env_value(raw);
        if matches!(value, toml::Value::Array(_) | toml::Value::Table(_)) {
            return Err(ConfigError(format!(
                "environment variable {name}: only scalar keys can be set from the environment; put lists in the config file"
            )));
        }
        let entry = table
            .entry(section.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(sec) = entry else {
            return Err(ConfigError(format!("config key {section} must be a table")));
        };
        set.push((format!("{section}.{field}"), name.clone()));
        sec.insert(field, value);
    }
    Ok(set)
}

fn parse_env_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

/// A `listen_addr`: an IP address and a port, as text. Serde's own message for a bad one
/// ("invalid socket address syntax") shows neither the value nor the form; this one shows both,
/// and says that a host name such as `localhost` is not looked up.
fn socket_addr<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = SocketAddr;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "an IP address and port as a string ({SOCKET_ADDR_FORM})")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SocketAddr, E> {
            v.parse().map_err(|_| {
                E::custom(format!(
                    "{v:?} is not an IP address and port ({SOCKET_ADDR_FORM}); host names are \
                     not resolved"
                ))
            })
        }
    }
    d.deserialize_str(Text)
}

const SOCKET_ADDR_FORM: &str =
    "e.g. \"127.0.0.1:50051\", \"0.0.0.0:50051\" for every interface, or \"[::1]:50051\"";

/// The commented example printed by `sepp config example`. Its values are the compiled
/// defaults; a test parses it back and compares it with [`Config::default`].
pub const EXAMPLE: &str = include_str!("config_example.toml");

/// How the PostgreSQL server's certificate is checked (`sslmode` of `storage.postgres_url`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PostgresVerify {
    /// `disable`, `prefer` or `require`: as libpq, verified only when a CA file is given.
    Libpq,
    /// `verify-ca`: chain only.
    Ca,
    /// `verify-full`: chain and host name.
    Full,
}

/// Parses a libpq connection string, `sslmode=verify-ca|verify-full` included (tokio-postgres
/// alone refuses them).
///
/// # Errors
/// The driver's message when the string is not a valid connection string.
pub(crate) fn parse_postgres_url(
    url: &str,
) -> Result<(tokio_postgres::Config, PostgresVerify), String> {
    let (text, verify) = if url.contains("sslmode=verify-full") {
        (
            url.replace("sslmode=verify-full", "sslmode=require"),
            PostgresVerify::Full,
        )
    } else if url.contains("sslmode=verify-ca") {
        (
            url.replace("sslmode=verify-ca", "sslmode=require"),
            PostgresVerify::Ca,
        )
    } else {
        (url.to_string(), PostgresVerify::Libpq)
    };
    let cfg = text
        .parse::<tokio_postgres::Config>()
        .map_err(|e| e.to_string())?;
    Ok((cfg, verify))
}

#[cfg(test)]
#[allow(clippy::field_reassign_with_default)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, String> {
        Config::from_toml_with_env(text, &[])
            .map(|l| l.config)
            .map_err(|e| e.0)
    }

    #[test]
    fn example_config_parses_to_the_compiled_defaults() {
        // The example declares no queue (its `[[queues]]` entry is commented out), so it is
        // the defaults exactly.
        let parsed = load(EXAMPLE).expect("example parses");
        assert_eq!(parsed, Config::default());
    }

    #[test]
    fn a_toml_syntax_error_gives_the_line_and_column_on_one_line() {
        let err = load("# limits\n[limits]\n[storage\npersist_mode = 1\n").unwrap_err();
        assert_eq!(
            err,
            "config line 3, column 9: not valid TOML: unclosed table, expected `]`"
        );
        let err = Config::from_toml_at(
            "[limits]\nmax_enqueue_batch = \"é\" 3\n",
            Some(Path::new("/etc/sepp/sepp.toml")),
            &[],
        )
        .unwrap_err()
        .0;
        assert!(
            err.starts_with("/etc/sepp/sepp.toml:2:25: not valid TOML: "),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn a_value_of_the_wrong_type_is_named_in_the_key_terms() {
        for (text, want) in [
            (
                "[limits]\nmax_payload_bytes = \"1MB\"\n",
                "config key limits.max_payload_bytes: \"1MB\" is not a number of bytes (an \
                 integer, e.g. 1048576 for 1 MiB)",
            ),
            (
                "[server]\nidle_timeout_ms = \"5m\"\n",
                "config key server.idle_timeout_ms: \"5m\" is not a number of milliseconds (an \
                 integer, e.g. 30000 for 30 seconds)",
            ),
            (
                "[storage]\ndedup_window_ms = 1.5\n",
                "config key storage.dedup_window_ms: 1.5 is not a number of milliseconds (an \
                 integer, e.g. 30000 for 30 seconds)",
            ),
            (
                "[limits]\nmax_enqueue_batch = \"many\"\n",
                "config key limits.max_enqueue_batch: \"many\" is not a whole number (an \
                 integer, e.g. 10)",
            ),
            (
                "[limits]\nmax_payload_bytes = -1\n",
                "config key limits.max_payload_bytes: -1 is not a number of bytes (an integer \
                 from 0 to 9223372036854775807)",
            ),
            (
                "[limits]\nmax_queue_name_bytes = 5000000000\n",
                "config key limits.max_queue_name_bytes: 5000000000 is not a number of bytes \
                 (an integer from 0 to 4294967295)",
            ),
            (
                "[[queues]]\nname = \"q\"\nmax_payload_bytes = \"2MB\"\n",
                "config key queues[0].max_payload_bytes: \"2MB\" is not a number of bytes (an \
                 integer, e.g. 1048576 for 1 MiB)",
            ),
            (
                "[server]\nstrict_queues = \"yes\"\n",
                "config key server.strict_queues: \"yes\" is not true or false",
            ),
            (
                "[tracing]\nsample_ratio = \"half\"\n",
                "config key tracing.sample_ratio: \"half\" is not a number (e.g. 0.5)",
            ),
        ] {
            assert_eq!(load(text).unwrap_err(), want, "{text}");
        }
    }

    #[test]
    fn a_mistyped_key_is_refused_naming_the_nearest_key() {
        let e = load("[storage]\npersist_mod = \"sync_all\"\n").unwrap_err();
        assert!(
            e.starts_with(
                "config key storage.persist_mod: unknown key `persist_mod`: did you mean \
                 `persist_mode`? This section's keys: `persist_mode`, `dead_letter_retention_ms`"
            ),
            "{e}"
        );
        let e = load("[server]\nzzz = 1\n").unwrap_err();
        assert!(
            e.starts_with("config key server.zzz: unknown key `zzz`. This section's keys: `"),
            "{e}"
        );
        assert!(!e.contains("did you mean"), "{e}");
    }

    #[test]
    fn a_wrong_value_of_an_enum_key_is_named_with_the_values_allowed() {
        for (text, want) in [
            (
                "[storage]\npersist_mode = \"sometimes\"\n",
                "config key storage.persist_mode: \"sometimes\" is not one of \"sync_all\", \
                 \"sync_data\", \"buffer\"",
            ),
            (
                "[storage]\npersist_mode = 3\n",
                "config key storage.persist_mode: 3 is not one of \"sync_all\", \"sync_data\", \
                 \"buffer\"",
            ),
            (
                "[storage]\npersist_mode = true\n",
                "config key storage.persist_mode: true is not one of \"sync_all\", \
                 \"sync_data\", \"buffer\"",
            ),
            (
                "[storage]\npersist_mode = \"SYNC_ALL\"\n",
                "config key storage.persist_mode: \"SYNC_ALL\" is not one of \"sync_all\", \
                 \"sync_data\", \"buffer\"",
            ),
            // Other enum keys alike, in a list of tables too.
            (
                "[storage]\nbackend = 1\n",
                "config key storage.backend: 1 is not one of \"embedded\", \"postgres\"",
            ),
            (
                "[[queues]]\nname = \"a\"\n[[queues]]\nname = \"b\"\nkey_conflict = \"fail\"\n",
                "config key queues[1].key_conflict: \"fail\" is not one of \"ignore\", \
                 \"reject\"",
            ),
        ] {
            assert_eq!(load(text).unwrap_err(), want, "{text}");
        }
        // From the environment: the variable is named too.
        let env = vec![("SEPP_STORAGE__PERSIST_MODE".to_string(), "3".to_string())];
        let err = Config::from_toml_with_env("", &env).unwrap_err().0;
        assert!(
            err.starts_with("config key storage.persist_mode: ")
                && err.contains("is not one of \"sync_all\", \"sync_data\", \"buffer\"")
                && err.ends_with("(from SEPP_STORAGE__PERSIST_MODE)"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_is_named() {
        let err = load("[limits]\nmax_enqueue_btch = 3\n").unwrap_err();
        assert!(err.contains("limits"), "{err}");
        assert!(err.contains("max_enqueue_btch"), "{err}");
    }

    #[test]
    fn wrong_type_names_key_and_expectation() {
        let err = load("[limits]\nmax_enqueue_batch = \"many\"\n").unwrap_err();
        assert!(err.contains("limits.max_enqueue_batch"), "{err}");
        assert!(err.contains("many"), "{err}");
    }

    #[test]
    fn a_request_buffer_smaller_than_one_message_is_rejected_naming_both_keys() {
        let err = load("[server]\nrequest_buffer_bytes = 1000000\n").unwrap_err();
        assert!(
            err.contains("server.request_buffer_bytes = 1000000"),
            "{err}"
        );
        assert!(err.contains("limits.max_message_bytes = 16777216"), "{err}");
        load("[server]\nrequest_buffer_bytes = 1000000\n[limits]\nmax_message_bytes = 999995\nmax_payload_bytes = 65536\n")
            .expect("a budget of one largest message plus its header is enough");
    }

    #[test]
    fn a_reply_buffer_smaller_than_one_message_is_rejected_naming_both_keys() {
        let err = load("[server]\nreply_buffer_bytes = 1000000\n").unwrap_err();
        assert!(err.contains("server.reply_buffer_bytes = 1000000"), "{err}");
        assert!(err.contains("limits.max_message_bytes = 16777216"), "{err}");
        let err = load("[server]\nreply_buffer_bytes = 1000\n").unwrap_err();
        assert!(err.contains("server.reply_buffer_bytes"), "{err}");
        load("[server]\nreply_buffer_bytes = 1000000\n[limits]\nmax_message_bytes = 999995\nmax_payload_bytes = 65536\n")
            .expect("a budget of one largest message plus its header is enough");
    }

    #[test]
    fn the_session_secret_is_checked_and_never_printed() {
        let err = load("[admin_ui]\nsession_secret = \"short\"\n").unwrap_err();
        assert!(err.contains("admin_ui.session_secret is 5 bytes"), "{err}");
        let err = load("[admin_ui]\nsession_ttl_ms = 1000\n").unwrap_err();
        assert!(err.contains("admin_ui.session_ttl_ms = 1000"), "{err}");
        let secret = "0123456789abcdef0123456789abcdef";
        let c = Config::from_toml_with_env(
            "",
            &[(
                "SEPP_ADMIN_UI__SESSION_SECRET".to_string(),
                secret.to_string(),
            )],
        )
        .expect("a 32-byte secret from the environment")
        .config;
        let s = c.admin_ui.session_secret.clone().expect("set");
        assert_eq!(s.expose(), secret.as_bytes());
        assert!(!format!("{c:?}").contains(secret));
        assert!(!c.to_toml().unwrap().contains(secret));
    }

    #[test]
    fn tls_cert_without_key_is_rejected() {
        let err = load("[server]\ntls_cert_path = \"/tmp/c.pem\"\n").unwrap_err();
        assert!(err.contains("server.tls_key_path"), "{err}");
    }

    #[test]
    fn ignored_sections_are_reported() {
        let l = Config::from_toml_with_env("[admin]\nenabled = true\n[cluster]\nx = 1\n", &[])
            .expect("accepted");
        assert_eq!(
            l.ignored_sections,
            vec!["admin".to_string(), "cluster".to_string()]
        );
    }

    /// `[metrics]`, `[logging]` and `[tracing]` take our keys, ignore (and report) any other
    /// key a public sepp config may carry, and take `SEPP_*` overrides.
    #[test]
    fn operations_sections_take_their_keys_and_ignore_others() {
        let text = "[metrics]\nenabled = true\nlisten_addr = \"127.0.0.1:0\"\nfoo = 1\n\
                    [logging]\nlevel = \"debug\"\nformat = \"json\"\n\
                    [tracing]\notlp_endpoint = \"http://127.0.0.1:4317\"\nbar = \"x\"\n";
        let env = vec![(
            "SEPP_METRICS__MAX_QUEUE_LABELS".to_string(),
            "7".to_string(),
        )];
        let l = Config::from_toml_with_env(text, &env).expect("accepted");
        assert!(l.ignored_sections.is_empty());
        assert_eq!(
            l.ignored_keys,
            vec!["metrics.foo".to_string(), "tracing.bar".to_string()]
        );
        let c = l.config;
        assert!(c.metrics.enabled);
        assert_eq!(c.metrics.listen_addr.port(), 0);
        assert_eq!(c.metrics.max_queue_labels, 7);
        assert_eq!(c.logging.level, "debug");
        assert_eq!(c.logging.format, LogFormat::Json);
        assert_eq!(
            c.tracing.endpoint().as_deref(),
            Some("http://127.0.0.1:4317")
        );
        let err = load("[tracing]\nsample_ratio = 1.5\n").unwrap_err();
        assert!(err.contains("tracing.sample_ratio"), "{err}");
        let err = load("[metrics]\nmax_queue_labels = 0\n").unwrap_err();
        assert!(err.contains("metrics.max_queue_labels"), "{err}");
    }

    #[test]
    fn env_overrides_file() {
        let env = vec![
            (
                "SEPP_STORAGE__PERSIST_MODE".to_string(),
                "buffer".to_string(),
            ),
            (
                "SEPP_LIMITS__MAX_ENQUEUE_BATCH".to_string(),
                "7".to_string(),
            ),
            (
                "SEPP_SERVER__LISTEN_ADDR".to_string(),
                "127.0.0.1:0".to_string(),
            ),
        ];
        let l = Config::from_toml_with_env("[limits]\nmax_enqueue_batch = 3\n", &env).expect("ok");
        assert_eq!(l.config.storage.persist_mode, PersistMode::Buffer);
        assert_eq!(l.config.limits.max_enqueue_batch, 7);
        assert_eq!(l.config.server.listen_addr.port(), 0);
    }

    #[test]
    fn other_sepp_variables_are_ignored_but_unknown_sections_are_not() {
        let env = vec![(
            "SEPP_TEST_SERVER_BIN".to_string(),
            "/usr/bin/sepp".to_string(),
        )];
        assert!(Config::from_toml_with_env("", &env).is_ok());
        let env = vec![(
            "SEPP_STORGE__PERSIST_MODE".to_string(),
            "buffer".to_string(),
        )];
        let err = Config::from_toml_with_env("", &env).unwrap_err().0;
        assert!(err.contains("SEPP_STORGE__PERSIST_MODE"), "{err}");
    }

    #[test]
    fn postgres_backend_needs_a_url_and_the_env_sets_it() {
        let err = load("[storage]\nbackend = \"postgres\"\n").unwrap_err();
        assert!(err.contains("storage.postgres_url"), "{err}");
        let env = vec![(
            "SEPP_STORAGE__POSTGRES_URL".to_string(),
            "postgres://sepp:s3cret@db1:5432,db2:5433/sepp?target_session_attrs=read-write"
                .to_string(),
        )];
        let l =
            Config::from_toml_with_env("[storage]\nbackend = \"postgres\"\n", &env).expect("ok");
        assert_eq!(l.config.storage.backend, StorageBackend::Postgres);
        let url = l.config.storage.postgres_url.clone().expect("url");
        assert!(url.expose().contains("s3cret"));
        let printed = l.config.to_toml().expect("toml");
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(printed.contains("sepp:***@db1:5432,db2:5433"), "{printed}");
        assert!(!format!("{:?}", l.config).contains("s3cret"));
        let err =
            load("[storage]\npostgres_url = \"postgres://u:pw@h:notaport/db\"\n").unwrap_err();
        assert!(err.contains("storage.postgres_url"), "{err}");
        assert!(!err.contains(":pw@"), "{err}");
    }

    #[test]
    fn postgres_tls_keys_are_taken() {
        let l = load(
            "[storage]\nbackend = \"postgres\"\n\
             postgres_url = \"postgres://u@h/db?sslmode=verify-full\"\n\
             postgres_ca_file = \"/etc/sepp/pg-ca.pem\"\n",
        )
        .expect("verify-full is a valid sslmode");
        assert_eq!(
            l.storage.postgres_ca_file.as_deref(),
            Some(std::path::Path::new("/etc/sepp/pg-ca.pem"))
        );
        let err =
            load("[storage]\npostgres_url = \"postgres://u@h/db?sslmode=verify\"\n").unwrap_err();
        assert!(err.contains("storage.postgres_url"), "{err}");
    }

    #[test]
    fn passwords_are_redacted_in_every_form() {
        for (raw, want) in [
            ("postgres://u:pw@h/db", "postgres://u:***@h/db"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            (
                "postgresql://u:p%40w@h1,h2/db?sslmode=disable",
                "postgresql://u:***@h1,h2/db?sslmode=disable",
            ),
            (
                "postgres://h/db?user=u&password=pw&x=1",
                "postgres://h/db?user=u&password=***&x=1",
            ),
            (
                "host=h user=u password=pw dbname=d",
                "host=h user=u password=*** dbname=d",
            ),
            (
                "host=h password='p w\\'x' dbname=d",
                "host=h password=*** dbname=d",
            ),
        ] {
            assert_eq!(PostgresUrl::new(raw).redacted(), want, "{raw}");
        }
    }

    #[test]
    fn a_listen_addr_that_is_not_an_ip_and_port_is_shown_with_the_form_expected() {
        for section in ["server", "admin_ui", "metrics"] {
            let err =
                load(&format!("[{section}]\nlisten_addr = \"localhost:21071\"\n")).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "config key {section}.listen_addr: \"localhost:21071\" is not an IP \
                     address and port (e.g. \"127.0.0.1:50051\""
                )),
                "{err}"
            );
            assert!(err.contains("host names are not resolved"), "{err}");
            let err = load(&format!("[{section}]\nlisten_addr = 21071\n")).unwrap_err();
            assert!(
                err.contains(&format!(
                    "config key {section}.listen_addr: invalid type: integer"
                )) && err.contains("\"127.0.0.1:50051\""),
                "{err}"
            );
        }
        let env = vec![(
            "SEPP_SERVER__LISTEN_ADDR".to_string(),
            "localhost:21071".to_string(),
        )];
        let err = Config::from_toml_with_env("", &env).unwrap_err().0;
        assert!(
            err.contains("server.listen_addr: \"localhost:21071\""),
            "{err}"
        );
        // Both families still parse.
        for ok in ["0.0.0.0:1", "[::1]:50051", "127.0.0.1:0"] {
            let c = load(&format!("[server]\nlisten_addr = \"{ok}\"\n")).unwrap();
            assert_eq!(c.server.listen_addr, ok.parse::<SocketAddr>().unwrap());
        }
    }

    #[test]
    fn a_bad_value_from_the_environment_names_the_variable() {
        let env = |name: &str, value: &str| vec![(name.to_string(), value.to_string())];
        let err = Config::from_toml_with_env(
            "[limits]\nmax_payload_bytes = 1024\n",
            &env("SEPP_LIMITS__MAX_PAYLOAD_BYTES", "abc"),
        )
        .unwrap_err()
        .0;
        assert!(
            err.starts_with("config key limits.max_payload_bytes: "),
            "{err}"
        );
        assert!(
            err.ends_with(" (from SEPP_LIMITS__MAX_PAYLOAD_BYTES)"),
            "{err}"
        );
        // A range error, and an unknown key, from the environment.
        let err = Config::from_toml_with_env("", &env("SEPP_SERVER__IDLE_TIMEOUT_MS", "5"))
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            "config key server.idle_timeout_ms = 5 is out of range: allowed 1000 to 86400000 \
             (from SEPP_SERVER__IDLE_TIMEOUT_MS)"
        );
        let err = Config::from_toml_with_env("", &env("SEPP_LIMITS__MAX_PAYLOAD_BYTE", "5"))
            .unwrap_err()
            .0;
        assert!(
            err.ends_with("(from SEPP_LIMITS__MAX_PAYLOAD_BYTE)"),
            "{err}"
        );
        // The same mistake in the file names no variable.
        let err = load("[limits]\nmax_payload_bytes = \"abc\"\n").unwrap_err();
        assert!(!err.contains("(from"), "{err}");
    }

    #[test]
    fn a_sepp_variable_sepp_does_not_read_is_reported_with_the_nearest_name() {
        let env: Vec<(String, String)> = [
            "SEPP_STORAGE_PERSIST_MODE",
            "SEPP_API_KEYS",
            "SEPP_WHATEVER",
            "SEPP_STORAGE__PERSIST_MODE",
            "SEPP_CONFIG",
            "SEPP_LOG",
            "SEPP_SERVER",
            "SEPP_TEST_BACKEND",
            "SEPP_TEST_SERVER_BIN",
            "SEPP_BENCH_BIN",
            "SEPP_BENCHMARK",
            "PATH",
        ]
        .iter()
        .map(|n| (n.to_string(), "x".to_string()))
        .collect();
        let found = unknown_variables(&env, &["SEPP_SERVER".into(), "SEPP_API_KEY".into()]);
        let lines: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(
            lines,
            vec![
                "environment variable SEPP_STORAGE_PERSIST_MODE is not one sepp reads and is \
                 ignored; did you mean SEPP_STORAGE__PERSIST_MODE?",
                "environment variable SEPP_API_KEYS is not one sepp reads and is ignored; did \
                 you mean SEPP_API_KEY?",
                "environment variable SEPP_WHATEVER is not one sepp reads and is ignored \
                 (config overrides are SEPP_<SECTION>__<KEY>, with two underscores)",
                // Only the prefix with its underscore is skipped.
                "environment variable SEPP_BENCHMARK is not one sepp reads and is ignored \
                 (config overrides are SEPP_<SECTION>__<KEY>, with two underscores)",
            ]
        );
        // Every field of every section is an override name.
        let names: Vec<String> = override_names().collect();
        for n in [
            "SEPP_SERVER__LISTEN_ADDR",
            "SEPP_LIMITS__MAX_REASON_BYTES",
            "SEPP_ADMIN_UI__SESSION_TTL_MS",
            "SEPP_TRACING__SAMPLE_RATIO",
        ] {
            assert!(names.contains(&n.to_string()), "{n} in {names:?}");
        }
    }

    #[test]
    fn env_with_bad_value_is_named() {
        let env = vec![(
            "SEPP_STORAGE__PERSIST_MODE".to_string(),
            "sometimes".to_string(),
        )];
        let err = Config::from_toml_with_env("", &env).unwrap_err().0;
        assert!(err.contains("storage.persist_mode"), "{err}");
        assert!(err.contains("sometimes"), "{err}");
    }
}
