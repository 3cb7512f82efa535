//! Every error row of shared/API.md that applies to the waiting room and admin API, with its
//! exact status and code — and no 500 for any bad input.

use std::time::Duration;

use rand::Rng as _;
use redis::AsyncCommands as _;
use reqwest::StatusCode;
use serde_json::json;

use crate::common::procs::RedisProcs;
use crate::common::{assert_error, eventually, spawn_app, spawn_app_with, unique, ADMIN_TOKEN};

#[tokio::test]
async fn malformed_bodies_and_ids_are_400_bad_request() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 2})).await;
    let url = format!("{}/v1/events/{ev}/queue", app.base);
    let post_raw = |body: &'static str| {
        app.http
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    assert_error(
        post_raw("{not json").await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    assert_error(
        post_raw(r#"{"user_id": 42}"#).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    assert_error(
        post_raw(r#"{}"#).await.unwrap(),
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let no_type = app
        .http
        .post(&url)
        .body(r#"{"user_id":"a"}"#)
        .send()
        .await
        .unwrap();
    assert_error(no_type, StatusCode::BAD_REQUEST, "bad_request").await;
    for bad_user in ["", "has space", "slash/", &"u".repeat(129)] {
        assert_error(
            app.enter(&ev, bad_user).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    for bad_event in ["Upper", "-dash", &"e".repeat(65)] {
        assert_error(
            app.enter(bad_event, "alice").await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    assert_error(
        app.poll(&ev, "not-a-uuid").await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    assert_error(
        app.leave(&ev, "12345").await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    // Admin: out-of-range and unknown fields, unknown strategy.
    for body in [
        json!({"shards": 0}),
        json!({"admit_per_second": -5}),
        json!({"state": "sleeping"}),
        json!({"shards": "eight"}),
        json!({"colour": "blue"}),
    ] {
        assert_error(
            app.put_event(&ev, body).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    let strategy = app
        .http
        .put(format!("{}/admin/v1/events/{ev}/strategy", app.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"strategy": "fifo"}))
        .send()
        .await
        .unwrap();
    assert_error(strategy, StatusCode::BAD_REQUEST, "bad_request").await;
}

#[tokio::test]
async fn admin_without_a_valid_token_is_401_unauthorized() {
    let app = spawn_app().await;
    let url = format!("{}/admin/v1/events/{}", app.base, unique("e"));
    let none = app.http.put(&url).json(&json!({})).send().await.unwrap();
    assert_error(none, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let wrong = app
        .http
        .get(&url)
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_error(wrong, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let basic = app
        .http
        .get(&url)
        .header("authorization", format!("Basic {ADMIN_TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_error(basic, StatusCode::UNAUTHORIZED, "unauthorized").await;
}

#[tokio::test]
async fn unknown_events_tickets_and_routes_are_404_not_found() {
    let app = spawn_app().await;
    let ev = unique("e");
    assert_error(
        app.enter(&ev, "alice").await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let ticket = uuid::Uuid::new_v4().to_string();
    assert_error(
        app.poll(&ev, &ticket).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    app.create_event(&ev, json!({"shards": 2})).await;
    assert_error(
        app.poll(&ev, &ticket).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        app.leave(&ev, &ticket).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let admin = app
        .http
        .get(format!("{}/admin/v1/events/{}", app.base, unique("none")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_error(admin, StatusCode::NOT_FOUND, "not_found").await;
    let route = app.get("/v1/nothing/here").await;
    assert_error(route, StatusCode::NOT_FOUND, "not_found").await;
}

#[tokio::test]
async fn paused_or_closed_events_refuse_entry_with_409_event_closed() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 2, "state": "paused"}))
        .await;
    assert_error(
        app.enter(&ev, "alice").await,
        StatusCode::CONFLICT,
        "event_closed",
    )
    .await;
    app.update_event(&ev, json!({"state": "closed"})).await;
    assert_error(
        app.enter(&ev, "alice").await,
        StatusCode::CONFLICT,
        "event_closed",
    )
    .await;
    app.update_event(&ev, json!({"state": "open"})).await;
    assert_eq!(app.enter(&ev, "alice").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn resharding_an_open_or_non_empty_line_is_409_conflict() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 4, "admit_per_second": 0}))
        .await;
    app.enter_ok(&ev, "alice").await;
    // Open: instances may still be entering people under the old shard names.
    assert_error(
        app.put_event(&ev, json!({"shards": 8})).await,
        StatusCode::CONFLICT,
        "conflict",
    )
    .await;
    // Paused but not empty.
    app.update_event(&ev, json!({"state": "paused"})).await;
    assert_error(
        app.put_event(&ev, json!({"shards": 8})).await,
        StatusCode::CONFLICT,
        "conflict",
    )
    .await;
    assert_eq!(app.get_event(&ev).await["config"]["shards"], 4);
    // Same shard count is not a change; a paused, empty line may be resharded.
    assert_eq!(
        app.put_event(&ev, json!({"shards": 4})).await.status(),
        StatusCode::OK
    );
    let other = unique("e");
    app.create_event(&other, json!({"shards": 4, "state": "paused"}))
        .await;
    assert_eq!(
        app.put_event(&other, json!({"shards": 16})).await.status(),
        StatusCode::OK
    );
    assert_eq!(app.shard_tags(&other).await.len(), 16);
}

#[tokio::test]
async fn a_known_path_with_another_method_is_405_with_a_json_error() {
    let app = spawn_app().await;
    let r = app
        .http
        .patch(format!("{}/v1/events/e1/queue", app.base))
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed").await;
}

#[tokio::test]
async fn bodies_over_64_kib_are_413_payload_too_large() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 2})).await;
    let big = json!({"user_id": "a", "pad": "x".repeat(70 * 1024)});
    let r = app
        .http
        .post(format!("{}/v1/events/{ev}/queue", app.base))
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    let r = app
        .http
        .put(format!("{}/admin/v1/events/{ev}", app.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_error(r, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
}

#[tokio::test]
async fn a_client_polling_too_fast_gets_429_with_retry_after() {
    let app = spawn_app_with(|c| {
        c.http.client_rate_per_second = 1;
        c.http.client_burst = 3;
    })
    .await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 2, "admit_per_second": 0}))
        .await;
    let t = app.enter_ok(&ev, "alice").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut limited = None;
    for _ in 0..10 {
        let r = app.poll(&ev, &t).await;
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(r);
            break;
        }
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = limited.expect("a burst of 10 polls is limited");
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    assert_error(r, StatusCode::TOO_MANY_REQUESTS, "rate_limited").await;
    // Another client is not affected.
    assert_eq!(app.enter(&ev, "bob").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn redis_unreachable_is_503_with_retry_after_and_never_a_guess() {
    let mut redis = RedisProcs::standalone(7301);
    let app = spawn_app_with(|c| c.redis.nodes = vec!["redis://127.0.0.1:7301".into()]).await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 2, "admit_per_second": 0}))
        .await;
    let t = app.enter_ok(&ev, "alice").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();

    redis.kill(7301);
    // The event's configuration may be cached for up to 500 ms: wait it out so every request
    // must reach Redis.
    tokio::time::sleep(Duration::from_millis(600)).await;
    for r in [
        app.enter(&ev, "bob").await,
        app.poll(&ev, &t).await,
        app.leave(&ev, &t).await,
    ] {
        assert!(
            r.headers().contains_key("retry-after"),
            "503 carries Retry-After"
        );
        assert_error(r, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    }
    // /readyz answers from a probe at most 1 s old.
    let ready = eventually(Duration::from_secs(3), "readyz 503", || async {
        let r = app.get("/readyz").await;
        (r.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(r)
    })
    .await;
    assert!(ready.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn a_queue_key_of_the_wrong_type_is_moved_aside_and_the_line_keeps_working() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "sorted_sets", "shards": 1, "admit_per_second": 0}),
    )
    .await;
    let tag = app.shard_tags(&ev).await.remove(0);
    let waiting = app.keys.shard(&tag).waiting;
    let () = app
        .redis
        .clone()
        .set(&waiting, "not a sorted set")
        .await
        .unwrap();

    let s = app.enter_ok(&ev, "alice").await;
    assert_eq!(s["position"], 1);
    // The bad value is kept aside for an operator, in the same slot.
    app.assert_moved_aside(&waiting, "zset", "not a sorted set")
        .await;
}

/// The same on a numbered line, for its own keys and for an index bucket: a bucket holding a
/// string fails every enter and poll of the members it indexes (and every batch of enters one
/// of them is in) until it is moved aside. Bob's entry was in the overwritten bucket, so an
/// instance that does not remember his number knows his ticket no more (404, not a 503 that
/// never ends), and he can enter again.
#[tokio::test]
async fn a_numbered_line_key_of_the_wrong_type_is_moved_aside_and_the_line_keeps_working() {
    let prefix = unique("t");
    let app = spawn_app_with(|c| c.redis.key_prefix = prefix.clone()).await;
    // A second instance on the same keys, which remembers no number.
    let other = spawn_app_with(|c| c.redis.key_prefix = prefix.clone()).await;
    let ev = unique("e");
    app.create_event(
        &ev,
        json!({"line_form": "numbered", "shards": 1, "admit_per_second": 0}),
    )
    .await;
    let alice = app.enter_ok(&ev, "alice").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let bob = app.enter_ok(&ev, "bob").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let cfg = app.get_event(&ev).await["config"].clone();
    let bucket = crate::numbered::index_key_of(&app, &ev, &cfg, &bob);
    let ticks = app.keys.numbered(&ev).ticks;
    for key in [&bucket, &ticks] {
        let () = app.redis.clone().del(key).await.unwrap();
        let () = app.redis.clone().set(key, "not mine").await.unwrap();
    }
    assert_eq!(other.poll_ok(&ev, &alice).await["position"], 1);
    assert_error(
        other.poll(&ev, &bob).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    let again = app.enter_ok(&ev, "bob").await;
    assert_eq!(again["status"], "waiting");
    for (key, now) in [(&bucket, "hash"), (&ticks, "none")] {
        app.assert_moved_aside(key, now, "not mine").await;
    }
}

#[tokio::test]
async fn random_garbage_never_gets_a_500() {
    let app = spawn_app().await;
    let ev = unique("e");
    app.create_event(&ev, json!({"shards": 2})).await;
    let mut rng = rand::rng();
    for i in 0..300 {
        let len = rng.random_range(0..200);
        let body: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let path = match i % 4 {
            0 => format!("/v1/events/{ev}/queue"),
            1 => format!("/admin/v1/events/{ev}"),
            2 => format!("/admin/v1/events/{ev}/strategy"),
            _ => format!(
                "/v1/events/{}/queue",
                String::from_utf8_lossy(&body[..len.min(8)]).replace(['/', '?', '#'], "")
            ),
        };
        let method = if i % 4 == 1 || i % 4 == 2 {
            reqwest::Method::PUT
        } else {
            reqwest::Method::POST
        };
        let r = app
            .http
            .request(method, format!("{}{}", app.base, path))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await;
        match r {
            Ok(r) => assert!(r.status().as_u16() < 500, "{} for {path}", r.status()),
            // Random bytes in the path can make a URL the client will not send at all.
            Err(e) if e.is_builder() => {}
            Err(e) => panic!("no answer for {path}: {e}"),
        }
    }
}
