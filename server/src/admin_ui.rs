//! The admin web UI (`[admin_ui]`, off by default): server-rendered HTML pages over the queue
//! layer's operator calls, on their own HTTP port. Pages: queues overview (`/`), a queue's
//! jobs by state (`/queues/{queue}`), job detail (`/jobs/{id}`), dead letters
//! (`/dead-letters`). Every action is a POST form carrying a CSRF token; nothing is loaded
//! from outside the binary (the stylesheet is embedded).
//!
//! Login: when auth is on (`[auth] api_keys` or `api_keys_file`), `/login` asks for an API key
//! with the `admin` role, checks it as the gRPC service does, and answers with an HttpOnly,
//! SameSite=Strict session cookie signed under `[admin_ui] session_secret` that holds the key's
//! fingerprint and an expiry, never the key (`admin_ui/session.rs`). Every request checks the signature,
//! the expiry and that the key is still accepted with the `admin` role. When auth is off,
//! `/login` hands out a signed anonymous session so that the CSRF check works the same way.

mod session;

use crate::api::auth::ApiKeyAuth;
use crate::config::AdminUiConfig;
use crate::domain::{JobInfo, JobState, ListState, Value};
use crate::queue::Queue;
use crate::queue::admin::SelectorInput;
use axum::Router;
use axum::extract::{Form, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use session::{LoginRefusal, Session, Sessions};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

const COOKIE: &str = "sepp_session";
const CSS: &str = include_str!("admin_ui/app.css");

#[derive(Clone)]
struct Ui {
    queue: Arc<Queue>,
    sessions: Arc<Sessions>,
}

/// The UI's routes over `queue`, with `[admin_ui]` settings `config` and the API keys `auth`
/// (the gRPC service's, reloaded on SIGHUP).
pub fn router(queue: Arc<Queue>, config: &AdminUiConfig, auth: ApiKeyAuth) -> Router {
    if config.session_secret.is_none() {
        tracing::warn!(
            "admin_ui.session_secret is unset: a random one is used, so admin UI sessions end \
             at a restart and only this server accepts them"
        );
    }
    let ui = Ui {
        queue,
        sessions: Arc::new(Sessions::new(
            config.session_secret.as_ref(),
            config.session_ttl_ms,
            auth,
        )),
    };
    Router::new()
        .route("/", get(queues_page))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/app.css", get(css))
        .route("/queues/{queue}", get(jobs_page))
        .route("/queues/{queue}/pause", post(pause))
        .route("/queues/{queue}/resume", post(resume))
        .route("/queues/{queue}/purge", post(purge))
        .route("/queues/{queue}/delete", post(delete_queue))
        .route("/jobs/{id}", get(job_page))
        .route("/jobs/{id}/cancel", post(cancel))
        .route("/find", get(find))
        .route("/dead-letters", get(dead_letters_page))
        .route("/dead-letters/requeue", post(dl_requeue))
        .route("/dead-letters/delete", post(dl_delete))
        .with_state(ui)
}

/// HTML-escapes `s`.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a path segment or query value.
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Ui {
    /// The session, or the response that refuses the request (a page goes to the login, a
    /// POST is refused with 403 saying why).
    #[allow(clippy::result_large_err)] // a refusal is the response itself, built once
    fn guard(&self, headers: &HeaderMap, csrf: Option<&str>) -> Result<Session, Response> {
        let checked = match cookie_value(headers) {
            Some(v) => self.sessions.check(&v, now_ms()),
            None => Err(session::Refusal::Invalid),
        };
        let s = match checked {
            Ok(s) => s,
            Err(refusal) => {
                return Err(match csrf {
                    None => Redirect::to("/login").into_response(),
                    Some(_) => (StatusCode::FORBIDDEN, refusal.message()).into_response(),
                });
            }
        };
        if csrf.is_some_and(|t| !Sessions::csrf_ok(&s, t)) {
            return Err((
                StatusCode::FORBIDDEN,
                "bad or missing CSRF token: reload the page and try again",
            )
                .into_response());
        }
        Ok(s)
    }
}

fn page(title: &str, body: &str, refresh: bool) -> Html<String> {
    let meta = if refresh {
        r#"<meta http-equiv="refresh" content="5">"#
    } else {
        ""
    };
    Html(format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}<title>{t} · sepp</title><link rel="stylesheet" href="/app.css"></head><body><header><a class="brand" href="/">sepp</a><nav><a href="/">Queues</a><a href="/dead-letters">Dead letters</a></nav><form class="find" action="/find" method="get"><input name="q" placeholder="job id, or queue/key" aria-label="find"><button>Find</button></form></header><main><h1>{t}</h1>{body}</main></body></html>"#,
        t = esc(title)
    ))
}

fn error_page(msg: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        page(
            "Error",
            &format!(r#"<p class="error">{}</p>"#, esc(msg)),
            false,
        ),
    )
        .into_response()
}

fn csrf_field(s: &Session) -> String {
    format!(r#"<input type="hidden" name="csrf" value="{}">"#, s.csrf)
}

async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

async fn login_page(State(ui): State<Ui>) -> Html<String> {
    let body = if ui.sessions.auth_on() {
        r#"<form method="post" action="/login" class="login"><label>Admin API key <input type="password" name="api_key" autocomplete="current-password" autofocus></label><button>Log in</button></form>"#
    } else {
        r#"<p>Authentication is off on this server (<code>[auth] api_keys</code> is not set).</p><form method="post" action="/login"><input type="hidden" name="api_key" value=""><button>Continue</button></form>"#
    };
    page("Log in", body, false)
}

#[derive(Deserialize)]
struct LoginForm {
    api_key: String,
}

async fn login(State(ui): State<Ui>, Form(f): Form<LoginForm>) -> Response {
    let value = match ui.sessions.login(&f.api_key, now_ms()) {
        Ok(v) => v,
        Err(refusal) => {
            let (status, msg) = match refusal {
                LoginRefusal::UnknownKey => (
                    StatusCode::UNAUTHORIZED,
                    "That is not an API key of this server.".to_string(),
                ),
                LoginRefusal::NotAdmin(name) => (
                    StatusCode::FORBIDDEN,
                    session::Refusal::NotAdmin(name).message(),
                ),
            };
            tracing::info!(outcome = "refused", reason = %msg, "admin UI login");
            return (
                status,
                page(
                    "Log in",
                    &format!(
                        r#"<p class="error">{}</p><p><a href="/login">Try again</a></p>"#,
                        esc(&msg)
                    ),
                    false,
                ),
            )
                .into_response();
        }
    };
    (
        [(
            header::SET_COOKIE,
            format!(
                "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
                ui.sessions.max_age_s()
            ),
        )],
        Redirect::to("/"),
    )
        .into_response()
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(State(ui): State<Ui>, headers: HeaderMap, Form(f): Form<CsrfForm>) -> Response {
    if let Err(r) = ui.guard(&headers, Some(&f.csrf)) {
        return r;
    }
    (
        [(
            header::SET_COOKIE,
            format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
        )],
        Redirect::to("/login"),
    )
        .into_response()
}

async fn queues_page(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let s = match ui.guard(&headers, None) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let mut rates: HashMap<String, crate::queue::rates::QueueRates> = HashMap::new();
    let mut token = String::new();
    loop {
        let r = match ui.queue.queue_rates(None, None, &token).await {
            Ok(r) => r,
            Err(e) => return error_page(&e.to_string()),
        };
        rates.extend(r.queues.into_iter().map(|q| (q.queue.clone(), q)));
        if r.next_page_token.is_empty() {
            break;
        }
        token = r.next_page_token;
    }
    let mut rows = String::new();
    let mut token = String::new();
    loop {
        let p = match ui.queue.list_queues(Some(1000), &token).await {
            Ok(p) => p,
            Err(e) => return error_page(&e.to_string()),
        };
        for (name, st) in &p.queues {
            let q = enc(name);
            let _ = write!(
                rows,
                r#"<tr data-queue="{n}"><td><a href="/queues/{q}">{n}</a></td><td class="num"><a href="/queues/{q}?state=ready">{}</a></td><td class="num"><a href="/queues/{q}?state=scheduled">{}</a></td><td class="num"><a href="/queues/{q}?state=in_flight">{}</a></td><td class="num"><a href="/dead-letters?queue={q}">{}</a></td><td class="num">{}</td><td class="rates">{}</td><td>{}</td></tr>"#,
                st.ready,
                st.scheduled,
                st.in_flight,
                st.dead_lettered,
                st.dedup_records,
                rates_cell(rates.get(name.as_str())),
                if st.paused {
                    r#"<span class="badge paused">paused</span>"#
                } else {
                    r#"<span class="badge">running</span>"#
                },
                n = esc(name),
            );
        }
        if p.next_page_token.is_empty() {
            break;
        }
        token = p.next_page_token;
    }
    if rows.is_empty() {
        rows = r#"<tr><td colspan="8">No queues yet.</td></tr>"#.into();
    }
    let body = format!(
        r#"<p class="hint">Refreshes every 5 s. Last hour: jobs per minute, summed over every server (<span class="k-enq">enqueued</span>, <span class="k-ack">acked</span>, <span class="k-nack">nacked</span>, <span class="k-dead">dead-lettered</span>); the numbers are the last complete minute.</p><table id="queues"><thead><tr><th>Queue</th><th>Ready</th><th>Scheduled</th><th>In flight</th><th>Dead letters</th><th>Keys</th><th>Last hour</th><th>State</th></tr></thead><tbody>{rows}</tbody></table><form method="post" action="/logout">{}<button class="link">Log out</button></form>"#,
        csrf_field(&s)
    );
    page("Queues", &body, true).into_response()
}

#[derive(Deserialize)]
struct JobsQuery {
    state: Option<String>,
    page_token: Option<String>,
}

fn state_param(s: Option<&str>) -> Option<(ListState, &'static str)> {
    Some(match s.unwrap_or("ready") {
        "ready" => (ListState::Ready, "ready"),
        "scheduled" => (ListState::Scheduled, "scheduled"),
        "in_flight" => (ListState::InFlight, "in_flight"),
        "dead" => (ListState::DeadLettered, "dead"),
        _ => return None,
    })
}

fn ms(t: Option<i64>) -> String {
    t.map(crate::time_fmt::rfc3339).unwrap_or_default()
}

fn state_label(s: JobState, reason: Option<&str>) -> &'static str {
    match s {
        JobState::Scheduled => "scheduled",
        JobState::Ready => "ready",
        JobState::InFlight => "in flight",
        JobState::DeadLettered => "dead-lettered",
        JobState::Acked if reason == Some(crate::queue::lifecycle::CANCELLED_REASON) => "cancelled",
        JobState::Acked => "acked",
        JobState::Deleted => "deleted",
    }
}

async fn jobs_page(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Query(q): Query<JobsQuery>,
) -> Response {
    let s = match ui.guard(&headers, None) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Some((state, sname)) = state_param(q.state.as_deref()) else {
        return error_page("state must be ready, scheduled, in_flight or dead");
    };
    let token = q.page_token.unwrap_or_default();
    let page_ = match ui.queue.list_jobs(&queue, state, Some(50), &token).await {
        Ok(p) => p,
        Err(e) => return error_page(&e.to_string()),
    };
    let stats = match ui.queue.queue_stats(&queue).await {
        Ok(s) => s,
        Err(e) => return error_page(&e.to_string()),
    };
    let qe = enc(&queue);
    let mut tabs = String::new();
    for (label, key, n) in [
        ("Ready", "ready", stats.ready),
        ("Scheduled", "scheduled", stats.scheduled),
        ("In flight", "in_flight", stats.in_flight),
        ("Dead letters", "dead", stats.dead_lettered),
    ] {
        let cls = if key == sname { " class=\"on\"" } else { "" };
        let _ = write!(
            tabs,
            r#"<a{cls} href="/queues/{qe}?state={key}">{label} ({n})</a>"#
        );
    }
    let mut rows = String::new();
    for j in &page_.jobs {
        let _ = write!(
            rows,
            r#"<tr><td><a class="mono" href="/jobs/{id}">{id}</a></td><td>{}</td><td class="num">{}</td><td class="num">{}/{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            esc(&j.job_type),
            j.priority,
            j.attempt,
            j.max_attempts,
            ms(Some(j.enqueued_at)),
            esc(j.idempotency_key.as_deref().unwrap_or("")),
            esc(j.last_reason.as_deref().unwrap_or("")),
            id = j.id,
        );
    }
    if rows.is_empty() {
        rows = r#"<tr><td colspan="7">No jobs in this state.</td></tr>"#.into();
    }
    let next = if page_.next_page_token.is_empty() {
        String::new()
    } else {
        format!(
            r#"<p><a href="/queues/{qe}?state={sname}&page_token={}">Next page →</a></p>"#,
            enc(&page_.next_page_token)
        )
    };
    let c = csrf_field(&s);
    let pause = if stats.paused {
        format!(
            r#"<span class="badge paused">paused</span> <form method="post" action="/queues/{qe}/resume">{c}<button id="resume">Resume</button></form>"#
        )
    } else {
        format!(
            r#"<form method="post" action="/queues/{qe}/pause">{c}<button id="pause">Pause</button></form>"#
        )
    };
    // Only an empty queue can be deleted (the server refuses otherwise, naming the counts).
    let delete = if stats.ready + stats.scheduled + stats.in_flight + stats.dead_lettered == 0 {
        format!(
            r#"<form method="post" action="/queues/{qe}/delete" onsubmit="return confirm('Delete this empty queue? Its paused state goes with it; its live dedup records stay until their window ends, and a new job creates the queue again.')">{c}<button id="delete-queue" class="danger">Delete queue</button></form>"#
        )
    } else {
        r#"<span class="hint">Delete queue: possible once it holds no job in any state.</span>"#
            .to_string()
    };
    let body = format!(
        r#"<div class="actions">{pause}<form method="post" action="/queues/{qe}/purge" onsubmit="return confirm('Cancel every ready and scheduled job of this queue? This cannot be undone.')">{c}<button class="danger">Purge ready and scheduled</button></form>{delete}</div><nav class="tabs">{tabs}</nav><table id="jobs"><thead><tr><th>Job id</th><th>Type</th><th>Priority</th><th>Attempt</th><th>Enqueued</th><th>Key</th><th>Last reason</th></tr></thead><tbody>{rows}</tbody></table>{next}"#
    );
    page(&format!("Queue {queue}"), &body, false).into_response()
}

async fn job_page(State(ui): State<Ui>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let s = match ui.guard(&headers, None) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let j = match ui.queue.get_job(&id).await {
        Ok(Some(j)) => j,
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                page(
                    "Job not found",
                    &format!(
                        "<p>Job <code>{}</code> is not known: it never existed, or it finished and its record is gone.</p>",
                        esc(&id)
                    ),
                    false,
                ),
            )
                .into_response();
        }
        Err(e) => return error_page(&e.to_string()),
    };
    page(&format!("Job {}", j.id), &job_detail(&j, &s), false).into_response()
}

/// The characters of a payload (or a custom string) the job page shows.
const PAYLOAD_PREVIEW_CHARS: usize = 1000;

fn job_detail(j: &JobInfo, s: &Session) -> String {
    let state = state_label(j.state, j.last_reason.as_deref());
    let mut rows = String::new();
    let mut fields: Vec<(String, String)> = [
        ("State", state.to_string()),
        ("Queue", j.queue.clone()),
        ("Type", j.job_type.clone()),
        ("Attempt", format!("{} of {}", j.attempt, j.max_attempts)),
        ("Priority", j.priority.to_string()),
        ("Enqueued", ms(Some(j.enqueued_at))),
        ("Scheduled for", ms(j.scheduled_at)),
        ("Lease expires", ms(j.lease_expires_at)),
        ("Finished", ms(j.finished_at)),
        (
            "Dead-letter cause",
            j.dead_letter_cause
                .map(|c| format!("{c:?}"))
                .unwrap_or_default(),
        ),
        ("Last reason", j.last_reason.clone().unwrap_or_default()),
        (
            "Idempotency key",
            j.idempotency_key.clone().unwrap_or_default(),
        ),
        ("Worker", j.worker_id.clone().unwrap_or_default()),
        ("Id", j.id.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // What the job carries: the payload as text (or its size and first bytes in hex), cut at
    // PAYLOAD_PREVIEW_CHARS with its full size; `sepp job ID --output json` has all of it.
    if let Some(c) = &j.content {
        if let Some(p) = &c.payload {
            fields.push(("Payload encoding".into(), p.encoding.clone()));
            fields.push((
                "Payload".into(),
                crate::payload_fmt::preview(&p.data, PAYLOAD_PREVIEW_CHARS),
            ));
        }
        for (k, v) in &c.custom {
            let v = match v {
                Value::String(s) => {
                    crate::payload_fmt::preview(s.as_bytes(), PAYLOAD_PREVIEW_CHARS)
                }
                Value::Double(d) => d.to_string(),
                Value::Int(i) => i.to_string(),
                Value::Bool(b) => b.to_string(),
            };
            fields.push((format!("Custom {k}"), v));
        }
        if let Some(t) = &c.trace_context {
            fields.push(("Trace parent".into(), t.traceparent.clone()));
            fields.push((
                "Trace state".into(),
                t.tracestate.clone().unwrap_or_default(),
            ));
        }
    }
    for (k, v) in fields {
        if !v.is_empty() {
            let _ = write!(rows, "<tr><th>{}</th><td>{}</td></tr>", esc(&k), esc(&v));
        }
    }
    let c = csrf_field(s);
    let action = match j.state {
        JobState::Ready | JobState::Scheduled => format!(
            r#"<form method="post" action="/jobs/{id}/cancel" onsubmit="return confirm('Cancel this job?')">{c}<button class="danger" id="cancel">Cancel job</button></form><p class="hint">A cancelled job's dedup record stays: a retried enqueue of its key answers this job's id and creates nothing.</p>"#,
            id = j.id
        ),
        JobState::DeadLettered => format!(
            r#"<form method="post" action="/dead-letters/requeue">{c}<input type="hidden" name="job_id" value="{id}"><input type="hidden" name="back" value="/jobs/{id}"><button id="requeue">Requeue</button></form>"#,
            id = j.id
        ),
        _ => String::new(),
    };
    format!(
        r#"<table class="detail" id="job">{rows}</table><div class="actions">{action}</div><p><a href="/queues/{}">← queue</a></p>"#,
        enc(&j.queue)
    )
}

async fn cancel(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Err(r) = ui.guard(&headers, Some(&f.csrf)) {
        return r;
    }
    match ui.queue.cancel_job(Some(&id), None).await {
        Ok(_) => Redirect::to(&format!("/jobs/{}", enc(&id))).into_response(),
        Err(e) => error_page(&e.to_string()),
    }
}

async fn pause(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    set_paused(ui, headers, queue, f, true).await
}

async fn resume(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    set_paused(ui, headers, queue, f, false).await
}

async fn set_paused(ui: Ui, headers: HeaderMap, queue: String, f: CsrfForm, p: bool) -> Response {
    if let Err(r) = ui.guard(&headers, Some(&f.csrf)) {
        return r;
    }
    match ui.queue.set_paused(&queue, p).await {
        Ok(()) => Redirect::to(&format!("/queues/{}", enc(&queue))).into_response(),
        Err(e) => error_page(&e.to_string()),
    }
}

async fn purge(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Err(r) = ui.guard(&headers, Some(&f.csrf)) {
        return r;
    }
    loop {
        match ui.queue.purge_queue(&queue, None).await {
            Ok((ids, more)) if more && !ids.is_empty() => {}
            Ok(_) => break,
            Err(e) => return error_page(&e.to_string()),
        }
    }
    Redirect::to(&format!("/queues/{}", enc(&queue))).into_response()
}

async fn delete_queue(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    Form(f): Form<CsrfForm>,
) -> Response {
    if let Err(r) = ui.guard(&headers, Some(&f.csrf)) {
        return r;
    }
    match ui.queue.delete_queue(&queue).await {
        Ok(was) => {
            tracing::warn!(
                target: "sepp::audit",
                action = "delete_queue",
                queue = %queue,
                dedup_records = was.dedup_records,
                was_paused = was.paused,
                "queue deleted by an operator (admin UI)"
            );
            Redirect::to("/").into_response()
        }
        Err(e) => error_page(&e.to_string()),
    }
}

/// The "Last hour" cell of a queue: an inline SVG sparkline of its per-minute counts (one
/// polyline per count, on one scale) and the last complete minute's numbers.
fn rates_cell(r: Option<&crate::queue::rates::QueueRates>) -> String {
    let Some(r) = r else {
        return r#"<span class="hint">no activity</span>"#.to_string();
    };
    const W: f64 = 120.0;
    const H: f64 = 24.0;
    let series: [(&str, Vec<u64>); 4] = [
        ("k-enq", r.minutes.iter().map(|c| c.enqueued).collect()),
        ("k-ack", r.minutes.iter().map(|c| c.acked).collect()),
        ("k-nack", r.minutes.iter().map(|c| c.nacked).collect()),
        (
            "k-dead",
            r.minutes.iter().map(|c| c.dead_lettered).collect(),
        ),
    ];
    let max = series
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let step = W / (r.minutes.len().max(2) - 1) as f64;
    let mut svg = format!(
        r#"<svg class="spark" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="jobs per minute, last hour">"#
    );
    for (class, v) in &series {
        if v.iter().all(|n| *n == 0) {
            continue;
        }
        let points: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let x = i as f64 * step;
                let y = (H - 1.0) - (*n as f64 / max) * (H - 2.0);
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = write!(
            svg,
            r#"<polyline class="{class}" points="{}"/>"#,
            points.join(" ")
        );
    }
    svg.push_str("</svg>");
    let last = r.last_minute();
    format!(
        r#"{svg} <span class="per-min" title="enqueued / acked / nacked / dead-lettered in the last complete minute">{} / {} / {} / {}</span>"#,
        last.enqueued, last.acked, last.nacked, last.dead_lettered
    )
}

#[derive(Deserialize)]
struct FindQuery {
    #[serde(default)]
    q: String,
}

/// `?q=ID` goes to the job; `?q=QUEUE/KEY` looks the idempotency key up.
async fn find(State(ui): State<Ui>, headers: HeaderMap, Query(f): Query<FindQuery>) -> Response {
    if let Err(r) = ui.guard(&headers, None) {
        return r;
    }
    let q = f.q.trim();
    if crate::domain::JobId::parse(q).is_some() {
        return Redirect::to(&format!("/jobs/{}", enc(q))).into_response();
    }
    let Some((queue, key)) = q.split_once('/') else {
        return error_page("enter a job id, or a queue and an idempotency key as QUEUE/KEY");
    };
    match ui.queue.lookup_idempotency_key(queue, key).await {
        Ok(Some(r)) => Redirect::to(&format!("/jobs/{}", r.job_id)).into_response(),
        Ok(None) => (
            StatusCode::NOT_FOUND,
            page(
                "Key not found",
                &format!(
                    "<p>No live dedup record for key <code>{}</code> on queue <code>{}</code>: never used, or its dedup window has passed.</p>",
                    esc(key),
                    esc(queue)
                ),
                false,
            ),
        )
            .into_response(),
        Err(e) => error_page(&e.to_string()),
    }
}

async fn dead_letters_page(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let s = match ui.guard(&headers, None) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let queue = q.get("queue").filter(|q| !q.is_empty()).cloned();
    let token = q.get("page_token").cloned().unwrap_or_default();
    let p = match ui
        .queue
        .list_dead_letters(queue.clone(), Some(100), &token)
        .await
    {
        Ok(p) => p,
        Err(e) => return error_page(&e.to_string()),
    };
    let c = csrf_field(&s);
    let mut rows = String::new();
    for d in &p.records {
        let _ = write!(
            rows,
            r#"<tr data-job="{id}"><td><input type="checkbox" name="job_id" value="{id}" form="selected"></td><td><a class="mono" href="/jobs/{id}">{id}</a></td><td>{}</td><td>{}</td><td>{:?}</td><td>{}</td><td class="num">{}</td><td>{}</td><td><form method="post" action="/dead-letters/requeue">{c}<input type="hidden" name="job_id" value="{id}"><button class="requeue">Requeue</button></form></td></tr>"#,
            esc(&d.job.queue),
            esc(&d.job.job_type),
            d.cause,
            ms(Some(d.failed_at)),
            d.final_attempt,
            esc(d.last_reason.as_deref().unwrap_or("")),
            id = d.job.id,
        );
    }
    if rows.is_empty() {
        rows = r#"<tr><td colspan="9">No dead letters.</td></tr>"#.into();
    }
    let qv = queue.as_deref().map(esc).unwrap_or_default();
    let all = match &queue {
        Some(q) => format!(
            r#"<form method="post" action="/dead-letters/requeue" onsubmit="return confirm('Requeue every dead letter of this queue?')">{c}<input type="hidden" name="queue" value="{qv}"><input type="hidden" name="all" value="1"><button>Requeue all of {qv}</button></form><form method="post" action="/dead-letters/delete" onsubmit="return confirm('Delete every dead letter of this queue for good?')">{c}<input type="hidden" name="queue" value="{qv}"><input type="hidden" name="all" value="1"><button class="danger">Delete all of {qv}</button></form>"#,
            qv = esc(q)
        ),
        None => String::new(),
    };
    let next = if p.next_page_token.is_empty() {
        String::new()
    } else {
        format!(
            r#"<p><a href="/dead-letters?queue={}&page_token={}">Next page →</a></p>"#,
            enc(queue.as_deref().unwrap_or("")),
            enc(&p.next_page_token)
        )
    };
    let body = format!(
        r#"<form class="filter" method="get" action="/dead-letters"><input name="queue" value="{qv}" placeholder="queue (all)"><button>Filter</button></form><div class="actions"><form id="selected" method="post" action="/dead-letters/requeue">{c}<button>Requeue selected</button><button formaction="/dead-letters/delete" class="danger" onclick="return confirm('Delete the selected dead letters for good?')">Delete selected</button></form>{all}</div><table id="dead-letters"><thead><tr><th></th><th>Job id</th><th>Queue</th><th>Type</th><th>Cause</th><th>Failed</th><th>Attempt</th><th>Last reason</th><th></th></tr></thead><tbody>{rows}</tbody></table>{next}"#
    );
    page("Dead letters", &body, false).into_response()
}

/// A dead-letter action's form: `job_id` (repeated) or `queue` + `all`.
fn dl_selection(form: &[(String, String)]) -> (String, SelectorInput, String) {
    let mut csrf = String::new();
    let mut sel = SelectorInput::default();
    let mut all = false;
    let mut back = "/dead-letters".to_string();
    for (k, v) in form {
        match k.as_str() {
            "csrf" => csrf = v.clone(),
            "job_id" => sel.job_ids.push(v.clone()),
            "queue" => sel.queue = Some(v.clone()),
            "all" => all = true,
            "back" if v.starts_with('/') && !v.starts_with("//") => back = v.clone(),
            _ => {}
        }
    }
    if all {
        sel.max = Some(crate::queue::admin::MAX_PAGE);
    }
    (csrf, sel, back)
}

async fn dl_requeue(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Form(form): Form<Vec<(String, String)>>,
) -> Response {
    dl_action(ui, headers, form, true).await
}

async fn dl_delete(
    State(ui): State<Ui>,
    headers: HeaderMap,
    Form(form): Form<Vec<(String, String)>>,
) -> Response {
    dl_action(ui, headers, form, false).await
}

async fn dl_action(
    ui: Ui,
    headers: HeaderMap,
    form: Vec<(String, String)>,
    requeue: bool,
) -> Response {
    let (csrf, sel, back) = dl_selection(&form);
    if let Err(r) = ui.guard(&headers, Some(&csrf)) {
        return r;
    }
    if sel.job_ids.is_empty() && sel.max.is_none() {
        return error_page("select at least one dead letter");
    }
    let repeat = sel.max.is_some();
    loop {
        let r = if requeue {
            ui.queue.requeue_dead_letters(sel.clone()).await
        } else {
            ui.queue.delete_dead_letters(sel.clone()).await
        };
        match r {
            Ok(ids) if repeat && !ids.is_empty() => {}
            Ok(_) => break,
            Err(e) => return error_page(&e.to_string()),
        }
    }
    Redirect::to(&back).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_page_shows_what_the_job_carries_escaped_and_cut() {
        use crate::domain::{DeadLetterCause, JobContent, JobId, Payload, TraceContext};
        let mut j = JobInfo {
            id: JobId(7),
            state: JobState::DeadLettered,
            queue: "mail".into(),
            job_type: "send".into(),
            attempt: 1,
            max_attempts: 1,
            priority: 0,
            enqueued_at: 0,
            scheduled_at: None,
            lease_expires_at: None,
            last_reason: None,
            finished_at: Some(1),
            dead_letter_cause: Some(DeadLetterCause::Rejected),
            idempotency_key: None,
            worker_id: None,
            content: Some(JobContent {
                payload: Some(Payload {
                    data: format!("<b>{}", "x".repeat(2000)).into_bytes(),
                    encoding: "text/html".into(),
                }),
                custom: [("tenant".to_string(), Value::String("acme".into()))]
                    .into_iter()
                    .collect(),
                trace_context: Some(TraceContext {
                    traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
                    tracestate: None,
                }),
            }),
        };
        let s = Session { csrf: "t".into() };
        let html = job_detail(&j, &s);
        assert!(
            html.contains("<tr><th>Payload encoding</th><td>text/html</td></tr>"),
            "{html}"
        );
        let cut = format!(
            "<tr><th>Payload</th><td>&lt;b&gt;{}… (2003 bytes in all)</td></tr>",
            "x".repeat(997)
        );
        assert!(html.contains(&cut), "{html}");
        assert!(
            html.contains("<tr><th>Custom tenant</th><td>acme</td></tr>"),
            "{html}"
        );
        assert!(html.contains("<th>Trace parent</th><td>00-0af7"), "{html}");
        assert!(!html.contains("Trace state"), "{html}");
        j.content = None;
        assert!(!job_detail(&j, &s).contains("Payload"));
    }

    #[test]
    fn escaping_and_tokens() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        assert_eq!(enc("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn the_rates_cell_draws_one_line_per_moving_count_and_the_last_complete_minute() {
        use crate::storage::RateCounts;
        assert!(rates_cell(None).contains("no activity"));
        let mut minutes = vec![RateCounts::default(); 60];
        minutes[57].enqueued = 4;
        minutes[58] = RateCounts {
            enqueued: 2,
            acked: 1,
            nacked: 0,
            dead_lettered: 1,
        };
        minutes[59].enqueued = 9;
        let cell = rates_cell(Some(&crate::queue::rates::QueueRates {
            queue: "q".into(),
            minutes,
        }));
        assert!(cell.starts_with(r#"<svg class="spark""#), "{cell}");
        assert_eq!(
            cell.matches("<polyline").count(),
            3,
            "no line for nacks: {cell}"
        );
        assert!(!cell.contains("k-nack"), "{cell}");
        // The tallest point (9, the current minute) is at the top, the last x at the right.
        assert!(cell.contains("120.0,1.0"), "{cell}");
        assert!(cell.contains(">2 / 1 / 0 / 1</span>"), "{cell}");
        assert!(!cell.contains("http"), "everything inline: {cell}");
    }
}
