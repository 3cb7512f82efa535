//! `waitroom-bench naive-server`: the baseline waitroom is measured against — the design notes'
//! sketch taken literally. One sorted set per event (no sharding, no strategies, no admission,
//! no last-seen, no limits, no metrics): enter is `ZADD NX` + `ZRANK` in one pipeline, a poll
//! is one `ZRANK`. The same crates as the service (axum, redis-rs's cluster client), the same
//! routes and the same answer fields for enter and poll, and the same ticket for the same user
//! (the service's signer, development secret), so one load generator drives both and one list
//! of tickets polls both. Not a product: nothing here is offered as a waiting room.
//!
//! `--wait-replicas N` (0 by default: the baseline) adds the one promise the baseline
//! lacks and the service keeps: an enter answers only once N replicas of the line's primary hold
//! it (`WAIT N 1000` in the same pipeline, on the line's primary), so a failover cannot lose an
//! answered place. It measures what that promise costs the naive design on the same cores. A
//! client blocked in `WAIT` holds its connection: the commands sent behind it wait too. So with
//! one connection per node the enters would take turns, a replica round trip each;
//! `--connections N` opens N cluster connections and spreads the requests over them, so that
//! N waits can be on their way at once.
//!
//! `--floor` answers the same routes with the same parsing, signing and answers but sends
//! nothing to Redis (an enter's position is a counter in the process, a poll's is 1): the most
//! requests per second an axum server answering these routes reaches on the machine, the
//! ceiling over any layout of the line. A server that answers these routes through axum with
//! these answers, whatever it keeps in Redis, does no better, so `floor ÷ naive` bounds the
//! ratio any such design can show on the machine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use serde::Deserialize;
use serde_json::json;

use waitroom::auth::Signer;
use waitroom::config::DEV_TOKEN_SECRET;
use waitroom::ids::{EventId, Ticket, UserId};

/// Options of `waitroom-bench naive-server`.
#[derive(Debug, Clone, Args)]
pub struct NaiveArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:8096")]
    pub addr: SocketAddr,
    /// Redis Cluster nodes (the local stack by default).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002"
    )]
    pub redis_nodes: Vec<String>,
    /// Prefix of the one key per event.
    #[arg(long, default_value = "naive")]
    pub key_prefix: String,
    /// Replicas an enter waits for before it answers (0: none, the baseline as the issue
    /// describes it).
    #[arg(long, default_value_t = 0)]
    pub wait_replicas: u32,
    /// Cluster connections to spread the requests over (1: the one multiplexed connection per
    /// node the service's client also keeps).
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Answer without Redis: the HTTP ceiling (see the module's documentation).
    #[arg(long)]
    pub floor: bool,
}

struct Naive {
    redis: Vec<redis::cluster_async::ClusterConnection>,
    next: std::sync::atomic::AtomicUsize,
    signer: Signer,
    prefix: String,
    wait_replicas: u32,
    /// `--floor`: no Redis; the enters answered so far number the next one.
    floor: Option<std::sync::atomic::AtomicI64>,
}

impl Naive {
    /// The next connection, round robin.
    fn conn(&self) -> redis::cluster_async::ClusterConnection {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.redis[i % self.redis.len()].clone()
    }
}

/// The most an enter waits for its replicas, as the service's `WAITROOM_BOOKING_WAIT_MS`.
const WAIT_MS: u64 = 1000;

/// The body of an enter.
#[derive(Deserialize)]
pub(crate) struct Enter {
    pub(crate) user_id: String,
}

fn key(prefix: &str, event: &str) -> String {
    format!("{prefix}:{{{event}}}:line")
}

/// The answer of an enter or a poll: waiting at `rank + 1`.
pub(crate) fn status(event: &str, ticket: &str, rank: i64) -> Response {
    Json(json!({
        "ticket": ticket,
        "event": event,
        "status": "waiting",
        "position": rank + 1,
        "eta_seconds": null,
        "next_poll_ms": 5000,
        "access_token": null,
    }))
    .into_response()
}

/// An error answer.
pub(crate) fn error(code: StatusCode, what: &str) -> Response {
    (code, Json(json!({"error": what, "message": what}))).into_response()
}

async fn enter(
    State(n): State<Arc<Naive>>,
    Path(event): Path<String>,
    Json(body): Json<Enter>,
) -> Response {
    let (Ok(ev), Ok(user)) = (EventId::parse(&event), UserId::parse(&body.user_id)) else {
        return error(StatusCode::BAD_REQUEST, "bad_request");
    };
    let ticket = n.signer.ticket(&ev, &user).to_string();
    if let Some(entered) = &n.floor {
        let rank = entered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return status(&event, &ticket, rank);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros() as u64;
    let k = key(&n.prefix, &event);
    let mut pipe = redis::pipe();
    pipe.cmd("ZADD")
        .arg(&k)
        .arg("NX")
        .arg(now)
        .arg(&ticket)
        .ignore()
        .cmd("ZRANK")
        .arg(&k)
        .arg(&ticket);
    if n.wait_replicas > 0 {
        return durable(&n, pipe, &k, &event, &ticket).await;
    }
    let rank: Result<(Option<i64>,), _> = pipe.query_async(&mut n.conn()).await;
    match rank {
        Ok((Some(r),)) => status(&event, &ticket, r),
        _ => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    }
}

/// An enter's pipeline (`ZADD` + `ZRANK`) with a `WAIT` behind it, all on the line's primary:
/// answered only once `wait_replicas` replicas hold the place, else 503 (as the service).
async fn durable(
    n: &Naive,
    mut pipe: redis::Pipeline,
    k: &str,
    event: &str,
    ticket: &str,
) -> Response {
    use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
    pipe.cmd("WAIT").arg(n.wait_replicas).arg(WAIT_MS);
    let slot = waitroom::redis::keys::slot(k);
    let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
    let replies = n.conn().route_pipeline(pipe, 0, 3, route).await;
    type Replies = (redis::Value, Option<i64>, u32);
    match replies.map(|v| redis::from_redis_value::<Replies>(redis::Value::Array(v))) {
        Ok(Ok((_, Some(r), acked))) if acked >= n.wait_replicas => status(event, ticket, r),
        _ => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    }
}

async fn poll(
    State(n): State<Arc<Naive>>,
    Path((event, ticket)): Path<(String, String)>,
) -> Response {
    if n.floor.is_some() {
        return status(&event, &ticket, 0);
    }
    let rank: Result<Option<i64>, _> = redis::cmd("ZRANK")
        .arg(key(&n.prefix, &event))
        .arg(&ticket)
        .query_async(&mut n.conn())
        .await;
    match rank {
        Ok(Some(r)) => status(&event, &ticket, r),
        Ok(None) => error(StatusCode::NOT_FOUND, "not_found"),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    }
}

/// Serves until killed.
pub async fn run(args: NaiveArgs) -> anyhow::Result<()> {
    let client = redis::cluster::ClusterClient::new(args.redis_nodes.clone())?;
    let mut redis = Vec::new();
    let connections = if args.floor {
        0
    } else {
        args.connections.max(1)
    };
    for _ in 0..connections {
        redis.push(
            client
                .get_async_connection()
                .await
                .context("connecting to the Redis Cluster")?,
        );
    }
    let state = Arc::new(Naive {
        redis,
        next: Default::default(),
        signer: Signer::new(DEV_TOKEN_SECRET),
        prefix: args.key_prefix,
        wait_replicas: args.wait_replicas,
        floor: args.floor.then(Default::default),
    });
    let app = Router::new()
        .route("/v1/events/{event}/queue", post(enter))
        .route("/v1/events/{event}/queue/{ticket}", get(poll))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    let what = if args.floor {
        "naive server's floor (no Redis)"
    } else {
        "naive one-set server"
    };
    println!("{what} listening on http://{}", args.addr);
    axum::serve(listener, app).await?;
    Ok(())
}

/// Options of `waitroom-bench tickets`.
#[derive(Debug, Clone, Args)]
pub struct TicketsArgs {
    /// The event.
    #[arg(long)]
    pub event: String,
    /// User ids as the wrk enter script made them: `w<thread>-<n>`, n from 1 to each count
    /// (comma-separated, one per thread), the last `--skip` of each left out (they may have
    /// been in flight when the run stopped).
    #[arg(long, value_delimiter = ',')]
    pub counts: Vec<u64>,
    /// Users left out at the end of each thread.
    #[arg(long, default_value_t = 100)]
    pub skip: u64,
}

/// Prints the tickets of the users a wrk enter run made, one per line (the service's and the
/// naive server's alike: both derive them with the development secret).
pub fn tickets(args: &TicketsArgs) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for t in user_tickets(args)? {
        writeln!(out, "{t}")?;
    }
    Ok(())
}

/// The tickets of the users a wrk enter run made, in order.
pub(crate) fn user_tickets(args: &TicketsArgs) -> anyhow::Result<Vec<Ticket>> {
    let signer = Signer::new(DEV_TOKEN_SECRET);
    let ev = EventId::parse(&args.event).map_err(|e| anyhow::anyhow!("event: {e}"))?;
    let mut all = Vec::new();
    for (thread, &count) in args.counts.iter().enumerate() {
        for n in 1..=count.saturating_sub(args.skip) {
            let user = UserId::parse(&format!("w{thread}-{n}"))
                .map_err(|e| anyhow::anyhow!("user: {e}"))?;
            all.push(signer.ticket(&ev, &user));
        }
    }
    Ok(all)
}
