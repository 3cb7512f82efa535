//! A Redis primary killed mid-sale: 503 with Retry-After while the cluster fails over, then
//! service again without a restart, and nobody waiting is lost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;
use waitroom::redis::keys::slot;

use crate::common::procs::RedisProcs;
use crate::common::{spawn_app_with, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_primary_gives_503_during_failover_then_service_resumes_with_nobody_lost() {
    let mut cluster = RedisProcs::cluster(7100);
    let urls = cluster.urls();
    let app = spawn_app_with(|c| c.redis.nodes = urls).await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 8, "admit_per_second": 0}))
        .await;
    let tags = app.shard_tags(&ev).await;
    let mut tickets = Vec::new();
    for i in 0..200 {
        tickets.push(
            app.enter_ok(&ev, &format!("u{i}")).await["ticket"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    cluster.sync_replicas();

    // Kill the primary that serves shard 0.
    let victim = cluster.primary_for_slot(slot(&app.keys.shard(&tags[0]).waiting));
    cluster.kill(victim);
    let killed_at = Instant::now();

    // Poll until every answer is 200 again; record what clients saw on the way.
    let mut seen: HashMap<u16, usize> = HashMap::new();
    let mut retry_after_on_every_503 = true;
    let recovered_at = loop {
        let mut all_ok = true;
        for t in tickets.iter().step_by(10) {
            let r = app.poll(&ev, t).await;
            let code = r.status().as_u16();
            *seen.entry(code).or_default() += 1;
            if r.status() == StatusCode::SERVICE_UNAVAILABLE {
                retry_after_on_every_503 &= r.headers().contains_key("retry-after");
            }
            all_ok &= r.status() == StatusCode::OK;
        }
        if all_ok && seen.contains_key(&503) {
            break Instant::now();
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(40),
            "no recovery: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        seen.get(&503).copied().unwrap_or(0) > 0,
        "clients saw 503 during failover: {seen:?}"
    );
    assert!(retry_after_on_every_503);
    assert_eq!(
        seen.keys().filter(|c| **c != 200 && **c != 503).count(),
        0,
        "only 200 or 503: {seen:?}"
    );
    eprintln!(
        "failover: service back {:?} after the kill",
        recovered_at - killed_at
    );

    // Nobody waiting is lost: everyone still has a position, exactly 1..200.
    let mut positions = Vec::new();
    for t in &tickets {
        positions.push(app.poll_ok(&ev, t).await["position"].as_u64().unwrap());
    }
    positions.sort();
    assert_eq!(positions, (1..=200).collect::<Vec<_>>());
    // And the line takes new people.
    assert_eq!(app.enter_ok(&ev, "after-failover").await["position"], 201);
}
