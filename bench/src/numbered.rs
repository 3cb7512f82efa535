//! `waitroom-bench numbered-server`: a measuring prototype of the numbered line
//! (docs/numbered-line.md), beside the naive one-set server. Not a product and not the
//! service's code: it has only enter and poll, no admission (the boundary stays at the first
//! number), no leave, no limits, no metrics, so that its requests cost what the layout costs,
//! measured the way the naive server is (the same crates, routes, answer fields and tickets;
//! `scripts/bench-instr` and `scripts/bench-cpu` run it with `NUMBERED=1`).
//!
//! Enter takes a number (`INCR`, the event's slot), then writes the person's index entry with
//! one script on their index bucket while the position's reads for that number go to the
//! event's slot in the same round. A poll reads the index entry (`HGET`), then the position's
//! reads; with `--remember`, a number this server handed out is read alongside instead of
//! before. The position is `n − boundary + 1 − departed(boundary, n)`, the departures from the
//! prefix sum of the blocks before n's and one partial `BITCOUNT … BIT`: exact, three commands
//! whatever the line's size or the shard count. With `--numbered-tickets` the ticket carries
//! its number (signed), so a poll reads no index: four commands to the event's slot, or one
//! script with `--poll-script`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use redis::cluster_async::ClusterConnection;
use redis::Script;

use waitroom::auth::Signer;
use waitroom::config::DEV_TOKEN_SECRET;
use waitroom::ids::{EventId, Ticket, UserId};
use waitroom::redis::keys::slot;

use crate::naive::{error, status, Enter};

/// Numbers per departure block: 4 KiB of bitmap, one prefix sum each (docs/numbered-line.md).
const BLOCK: u64 = 32_768;

/// The position's three replies: `(boundary, departed before it)`, the departures in the
/// number's own block before it, the departures in all blocks before that.
type PositionReads = ((Option<u64>, Option<u64>), u64, Option<u64>);

/// Where the prototype's keys are: the cluster, the prefix and the index's buckets.
#[derive(Debug, Clone, Args)]
pub struct LayoutArgs {
    /// Redis Cluster nodes (the local stack by default).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002"
    )]
    pub redis_nodes: Vec<String>,
    /// Prefix of the keys.
    #[arg(long, default_value = "numbered")]
    pub key_prefix: String,
    /// Index buckets per event (~80 people each keeps them listpack-encoded).
    #[arg(long, default_value_t = 16_384)]
    pub buckets: u32,
    /// Hash-tag groups the buckets are spread over (as the service's shards).
    #[arg(long, default_value_t = 8)]
    pub groups: u32,
}

impl LayoutArgs {
    fn event_key(&self, event: &str, what: &str) -> String {
        format!("{}:{{{event}}}:{what}", self.key_prefix)
    }

    fn bucket_key(&self, event: &str, member: &str) -> String {
        let b = u32::from(slot(member)) % self.buckets.max(1);
        let g = b % self.groups.max(1);
        format!("{}:{{{event}:{g}}}:ix:{b}", self.key_prefix)
    }

    async fn connect(&self) -> anyhow::Result<ClusterConnection> {
        anyhow::ensure!(
            self.buckets > 0 && self.groups > 0,
            "--buckets and --groups must be above 0"
        );
        redis::cluster::ClusterClient::new(self.redis_nodes.clone())?
            .get_async_connection()
            .await
            .context("connecting to the Redis Cluster")
    }
}

/// Options of `waitroom-bench numbered-server`.
#[derive(Debug, Clone, Args)]
pub struct NumberedArgs {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:8097")]
    pub addr: SocketAddr,
    /// The keys.
    #[command(flatten)]
    pub layout: LayoutArgs,
    /// Remember the numbers this server handed out, so a poll reads its position alongside the
    /// index entry instead of after it (as the service's score cache does).
    #[arg(long)]
    pub remember: bool,
    /// Issue tickets that carry the person's number, signed (40 bits of number, 82 of HMAC, in
    /// the UUID the API asks for): a poll then reads no index, one pipeline to the event's slot.
    #[arg(long)]
    pub numbered_tickets: bool,
    /// With numbered tickets: a poll is one script on the event's slot (lua below) instead of a
    /// pipeline of four commands: one command for the client, the arithmetic in Redis.
    #[arg(long)]
    pub poll_script: bool,
}

struct Numbered {
    redis: ClusterConnection,
    signer: Signer,
    args: NumberedArgs,
    index: Script,
    poll_script: Script,
    numbers: Mutex<HashMap<String, u64>>,
}

/// The index write: the member's number if it has one, else the number given.
const INDEX_LUA: &str = r"
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then return tonumber(old) end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return tonumber(ARGV[2])";

/// A ticket that carries its number: the number's 40 bits, then the HMAC of (event, number)
/// in the remaining bits of a version-8 UUID (its version and variant bits fall in the HMAC).
pub fn numbered_ticket(signer: &Signer, event: &str, n: u64) -> Ticket {
    let digest = signer.digest(
        b"waitroom-numbered-v1",
        &[event.as_bytes(), &n.to_be_bytes()],
    );
    let mut bytes = [0u8; 16];
    bytes[..5].copy_from_slice(&n.to_be_bytes()[3..]);
    bytes[5..].copy_from_slice(&digest[..11]);
    Ticket::from_uuid(uuid::Uuid::new_v8(bytes))
}

/// The number a numbered ticket carries, if the server signed it for this event.
fn number_of(signer: &Signer, event: &str, t: Ticket) -> Option<u64> {
    let bytes = t.as_u128().to_be_bytes();
    let mut n = [0u8; 8];
    n[3..].copy_from_slice(&bytes[..5]);
    let n = u64::from_be_bytes(n);
    (numbered_ticket(signer, event, n) == t).then_some(n)
}

/// A numbered ticket's poll in one script: `{position, 1 if the number has left}`; the same
/// reads and arithmetic as `Numbered::position_and_gone`.
/// KEYS: stats, gone, gone:prefix. ARGV: n, BLOCK.
const POLL_LUA: &str = r"
local n, size = tonumber(ARGV[1]), tonumber(ARGV[2])
local block = math.floor(n / size)
local f = redis.call('HMGET', KEYS[1], 'boundary', 'gone_before')
local boundary, before = tonumber(f[1]) or 1, tonumber(f[2]) or 0
local ahead = (tonumber(redis.call('HGET', KEYS[3], block)) or 0)
  + redis.call('BITCOUNT', KEYS[2], block * size, n - 1, 'BIT') - before
local behind = math.max(n - boundary, 0)
return {behind + 1 - math.min(math.max(ahead, 0), behind), redis.call('GETBIT', KEYS[2], n)}";

impl Numbered {
    fn event_key(&self, event: &str, what: &str) -> String {
        self.args.layout.event_key(event, what)
    }

    fn bucket_key(&self, event: &str, member: &str) -> String {
        self.args.layout.bucket_key(event, member)
    }

    /// The reads a position at number `n` needs, one pipeline to the event's slot.
    async fn position(&self, event: &str, n: u64) -> redis::RedisResult<u64> {
        self.position_and_gone(event, n, false)
            .await
            .map(|(p, _)| p)
    }

    /// The same, and with `check` whether `n` has left (one more command in the pipeline).
    async fn position_and_gone(
        &self,
        event: &str,
        n: u64,
        check: bool,
    ) -> redis::RedisResult<(u64, bool)> {
        let block = n / BLOCK;
        let mut pipe = redis::pipe();
        pipe.cmd("HMGET")
            .arg(self.event_key(event, "stats"))
            .arg("boundary")
            .arg("gone_before");
        // Bits from the block's start up to n − 1 (an empty range when n starts the block).
        pipe.cmd("BITCOUNT")
            .arg(self.event_key(event, "gone"))
            .arg(block * BLOCK)
            .arg(n.saturating_sub(1))
            .arg("BIT");
        // The departures in all blocks before, kept as prefix sums by the departures.
        pipe.cmd("HGET")
            .arg(self.event_key(event, "gone:prefix"))
            .arg(block);
        if check {
            pipe.cmd("GETBIT").arg(self.event_key(event, "gone")).arg(n);
        }
        let (((boundary, gone_before), in_block, whole), gone): (PositionReads, bool) = if check {
            let (a, b, c, d): (_, _, _, u8) = pipe.query_async(&mut self.redis.clone()).await?;
            ((a, b, c), d == 1)
        } else {
            (pipe.query_async(&mut self.redis.clone()).await?, false)
        };
        let whole = whole.unwrap_or(0);
        let boundary = boundary.unwrap_or(1);
        // Numbers before `n` that left, less those behind the boundary (frozen once passed).
        let departed = (whole + in_block).saturating_sub(gone_before.unwrap_or(0));
        Ok((
            n.saturating_sub(boundary) + 1 - departed.min(n.saturating_sub(boundary)),
            gone,
        ))
    }
}

async fn enter(
    State(s): State<Arc<Numbered>>,
    Path(event): Path<String>,
    Json(body): Json<Enter>,
) -> Response {
    let (Ok(ev), Ok(user)) = (EventId::parse(&event), UserId::parse(&body.user_id)) else {
        return error(StatusCode::BAD_REQUEST, "bad_request");
    };
    let ticket = s.signer.ticket(&ev, &user);
    let member = ticket.to_short_member();
    let n: u64 = match redis::cmd("INCR")
        .arg(s.event_key(&event, "seq"))
        .query_async(&mut s.redis.clone())
        .await
    {
        Ok(n) => n,
        Err(_) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    let index = async {
        s.index
            .key(s.bucket_key(&event, &member))
            .arg(&member)
            .arg(n)
            .invoke_async::<u64>(&mut s.redis.clone())
            .await
    };
    let (kept, pos) = tokio::join!(index, s.position(&event, n));
    let (Ok(kept), Ok(pos)) = (kept, pos) else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    };
    if kept != n {
        // A re-entry: the number just taken waits nowhere. The prototype's load never enters
        // twice; the layout would mark it gone (docs/numbered-line.md, "Enter").
        return error(StatusCode::NOT_IMPLEMENTED, "re-entry not in the prototype");
    }
    if s.args.remember {
        if let Ok(mut m) = s.numbers.lock() {
            m.insert(member, n);
        }
    }
    let ticket = if s.args.numbered_tickets {
        numbered_ticket(&s.signer, &event, n)
    } else {
        ticket
    };
    status(&event, &ticket.to_string(), pos as i64 - 1)
}

async fn poll(
    State(s): State<Arc<Numbered>>,
    Path((event, ticket)): Path<(String, String)>,
) -> Response {
    let Ok(ticket) = Ticket::parse(&ticket) else {
        return error(StatusCode::BAD_REQUEST, "bad_request");
    };
    if s.args.numbered_tickets {
        let Some(n) = number_of(&s.signer, &event, ticket) else {
            return error(StatusCode::NOT_FOUND, "not_found");
        };
        let answer = if s.args.poll_script {
            s.poll_script
                .key(s.event_key(&event, "stats"))
                .key(s.event_key(&event, "gone"))
                .key(s.event_key(&event, "gone:prefix"))
                .arg(n)
                .arg(BLOCK)
                .invoke_async::<(u64, u8)>(&mut s.redis.clone())
                .await
                .map(|(p, g)| (p, g == 1))
        } else {
            s.position_and_gone(&event, n, true).await
        };
        return match answer {
            Ok((_, true)) => error(StatusCode::NOT_FOUND, "not_found"),
            Ok((p, false)) => status(&event, &ticket.to_string(), p as i64 - 1),
            Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        };
    }
    let member = ticket.to_short_member();
    let remembered = if s.args.remember {
        s.numbers.lock().ok().and_then(|m| m.get(&member).copied())
    } else {
        None
    };
    let read = async {
        redis::cmd("HGET")
            .arg(s.bucket_key(&event, &member))
            .arg(&member)
            .query_async::<Option<u64>>(&mut s.redis.clone())
            .await
    };
    let (n, guessed) = match remembered {
        Some(g) => {
            let (n, pos) = tokio::join!(read, s.position(&event, g));
            (n, pos.ok().map(|p| (g, p)))
        }
        None => (read.await, None),
    };
    let n = match n {
        Ok(Some(n)) => n,
        Ok(None) => return error(StatusCode::NOT_FOUND, "not_found"),
        Err(_) => return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    };
    let pos = match guessed {
        Some((g, p)) if g == n => Ok(p),
        _ => s.position(&event, n).await,
    };
    match pos {
        Ok(p) => status(&event, &ticket.to_string(), p as i64 - 1),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    }
}

/// Serves until killed.
pub async fn run(args: NumberedArgs) -> anyhow::Result<()> {
    let redis = args.layout.connect().await?;
    let addr = args.addr;
    let state = Arc::new(Numbered {
        redis,
        signer: Signer::new(DEV_TOKEN_SECRET),
        args,
        index: Script::new(INDEX_LUA),
        poll_script: Script::new(POLL_LUA),
        numbers: Mutex::new(HashMap::new()),
    });
    let app = Router::new()
        .route("/v1/events/{event}/queue", post(enter))
        .route("/v1/events/{event}/queue/{ticket}", get(poll))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    println!("numbered-line prototype listening on http://{addr}");
    axum::serve(listener, app).await?;
    Ok(())
}

/// Options of `waitroom-bench numbered-tickets`.
#[derive(Debug, Clone, Args)]
pub struct NumberedTicketsArgs {
    /// The users, as `waitroom-bench tickets` takes them.
    #[command(flatten)]
    pub users: crate::naive::TicketsArgs,
    /// The prototype's keys.
    #[command(flatten)]
    pub layout: LayoutArgs,
}

/// Prints the numbered tickets of the users a wrk enter run made against
/// `numbered-server --numbered-tickets`: each user's number read from the index.
pub async fn numbered_tickets(args: NumberedTicketsArgs) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut conn = args.layout.connect().await?;
    let signer = Signer::new(DEV_TOKEN_SECRET);
    let event = &args.users.event;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for t in crate::naive::user_tickets(&args.users)? {
        let member = t.to_short_member();
        let n: Option<u64> = redis::cmd("HGET")
            .arg(args.layout.bucket_key(event, &member))
            .arg(&member)
            .query_async(&mut conn)
            .await?;
        if let Some(n) = n {
            writeln!(out, "{}", numbered_ticket(&signer, event, n))?;
        }
    }
    Ok(())
}
