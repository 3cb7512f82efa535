//! What a poll costs in Redis commands, and where its reads go.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;

use crate::common::{eventually, spawn_app, spawn_app_with, unique, TestApp};

/// `<sum>/<count>` of the commands-per-poll histogram for `strategy`, from /metrics.
async fn commands_per_poll(app: &TestApp, strategy: &str) -> (f64, f64) {
    let text = app.metrics().await;
    let read = |suffix: &str| {
        let prefix =
            format!(r#"waitroom_redis_commands_per_poll_{suffix}{{strategy="{strategy}"}} "#);
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.trim().parse::<f64>().unwrap())
            .unwrap_or(0.0)
    };
    (read("sum"), read("count"))
}

const PREFETCH: &str = "waitroom_position_prefetch_total";

#[tokio::test]
async fn a_poll_costs_n_commands_under_timestamp_three_under_global_counter_one_under_statistical()
{
    let app = spawn_app().await;
    for (strategy, expected) in [
        ("timestamp", 8.0),
        // The own shard's read, the leader's figures and the count of gaps ahead.
        ("global_counter", 3.0),
        ("statistical", 1.0),
    ] {
        let ev = unique("e");
        app.create_event(
            &ev,
            json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0, "strategy": strategy}),
        )
        .await;
        let mut tickets = Vec::new();
        for i in 0..20 {
            tickets.push(
                app.enter_ok(&ev, &format!("u{i}")).await["ticket"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        // Let the admission leader publish the figures estimated and counted positions read.
        eventually(Duration::from_secs(10), "leader figures", || async {
            (!app.get_event(&ev).await["stats"]["measured_admit_per_second"].is_null())
                .then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_millis(600)).await;
        let (sum0, count0) = commands_per_poll(&app, strategy).await;
        let used0 = outcome_total(&app.metrics().await, PREFETCH, "used");
        for t in &tickets {
            assert_eq!(app.poll_ok(&ev, t).await["strategy"], strategy);
        }
        let (sum1, count1) = commands_per_poll(&app, strategy).await;
        // The reads beyond the own shard went out with it (one round trip) where they can:
        // the other shards' counts at the score remembered from the enter, the counter's
        // figures; a `statistical` poll has nothing more to read.
        let used = outcome_total(&app.metrics().await, PREFETCH, "used") - used0;
        let expected_used = if strategy == "statistical" { 0.0 } else { 20.0 };
        assert_eq!(used, expected_used, "{strategy}: prefetches used");
        assert_eq!(count1 - count0, 20.0, "{strategy}: 20 polls recorded");
        assert_eq!(
            (sum1 - sum0) / 20.0,
            expected,
            "{strategy}: commands per poll"
        );
    }
}

/// `cmdstat_zcount` calls per node port, from INFO commandstats on every node of the stack.
async fn zcount_calls(ports: &[u16]) -> HashMap<u16, u64> {
    let mut calls = HashMap::new();
    for p in ports {
        let client = redis::Client::open(format!("redis://127.0.0.1:{p}")).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut c)
            .await
            .unwrap();
        let n = info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_zcount:calls="))
            .and_then(|v| v.split(',').next())
            .map(|v| v.parse().unwrap())
            .unwrap_or(0);
        calls.insert(*p, n);
    }
    calls
}

async fn replica_ports() -> Vec<u16> {
    let client = redis::Client::open("redis://127.0.0.1:7000").unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut c)
        .await
        .unwrap();
    nodes
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(2)
                .is_some_and(|f| f.contains("slave"))
        })
        .filter_map(|l| {
            l.split_whitespace()
                .nth(1)?
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

#[tokio::test]
async fn with_replica_reads_the_other_shards_counts_come_from_replicas_and_stay_exact() {
    let app = spawn_app_with(|c| c.redis.read_from_replicas = true).await;
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0}),
    )
    .await;
    let mut tickets = Vec::new();
    for i in 0..30 {
        tickets.push(
            app.enter_ok(&ev, &format!("u{i}")).await["ticket"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    let replicas = replica_ports().await;
    assert_eq!(replicas.len(), 3);
    let before = zcount_calls(&replicas).await;
    // Replication is asynchronous: once it has caught up, positions read there are exact.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (i, t) in tickets.iter().enumerate() {
        assert_eq!(app.poll_ok(&ev, t).await["position"], i + 1);
    }
    let after = zcount_calls(&replicas).await;
    let served: u64 = replicas.iter().map(|p| after[p] - before[p]).sum();
    // 30 polls x 7 other shards. Other tests running now do not read from replicas.
    assert!(served >= 30 * 7, "replicas served {served} ZCOUNTs");
}

#[tokio::test]
async fn a_stale_slot_map_costs_a_retry_but_never_a_wrong_position() {
    // The other shards' counts go as one pipeline per node, grouped by a slot map. Here the map
    // claims one node serves every slot, so the one pipeline meets MOVED for the keys of the
    // other primaries: the counts must be retried one by one, and the positions stay exact.
    use waitroom::ids::{EventId, UserId};
    use waitroom::queue::event::{EventPatch, LineForm};
    let cfg = crate::common::test_config(&unique("t"));
    let conn = waitroom::redis::connect(&cfg.redis).await.unwrap();
    assert!(conn.is_cluster(), "the local stack is a cluster");
    let store = waitroom::redis::Store::connect(&cfg.redis).await.unwrap();
    let queue =
        waitroom::queue::Queue::new(store.clone(), waitroom::auth::Signer::new("stale-map-test"));
    let ev = EventId::parse(&unique("e")).unwrap();
    queue
        .put_event(
            &ev,
            &EventPatch {
                shards: Some(8),
                admit_per_second: Some(0.0),
                line_form: Some(LineForm::SortedSets),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut tickets = Vec::new();
    for i in 0..30 {
        let user = UserId::parse(&format!("u{i}")).unwrap();
        let status = queue.enter(&ev, &user).await.unwrap();
        tickets.push(waitroom::ids::Ticket::parse(&status.ticket).unwrap());
    }
    let groups = store.node_groups().expect("a cluster has a slot map");
    groups.force(vec![vec![(0, 16383)]]);
    for (i, t) in tickets.iter().enumerate() {
        let status = queue.poll(&ev, t).await.unwrap();
        assert_eq!(status.position, Some(i as u64 + 1), "ticket {i}");
        if i == 0 {
            // 7 other shards over 3 primaries: the one pipeline met MOVED and the forced map
            // was dropped (it may already have been read again, in the background).
            assert_ne!(groups.primaries(), Some(1), "the stale map was dropped");
        }
    }
    // Read again from the cluster, in the background: three primaries.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while groups.primaries() != Some(3) && std::time::Instant::now() < deadline {
        queue.poll(&ev, &tickets[0]).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(groups.primaries(), Some(3), "the map was read again");
}

/// `waitroom_redis_direct_requests_total{outcome}` from /metrics.
async fn direct_requests(app: &TestApp, outcome: &str) -> f64 {
    app.metric(&format!(
        r#"waitroom_redis_direct_requests_total{{outcome="{outcome}"}}"#
    ))
    .await
}

/// Enters 30 people into an 8-shard `timestamp` event and polls each: the positions are
/// 1..30 in order of arrival. Returns the event and the tickets.
async fn exact_line(app: &TestApp) -> (String, Vec<String>) {
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 8, "admit_per_second": 0, "strategy": "timestamp"}),
    )
    .await;
    let mut tickets = Vec::new();
    for i in 0..30 {
        let b = app.enter_ok(&ev, &format!("u{i}")).await;
        tickets.push(b["ticket"].as_str().unwrap().to_owned());
    }
    for (i, t) in tickets.iter().enumerate() {
        assert_eq!(
            app.poll_ok(&ev, t).await["position"],
            json!(i + 1),
            "ticket {i}"
        );
    }
    (ev, tickets)
}

/// The sum of `waitroom_redis_direct_requests_total` series with `outcome` in a rendering.
fn direct_total(rendered: &str, outcome: &str) -> f64 {
    outcome_total(rendered, "waitroom_redis_direct_requests_total", outcome)
}

/// The sum of the series of counter `name` with `outcome` in a rendering.
fn outcome_total(rendered: &str, name: &str, outcome: &str) -> f64 {
    let label = format!(r#"outcome="{outcome}""#);
    let start = format!("{name}{{");
    rendered
        .lines()
        .filter(|l| l.starts_with(&start) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn with_direct_connections_each_poll_is_answered_by_its_primary_directly() {
    // A queue over its own store, with no admission running: every direct request counted
    // below is a poll's. A `statistical` poll is one pipeline of its own shard's reads (no
    // grouped reads), so if commands were not routed directly the count would not move.
    use waitroom::ids::{EventId, Ticket, UserId};
    use waitroom::queue::event::{EventPatch, LineForm};
    let metrics = waitroom::telemetry::metrics_handle();
    let mut cfg = crate::common::test_config(&unique("t"));
    cfg.redis.direct = true;
    let store = waitroom::redis::Store::connect(&cfg.redis).await.unwrap();
    let queue = waitroom::queue::Queue::new(store.clone(), waitroom::auth::Signer::new("direct"));
    let mut lines = Vec::new();
    for strategy in ["timestamp", "statistical"] {
        let ev = EventId::parse(&unique("e")).unwrap();
        let patch = EventPatch {
            shards: Some(8),
            admit_per_second: Some(0.0),
            strategy: Some(strategy.parse().unwrap()),
            line_form: Some(LineForm::SortedSets),
            ..Default::default()
        };
        queue.put_event(&ev, &patch).await.unwrap();
        let mut tickets = Vec::new();
        for i in 0..30 {
            let user = UserId::parse(&format!("u{i}")).unwrap();
            let status = queue.enter(&ev, &user).await.unwrap();
            tickets.push(Ticket::parse(&status.ticket).unwrap());
        }
        lines.push((ev, tickets));
    }
    // The map, and the connections with it, are read in the background after the first use.
    let groups = store.node_groups().expect("a cluster has a slot map");
    let (ts, ts_tickets) = &lines[0];
    eventually(Duration::from_secs(10), "the slot map", || async {
        queue.poll(ts, &ts_tickets[0]).await.unwrap();
        (groups.primaries() == Some(3)).then_some(())
    })
    .await;
    // Exact positions, with the other shards' counts read over the direct connections.
    for (i, t) in ts_tickets.iter().enumerate() {
        let status = queue.poll(ts, t).await.unwrap();
        assert_eq!(status.position, Some(i as u64 + 1), "ticket {i}");
    }
    let (st, st_tickets) = &lines[1];
    let before = direct_total(&metrics.render(), "answered");
    for t in st_tickets {
        queue.poll(st, t).await.unwrap();
    }
    let after = direct_total(&metrics.render(), "answered");
    assert!(
        after - before >= 30.0,
        "30 statistical polls, each a pipeline answered directly: {before} -> {after}"
    );
    let rendered = metrics.render();
    assert_eq!(
        direct_total(&rendered, "sent_again"),
        0.0,
        "a steady cluster"
    );
    assert_eq!(
        direct_total(&rendered, "timed_out"),
        0.0,
        "a steady cluster"
    );
}

#[tokio::test]
async fn without_direct_connections_every_command_goes_through_the_cluster_client() {
    let app = spawn_app_with(|c| c.redis.direct = false).await;
    exact_line(&app).await;
    assert_eq!(direct_requests(&app, "answered").await, 0.0);
    assert_eq!(direct_requests(&app, "sent_again").await, 0.0);
}

#[tokio::test]
async fn a_remembered_score_makes_an_exact_position_one_round_trip_and_a_stale_one_costs_two() {
    // Two instances over one cluster: `a` took everyone's enter (and remembers their scores),
    // `b` has never seen them.
    use waitroom::ids::{EventId, Ticket, UserId};
    use waitroom::queue::event::{EventPatch, LineForm};
    use waitroom::queue::Queue;
    let metrics = waitroom::telemetry::metrics_handle();
    let prefetches = |outcome: &str| outcome_total(&metrics.render(), PREFETCH, outcome);
    let cfg = crate::common::test_config(&unique("t"));
    let store = waitroom::redis::Store::connect(&cfg.redis).await.unwrap();
    let signer = waitroom::auth::Signer::new("prefetch");
    let a = Queue::new(store.clone(), signer.clone());
    let b = Queue::new(store.clone(), signer.clone());
    let ev = EventId::parse(&unique("e")).unwrap();
    let patch = EventPatch {
        shards: Some(8),
        admit_per_second: Some(0.0),
        strategy: Some("timestamp".parse().unwrap()),
        line_form: Some(LineForm::SortedSets),
        ..Default::default()
    };
    a.put_event(&ev, &patch).await.unwrap();
    let users: Vec<UserId> = (0..20)
        .map(|i| UserId::parse(&format!("u{i}")).unwrap())
        .collect();
    let mut tickets = Vec::new();
    for u in &users {
        let status = a.enter(&ev, u).await.unwrap();
        tickets.push(Ticket::parse(&status.ticket).unwrap());
    }
    let (used0, unused0, none0) = (
        prefetches("used"),
        prefetches("unused"),
        prefetches("no_guess"),
    );
    for (i, t) in tickets.iter().enumerate() {
        assert_eq!(a.poll(&ev, t).await.unwrap().position, Some(i as u64 + 1));
    }
    assert_eq!(
        prefetches("used") - used0,
        20.0,
        "a remembers every score from the enters"
    );
    // b: the first poll of each has no score to guess and takes two rounds, then one.
    for round in 0..2 {
        for (i, t) in tickets.iter().enumerate() {
            assert_eq!(
                b.poll(&ev, t).await.unwrap().position,
                Some(i as u64 + 1),
                "b, round {round}, ticket {i}"
            );
        }
    }
    assert_eq!(prefetches("no_guess") - none0, 20.0, "b's first polls");
    assert_eq!(
        prefetches("used") - used0,
        40.0,
        "b's second polls used its scores"
    );
    // The first person leaves and comes back through `a`: a new score, at the back. `b` still
    // remembers the old one; its guess is checked by the own shard's read, so the position is
    // the new one, at the price of the second round.
    a.leave(&ev, &tickets[0]).await.unwrap();
    let back = a.enter(&ev, &users[0]).await.unwrap(); // its counts went out with the script
    assert_eq!(back.ticket, tickets[0].to_string(), "the same ticket");
    assert_eq!(back.position, Some(20));
    assert_eq!(prefetches("unused") - unused0, 0.0);
    assert_eq!(prefetches("used") - used0, 41.0);
    assert_eq!(b.poll(&ev, &tickets[0]).await.unwrap().position, Some(20));
    assert_eq!(
        prefetches("unused") - unused0,
        1.0,
        "b's stale score was not used"
    );
    assert_eq!(b.poll(&ev, &tickets[0]).await.unwrap().position, Some(20));
    assert_eq!(b.poll(&ev, &tickets[1]).await.unwrap().position, Some(1));
    assert_eq!(
        prefetches("used") - used0,
        43.0,
        "the enter's counts, then b's two polls with the new score"
    );
    // A ticket found gone is forgotten: after it comes back, b has no guess (not a wrong one).
    a.leave(&ev, &tickets[1]).await.unwrap();
    assert!(matches!(
        b.poll(&ev, &tickets[1]).await,
        Err(waitroom::queue::QueueError::UnknownTicket)
    ));
    a.enter(&ev, &users[1]).await.unwrap();
    let (unused1, none1) = (prefetches("unused"), prefetches("no_guess"));
    assert_eq!(b.poll(&ev, &tickets[1]).await.unwrap().position, Some(20));
    assert_eq!(
        prefetches("no_guess") - none1,
        1.0,
        "forgotten when found gone"
    );
    assert_eq!(prefetches("unused"), unused1);
    // Without the cache every exact position takes its two rounds, and is the same.
    let c = Queue::new(store.clone(), signer).with_score_cache(0);
    let used1 = prefetches("used");
    for (i, t) in tickets[2..].iter().enumerate() {
        assert_eq!(c.poll(&ev, t).await.unwrap().position, Some(i as u64 + 1));
        assert_eq!(c.poll(&ev, t).await.unwrap().position, Some(i as u64 + 1));
    }
    assert_eq!(prefetches("used"), used1, "nothing remembered");
}
