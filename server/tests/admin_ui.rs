//! The admin web UI in a real browser: a real server (API keys on, `[admin_ui]` on), jobs
//! enqueued over gRPC, then `tests/admin_ui/browser.mjs` drives Debian's headless Chromium
//! through playwright-core against the UI, and the server's state is checked over gRPC after.
//!
//! Needs `chromium` and `npm ci` in `tests/admin_ui` (`.ci/run` installs both); run with
//! `make test-admin-ui`. Set `SEPP_TEST_UI_SHOTS=DIR` to save the screenshots of
//! docs/operations.md.

mod common;

use common::{Clients, TestServer};
use sepp_proto::admin::v1 as apb;
use sepp_rs::{EnqueueRequest, NackRetry, ReserveOptions, SeppClient};
use sepp_server::config::{ApiKey, Role, SessionSecret};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const KEY: &str = "h16a-ui-key";
/// A key of the server without the `admin` role: the UI refuses it.
const WORKER_KEY: &str = "h16-ui-worker-key";

#[tokio::test]
#[ignore = "needs chromium and tests/admin_ui/node_modules: make test-admin-ui"]
async fn the_admin_ui_in_headless_chromium() {
    let server = TestServer::start(|c| {
        c.auth.api_keys = Some(vec![
            ApiKey::new("ops", KEY),
            ApiKey {
                roles: vec![Role::Producer, Role::Worker],
                ..ApiKey::new("app", WORKER_KEY)
            },
        ]);
        c.admin_ui.session_secret = Some(SessionSecret::new("test-secret-".repeat(4)));
        c.storage.dead_letter_retention_ms = 600_000;
        c.admin_ui.enabled = true;
        c.admin_ui.listen_addr = "127.0.0.1:0".parse().unwrap();
    })
    .await;
    let ui = server.admin_ui_addr.expect("admin UI on");
    let c = SeppClient::builder(server.url())
        .api_key(KEY)
        .connect()
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = EnqueueRequest::new("mail", "send")
            .unwrap()
            .with_idempotency_key(format!("order-{i}"));
        ids.push(c.enqueue(r).await.unwrap().job_id);
    }
    let j = c
        .reserve(ReserveOptions::new(["mail"], Duration::from_secs(30)))
        .await
        .unwrap()
        .remove(0);
    c.nack(
        &j.id,
        j.attempt,
        NackRetry::DeadLetter,
        Some("bad address".into()),
    )
    .await
    .unwrap();

    // An emptied queue, for the Delete queue button.
    c.enqueue(EnqueueRequest::new("old", "t").unwrap())
        .await
        .unwrap();
    let o = c
        .reserve(ReserveOptions::new(["old"], Duration::from_secs(30)))
        .await
        .unwrap()
        .remove(0);
    c.ack(&o.id, o.attempt).await.unwrap();

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/admin_ui");
    let args = serde_json::json!({
        "base": format!("http://{ui}"),
        "apiKey": KEY,
        "workerKey": WORKER_KEY,
        "deadId": j.id,
        "keyedId": ids[1],
        "shots": std::env::var("SEPP_TEST_UI_SHOTS").ok(),
    });
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(root.join("browser.mjs"))
            .arg(args.to_string())
            .current_dir(&root)
            .output()
            .expect("run node")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "browser checks failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // What the clicks did, read over gRPC.
    let mut admin = server.admin().await;
    let mut req = tonic::Request::new(apb::GetQueueStatsRequest {
        queue: "mail".into(),
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    let stats = admin.get_queue_stats(req).await.unwrap().into_inner();
    assert!(stats.paused);
    assert_eq!((stats.ready, stats.dead_lettered), (3, 0));
    let mut req = tonic::Request::new(apb::ListQueuesRequest::default());
    req.metadata_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    let names: Vec<String> = admin
        .list_queues(req)
        .await
        .unwrap()
        .into_inner()
        .queues
        .into_iter()
        .map(|q| q.queue)
        .collect();
    assert_eq!(names, ["mail"], "the empty queue was deleted");
}
