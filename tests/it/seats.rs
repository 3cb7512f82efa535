//! Seats and bookings against the real Redis Cluster, tansu (Kafka protocol) and PostgreSQL.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use rand::seq::IndexedRandom as _;
use rand::Rng as _;
use redis::AsyncCommands as _;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::common::on_both_forms;
use crate::common::{
    assert_error, db, eventually, spawn_app, spawn_app_with, unique, TestApp, ADMIN_TOKEN,
};

/// An open event whose line admits at once, and a show on it. Returns (event, show).
async fn sale(app: &TestApp, show_body: Value, event_extra: Value) -> (String, String) {
    let ev = unique("e");
    let mut body = json!({"shards": 2, "admit_per_second": 100000, "active_capacity": 100000});
    body.as_object_mut()
        .unwrap()
        .extend(event_extra.as_object().unwrap().clone());
    app.create_event(&ev, body).await;
    let show = unique("s");
    let mut spec = show_body;
    spec["event"] = json!(ev);
    app.create_show(&show, spec).await;
    (ev, show)
}

/// Enters `user` and waits until admitted; returns the access token, or None when the line
/// says the event is sold out.
async fn admitted_unless_sold_out(app: &TestApp, ev: &str, user: &str) -> Option<String> {
    let s = app.enter_ok(ev, user).await;
    if s["status"] == "sold_out" {
        return None;
    }
    let ticket = s["ticket"].as_str().unwrap().to_owned();
    eventually(Duration::from_secs(20), "admitted or sold out", || async {
        let s = app.poll_ok(ev, &ticket).await;
        match s["status"].as_str() {
            Some("admitted") => Some(s["access_token"].as_str().map(str::to_owned)),
            Some("sold_out") => Some(None),
            _ => None,
        }
    })
    .await
}

/// Enters `user` and waits until admitted; returns the access token.
async fn admitted(app: &TestApp, ev: &str, user: &str) -> String {
    app.admitted(ev, user).await
}

pub(crate) async fn hold(app: &TestApp, show: &str, token: &str, body: Value) -> Response {
    app.http
        .post(format!("{}/v1/shows/{show}/holds", app.base))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn release(app: &TestApp, show: &str, token: &str, hold_id: &str) -> Response {
    app.http
        .delete(format!("{}/v1/shows/{show}/holds/{hold_id}", app.base))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

pub(crate) async fn book(app: &TestApp, show: &str, token: &str, hold_id: &str) -> Response {
    app.http
        .post(format!("{}/v1/shows/{show}/bookings", app.base))
        .bearer_auth(token)
        .json(&json!({"hold_id": hold_id}))
        .send()
        .await
        .unwrap()
}

/// A hold that is over (released or lapsed): booking it is 409 `hold_expired`, and releasing it
/// is 404 (it gives nothing back a second time).
async fn assert_hold_gone(app: &TestApp, show: &str, token: &str, hold_id: &str) {
    assert_error(
        book(app, show, token, hold_id).await,
        StatusCode::CONFLICT,
        "hold_expired",
    )
    .await;
    assert_error(
        release(app, show, token, hold_id).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
}

/// Holds `body` for `token`, books the hold and waits for the ledger to confirm it: the
/// booking's id.
async fn bought(app: &TestApp, show: &str, token: &str, body: Value) -> String {
    let h: Value = hold(app, show, token, body).await.json().await.unwrap();
    let b: Value = book(app, show, token, h["hold_id"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    let id = b["booking_id"].as_str().unwrap().to_owned();
    assert_eq!(wait_decided(app, &id).await, "confirmed");
    id
}

async fn booking(app: &TestApp, id: &str) -> Value {
    let r = app.get(&format!("/v1/bookings/{id}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

pub(crate) async fn wait_decided(app: &TestApp, id: &str) -> String {
    eventually(Duration::from_secs(30), "booking decided", || async {
        let b = booking(app, id).await;
        let s = b["status"].as_str().unwrap().to_owned();
        (s != "pending").then_some(s)
    })
    .await
}

async fn seat_states(app: &TestApp, show: &str) -> HashMap<String, String> {
    let map: Value = app.seat_map(show).await;
    map["seats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_owned(),
                s["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_show_is_listed_from_redis_with_every_seat_available() {
    let app = spawn_app().await;
    let (ev, show) = sale(&app, json!({"rows": "A-B", "seats_per_row": 3}), json!({})).await;
    let map: Value = app.seat_map(&show).await;
    assert_eq!(map["event"], ev.as_str());
    assert_eq!(map["available"], 6);
    let ids: Vec<&str> = map["seats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["A-1", "A-2", "A-3", "B-1", "B-2", "B-3"]);
    assert!(map["seats"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["state"] == "available"));
    // Putting the same show again is not a second creation.
    let again = app
        .http
        .put(format!("{}/admin/v1/shows/{show}", app.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"event": ev, "rows": "A-B", "seats_per_row": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    assert_error(
        app.get(&format!("/v1/shows/{}/seats", unique("none")))
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
}

#[tokio::test]
async fn two_buyers_racing_for_the_same_seat_exactly_one_hold_succeeds_and_nothing_partial_is_held()
{
    let app = spawn_app().await;
    let (ev, show) = sale(&app, json!({"seats": ["A-1", "A-2", "A-3"]}), json!({})).await;
    let (alice, bob) = (
        admitted(&app, &ev, "alice").await,
        admitted(&app, &ev, "bob").await,
    );
    let (a, b) = tokio::join!(
        hold(&app, &show, &alice, json!({"seats": ["A-1", "A-2"]})),
        hold(&app, &show, &bob, json!({"seats": ["A-2", "A-3"]})),
    );
    let statuses = [a.status(), b.status()];
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "{statuses:?}"
    );
    let loser = if a.status() == StatusCode::CREATED {
        b
    } else {
        a
    };
    let body = assert_error(loser, StatusCode::CONFLICT, "seat_unavailable").await;
    assert_eq!(body["seats"], json!(["A-2"]));
    // All or nothing: the loser's other seat is still free.
    let states = seat_states(&app, &show).await;
    let held: HashSet<&str> = states
        .iter()
        .filter(|(_, v)| *v == "held")
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(held.len(), 2);
    assert!(held.contains("A-2"));
    assert_eq!(states.values().filter(|v| *v == "available").count(), 1);
}

#[tokio::test]
async fn a_lapsed_hold_frees_its_seats_and_cannot_be_booked() {
    let app = spawn_app().await;
    let (ev, show) = sale(
        &app,
        json!({"seats": ["A-1", "A-2"]}),
        json!({"hold_ttl_seconds": 2}),
    )
    .await;
    let token = admitted(&app, &ev, "alice").await;
    let r = hold(&app, &show, &token, json!({"seats": ["A-1"]})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let h: Value = r.json().await.unwrap();
    assert!(h["expires_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(seat_states(&app, &show).await["A-1"], "held");
    tokio::time::sleep(Duration::from_millis(2300)).await;
    assert_eq!(seat_states(&app, &show).await["A-1"], "available");
    assert_hold_gone(&app, &show, &token, h["hold_id"].as_str().unwrap()).await;
    // Released holds are gone too.
    let r = hold(&app, &show, &token, json!({"seats": ["A-2"]})).await;
    let h: Value = r.json().await.unwrap();
    let del = release(&app, &show, &token, h["hold_id"].as_str().unwrap()).await;
    assert_eq!(del.status(), StatusCode::NO_CONTENT);
    assert_eq!(seat_states(&app, &show).await["A-2"], "available");
    assert_hold_gone(&app, &show, &token, h["hold_id"].as_str().unwrap()).await;
}

on_both_forms!(
    tokio::test,
    the_same_booking_request_twice_gives_one_booking_and_it_becomes_confirmed_in:
    the_same_booking_request_twice_gives_one_booking_and_it_becomes_confirmed,
    on_a_numbered_line_the_same_booking_request_twice_gives_one_booking
);

async fn the_same_booking_request_twice_gives_one_booking_and_it_becomes_confirmed_in(form: &str) {
    let app = spawn_app().await;
    let (ev, show) = sale(
        &app,
        json!({"seats": ["A-1", "A-2"]}),
        json!({"line_form": form}),
    )
    .await;
    let token = admitted(&app, &ev, "alice").await;
    let h: Value = hold(&app, &show, &token, json!({"seats": ["A-1", "A-2"]}))
        .await
        .json()
        .await
        .unwrap();
    let hold_id = h["hold_id"].as_str().unwrap();
    let first = book(&app, &show, &token, hold_id).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first: Value = first.json().await.unwrap();
    assert_eq!(first["seats"], json!(["A-1", "A-2"]));
    // The purchase ended the session: the same token no longer holds anything...
    assert_error(
        hold(&app, &show, &token, json!({"seats": ["A-1"]})).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    // ...but repeating the confirmation answers the same booking, never a second one.
    let again = book(&app, &show, &token, hold_id).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["booking_id"], first["booking_id"]);
    assert_eq!(
        wait_decided(&app, first["booking_id"].as_str().unwrap()).await,
        "confirmed"
    );
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM bookings WHERE show_id = $1")
        .bind(&show)
        .fetch_one(&db().await)
        .await
        .unwrap();
    assert_eq!(rows, 1);
    assert_eq!(seat_states(&app, &show).await["A-1"], "sold");
}

on_both_forms!(
    tokio::test(flavor = "multi_thread", worker_threads = 4),
    two_thousand_buyers_for_a_hundred_seats_sell_each_seat_once_and_every_201_is_confirmed_in:
    two_thousand_buyers_for_a_hundred_seats_sell_each_seat_once_and_every_201_is_confirmed,
    on_a_numbered_line_two_thousand_buyers_for_a_hundred_seats_sell_each_seat_once
);

async fn two_thousand_buyers_for_a_hundred_seats_sell_each_seat_once_and_every_201_is_confirmed_in(
    form: &str,
) {
    let app = Arc::new(spawn_app().await);
    let (ev, show) = sale(
        &app,
        json!({"rows": "A-E", "seats_per_row": 20}),
        json!({"max_seats_per_hold": 4, "active_capacity": 5000, "line_form": form}),
    )
    .await;
    let all_seats: Vec<String> = ('A'..='E')
        .flat_map(|r| (1..=20).map(move |n| format!("{r}-{n}")))
        .collect();
    let gate = Arc::new(Semaphore::new(200));
    let buyers: Vec<_> = (0..2000)
        .map(|i| {
            let (app, ev, show, gate) = (app.clone(), ev.clone(), show.clone(), gate.clone());
            let picks: Vec<String> = {
                let mut rng = rand::rng();
                let k = rng.random_range(1..=4);
                all_seats.choose_multiple(&mut rng, k).cloned().collect()
            };
            tokio::spawn(async move {
                let _p = gate.acquire().await.unwrap();
                let token = admitted_unless_sold_out(&app, &ev, &format!("buyer{i}")).await?;
                let r = hold(&app, &show, &token, json!({"seats": picks})).await;
                match r.status() {
                    StatusCode::CREATED => {}
                    StatusCode::CONFLICT => return None,
                    // The session ended between admission and the hold: fine, no purchase.
                    StatusCode::FORBIDDEN => return None,
                    other => panic!("hold answered {other}"),
                }
                let h: Value = r.json().await.unwrap();
                let b = book(&app, &show, &token, h["hold_id"].as_str().unwrap()).await;
                assert_eq!(b.status(), StatusCode::CREATED, "a live hold books");
                let b: Value = b.json().await.unwrap();
                Some((b["booking_id"].as_str().unwrap().to_owned(), picks))
            })
        })
        .collect();
    let mut promised: HashMap<String, Vec<String>> = HashMap::new();
    for b in buyers {
        if let Some((id, seats)) = b.await.unwrap() {
            promised.insert(id, seats);
        }
    }
    assert!(!promised.is_empty());
    // Every 201 became confirmed.
    for id in promised.keys() {
        assert_eq!(wait_decided(&app, id).await, "confirmed", "booking {id}");
    }
    let db = db().await;
    // No seat in two confirmed bookings; sold count = seats in confirmed bookings.
    let doubled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT unnest(seats) AS seat FROM bookings \
         WHERE show_id = $1 AND status = 'confirmed' GROUP BY 1 HAVING count(*) > 1) d",
    )
    .bind(&show)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(doubled, 0);
    let sold: i64 =
        sqlx::query_scalar("SELECT count(*) FROM seats WHERE show_id = $1 AND status = 'SOLD'")
            .bind(&show)
            .fetch_one(&db)
            .await
            .unwrap();
    let in_bookings: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(cardinality(seats)), 0) FROM bookings WHERE show_id = $1 AND status = 'confirmed'",
    )
    .bind(&show)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(sold, in_bookings);
    assert_eq!(
        sold as usize,
        promised.values().map(Vec::len).sum::<usize>()
    );
    let confirmed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM bookings WHERE show_id = $1 AND status = 'confirmed'",
    )
    .bind(&show)
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(confirmed as usize, promised.len());
    // Redis agrees with the ledger seat by seat.
    let states = seat_states(&app, &show).await;
    let redis_sold = states.values().filter(|s| *s == "sold").count();
    assert_eq!(redis_sold as i64, sold);
}

#[tokio::test]
async fn bad_hold_and_booking_requests_get_the_contract_errors() {
    let app = spawn_app().await;
    let (ev, show) = sale(
        &app,
        json!({"seats": ["A-1", "A-2", "A-3"]}),
        json!({"max_seats_per_hold": 2}),
    )
    .await;
    let (other_ev, _) = sale(&app, json!({"seats": ["Z-1"]}), json!({})).await;
    let token = admitted(&app, &ev, "alice").await;
    let foreign = admitted(&app, &other_ev, "alice").await;
    for body in [
        json!({"seats": ["Q-9"]}),
        json!({"seats": ["A-1", "A-1"]}),
        json!({"seats": ["A-1", "A-2", "A-3"]}),
        json!({"seats": []}),
        json!({"seats": ["bad seat"]}),
        json!({"quantity": 1}),
        json!({}),
    ] {
        assert_error(
            hold(&app, &show, &token, body).await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        )
        .await;
    }
    assert_error(
        hold(&app, &show, &foreign, json!({"seats": ["A-1"]})).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    let forged = format!("{}x", &token[..token.len() - 1]);
    assert_error(
        hold(&app, &show, &forged, json!({"seats": ["A-1"]})).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    )
    .await;
    let none = app
        .http
        .post(format!("{}/v1/shows/{show}/holds", app.base))
        .json(&json!({"seats": ["A-1"]}))
        .send()
        .await
        .unwrap();
    assert_error(none, StatusCode::UNAUTHORIZED, "unauthorized").await;
    assert_error(
        book(&app, &show, &token, "not-a-uuid").await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let unknown = uuid::Uuid::new_v4().to_string();
    assert_error(
        book(&app, &show, &token, &unknown).await,
        StatusCode::CONFLICT,
        "hold_expired",
    )
    .await;
    assert_error(
        app.get(&format!("/v1/bookings/{unknown}")).await,
        StatusCode::NOT_FOUND,
        "not_found",
    )
    .await;
    assert_error(
        app.get("/v1/bookings/nope").await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    // Still nothing held.
    assert!(seat_states(&app, &show)
        .await
        .values()
        .all(|s| s == "available"));
}

#[tokio::test]
async fn general_admission_holds_a_quantity_and_never_sells_more_than_it_has() {
    let app = spawn_app().await;
    let (ev, show) = sale(&app, json!({"quantity": 5}), json!({})).await;
    let (alice, bob) = (
        admitted(&app, &ev, "alice").await,
        admitted(&app, &ev, "bob").await,
    );
    let r = hold(&app, &show, &alice, json!({"quantity": 3})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let h: Value = r.json().await.unwrap();
    assert_eq!(h["quantity"], 3);
    assert_error(
        hold(&app, &show, &bob, json!({"quantity": 3})).await,
        StatusCode::CONFLICT,
        "sold_out",
    )
    .await;
    assert_error(
        hold(&app, &show, &bob, json!({"seats": ["A-1"]})).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    )
    .await;
    let b: Value = book(&app, &show, &alice, h["hold_id"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    // The confirmation repeated at once: the same booking goes to Kafka twice, very likely in
    // one ledger batch; it must still sell 3 places, not 6, and not be rejected.
    let again: Value = book(&app, &show, &alice, h["hold_id"].as_str().unwrap())
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(again["booking_id"], b["booking_id"]);
    assert_eq!(b["quantity"], 3);
    assert_eq!(
        wait_decided(&app, b["booking_id"].as_str().unwrap()).await,
        "confirmed"
    );
    let sold = ga_sold(&show).await;
    assert_eq!(sold, 3);
    let map: Value = app.seat_map(&show).await;
    assert_eq!(map["available"], 2);
    assert_eq!(map["quantity"], 5);
}

on_both_forms!(
    tokio::test,
    when_everything_is_taken_the_line_says_sold_out_and_reopens_when_seats_come_back_in:
    when_everything_is_taken_the_line_says_sold_out_and_reopens_when_seats_come_back,
    on_a_numbered_line_when_everything_is_taken_the_line_says_sold_out_and_reopens
);

async fn when_everything_is_taken_the_line_says_sold_out_and_reopens_when_seats_come_back_in(
    form: &str,
) {
    let app = spawn_app().await;
    let (ev, show) = sale(
        &app,
        json!({"seats": ["A-1", "A-2"]}),
        json!({"max_seats_per_hold": 2, "line_form": form}),
    )
    .await;
    let alice = admitted(&app, &ev, "alice").await;
    let h: Value = hold(&app, &show, &alice, json!({"seats": ["A-1", "A-2"]}))
        .await
        .json()
        .await
        .unwrap();
    // New arrivals are told at once (within the config cache's half second), and not queued.
    // Each try is a new person: one who got in before the flag was seen stays admitted.
    let tries = std::sync::atomic::AtomicUsize::new(0);
    let s = eventually(Duration::from_secs(5), "sold out", || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let s = app.enter_ok(&ev, &format!("carol{n}")).await;
        (s["status"] == "sold_out").then_some(s)
    })
    .await;
    assert!(s["position"].is_null());
    // Told, not queued: the ticket is not in the line.
    assert_eq!(
        app.poll(&ev, s["ticket"].as_str().unwrap()).await.status(),
        StatusCode::NOT_FOUND
    );
    // Someone already admitted keeps their session and token while the line is sold out.
    let alice_again = app.enter_ok(&ev, "alice").await;
    assert_eq!(alice_again["status"], "admitted");
    assert!(alice_again["access_token"].is_string());
    // The hold is released: seats are back, the line takes people again.
    let del = release(&app, &show, &alice, h["hold_id"].as_str().unwrap()).await;
    assert_eq!(del.status(), StatusCode::NO_CONTENT);
    eventually(Duration::from_secs(5), "reopened", || async {
        (app.enter_ok(&ev, "carol").await["status"] != "sold_out").then_some(())
    })
    .await;
}

/// An enter while the line is sold out reads where the person stands (someone admitted keeps
/// their session) through the same wrong-type repair as every other read of the line. It did
/// not: an index bucket of the wrong type answered 503 to its members' enters for as long as
/// the event stayed sold out (the tick reads no bucket, so nothing else repairs one). Carol is
/// admitted, Alice holds the only seat, and Carol's bucket is overwritten; a second instance,
/// which remembers no number, has to read it. Her entry was in the bucket, so the line knows
/// her no more: sold out, as for anyone new. (On the sorted sets the tick, which keeps running
/// while an event is sold out, reads and so repairs every shard key such an enter reads.)
#[tokio::test]
async fn on_a_numbered_line_a_wrong_typed_bucket_is_repaired_while_the_line_is_sold_out() {
    let prefix = unique("t");
    let app = spawn_app_with(|c| c.redis.key_prefix = prefix.clone()).await;
    let other = spawn_app_with(|c| c.redis.key_prefix = prefix.clone()).await;
    let (ev, show) = sale(
        &app,
        json!({"seats": ["A-1"]}),
        json!({"shards": 1, "line_form": "numbered"}),
    )
    .await;
    let alice = admitted(&app, &ev, "alice").await;
    admitted(&app, &ev, "carol").await;
    let carol = app.enter_ok(&ev, "carol").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    let h = hold(&app, &show, &alice, json!({"seats": ["A-1"]})).await;
    assert_eq!(h.status(), StatusCode::CREATED);
    let tries = std::sync::atomic::AtomicUsize::new(0);
    eventually(Duration::from_secs(5), "sold out at the other", || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (other.enter_ok(&ev, &format!("dave{n}")).await["status"] == "sold_out").then_some(())
    })
    .await;

    let cfg = app.get_event(&ev).await["config"].clone();
    let bucket = crate::numbered::index_key_of(&app, &ev, &cfg, &carol);
    let () = app.redis.clone().del(&bucket).await.unwrap();
    let () = app.redis.clone().set(&bucket, "not mine").await.unwrap();
    let r = other.enter(&ev, "carol").await;
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let s: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["status"], "sold_out");
    assert_eq!(s["ticket"], carol.as_str());
    app.assert_moved_aside(&bucket, "none", "not mine").await;
    // Alice, admitted and holding, is still admitted at the other instance (unless her
    // entry shared Carol's bucket, one chance in 16,384).
    let alice_ticket = app.enter_ok(&ev, "alice").await["ticket"]
        .as_str()
        .unwrap()
        .to_owned();
    if crate::numbered::index_key_of(&app, &ev, &cfg, &alice_ticket) != bucket {
        assert_eq!(other.enter_ok(&ev, "alice").await["status"], "admitted");
    }
}

#[tokio::test]
async fn a_seat_sold_again_after_redis_lost_its_mark_is_rejected_by_the_ledger_and_reconcile_repairs(
) {
    let app = spawn_app().await;
    let (ev, show) = sale(&app, json!({"seats": ["A-1", "A-2", "A-3"]}), json!({})).await;
    let alice = admitted(&app, &ev, "alice").await;
    let first = bought(&app, &show, &alice, json!({"seats": ["A-1"]})).await;

    // Redis loses the sold mark (a primary lost before replicating, say).
    let seats_key = app.keys.show(&show).seats;
    let () = app.redis.clone().hset(&seats_key, "A-1", "").await.unwrap();
    assert_eq!(seat_states(&app, &show).await["A-1"], "available");

    // A second buyer gets the seat in Redis: the ledger's conditional update stops the sale.
    let bob = admitted(&app, &ev, "bob").await;
    let h: Value = hold(&app, &show, &bob, json!({"seats": ["A-1"]}))
        .await
        .json()
        .await
        .unwrap();
    let second = book(&app, &show, &bob, h["hold_id"].as_str().unwrap()).await;
    assert_eq!(second.status(), StatusCode::CREATED);
    let second: Value = second.json().await.unwrap();
    assert_eq!(
        wait_decided(&app, second["booking_id"].as_str().unwrap()).await,
        "rejected"
    );
    let owner: uuid::Uuid =
        sqlx::query_scalar("SELECT booking_id FROM seats WHERE show_id = $1 AND seat_id = 'A-1'")
            .bind(&show)
            .fetch_one(&db().await)
            .await
            .unwrap();
    assert_eq!(owner.to_string(), first);
    // The rejection put Redis back in line with the ledger.
    eventually(Duration::from_secs(5), "redis settled", || async {
        (seat_states(&app, &show).await["A-1"] == "sold").then_some(())
    })
    .await;

    // reconcile reports a drift and, with --repair, rewrites Redis from the ledger.
    let () = app.redis.clone().hset(&seats_key, "A-1", "").await.unwrap();
    let (ok, report, err) = reconcile(&app, false);
    assert!(ok, "{err}");
    let d = &drifts(&report, &show)["A-1"];
    assert_eq!(d["redis"], "available");
    assert_eq!(d["action"], "would repair");
    assert_eq!(
        seat_states(&app, &show).await["A-1"],
        "available",
        "reporting changes nothing"
    );
    let (ok, _, err) = reconcile(&app, true);
    assert!(ok, "{err}");
    assert_eq!(seat_states(&app, &show).await["A-1"], "sold");
    assert!(
        drifts(&reconcile(&app, false).1, &show).is_empty(),
        "no drift after repair"
    );

    // Two seats Redis shows sold by bookings the ledger has never seen: A-2's booking has a
    // live intent (its request is still in flight, or the sweeper is publishing it); A-3's has
    // none, and the ledger has read the whole topic: it can never be decided.
    let k = app.keys.show(&show);
    let (in_flight, lost) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let hold_id = uuid::Uuid::new_v4().to_string();
    let mut conn = app.redis.clone();
    let rec =
        json!({"ticket": "t", "seats": ["A-2"], "expires": 0, "booking": in_flight.to_string()});
    let () = conn
        .hset(&k.holdrec, &hold_id, rec.to_string())
        .await
        .unwrap();
    // Far in the future, so this test's own sweeper leaves it alone.
    let _: i64 = conn.zadd(&k.intents, &hold_id, 9e15).await.unwrap();
    let () = conn
        .hset(&k.seats, "A-2", format!("s:{in_flight}"))
        .await
        .unwrap();
    let () = conn
        .hset(&k.seats, "A-3", format!("s:{lost}"))
        .await
        .unwrap();
    let (ok, report, _) = reconcile(&app, true);
    let found = drifts(&report, &show);
    assert!(
        found["A-2"]["action"]
            .as_str()
            .unwrap()
            .starts_with("left: its intent is live"),
        "{report}"
    );
    assert_eq!(found["A-3"]["action"], "repaired", "{report}");
    assert!(!ok, "--repair that left a seat says so in its exit status");
    let states = seat_states(&app, &show).await;
    assert_eq!(states["A-2"], "sold", "a booking in flight kept its seat");
    assert_eq!(
        states["A-3"], "available",
        "a booking that can never be decided freed its seat"
    );
}

/// The ledger killed with -9 while it is applying a backlog (some bookings applied, some not:
/// asserted at the kill), then restarted: every booking is decided exactly once. "Once" is
/// checked by more than a row count: a booking decided before the kill keeps its `decided_at`
/// (applying it again would move it), and every seat is sold by the booking that named it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_ledger_killed_mid_batch_and_restarted_decides_each_booking_exactly_once() {
    use waitroom::booking::producer::{ensure_topic, BookingProducer};
    use waitroom::booking::BookingMessage;

    let prefix = unique("t");
    let cfg = crate::common::test_config(&prefix);
    let (_, secret) = cfg.secrets().unwrap();
    let signer = waitroom::auth::Signer::new(&secret);
    let db = db().await;
    waitroom::startup::migrate(&db).await.unwrap();
    ensure_topic(&cfg.kafka).await.unwrap();
    // A backlog of 3,000 one-seat bookings on the topic before the ledger starts (published
    // straight to Kafka, as the service does, to make a backlog several batches long).
    let (event, show) = (unique("e"), unique("s"));
    let seats: Vec<String> = (0..3000).map(|i| format!("S-{i}")).collect();
    waitroom::seats::repo::upsert_show(&db, &show, &event, &seats, None)
        .await
        .unwrap();
    let producer = BookingProducer::new(&cfg.kafka).unwrap();
    let messages: Vec<BookingMessage> = seats
        .iter()
        .map(|seat| {
            BookingMessage {
                booking_id: uuid::Uuid::new_v4().to_string(),
                show: show.clone(),
                event: event.clone(),
                ticket: uuid::Uuid::new_v4().to_string(),
                seats: vec![seat.clone()],
                quantity: 0,
                mac: String::new(),
            }
            .signed(&signer)
        })
        .collect();
    futures::future::try_join_all(messages.iter().map(|m| producer.publish(m)))
        .await
        .unwrap();

    let start_ledger = || {
        crate::common::procs::dies_with_test(env!("CARGO_BIN_EXE_waitroom"))
            .arg("ledger")
            .env("WAITROOM_ENV", "development")
            .env("WAITROOM_KEY_PREFIX", &prefix)
            .env("WAITROOM_KAFKA_TOPIC", &cfg.kafka.topic)
            .env("WAITROOM_KAFKA_GROUP", &cfg.kafka.group)
            // Batches of 100: the backlog is 30 of them on any machine. At the default (5,000)
            // a fast one took all 3,000 in one batch, and the kill could only land after it.
            .env("WAITROOM_LEDGER_BATCH_MAX", "100")
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("ledger starts")
    };
    let decided = |db: sqlx::PgPool, show: String| async move {
        sqlx::query_as::<_, (uuid::Uuid, String, Option<String>)>(
            "SELECT booking_id, status, decided_at::text FROM bookings WHERE show_id = $1",
        )
        .bind(show)
        .fetch_all(&db)
        .await
        .unwrap()
    };
    let mut ledger = start_ledger();
    // Kill it as soon as PostgreSQL shows its first applied bookings.
    let started = std::time::Instant::now();
    loop {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM bookings WHERE show_id = $1")
            .bind(&show)
            .fetch_one(&db)
            .await
            .unwrap();
        if n > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the ledger applied nothing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    ledger.kill().unwrap();
    ledger.wait().unwrap();
    let at_kill = decided(db.clone(), show.clone()).await;
    assert!(
        !at_kill.is_empty() && at_kill.len() < messages.len(),
        "killed mid-stream: {} of {} applied at the kill",
        at_kill.len(),
        messages.len()
    );
    eprintln!(
        "ledger killed with {} of {} bookings applied",
        at_kill.len(),
        messages.len()
    );
    let mut ledger = start_ledger();
    let done = eventually(Duration::from_secs(120), "every booking decided", || {
        let (db, show) = (db.clone(), show.clone());
        async move {
            let rows = decided(db, show).await;
            (rows.len() == 3000).then_some(rows)
        }
    })
    .await;
    ledger.kill().unwrap();
    ledger.wait().unwrap();
    assert!(done.iter().all(|(_, status, _)| status == "confirmed"));
    assert!(
        done.iter().all(|(_, _, at)| at.is_some()),
        "every booking has decided_at"
    );
    let before: HashMap<uuid::Uuid, Option<String>> =
        at_kill.into_iter().map(|(id, _, at)| (id, at)).collect();
    for (id, _, at) in &done {
        if let Some(was) = before.get(id) {
            assert_eq!(at, was, "booking {id} was decided again after the restart");
        }
    }
    // Each seat sold by exactly the booking that named it.
    let owners: HashMap<String, uuid::Uuid> = sqlx::query_as::<_, (String, uuid::Uuid)>(
        "SELECT seat_id, booking_id FROM seats WHERE show_id = $1 AND status = 'SOLD'",
    )
    .bind(&show)
    .fetch_all(&db)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(owners.len(), 3000);
    for m in &messages {
        assert_eq!(
            owners[&m.seats[0]].to_string(),
            m.booking_id,
            "seat {} sold by its booking",
            m.seats[0]
        );
    }
}

#[tokio::test]
async fn when_kafka_does_not_acknowledge_the_answer_is_503_with_the_booking_and_nothing_is_undone()
{
    // A broker address where nothing listens: holds work (Redis), bookings cannot be published.
    let app = crate::common::spawn_app_with(|c| {
        c.kafka.brokers = "127.0.0.1:1".into();
        c.kafka.ack_timeout_ms = 1000;
        c.kafka.no_ledger = true;
    })
    .await;
    let (ev, show) = sale(&app, json!({"seats": ["A-1"]}), json!({})).await;
    let token = admitted(&app, &ev, "alice").await;
    let h: Value = hold(&app, &show, &token, json!({"seats": ["A-1"]}))
        .await
        .json()
        .await
        .unwrap();
    let hold_id = h["hold_id"].as_str().unwrap().to_owned();
    let r = book(&app, &show, &token, &hold_id).await;
    assert_eq!(r.headers()["retry-after"], "2");
    let body = assert_error(r, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    let id = body["booking_id"]
        .as_str()
        .expect("the 503 names the booking")
        .to_owned();
    // The outcome is unknown, so nothing is undone: the seat stays sold, the buyer can follow
    // the booking, and the same request again names the same booking.
    assert_eq!(seat_states(&app, &show).await["A-1"], "sold");
    assert_eq!(booking(&app, &id).await["status"], "pending");
    let again = book(&app, &show, &token, &hold_id).await;
    let again = assert_error(again, StatusCode::SERVICE_UNAVAILABLE, "unavailable").await;
    assert_eq!(again["booking_id"], id.as_str());
    assert_eq!(seat_states(&app, &show).await["A-1"], "sold");
    // The intent stays for the sweeper (tests/it/booking_faults.rs shows it ending confirmed).
    let intents: Vec<String> =
        redis::AsyncCommands::zrange(&mut app.redis.clone(), app.keys.show(&show).intents, 0, -1)
            .await
            .unwrap();
    assert_eq!(intents, vec![hold_id]);
}

/// Giving a hold back frees only the seats that still say that hold: a seat the ledger's
/// verdict or a repair set to sold meanwhile stays sold (release_hold.lua checks each seat).
#[tokio::test]
async fn releasing_a_hold_frees_only_the_seats_it_still_holds() {
    let app = spawn_app().await;
    let (ev, show) = sale(&app, json!({"seats": ["A-1", "A-2"]}), json!({})).await;
    let token = admitted(&app, &ev, "alice").await;
    let h: Value = hold(&app, &show, &token, json!({"seats": ["A-1", "A-2"]}))
        .await
        .json()
        .await
        .unwrap();
    let hold_id = h["hold_id"].as_str().unwrap().to_owned();
    // A-2 was set sold by something else meanwhile (a reconcile repair from the ledger, say).
    let sold_by = format!("s:{}", uuid::Uuid::new_v4());
    let () = app
        .redis
        .clone()
        .hset(app.keys.show(&show).seats, "A-2", &sold_by)
        .await
        .unwrap();
    let r = release(&app, &show, &token, &hold_id).await;
    assert!(r.status().is_success(), "{}", r.status());
    let states = seat_states(&app, &show).await;
    assert_eq!(states["A-1"], "available");
    assert_eq!(
        states["A-2"], "sold",
        "a seat no longer this hold's stayed as it was"
    );
}

#[tokio::test]
async fn a_hold_answers_only_to_its_ticket_and_a_booked_one_cannot_be_released() {
    let app = spawn_app().await;
    let (ev, show) = sale(&app, json!({"seats": ["A-1", "A-2"]}), json!({})).await;
    let (alice, bob) = (
        admitted(&app, &ev, "alice").await,
        admitted(&app, &ev, "bob").await,
    );
    let r = hold(&app, &show, &alice, json!({"seats": ["A-1"]})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let h: Value = r.json().await.unwrap();
    let id = h["hold_id"].as_str().unwrap();
    // Another admitted buyer who learns the hold's id can neither free nor buy it.
    assert_error(
        release(&app, &show, &bob, id).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_error(
        book(&app, &show, &bob, id).await,
        StatusCode::FORBIDDEN,
        "forbidden",
    )
    .await;
    assert_eq!(seat_states(&app, &show).await["A-1"], "held");
    assert_eq!(
        book(&app, &show, &alice, id).await.status(),
        StatusCode::CREATED
    );
    // Booked, it is no longer a hold: its holder (admitted again, a booking ends the session)
    // cannot release it, and the seat stays sold.
    let alice = admitted(&app, &ev, "alice").await;
    assert_error(
        release(&app, &show, &alice, id).await,
        StatusCode::CONFLICT,
        "conflict",
    )
    .await;
    assert_eq!(seat_states(&app, &show).await["A-1"], "sold");
    // A released hold gives its seat back, once, and leaves its ticket free to hold again.
    let r = hold(&app, &show, &alice, json!({"seats": ["A-2"]})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let h: Value = r.json().await.unwrap();
    let id = h["hold_id"].as_str().unwrap();
    assert_eq!(available(&app, &show).await, 0);
    let r = release(&app, &show, &alice, id).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(available(&app, &show).await, 1);
    assert_eq!(seat_states(&app, &show).await["A-2"], "available");
    assert_hold_gone(&app, &show, &alice, id).await;
    let r = hold(&app, &show, &alice, json!({"seats": ["A-2"]})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(available(&app, &show).await, 0);
}

#[tokio::test]
async fn a_seat_whose_hold_lapsed_can_be_held_at_once_without_waiting_for_a_sweep() {
    let app = spawn_app().await;
    let (ev, show) = sale(
        &app,
        json!({"seats": ["A-1"]}),
        json!({"hold_ttl_seconds": 1}),
    )
    .await;
    let (alice, bob) = (
        admitted(&app, &ev, "alice").await,
        admitted(&app, &ev, "bob").await,
    );
    let r = hold(&app, &show, &alice, json!({"seats": ["A-1"]})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // The hold lapses at most 1 s after its answer. 30 ms later, with no read of the seat map
    // in between (a read lapses holds too), the seat is bob's to hold: the hold script lapses
    // what is due before it looks, rather than leaving it to the leader's sweep (once a second).
    tokio::time::sleep(Duration::from_millis(1030)).await;
    let r = hold(&app, &show, &bob, json!({"seats": ["A-1"]})).await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "{}",
        r.text().await.unwrap()
    );
}

#[tokio::test]
async fn a_general_admission_hold_released_or_lapsed_gives_its_places_back_once_and_a_booked_one_never(
) {
    let app = spawn_app().await;
    // Holds of 3 s: each part does up to four requests (a booking among them) inside one.
    let (ev, show) = sale(&app, json!({"quantity": 5}), json!({"hold_ttl_seconds": 3})).await;
    let (alice, bob) = (
        admitted(&app, &ev, "alice").await,
        admitted(&app, &ev, "bob").await,
    );
    // Released: the places come back once, and the ticket may hold again.
    let r = hold(&app, &show, &alice, json!({"quantity": 2})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let released: Value = r.json().await.unwrap();
    let released = released["hold_id"].as_str().unwrap();
    assert_eq!(available(&app, &show).await, 3);
    let r = release(&app, &show, &alice, released).await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(available(&app, &show).await, 5);
    assert_hold_gone(&app, &show, &alice, released).await;
    assert_eq!(available(&app, &show).await, 5);
    // Lapsed: the same.
    let r = hold(&app, &show, &alice, json!({"quantity": 3})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let lapsed: Value = r.json().await.unwrap();
    let lapsed = lapsed["hold_id"].as_str().unwrap();
    assert_eq!(available(&app, &show).await, 2);
    tokio::time::sleep(Duration::from_millis(3300)).await;
    assert_eq!(
        available(&app, &show).await,
        5,
        "a lapsed hold's places come back"
    );
    // A lapsed hold is gone: it books nothing, and releasing it gives nothing back a second time.
    assert_hold_gone(&app, &show, &alice, lapsed).await;
    assert_eq!(available(&app, &show).await, 5);
    // A booked hold never lapses: its places stay taken past the hold's time.
    let r = hold(&app, &show, &bob, json!({"quantity": 4})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let h: Value = r.json().await.unwrap();
    let b = book(&app, &show, &bob, h["hold_id"].as_str().unwrap()).await;
    assert_eq!(b.status(), StatusCode::CREATED);
    let b: Value = b.json().await.unwrap();
    tokio::time::sleep(Duration::from_millis(3300)).await;
    assert_eq!(
        available(&app, &show).await,
        1,
        "a booked hold does not lapse"
    );
    assert_eq!(
        wait_decided(&app, b["booking_id"].as_str().unwrap()).await,
        "confirmed"
    );
    let sold = ga_sold(&show).await;
    assert_eq!(sold, 4);
}

/// The general-admission places the ledger has sold in `show`.
async fn ga_sold(show: &str) -> i32 {
    sqlx::query_scalar("SELECT ga_sold FROM shows WHERE show_id = $1")
        .bind(show)
        .fetch_one(&db().await)
        .await
        .unwrap()
}

/// The places a show has left, as its map says.
async fn available(app: &TestApp, show: &str) -> i64 {
    app.seat_map(show).await["available"].as_i64().unwrap()
}

#[tokio::test]
async fn a_hold_whose_seat_the_ledger_sold_meanwhile_books_or_lapses_without_taking_it() {
    let app = spawn_app().await;
    let (ev, show) = sale(
        &app,
        json!({"seats": ["A-1", "A-2", "A-3"]}),
        json!({"hold_ttl_seconds": 1}),
    )
    .await;
    let alice = admitted(&app, &ev, "alice").await;
    let first = bought(&app, &show, &alice, json!({"seats": ["A-1"]})).await;
    // Redis loses A-1's sold mark; bob holds it with A-2.
    let k = app.keys.show(&show);
    let () = app.redis.clone().hset(&k.seats, "A-1", "").await.unwrap();
    let bob = admitted(&app, &ev, "bob").await;
    let r = hold(&app, &show, &bob, json!({"seats": ["A-1", "A-2"]})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let h: Value = r.json().await.unwrap();
    // Reconciliation gives A-1 back to the sale the ledger holds (what `waitroom reconcile
    // --repair` writes for a seat the ledger has sold: the test above runs it).
    let () = app
        .redis
        .clone()
        .hset(&k.seats, "A-1", format!("s:{first}"))
        .await
        .unwrap();
    // Bob's hold is over: no 201 that the ledger would reject, and A-2 goes back.
    assert_error(
        book(&app, &show, &bob, h["hold_id"].as_str().unwrap()).await,
        StatusCode::CONFLICT,
        "hold_expired",
    )
    .await;
    let states = seat_states(&app, &show).await;
    assert_eq!(states["A-1"], "sold");
    assert_eq!(states["A-2"], "available");
    assert_eq!(states["A-3"], "available");
    // The same again, but carol's hold lapses instead: the lapse frees only the seat still hers.
    let () = app.redis.clone().hset(&k.seats, "A-1", "").await.unwrap();
    let carol = admitted(&app, &ev, "carol").await;
    let r = hold(&app, &show, &carol, json!({"seats": ["A-1", "A-3"]})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let () = app
        .redis
        .clone()
        .hset(&k.seats, "A-1", format!("s:{first}"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let states = seat_states(&app, &show).await;
    assert_eq!(states["A-1"], "sold");
    assert_eq!(states["A-3"], "available");
    let owner: uuid::Uuid =
        sqlx::query_scalar("SELECT booking_id FROM seats WHERE show_id = $1 AND seat_id = 'A-1'")
            .bind(&show)
            .fetch_one(&db().await)
            .await
            .unwrap();
    assert_eq!(owner.to_string(), first);
}

#[tokio::test]
async fn general_admission_counts_agree_with_the_ledger_and_reconcile_repairs_a_drift() {
    let app = spawn_app().await;
    let (ev, show) = sale(&app, json!({"quantity": 5}), json!({})).await;
    let alice = admitted(&app, &ev, "alice").await;
    bought(&app, &show, &alice, json!({"quantity": 3})).await;
    // Redis's count of places sold is the ledger's: reconcile finds nothing to say.
    let (ok, report, err) = reconcile(&app, false);
    assert!(ok, "{err}");
    assert!(drifts(&report, &show).is_empty(), "{report}");
    // The count drifts (two sold places lost with a primary, say): --repair writes the
    // ledger's, and the places available move the other way.
    let k = app.keys.show(&show);
    let () = app
        .redis
        .clone()
        .hset_multiple(&k.info, &[("sold", 1), ("available", 4)])
        .await
        .unwrap();
    let (_, report, _) = reconcile(&app, false);
    let d = &drifts(&report, &show)["#ga"];
    assert_eq!(d["redis"], "sold:1", "{report}");
    assert_eq!(d["ledger"], "sold:3", "{report}");
    // Repaired once the ledger has read the whole topic (its lag is 0).
    eventually(
        Duration::from_secs(20),
        "the #ga drift repaired",
        || async {
            let (_, report, _) = reconcile(&app, true);
            let repaired = drifts(&report, &show)
                .get("#ga")
                .is_some_and(|d| d["action"] == "repaired");
            repaired.then_some(())
        },
    )
    .await;
    assert_eq!(available(&app, &show).await, 2);
    let sold: i64 = app.redis.clone().hget(&k.info, "sold").await.unwrap();
    assert_eq!(sold, 3);
    let (ok, report, err) = reconcile(&app, false);
    assert!(ok, "{err}");
    assert!(drifts(&report, &show).is_empty(), "{report}");
}

/// Runs `waitroom reconcile` (with `--repair` when asked) on the app's keys, topic and ledger
/// group: (whether it exited 0, its report, its stderr).
fn reconcile(app: &TestApp, repair: bool) -> (bool, String, String) {
    let prefix = app.keys.registry().trim_end_matches(":events").to_owned();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_waitroom"));
    cmd.arg("reconcile")
        .env("WAITROOM_ENV", "development")
        .env("WAITROOM_KEY_PREFIX", &prefix)
        .env("WAITROOM_KAFKA_TOPIC", format!("{prefix}.bookings"))
        .env("WAITROOM_KAFKA_GROUP", format!("{prefix}-ledger"))
        .env("RUST_LOG", "error");
    if repair {
        cmd.arg("--repair");
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The drifts a reconcile report names for `show`, by seat ("#ga" for a general-admission count).
fn drifts(report: &str, show: &str) -> HashMap<String, Value> {
    report
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|d| d["show"] == show)
        .map(|d| (d["seat"].as_str().unwrap().to_owned(), d))
        .collect()
}

/// The cluster client sends a script again when a node's answer is lost (a failover, a broken
/// connection): hold.lua run a second time with the same hold id and ticket answers the hold it
/// made, rather than refusing the buyer for having a live hold or holding twice.
#[tokio::test]
async fn the_hold_script_run_again_after_a_lost_answer_holds_once() {
    use waitroom::redis::replies::HoldReply;
    use waitroom::redis::scripts::{with_show_keys, Scripts};
    let app = spawn_app().await;
    let (_, show) = sale(&app, json!({"seats": ["A-1", "A-2", "A-3"]}), json!({})).await;
    let (scripts, k) = (Scripts::new(), app.keys.show(&show));
    let now_ms = waitroom::queue::now_ms();
    let hold_id = uuid::Uuid::new_v4().to_string();
    let mut replies = Vec::new();
    for ticket in ["ticket-a", "ticket-a", "ticket-b"] {
        let mut call = with_show_keys(&scripts.hold, &k);
        call.arg(&hold_id)
            .arg(ticket)
            .arg(now_ms)
            .arg(60_000)
            .arg("")
            .arg(4)
            .arg("A-1")
            .arg("A-2");
        let reply: HoldReply = call.invoke_async(&mut app.redis.clone()).await.unwrap();
        replies.push(reply);
    }
    assert_eq!(
        replies,
        [
            HoldReply::Held { available: 1 },
            HoldReply::Held { available: 1 },
            HoldReply::Taken(vec!["A-1".into(), "A-2".into()]),
        ]
    );
    let states = seat_states(&app, &show).await;
    assert_eq!(
        (states["A-1"].as_str(), states["A-2"].as_str()),
        ("held", "held")
    );
    assert_eq!(available(&app, &show).await, 1);
}

/// settle.lua, the script that writes the ledger's verdicts into Redis, run directly: it changes
/// only what the ledger decided, and keeps the show's counts with the seats.
#[tokio::test]
async fn settling_writes_only_the_ledgers_verdicts_and_keeps_the_counts() {
    let app = spawn_app().await;
    let (_, show) = sale(
        &app,
        json!({"seats": ["A-1", "A-2", "A-3", "A-4"]}),
        json!({}),
    )
    .await;
    let k = app.keys.show(&show);
    let mut conn = app.redis.clone();
    // A-1 sold to a booking the ledger rejected, A-2 sold since to another booking, A-3 free,
    // A-4 held.
    let () = conn
        .hset_multiple(
            &k.seats,
            &[
                ("A-1", "s:rejected"),
                ("A-2", "s:other"),
                ("A-4", "h:some-hold"),
            ],
        )
        .await
        .unwrap();
    let () = conn
        .hset_multiple(&k.info, &[("available", 1), ("sold", 2)])
        .await
        .unwrap();
    // The rejection frees only what is still marked for the rejected booking.
    let changed = settle(
        &app,
        &show,
        &["#rejected", "rejected", "A-1", "", "A-2", ""],
    )
    .await;
    assert_eq!(changed, 1);
    assert_eq!(counts(&app, &show).await, (2, 1));
    // The ledger's sales: a free seat and a held one become sold, and are counted so.
    let changed = settle(&app, &show, &["A-3", "s:ledger-a", "A-4", "s:ledger-b"]).await;
    assert_eq!(changed, 2);
    assert_eq!(counts(&app, &show).await, (1, 3));
    let states = seat_states(&app, &show).await;
    assert_eq!(
        ["A-1", "A-2", "A-3", "A-4"].map(|s| states[s].as_str()),
        ["available", "sold", "sold", "sold"]
    );

    // General admission: a rejected booking's places are no longer sold (nor offered again);
    // the `sold` repair is a compare-and-set that refuses while a booking is in flight or when
    // `sold` moved since it was read.
    let (_, ga) = sale(&app, json!({"quantity": 5}), json!({})).await;
    let k = app.keys.show(&ga);
    let () = conn
        .hset_multiple(&k.info, &[("available", 2), ("sold", 3)])
        .await
        .unwrap();
    assert_eq!(settle(&app, &ga, &["#ga", "1"]).await, 0);
    assert_eq!(counts(&app, &ga).await, (2, 2));
    let _: i64 = conn.zadd(&k.intents, "a-hold", 1).await.unwrap();
    assert_eq!(
        settle(&app, &ga, &["#ga-sold", "2", "3"]).await,
        -1,
        "an intent"
    );
    let _: i64 = conn.zrem(&k.intents, "a-hold").await.unwrap();
    assert_eq!(
        settle(&app, &ga, &["#ga-sold", "1", "3"]).await,
        -1,
        "moved"
    );
    assert_eq!(counts(&app, &ga).await, (2, 2));
    assert_eq!(settle(&app, &ga, &["#ga-sold", "2", "3"]).await, 1);
    assert_eq!(counts(&app, &ga).await, (1, 3));
}

/// Runs settle.lua on `show` at time 0 (no hold lapses) with `args`.
async fn settle(app: &TestApp, show: &str, args: &[&str]) -> i64 {
    use waitroom::redis::scripts::{with_show_keys, Scripts};
    let (scripts, k) = (Scripts::new(), app.keys.show(show));
    let mut call = with_show_keys(&scripts.settle, &k);
    call.key(&k.intents).arg(0).arg(args);
    call.invoke_async(&mut app.redis.clone()).await.unwrap()
}

/// The show's (available, sold) counts in Redis.
async fn counts(app: &TestApp, show: &str) -> (i64, i64) {
    let k = app.keys.show(show);
    let v: Vec<i64> = app
        .redis
        .clone()
        .hmget(&k.info, &["available", "sold"])
        .await
        .unwrap();
    (v[0], v[1])
}
