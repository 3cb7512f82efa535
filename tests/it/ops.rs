//! Operations endpoints, metrics, and graceful shutdown.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::on_both_forms;
use crate::common::{spawn_app, unique};

#[tokio::test]
async fn healthz_and_readyz_report_the_stack() {
    let app = spawn_app().await;
    let health = app.get("/healthz").await;
    assert_eq!(health.status(), StatusCode::OK);
    let ready = app.get("/readyz").await;
    let status = ready.status();
    let body: Value = ready.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["checks"],
        json!({"redis": "ok", "postgres": "ok", "kafka": "ok"})
    );
}

on_both_forms!(
    tokio::test,
    metrics_show_requests_by_route_and_queue_sizes_in:
    metrics_show_requests_by_route_and_queue_sizes,
    /// The dashboards' queue sizes on a numbered line, whose tick counts the line from its
    /// boundary and bitmaps instead of the sorted sets' cardinalities.
    on_a_numbered_line_metrics_show_requests_by_route_and_queue_sizes
);

async fn metrics_show_requests_by_route_and_queue_sizes_in(form: &str) {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"shards": 2, "admit_per_second": 5, "active_capacity": 1, "line_form": form}),
    )
    .await;
    for i in 0..3 {
        app.enter_ok(&ev, &format!("u{i}")).await;
    }
    crate::common::eventually(
        std::time::Duration::from_secs(10),
        "one admitted",
        || async { (app.get_event(&ev).await["stats"]["admitted_total"] == 1).then_some(()) },
    )
    .await;
    // The leader sets its gauges after the tick's Redis work, which the stats above already
    // read: wait for them too. (This test failed once beside 12 others on 2026-12-06, its
    // message not kept; a scrape between the two is the race this read could lose.)
    let waiting = format!(r#"waitroom_queue_waiting{{event="{ev}"}} 2"#);
    let active = format!(r#"waitroom_queue_active{{event="{ev}"}} 1"#);
    let text = crate::common::eventually(
        std::time::Duration::from_secs(10),
        "the leader's gauges",
        || async {
            let text = app.metrics().await;
            (text.contains(&waiting) && text.contains(&active)).then_some(text)
        },
    )
    .await;
    assert!(
        text.lines()
            .any(|l| l.starts_with("waitroom_http_requests_total")
                && l.contains(r#"route="/v1/events/{event}/queue""#)
                && l.contains(r#"status="200""#)),
        "{text}"
    );
    assert!(
        text.contains("waitroom_http_request_duration_seconds_bucket"),
        "{text}"
    );
    assert!(text.contains(&waiting), "missing {waiting}");
    // Admission's Redis cost: at least the lease, both shards' reads and one move so far (on a
    // numbered line the lease and the tick's script, at every tick).
    let commands = format!(r#"waitroom_admission_redis_commands_total{{event="{ev}"}} "#);
    let spent: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(&commands))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("missing {commands}"));
    assert!(spent >= 4.0, "{spent}");
    assert!(text.contains(&active), "missing {active}");
    // The numbered lines' service-wide counters have a series from the start, on either form,
    // so WaitroomEntersNotReplicated and the sale dashboard's numbered-line row have one to
    // watch; nothing here was refused.
    assert!(
        text.lines()
            .any(|l| l == "waitroom_numbers_not_replicated_total 0"),
        "{text}"
    );
    for counter in [
        "waitroom_line_figures_reads_total",
        "waitroom_line_figures_bytes_total",
        "waitroom_line_figures_blocks_held_total",
        r#"waitroom_remembered_forgotten_total{cache="places"}"#,
        r#"waitroom_places_learned_total{from="index"}"#,
        r#"waitroom_places_learned_total{from="script"}"#,
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{counter} "))),
            "missing {counter}"
        );
    }
}

#[tokio::test]
async fn shutdown_releases_the_admission_lease_for_the_next_instance() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 2})).await;
    let lease = app.keys.lease(&ev);
    let mut redis = app.redis.clone();
    crate::common::eventually(std::time::Duration::from_secs(10), "lease taken", || {
        let (mut r, k) = (redis.clone(), lease.clone());
        async move {
            redis::AsyncCommands::exists::<_, bool>(&mut r, k)
                .await
                .unwrap()
                .then_some(())
        }
    })
    .await;
    app.stop().await;
    let held: bool = redis::AsyncCommands::exists(&mut redis, &lease)
        .await
        .unwrap();
    assert!(!held, "a stopped instance gives its lease back");
}

/// Runs `waitroom admin ARGS…` against the test service, as an operator would.
async fn admin(app: &crate::common::TestApp, args: &[&str]) -> anyhow::Result<()> {
    use clap::Parser as _;
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        admin: waitroom::admin_cli::AdminArgs,
    }
    let mut argv = vec![
        "admin",
        "--url",
        &app.base,
        "--admin-token",
        crate::common::ADMIN_TOKEN,
    ];
    argv.extend_from_slice(args);
    waitroom::admin_cli::run(Cli::try_parse_from(argv)?.admin).await
}

#[tokio::test]
async fn the_admin_command_line_creates_pauses_and_switches_an_event() {
    let app = spawn_app().await;
    let ev = unique("cli");
    admin(
        &app,
        &["put", &ev, "--shards", "4", "--admit-per-second", "0"],
    )
    .await
    .unwrap();
    let created = app.get_event(&ev).await;
    assert_eq!(created["config"]["shards"], 4);
    assert_eq!(created["config"]["line_form"], "numbered", "the default");
    // The sorted sets, asked for by name; a form is fixed once the event exists.
    let sorted = unique("cli");
    admin(&app, &["put", &sorted, "--line-form", "sorted_sets"])
        .await
        .unwrap();
    assert_eq!(
        app.get_event(&sorted).await["config"]["line_form"],
        "sorted_sets"
    );
    let err = admin(&app, &["put", &sorted, "--line-form", "numbered"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bad_request"), "{err}");
    admin(&app, &["pause", &ev]).await.unwrap();
    assert_eq!(app.get_event(&ev).await["config"]["state"], "paused");
    admin(&app, &["strategy", &ev, "statistical"])
        .await
        .unwrap();
    assert_eq!(
        app.get_event(&ev).await["config"]["strategy"],
        "statistical"
    );
    admin(&app, &["--json", "list"]).await.unwrap();
    admin(&app, &["show", &ev]).await.unwrap();
    // A refused change is an error with the API's code, not a silent success.
    let err = admin(&app, &["strategy", &ev, "fastest"])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bad_request"), "{err}");
    let err = admin(&app, &["show", "no-such-event"]).await.unwrap_err();
    assert!(err.to_string().contains("not_found"), "{err}");
}

#[tokio::test]
async fn the_event_list_and_an_events_shows_are_listed() {
    let app = spawn_app().await;
    let (ev, show) = (unique("list"), unique("show"));
    app.create_event(&ev, json!({"shards": 2})).await;
    app.create_show(&show, json!({"event": ev, "quantity": 50}))
        .await;
    let list: Value = app
        .http
        .get(format!("{}/admin/v1/events", app.base))
        .bearer_auth(crate::common::ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mine: Vec<&Value> = list["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"] == ev.as_str())
        .collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0]["config"]["shards"], 2);
    assert_eq!(mine[0]["stats"]["waiting"], 0);
    let unauthorized = app.get("/admin/v1/events").await;
    assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);

    let shows: Value = app
        .get(&format!("/v1/events/{ev}/shows"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        shows,
        json!({"event": ev, "shows": [{"show": show, "general_admission": true, "seats": 50}]})
    );
    let unknown = app.get("/v1/events/no-such-event/shows").await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
}

#[test]
fn serve_refuses_to_start_in_production_without_its_secrets() {
    // Production is the default: no WAITROOM_ENV, no secrets → start-up refused, naming what is
    // missing; short secrets → refused, naming the minimum; never the value.
    let run = |envs: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"));
        cmd.arg("serve")
            .env_remove("WAITROOM_ENV")
            .env_remove("WAITROOM_ADMIN_TOKEN")
            .env_remove("WAITROOM_TOKEN_SECRET")
            .env("WAITROOM_HTTP_ADDR", "127.0.0.1:0")
            .env("RUST_BACKTRACE", "0");
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&[]);
    assert!(!ok);
    assert!(
        err.contains("WAITROOM_ADMIN_TOKEN") && err.contains("required"),
        "{err}"
    );
    let (ok, err) = run(&[
        ("WAITROOM_ADMIN_TOKEN", "tiny-admin"),
        ("WAITROOM_TOKEN_SECRET", "tiny-secret"),
    ]);
    assert!(!ok);
    assert!(err.contains("at least 32"), "{err}");
    assert!(
        !err.contains("tiny-admin") && !err.contains("tiny-secret"),
        "{err}"
    );
}
