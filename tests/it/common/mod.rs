//! Test harness: `spawn_app()` starts the real service in-process on port 0 with a unique key
//! prefix, so tests share the stack's Redis Cluster without sharing any state.

pub mod procs;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use clap::Parser as _;
use redis::AsyncCommands as _;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use waitroom::config::Config;
use waitroom::redis::keys::{Keys, ShardKeys};
use waitroom::redis::RedisConn;
use waitroom::startup::Application;

pub const ADMIN_TOKEN: &str = "test-admin-token";

/// A running service and handles to inspect it.
pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub redis: RedisConn,
    pub keys: Keys,
    /// The service's bookings topic.
    pub kafka_topic: String,
    shutdown: CancellationToken,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub fn unique(name: &str) -> String {
    format!("{name}{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// Config for a test instance: port 0, unique prefix, no per-client limit, fast ticks.
pub fn test_config(prefix: &str) -> Config {
    let mut cfg = Config::try_parse_from([
        "serve",
        "--env",
        "development",
        "--http-addr",
        "127.0.0.1:0",
        "--key-prefix",
        prefix,
        "--admin-token",
        ADMIN_TOKEN,
        "--client-rate-per-second",
        "0",
    ])
    .expect("test config parses");
    // Each test service has its own bookings topic and ledger group.
    cfg.kafka.topic = format!("{prefix}.bookings");
    cfg.kafka.group = format!("{prefix}-ledger");
    cfg.admission.tick_ms = 50;
    // Tests read the seat map right after changing it; the snapshot has its own test.
    cfg.http.seat_map_max_age_ms = 0;
    cfg.admission.lease_ms = 1500;
    // Debug builds of client and server share 2 cores here; under the 200-way concurrent tests a
    // response can queue for over a second. Production keeps the 1 s default.
    cfg.redis.response_timeout_ms = 3000;
    cfg
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(tweak: impl FnOnce(&mut Config)) -> TestApp {
    waitroom::telemetry::init_tracing();
    let prefix = unique("t");
    let mut cfg = test_config(&prefix);
    tweak(&mut cfg);
    let redis_cfg = cfg.redis.clone();
    let kafka_topic = cfg.kafka.topic.clone();
    let app = Application::build(cfg).await.expect("service builds");
    let base = format!("http://127.0.0.1:{}", app.port());
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(app.run_until_stopped(shutdown.clone()));
    let redis = waitroom::redis::connect(&redis_cfg)
        .await
        .expect("test redis connection");
    wait_until_prepared(&base).await;
    TestApp {
        base,
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            // A hung service fails the test instead of hanging it.
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        keys: Keys::new(redis_cfg.key_prefix.clone()),
        kafka_topic,
        redis,
        shutdown,
        handle: Some(handle),
    }
}

/// Waits (bounded) until the service has prepared its back ends in the background: `/readyz`
/// answers 200, or at least the schema is there (a test may point Kafka at a dead port on
/// purpose). Start-up itself no longer waits for PostgreSQL or Kafka.
async fn wait_until_prepared(base: &str) {
    let http = reqwest::Client::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if let Ok(r) = http.get(format!("{base}/readyz")).send().await {
            let ok = r.status() == StatusCode::OK;
            let body: Value = r.json().await.unwrap_or_default();
            if ok
                || (body["checks"]["postgres"] == "ok"
                    && started.elapsed() > Duration::from_secs(5))
            {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl TestApp {
    /// A second instance of the service on the same keys (the same key prefix): another
    /// replica of the deployment, with its own caches and its own admission task.
    pub async fn another_instance(&self) -> TestApp {
        let prefix = self.keys.prefix().to_owned();
        spawn_app_with(|c| c.redis.key_prefix = prefix).await
    }

    /// Stops the service and waits for it to exit.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(h) = self.handle.take() {
            h.await.unwrap().unwrap();
        }
    }

    /// A plain GET of `path` on the service.
    pub async fn get(&self, path: &str) -> Response {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
    }

    /// The public seat map of `show` (`GET /v1/shows/{show}/seats`).
    pub async fn seat_map(&self, show: &str) -> Value {
        self.get(&format!("/v1/shows/{show}/seats"))
            .await
            .json()
            .await
            .unwrap()
    }

    /// The `/metrics` page.
    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.unwrap()
    }

    /// The value of one series of /metrics (`name{labels}` as rendered), 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        let prefix = format!("{series} ");
        self.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map_or(0.0, |v| v.trim().parse().unwrap())
    }

    pub async fn put_event(&self, event: &str, body: Value) -> Response {
        self.http
            .put(format!("{}/admin/v1/events/{event}", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Changes an event and asserts the change was taken (200): a refused change would let the
    /// next assertion pass for the wrong reason.
    pub async fn update_event(&self, event: &str, body: Value) {
        let r = self.put_event(event, body).await;
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    }

    /// Creates an event and asserts it was created.
    pub async fn create_event(&self, event: &str, body: Value) {
        let r = self.put_event(event, body).await;
        assert_eq!(
            r.status(),
            StatusCode::CREATED,
            "{}",
            r.text().await.unwrap()
        );
    }

    pub async fn put_show(&self, show: &str, body: Value) -> Response {
        self.http
            .put(format!("{}/admin/v1/shows/{show}", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Creates a show and asserts it was created.
    pub async fn create_show(&self, show: &str, body: Value) {
        let r = self.put_show(show, body).await;
        assert_eq!(
            r.status(),
            StatusCode::CREATED,
            "{}",
            r.text().await.unwrap()
        );
    }

    /// Enters `user` and waits until admitted; returns the access token.
    pub async fn admitted(&self, event: &str, user: &str) -> String {
        let ticket = self.enter_ok(event, user).await["ticket"]
            .as_str()
            .unwrap()
            .to_owned();
        eventually(Duration::from_secs(20), "admitted", || async {
            let s = self.poll_ok(event, &ticket).await;
            s["access_token"].as_str().map(str::to_owned)
        })
        .await
    }

    pub async fn get_event(&self, event: &str) -> Value {
        let r = self
            .http
            .get(format!("{}/admin/v1/events/{event}", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    pub async fn enter(&self, event: &str, user: &str) -> Response {
        self.http
            .post(format!("{}/v1/events/{event}/queue", self.base))
            .json(&json!({"user_id": user}))
            .send()
            .await
            .unwrap()
    }

    /// Enters and returns the queue status, asserting 200. A 503 is answered as a client
    /// answers it, by entering again after a pause (entering again never moves anyone): on 2
    /// cores shared with the other tests' servers, 200 enters at once can outlast the Redis
    /// deadline, and the contract's answer to that is a 503 (seen on a slow machine in
    /// `queue::five_thousand_concurrent_enters…` and `strategies::timestamp_orders…`). Any other
    /// status, or 503s for 10 tries over 5 s, fails. Tests of the 503 itself call [`Self::enter`].
    pub async fn enter_ok(&self, event: &str, user: &str) -> Value {
        for _ in 0..10 {
            let r = self.enter(event, user).await;
            if r.status() == StatusCode::SERVICE_UNAVAILABLE {
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                continue;
            }
            assert_eq!(r.status(), StatusCode::OK, "enter of {user}");
            return r.json().await.unwrap();
        }
        panic!("enter of {user}: ten 503s in a row")
    }

    pub async fn poll(&self, event: &str, ticket: &str) -> Response {
        self.http
            .get(format!("{}/v1/events/{event}/queue/{ticket}", self.base))
            .send()
            .await
            .unwrap()
    }

    pub async fn poll_ok(&self, event: &str, ticket: &str) -> Value {
        let r = self.poll(event, ticket).await;
        assert_eq!(r.status(), StatusCode::OK);
        r.json().await.unwrap()
    }

    pub async fn leave(&self, event: &str, ticket: &str) -> Response {
        self.http
            .delete(format!("{}/v1/events/{event}/queue/{ticket}", self.base))
            .send()
            .await
            .unwrap()
    }

    /// That the wrong-type repair moved `key` aside: `key` is now of type `now` (`none` when
    /// nothing wrote it since), and exactly one `<key>:wrongtype:*` keeps the string `kept`.
    pub async fn assert_moved_aside(&self, key: &str, now: &str, kept: &str) {
        let kind: String = redis::cmd("TYPE")
            .arg(key)
            .query_async(&mut self.redis.clone())
            .await
            .unwrap();
        assert_eq!(kind, now, "{key}");
        let aside: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{key}:wrongtype:*"))
            .query_async(&mut self.redis.clone())
            .await
            .unwrap();
        assert_eq!(aside.len(), 1, "{key}: {aside:?}");
        let value: String = self.redis.clone().get(&aside[0]).await.unwrap();
        assert_eq!(value, kept, "{}", aside[0]);
    }

    /// The event's shard tags, as stored.
    pub async fn shard_tags(&self, event: &str) -> Vec<String> {
        let cfg = self.get_event(event).await;
        serde_json::from_value(cfg["config"]["shard_tags"].clone()).unwrap()
    }

    /// Every member of the event's active sets, read straight from Redis: [`member`] of each
    /// admitted ticket. On a numbered line, the members whose number lies between the first
    /// live session and the boundary, departed from neither bitmap ([`numbered_active`]).
    pub async fn active_tickets(&self, event: &str) -> HashSet<String> {
        let cfg = self.get_event(event).await["config"].clone();
        if cfg["line_form"] == "numbered" {
            return numbered_active(&self.redis, &self.keys, event, &cfg).await;
        }
        let tags: Vec<String> = serde_json::from_value(cfg["shard_tags"].clone()).unwrap();
        active_tickets(&self.redis, &self.keys, &tags).await
    }

    /// Every member of the event's waiting lines, read straight from Redis.
    pub async fn waiting_members(&self, event: &str) -> HashSet<String> {
        let tags = self.shard_tags(event).await;
        set_members(&self.redis, &self.keys, &tags, |k| k.waiting).await
    }
}

/// The line's member for `ticket` in the events this version creates (14 characters); a string
/// that is not a ticket (a member already, or a name a test placed in a line) as it is.
pub fn member(ticket: &str) -> String {
    match waitroom::ids::Ticket::parse(ticket) {
        Ok(t) => t.to_short_member(),
        Err(_) => ticket.to_owned(),
    }
}

/// [`member`] of each of `tickets`.
pub fn members<'a>(tickets: impl IntoIterator<Item = &'a String>) -> HashSet<String> {
    tickets.into_iter().map(|t| member(t)).collect()
}

pub async fn active_tickets(redis: &RedisConn, keys: &Keys, tags: &[String]) -> HashSet<String> {
    set_members(redis, keys, tags, |k| k.active).await
}

/// Two tests of one sale under the test attribute `$test` (`tokio::test` and its arguments):
/// `$sorted` runs `$body("sorted_sets")`, `$numbered` runs `$body("numbered")`, each with the
/// doc comments written before its name.
macro_rules! on_both_forms {
    ($test:meta, $body:ident: $(#[$sdoc:meta])* $sorted:ident, $(#[$ndoc:meta])* $numbered:ident) => {
        $(#[$sdoc])*
        #[$test]
        async fn $sorted() {
            $body("sorted_sets").await;
        }

        $(#[$ndoc])*
        #[$test]
        async fn $numbered() {
            $body("numbered").await;
        }
    };
}
pub(crate) use on_both_forms;

/// `body` (an event's creation body) with the line form `form` (`sorted_sets` or `numbered`):
/// for the tests that run the same sale on both forms.
pub fn in_form(form: &str, mut body: Value) -> Value {
    body["line_form"] = json!(form);
    body
}

/// The members admitted on a numbered line whose session the tick has not ended, read straight
/// from Redis in one script on the event's slot (docs/numbered-line.md, "The layout"): every
/// index entry whose number `n` has `e <= n < b` (`e` the first number whose session may be
/// live, `b` the boundary) and no bit in the departures or the ended sessions. This is what the
/// tick counts as active, as the sorted sets' active sets are what their tick has not pruned.
/// Reads every index bucket: for tests, not for a line of millions.
pub async fn numbered_active(
    redis: &RedisConn,
    keys: &Keys,
    event: &str,
    cfg: &Value,
) -> HashSet<String> {
    assert_eq!(cfg["index_in_line"], true, "an index in the event's slot");
    let k = keys.numbered(event);
    let script = redis::Script::new(
        r"
        local f = redis.call('HMGET', KEYS[1], 'b', 'e')
        local b, e = tonumber(f[1]) or 1, tonumber(f[2]) or 1
        local out = {}
        for i = 0, tonumber(ARGV[2]) - 1 do
          local kv = redis.call('HGETALL', ARGV[1] .. i)
          for j = 1, #kv, 2 do
            local n = tonumber(kv[j + 1])
            if n >= e and n < b and redis.call('GETBIT', KEYS[2], n) == 0
                and redis.call('GETBIT', KEYS[3], n) == 0 then
              out[#out + 1] = kv[j]
            end
          end
        end
        return out
        ",
    );
    let members: Vec<String> = script
        .key(&k.line)
        .key(&k.gone)
        .key(&k.ended)
        .arg(format!("{}:ix:", k.line))
        .arg(cfg["index_buckets"].as_u64().unwrap())
        .invoke_async(&mut redis.clone())
        .await
        .unwrap();
    members.into_iter().collect()
}

/// The members of one sorted set of every shard (`set` picks it from the shard's keys).
async fn set_members(
    redis: &RedisConn,
    keys: &Keys,
    tags: &[String],
    set: fn(ShardKeys) -> String,
) -> HashSet<String> {
    let mut all = HashSet::new();
    for tag in tags {
        let members: Vec<String> = redis
            .clone()
            .zrange(set(keys.shard(tag)), 0, -1)
            .await
            .unwrap();
        all.extend(members);
    }
    all
}

/// Polls `check` every 50 ms until it returns Some, or panics after `limit`.
pub async fn eventually<T, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts an error response: exact status and `error` code, with a message.
pub async fn assert_error(r: Response, status: StatusCode, code: &str) -> Value {
    assert_eq!(r.status(), status, "expected {status} {code}");
    let body: Value = r.json().await.expect("error body is JSON");
    assert_error_body(&body, code);
    body
}

/// Asserts the contract's error body: the `error` code, and a message.
pub fn assert_error_body(body: &Value, code: &str) {
    assert_eq!(body["error"], code, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

/// A port nothing listens on right now, for a process a test starts on it a moment later.
///
/// Taken below the kernel's ephemeral range (32768–60999 by default), never from it: a port the
/// kernel handed out (`bind` to port 0) and released is free again for any outgoing
/// connection's local end, and with the tests' thousands of Redis and HTTP connections one
/// took such a port before the broker's proxy could listen on it (CI, "Address already in
/// use"). Ports below that range are only ever taken by a listener that asks for them.
pub fn free_port() -> u16 {
    const LOW: u16 = 20_000;
    const SPAN: u16 = 12_000;
    let start = rand::random_range(0..SPAN);
    (0..SPAN)
        .map(|i| LOW + (start + i) % SPAN)
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port between 20000 and 31999")
}

/// The stack's PostgreSQL (`WAITROOM_DATABASE_URL`).
pub async fn db() -> sqlx::PgPool {
    let url = std::env::var("WAITROOM_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/waitroom".into());
    sqlx::PgPool::connect(&url).await.unwrap()
}
