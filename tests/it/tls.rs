//! The service over TLS with credentials, as on ElastiCache (in-transit encryption + AUTH) and
//! RDS (`sslmode=verify-full`): a whole sale against the TLS stack of `scripts/stack tls-up`
//! (a TLS-only Redis Cluster with `requirepass`, PostgreSQL with `hostssl` only), and clear
//! start-up errors for a wrong password and an untrusted certificate.
//!
//! The stack's coordinates come from `scripts/stack tls-env`, which `scripts/test` exports as
//! `WAITROOM_TLS_TEST_*` before the tests run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use waitroom::config::{Config, Secret};

use crate::common::on_both_forms;
use crate::common::{eventually, spawn_app_with, unique};

/// The TLS stack's settings, or a panic saying how to get them.
struct TlsStack {
    nodes: Vec<String>,
    ca: PathBuf,
    database_url: String,
}

impl TlsStack {
    fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var(format!("WAITROOM_TLS_TEST_{name}")).unwrap_or_else(|_| {
                panic!(
                    "WAITROOM_TLS_TEST_{name} is not set: start the TLS stack with \
                     `scripts/stack tls-up` and export `scripts/stack tls-env` with the \
                     WAITROOM_ prefix renamed WAITROOM_TLS_TEST_ (scripts/test does both)"
                )
            })
        };
        TlsStack {
            nodes: var("REDIS_NODES").split(',').map(str::to_owned).collect(),
            ca: PathBuf::from(var("REDIS_CA_FILE")),
            database_url: var("DATABASE_URL"),
        }
    }

    fn apply(&self, c: &mut Config) {
        c.redis.nodes = self.nodes.clone();
        c.redis.ca_file = Some(self.ca.clone());
        c.db.url = Secret(self.database_url.clone());
    }
}

on_both_forms!(
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    a_sale_runs_end_to_end_over_tls_with_credentials_in:
    a_sale_runs_end_to_end_over_tls_with_credentials,
    /// The numbered line over TLS: its batches of enters and their replicas' `WAIT` go on
    /// direct connections of their own to the event's primary, and its polls read the line's
    /// figures, each a path the sorted sets' sale does not take.
    on_a_numbered_line_a_sale_runs_end_to_end_over_tls_with_credentials
);

async fn a_sale_runs_end_to_end_over_tls_with_credentials_in(form: &str) {
    let stack = TlsStack::from_env();
    assert!(
        stack.nodes.iter().all(|n| n.starts_with("rediss://")),
        "the TLS stack's nodes are rediss:// URLs"
    );
    assert!(stack.database_url.contains("sslmode=verify-full"));
    let app = spawn_app_with(|c| stack.apply(c)).await;

    // /readyz checks Redis, PostgreSQL (migrated over TLS) and Kafka.
    let ready = app.get("/readyz").await;
    assert_eq!(
        ready.status(),
        StatusCode::OK,
        "{}",
        ready.text().await.unwrap()
    );

    let (ev, show) = (unique("tls"), unique("tlsshow"));
    app.create_event(
        &ev,
        json!({"shards": 4, "admit_per_second": 1000, "line_form": form}),
    )
    .await;
    app.create_show(&show, json!({"event": ev, "seats": ["A-1", "A-2", "A-3"]}))
        .await;
    let token = app.admitted(&ev, "tls-buyer").await;

    let hold: Value = app
        .http
        .post(format!("{}/v1/shows/{show}/holds", app.base))
        .bearer_auth(&token)
        .json(&json!({"seats": ["A-1", "A-2"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let hold_id = hold["hold_id"].as_str().expect("a hold id").to_owned();
    let r = app
        .http
        .post(format!("{}/v1/shows/{show}/bookings", app.base))
        .bearer_auth(&token)
        .json(&json!({"hold_id": hold_id}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let booking: Value = r.json().await.unwrap();
    let id = booking["booking_id"].as_str().unwrap().to_owned();
    let confirmed = eventually(Duration::from_secs(20), "booking confirmed", || async {
        let b: Value = app
            .get(&format!("/v1/bookings/{id}"))
            .await
            .json()
            .await
            .unwrap();
        (b["status"] == "confirmed").then_some(b)
    })
    .await;
    assert_eq!(confirmed["seats"], json!(["A-1", "A-2"]));
    let map: Value = app.seat_map(&show).await;
    assert_eq!(map["available"], 1);
}

/// Builds the service with `tweak` over the TLS stack; returns the start-up error and how long
/// it took to come.
async fn start_up_error(tweak: impl FnOnce(&mut Config)) -> (String, Duration) {
    let stack = TlsStack::from_env();
    let mut cfg = crate::common::test_config(&unique("t"));
    stack.apply(&mut cfg);
    tweak(&mut cfg);
    let started = Instant::now();
    let built = waitroom::startup::Application::build(cfg).await;
    let err = match built {
        Ok(_) => panic!("start-up succeeded with bad credentials"),
        Err(e) => format!("{e:#}"),
    };
    (err, started.elapsed())
}

#[tokio::test]
async fn a_wrong_redis_password_fails_start_up_clearly_and_at_once() {
    let (err, took) = start_up_error(|c| {
        c.redis.nodes = c
            .redis
            .nodes
            .iter()
            .map(|n| {
                let host = n.rsplit_once('@').map_or(n.as_str(), |(_, h)| h);
                format!("rediss://:not-the-password@{host}")
            })
            .collect();
    })
    .await;
    assert!(
        err.contains("WRONGPASS") || err.to_lowercase().contains("auth"),
        "the error names authentication: {err}"
    );
    assert!(took < Duration::from_secs(30), "no hang: {took:?}");
    assert!(
        !err.contains("not-the-password"),
        "the password is not shown: {err}"
    );
}

#[tokio::test]
async fn an_untrusted_redis_certificate_fails_start_up_clearly_and_at_once() {
    // The server's own certificate is no certificate authority: nothing it would sign, and not
    // the CA that signed the nodes' certificates.
    let stack = TlsStack::from_env();
    let (err, took) = start_up_error(|c| {
        let dir = c
            .redis
            .ca_file
            .as_ref()
            .unwrap()
            .parent()
            .unwrap()
            .to_owned();
        c.redis.ca_file = Some(dir.join("server.crt"));
    })
    .await;
    let lower = err.to_lowercase();
    assert!(
        lower.contains("certificate") || lower.contains("tls") || lower.contains("issuer"),
        "the error names the certificate: {err}"
    );
    for node in &stack.nodes {
        if let Some((userinfo, _)) = node.rsplit_once('@') {
            let pass = userinfo.rsplit(':').next().unwrap_or_default();
            assert!(
                pass.is_empty() || !err.contains(pass),
                "the password is not shown: {err}"
            );
        }
    }
    assert!(took < Duration::from_secs(30), "no hang: {took:?}");
}
