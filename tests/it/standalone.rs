//! The same code on one non-cluster Redis (hash tags kept, detected automatically).

use std::time::Duration;

use serde_json::json;

use crate::common::procs::RedisProcs;
use crate::common::{eventually, in_form, members, spawn_app_with, unique};

#[tokio::test]
async fn the_waiting_room_runs_unchanged_on_one_non_cluster_redis() {
    runs_on_one_non_cluster_redis("sorted_sets", 7300).await;
}

#[tokio::test]
async fn a_numbered_line_runs_unchanged_on_one_non_cluster_redis() {
    runs_on_one_non_cluster_redis("numbered", 7302).await;
}

async fn runs_on_one_non_cluster_redis(form: &str, port: u16) {
    let _redis = RedisProcs::standalone(port);
    let app = spawn_app_with(|c| c.redis.nodes = vec![format!("redis://127.0.0.1:{port}")]).await;
    assert!(!app.redis.is_cluster(), "cluster mode detected as off");
    let ev = unique("e");
    app.create_event(
        &ev,
        in_form(
            form,
            json!({"shards": 4, "admit_per_second": 0, "active_capacity": 5}),
        ),
    )
    .await;
    assert_eq!(
        app.shard_tags(&ev).await,
        vec![
            format!("{{{ev}:0}}"),
            format!("{{{ev}:1}}"),
            format!("{{{ev}:2}}"),
            format!("{{{ev}:3}}")
        ]
    );
    let mut tickets = Vec::new();
    for i in 0..40 {
        let s = app.enter_ok(&ev, &format!("u{i}")).await;
        assert_eq!(s["position"], i + 1);
        tickets.push(s["ticket"].as_str().unwrap().to_owned());
    }
    app.update_event(&ev, json!({"admit_per_second": 100}))
        .await;
    eventually(Duration::from_secs(10), "capacity filled", || async {
        (app.active_tickets(&ev).await.len() == 5).then_some(())
    })
    .await;
    let admitted = app.active_tickets(&ev).await;
    assert_eq!(admitted, members(&tickets[..5]));
    assert_eq!(app.poll_ok(&ev, &tickets[5]).await["position"], 1);
}
