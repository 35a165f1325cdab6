//! `[[schedules]]` (recurring jobs) end to end: a server on a manual clock enqueues its catch-up
//! tick before it is ready, its scheduler task enqueues the next tick once the clock passes it
//! (a waiting Reserve receives the job), `ListSchedules` over real gRPC reports next and last
//! ticks from the store, `sepp schedules` prints them, and a bad schedule stops the binary with
//! one line.

mod common;

use common::{Clients, TestServer, sepp_bin};
use sepp_proto::admin::v1 as apb;
use sepp_rs::ReserveOptions;
use sepp_server::config::{QueueConfig, ScheduleConfig};
use sepp_server::queue::clock::ManualClock;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// The few instants the test uses, in milliseconds since the epoch.
fn ms(rfc: &str) -> i64 {
    match rfc {
        "2026-12-02T10:00:30Z" => 1_796_205_630_000,
        "2026-12-02T02:00:00Z" => 1_796_176_800_000,
        "2026-12-03T02:00:00Z" => 1_796_263_200_000,
        "2026-12-02T10:01:00Z" => 1_796_205_660_000,
        "2026-12-02T10:02:00Z" => 1_796_205_720_000,
        other => panic!("no epoch value for {other}"),
    }
}

fn at(t: &Option<prost_types::Timestamp>) -> Option<i64> {
    t.as_ref()
        .map(|t| t.seconds * 1000 + i64::from(t.nanos / 1_000_000))
}

fn schedules(c: &mut sepp_server::config::Config) {
    c.queues.push(QueueConfig {
        name: "reports".into(),
        ..Default::default()
    });
    c.schedules.push(ScheduleConfig {
        name: "nightly".into(),
        queue: "reports".into(),
        job_type: "build-report".into(),
        cron: Some("0 3 * * *".into()),
        timezone: Some("Europe/Berlin".into()),
        payload: Some("{\"kind\":\"daily\"}".into()),
        catch_up: true,
        ..Default::default()
    });
    c.schedules.push(ScheduleConfig {
        name: "minutely".into(),
        queue: "reports".into(),
        job_type: "ping".into(),
        every_ms: Some(60_000),
        ..Default::default()
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_schedules_reports_the_catch_up_tick_and_the_next_ones() {
    // 10:00:30 UTC; the nightly run at 03:00 Berlin (02:00 UTC) was missed.
    let clock = Arc::new(ManualClock::new(ms("2026-12-02T10:00:30Z")));
    let server = TestServer::start_with_clock(clock, schedules).await;
    let mut admin = server.admin().await;
    let list = admin
        .list_schedules(apb::ListSchedulesRequest {})
        .await
        .unwrap()
        .into_inner()
        .schedules;
    assert_eq!(list.len(), 2);
    let (n, m) = (&list[0], &list[1]);
    assert_eq!(
        (n.name.as_str(), n.queue.as_str(), n.job_type.as_str()),
        ("nightly", "reports", "build-report")
    );
    assert_eq!(
        n.spec,
        Some(apb::schedule_info::Spec::Cron("0 3 * * *".into()))
    );
    assert_eq!((n.timezone.as_str(), n.catch_up), ("Europe/Berlin", true));
    assert_eq!(at(&n.next_tick), Some(ms("2026-12-03T02:00:00Z")));
    // Enqueued by the start-up pass, before the server answered.
    assert_eq!(at(&n.last_tick), Some(ms("2026-12-02T02:00:00Z")));
    assert_eq!(at(&n.last_enqueued_at), Some(ms("2026-12-02T10:00:30Z")));
    assert!(!n.last_job_id.is_empty());

    assert_eq!(m.name, "minutely");
    assert_eq!(
        m.spec,
        Some(apb::schedule_info::Spec::Every(prost_types::Duration {
            seconds: 60,
            nanos: 0
        }))
    );
    assert_eq!((m.timezone.as_str(), m.catch_up), ("UTC", false));
    assert_eq!(at(&m.next_tick), Some(ms("2026-12-02T10:01:00Z")));
    assert_eq!((m.last_tick, m.last_job_id.as_str()), (None, ""));

    // The job is a normal job with the tick's key.
    let job = admin
        .get_job(apb::GetJobRequest {
            job_id: n.last_job_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(
        job.idempotency_key.as_deref(),
        Some("schedule:nightly:2026-12-02T02:00:00.000Z")
    );
    let c = server.client().await;
    let got = c
        .reserve(ReserveOptions::new(["reports"], Duration::from_secs(600)))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, n.last_job_id);
    assert_eq!(got[0].job_type, "build-report");

    // The scheduler task: once the clock passes 10:01, its next pass (within a second)
    // enqueues the minutely tick, which a waiting Reserve receives.
    server.clock().set(ms("2026-12-02T10:01:00Z") + 5);
    let got = c
        .reserve(
            ReserveOptions::new(["reports"], Duration::from_secs(600))
                .with_wait_timeout(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "the tick's job arrived");
    assert_eq!(got[0].job_type, "ping");
    let ping = got[0].id.clone();
    let job = admin
        .get_job(apb::GetJobRequest {
            job_id: ping.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(
        job.idempotency_key.as_deref(),
        Some("schedule:minutely:2026-12-02T10:01:00.000Z")
    );
    let list = admin
        .list_schedules(apb::ListSchedulesRequest {})
        .await
        .unwrap()
        .into_inner()
        .schedules;
    assert_eq!(at(&list[1].last_tick), Some(ms("2026-12-02T10:01:00Z")));
    assert_eq!(list[1].last_job_id, ping);
    assert_eq!(at(&list[1].next_tick), Some(ms("2026-12-02T10:02:00Z")));

    // `sepp schedules`, table and JSON.
    let url = server.url();
    let run = move |json: bool| {
        let mut cmd = Command::new(sepp_bin());
        cmd.arg("schedules")
            .env("SEPP_SERVER", &url)
            .env_remove("SEPP_API_KEY")
            .env_remove("SEPP_CONFIG");
        if json {
            cmd.args(["--output", "json"]);
        }
        let out = cmd.output().expect("run sepp");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let (table, json) = tokio::task::spawn_blocking(move || (run(false), run(true)))
        .await
        .unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("NAME") && lines[0].contains("LAST_JOB"));
    assert!(
        lines[1].starts_with("nightly")
            && lines[1].contains("0 3 * * *")
            && lines[1].contains("Europe/Berlin")
            && lines[1].contains("2026-12-03T02:00:00.000Z")
            && lines[1].contains(&n.last_job_id),
        "{table}"
    );
    assert!(
        lines[2].contains("every 60000 ms") && lines[2].contains(&ping),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let s = &v["schedules"];
    assert_eq!(s[0]["name"], "nightly");
    assert_eq!(s[0]["cron"], "0 3 * * *");
    assert_eq!(s[0]["last_tick"], "2026-12-02T02:00:00.000Z");
    assert_eq!(s[0]["last_job_id"], n.last_job_id.as_str());
    assert_eq!(s[1]["every_ms"], 60_000);
    assert_eq!(s[1]["last_tick"], "2026-12-02T10:01:00.000Z");
    assert_eq!(s[0]["next_tick"], "2026-12-03T02:00:00.000Z");
    server.stop().await;
}

#[test]
fn a_bad_schedule_stops_the_binary_with_one_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.toml");
    std::fs::write(
        &p,
        "[[schedules]]\nname = \"nightly\"\nqueue = \"q\"\njob_type = \"t\"\n\
         cron = \"0 3 * * *\"\ntimezone = \"Europe/Atlantis\"\n",
    )
    .unwrap();
    let out = Command::new(sepp_bin())
        .arg("--config")
        .arg(&p)
        .current_dir(dir.path())
        .env_remove("SEPP_CONFIG")
        .env("SEPP_SERVER__LISTEN_ADDR", "127.0.0.1:0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("schedules[0].timezone")
            && lines[0].contains("\"nightly\"")
            && lines[0].contains("Europe/Atlantis"),
        "{err}"
    );
}
