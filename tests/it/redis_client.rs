//! A Redis Cluster client that answers nothing is replaced; one that answers for some nodes is
//! not (src/redis/watched.rs). The stuck client of the failover test cannot be made to order
//! (redis-rs wedged in a slot refresh, 3 runs of 16): here the client's whole cluster goes
//! silent instead, and its replacement is built for the stack's cluster, so which client
//! answered shows in the data.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use waitroom::redis::batch::NodeGroups;
use waitroom::redis::keys::slot;
use waitroom::redis::watched::{Build, Watched, STALL, STALL_TIMEOUTS};
use waitroom::redis::{cluster_client, RedisConn};

use crate::common::procs::RedisProcs;
use crate::common::{test_config, unique};

/// One GET: `Ok(value)`, or `Err(true)` for a timeout and `Err(false)` for another error.
async fn get(conn: &mut RedisConn, key: &str) -> Result<Option<String>, bool> {
    conn.get::<_, Option<String>>(key)
        .await
        .map_err(|e| e.is_timeout())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_that_answers_nothing_is_replaced_and_one_that_answers_is_kept() {
    waitroom::telemetry::init_tracing();
    let own = RedisProcs::cluster(7170);
    let mut healthy = test_config(&unique("t")).redis;
    healthy.response_timeout_ms = 500;
    // Sets the per-command bound from this configuration (1.5 s), as the service does.
    waitroom::redis::connect(&healthy)
        .await
        .expect("the stack's cluster answers");
    let mut cfg = healthy.clone();
    cfg.nodes = own.urls();
    let first = cluster_client(&cfg, false).await.expect("own cluster");
    let build: Build = Box::new(move || {
        let healthy = healthy.clone();
        Box::pin(async move { cluster_client(&healthy, false).await })
    });
    let watched = Watched::new(first, "test", build);
    let mut conn = RedisConn::Cluster(watched, Arc::new(NodeGroups::new(None)));

    // Two keys on two primaries of the client's own cluster; neither exists on the stack's.
    let a = unique("{a}");
    let b = loop {
        let b = unique("{b}");
        if own.primary_for_slot(slot(&b)) != own.primary_for_slot(slot(&a)) {
            break b;
        }
    };
    for k in [&a, &b] {
        let _: () = conn.set(k, "own").await.expect("set on the own cluster");
    }

    // 1. One primary stops answering clients for 8 s (CLIENT PAUSE: no failover meanwhile).
    //    Its key times out again and again, past the stall time, while the other key answers:
    //    the client is kept.
    let paused = own.primary_for_slot(slot(&a));
    let out = Command::new("redis-cli")
        .args(["-p", &paused.to_string(), "client", "pause", "8000", "all"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK"));
    let started = Instant::now();
    let (mut a_timeouts, mut b_answers) = (0, 0);
    while started.elapsed() < Duration::from_secs(6) {
        match get(&mut conn, &a).await {
            Err(true) => a_timeouts += 1,
            other => panic!("the paused primary's key answered {other:?}"),
        }
        assert_eq!(
            get(&mut conn, &b).await,
            Ok(Some("own".into())),
            "the other primary's key, on the same client"
        );
        b_answers += 1;
    }
    assert!(
        a_timeouts >= STALL_TIMEOUTS && started.elapsed() > STALL,
        "the fault was real: {a_timeouts} timeouts in {:?}",
        started.elapsed()
    );
    assert!(b_answers > 0);
    // The pause is over (8 s after it began).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        get(&mut conn, &a).await,
        Ok(Some("own".into())),
        "kept: the client still reads its own cluster"
    );

    // 2. The whole cluster freezes: every request times out, and after the stall time the
    //    client is replaced by one for the stack's cluster, where the key does not exist.
    for p in &own.ports {
        own.pause(*p);
    }
    let started = Instant::now();
    let mut timeouts = 0;
    let answer = loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not replaced after 30 s ({timeouts} timeouts)"
        );
        match get(&mut conn, &b).await {
            Ok(v) => break v,
            Err(true) => timeouts += 1,
            Err(false) => panic!("a frozen cluster answered an error"),
        }
    };
    assert_eq!(
        answer, None,
        "answered by the replacement, on the stack's cluster"
    );
    assert!(
        timeouts >= STALL_TIMEOUTS && started.elapsed() >= STALL,
        "replaced only after a whole stall: {timeouts} timeouts in {:?}",
        started.elapsed()
    );
}
