//! Several service processes on one cluster: one admits at a time; when it is killed the
//! other takes over, and nobody is admitted twice.

use std::process::{Child, Stdio};
use std::time::Duration;

use redis::AsyncCommands as _;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::common::on_both_forms;
use crate::common::{
    active_tickets, eventually, free_port, in_form, numbered_active, test_config, unique,
    ADMIN_TOKEN,
};

struct Instance {
    child: Option<Child>,
    base: String,
    id: String,
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start(prefix: &str, id: &str) -> Instance {
    let port = free_port();
    let child = crate::common::procs::dies_with_test(env!("CARGO_BIN_EXE_waitroom"))
        .arg("serve")
        .env("WAITROOM_ENV", "development")
        .env("WAITROOM_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .env("WAITROOM_KEY_PREFIX", prefix)
        .env("WAITROOM_INSTANCE_ID", id)
        .env("WAITROOM_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("WAITROOM_CLIENT_RATE_PER_SECOND", "0")
        .env("WAITROOM_ADMISSION_TICK_MS", "50")
        .env("WAITROOM_LEASE_MS", "1500")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("waitroom binary starts");
    Instance {
        child: Some(child),
        base: format!("http://127.0.0.1:{port}"),
        id: id.to_owned(),
    }
}

async fn stats(http: &reqwest::Client, base: &str, ev: &str) -> Option<Value> {
    let r = http
        .get(format!("{base}/admin/v1/events/{ev}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .ok()?;
    (r.status() == StatusCode::OK)
        .then(|| r.json::<Value>())?
        .await
        .ok()
        .map(|v| v["stats"].clone())
}

on_both_forms!(
    tokio::test(flavor = "multi_thread", worker_threads = 2),
    hand_over:
    killing_the_admitting_instance_hands_admission_to_the_other_without_double_admission,
    /// The same on a numbered line: its tick moves a boundary, fenced by the lease as the sorted
    /// sets' moves are, and the survivor takes it from where the dead leader left it.
    on_a_numbered_line_killing_the_admitting_instance_hands_admission_to_the_other
);

async fn hand_over(form: &str) {
    let prefix = unique("t");
    let (a, b) = (start(&prefix, "inst-a"), start(&prefix, "inst-b"));
    let mut instances = vec![a, b];
    let http = reqwest::Client::new();
    for i in &instances {
        let health = format!("{}/healthz", i.base);
        eventually(Duration::from_secs(30), "instance up", || {
            let (http, health) = (http.clone(), health.clone());
            async move {
                http.get(&health)
                    .send()
                    .await
                    .ok()
                    .filter(|r| r.status().is_success())
                    .map(|_| ())
            }
        })
        .await;
    }

    // 300 people enter through both instances while admission is held back.
    let ev = unique("e");
    let r = http
        .put(format!("{}/admin/v1/events/{ev}", instances[0].base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&in_form(
            form,
            json!({"shards": 4, "admit_per_second": 0, "active_capacity": 10000}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    for n in 0..300 {
        let base = &instances[n % 2].base;
        let r = http
            .post(format!("{base}/v1/events/{ev}/queue"))
            .json(&json!({"user_id": format!("u{n}")}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    http.put(format!("{}/admin/v1/events/{ev}", instances[1].base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"admit_per_second": 40}))
        .send()
        .await
        .unwrap();

    // Admission is under way; find the leader and kill it (SIGKILL: no lease release).
    let base0 = instances[0].base.clone();
    let leader = eventually(Duration::from_secs(15), "admission started", || {
        let (http, base0, ev) = (http.clone(), base0.clone(), ev.clone());
        async move {
            let s = stats(&http, &base0, &ev).await?;
            (s["admitted_total"].as_u64()? >= 20)
                .then(|| s["admission_leader"].as_str().map(str::to_owned))?
        }
    })
    .await;
    let li = instances
        .iter()
        .position(|i| i.id == leader)
        .expect("leader is one of ours");
    let mut dead = instances.remove(li);
    dead.child.as_mut().unwrap().kill().unwrap();
    dead.child.take().unwrap().wait().unwrap();
    let survivor = instances.remove(0);

    // The survivor takes over and admits everyone.
    let base = survivor.base.clone();
    let final_stats = eventually(
        Duration::from_secs(40),
        "everyone admitted by the survivor",
        || {
            let (http, base, ev) = (http.clone(), base.clone(), ev.clone());
            async move {
                let s = stats(&http, &base, &ev).await?;
                (s["admitted_total"] == 300).then_some(s)
            }
        },
    )
    .await;
    assert_eq!(final_stats["admission_leader"], survivor.id.as_str());
    assert_eq!(final_stats["waiting"], 0);
    assert_eq!(final_stats["active"], 300);

    // Nobody admitted twice: the counters (bumped atomically with each move) equal the number
    // of distinct people in the active sets, which equals the number who entered.
    let cfg = waitroom::config::Config {
        ..test_config(&prefix)
    };
    let redis = waitroom::redis::connect(&cfg.redis).await.unwrap();
    let keys = waitroom::redis::keys::Keys::new(prefix.clone());
    let config = http
        .get(format!("{base}/admin/v1/events/{ev}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap()["config"]
        .clone();
    if form == "numbered" {
        // One boundary over the line: 300 distinct people between the first live session and
        // it, none departed.
        assert_eq!(
            numbered_active(&redis, &keys, &ev, &config).await.len(),
            300
        );
        return;
    }
    let tags: Vec<String> = serde_json::from_value(config["shard_tags"].clone()).unwrap();
    let active = active_tickets(&redis, &keys, &tags).await;
    assert_eq!(active.len(), 300);
    let mut counted = 0u64;
    for t in &tags {
        counted += redis
            .clone()
            .get::<_, Option<u64>>(keys.shard(t).admitted)
            .await
            .unwrap()
            .unwrap_or(0);
    }
    assert_eq!(counted, 300);
}
