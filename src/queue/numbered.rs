//! The numbered line (docs/numbered-line.md): an event created with `"line_form": "numbered"`
//! keeps no sorted set per person. Everyone gets an arrival number from the event's counter;
//! an index of small hashes maps a ticket's member to its number; departures are a bitmap by
//! number with prefix sums per block; admission advances a boundary. A position is arithmetic
//! on those figures: exact, a few commands whatever the line's size (`lua/numbered_lib.lua`).
//!
//! Round trips: an enter is one round trip shared by the enters arriving together
//! ([`Durable`]: one script takes their numbers, writes their index entries and reports their
//! standings, made durable on a replica in the same round trip). A poll of a ticket this
//! instance remembers costs no command far from the front (the line's figures this instance
//! holds, src/queue/snapshot.rs), one script near it; a ticket it does not know, a plain read
//! of its index entry and then the same (`Queue::index_entry`), or, while the whole line is
//! near the front, one script that reads the index too. Lines created before the index moved into the event's slot keep
//! it in the shards' tags: there an enter writes its index entry after the shared number, and
//! a poll of an unknown ticket reads the index first.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::RedisError;
use tokio::sync::oneshot;
use waitroom_strategies::StrategyKind;

use super::event::{Event, EventConfig};
use super::served::{kept, Served, Serving};
use super::snapshot::LineFigures;
use super::{horizon, now_ms, Queue, QueueError, Standing};
use crate::ids::Ticket;
use crate::redis::keys::NumberedKeys;
use crate::redis::scripts::with_numbered_keys;
use crate::redis::store::Store;

/// A standing script's reply: `{kind, value, recorded, n}` (lua/nl_status.lua).
type Reply = (i64, i64, i64, i64);

/// The standing a numbered script reported, found with `commands` Redis commands (counted
/// for polls in `waitroom_redis_commands_per_poll`; an enter's count is not recorded).
fn standing(kind: i64, value: i64, commands: u32) -> Result<Standing, QueueError> {
    match kind {
        0 => Ok(waiting(value.max(1) as u64, commands)),
        1 => Ok(Standing::Admitted {
            admitted_at_ms: value.max(0) as u64,
        }),
        _ => Err(QueueError::UnknownTicket),
    }
}

fn waiting(position: u64, commands: u32) -> Standing {
    Standing::Waiting {
        position,
        strategy: StrategyKind::GlobalCounter,
        commands,
    }
}

/// A numbered line's ticket as this instance last found it: its number, and the period its
/// last-seen record is current for plus one (0: none known).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Place {
    n: u64,
    recorded: u64,
}

/// The horizon of a numbered line, in numbers: the sorted line's horizon per shard times the
/// shards (the same people near the front, counted over the whole line).
pub(super) fn numbered_horizon(cfg: &EventConfig) -> u64 {
    horizon(cfg).saturating_mul(u64::from(cfg.shards.max(1)))
}

/// Numbered lines' arrival numbers, handed out in batches: the enters that arrive while one
/// batch is on its way wait for the next, which serves them all in one round trip (in arrival
/// order at this instance) and makes it durable in the same round trip.
///
/// A line whose index lives in the event's slot (`index_in_line`, every numbered event created
/// by this version) sends one script per batch (`lua/nl_enter.lua`): for each member it finds
/// the number the index holds, keeps it while that place holds, else takes the counter's next
/// and writes it into the index, and reports the standing. An enter is then one shared round
/// trip, and no number is ever taken without its index entry. A line created before keeps its
/// index in the shards' tags: its batch takes as many numbers as it serves in one `INCRBY`, and
/// each enter writes its index entry after.
///
/// Redis replicates asynchronously: a failover of the counter's primary can promote a replica
/// whose counter is behind numbers already handed out, and the next enters would get them again
/// (two people, one number, one place; docs/numbered-line.md, "Risks"). So a number is used only
/// once a replica holds it: with replicas configured, the batch goes out on the connection kept
/// for waits, in one pipeline with a probe write and a `WAIT`
/// ([`crate::redis::RedisConn::wait_replicated_after`]); when the `WAIT` falls short, every
/// enter of the batch answers 503. Their index entries (when the script wrote them) stay, so an
/// enter sent again keeps the number; `INCRBY`'s numbers are never used (dead numbers, found at
/// the front like people who never polled).
///
/// The batch runs in a task of its own, so an enter given up by its client (a dropped request)
/// does not take the others' numbers with it.
pub(crate) struct Durable {
    replicas: u32,
    wait: Duration,
    /// By counter key; looked up by every enter (foldhash: the keys are the service's own).
    events: Mutex<foldhash::HashMap<String, Arc<Counter>>>,
}

/// One enter's part of a batch: with `entry`, its index entry and standing too (a line whose
/// index lives in the event's slot); without, a number alone.
struct Ask {
    entry: Option<Entry>,
    tx: oneshot::Sender<Result<Taken, Shortfall>>,
}

/// What `lua/nl_enter.lua` needs of one enter: the member, its index bucket, and the event's
/// figures at the time of the enter (the batch takes its last enter's).
struct Entry {
    index: String,
    member: String,
    ttl_ms: u64,
    horizon: u64,
    period_ms: u64,
}

/// What a batch gave one enter: its number and, for an [`Entry`], the number's standing as
/// `(kind, value)` of [`Reply`].
struct Taken {
    n: u64,
    standing: Option<(i64, i64)>,
}

/// Why a batch handed out no numbers.
#[derive(Clone)]
enum Shortfall {
    /// The numbers did not reach the replicas in time. The enters queued behind the batch get
    /// it too.
    NotReplicated,
    /// Redis failed: the error's kind and text (a `RedisError` is not `Clone`).
    Redis(redis::ErrorKind, String),
    /// The node did not answer in time: the error's text. The enters queued behind the batch
    /// get it too ([`super::served::fail_batch`]).
    TimedOut(String),
}

/// One counter's enters waiting for a number.
struct Counter {
    waiting: Arc<Served<Ask>>,
    /// The line's keys (fixed for a counter: both come from the event's id).
    keys: NumberedKeys,
}

impl Durable {
    pub(crate) fn new(replicas: u32, wait: Duration) -> Self {
        Durable {
            replicas,
            wait,
            events: Mutex::default(),
        }
    }

    /// The line's counter state; its keys are copied only the first time (an enter calls this).
    fn counter(&self, keys: &NumberedKeys) -> Arc<Counter> {
        kept(&self.events, &keys.seq, || Counter {
            waiting: Served::new(),
            keys: keys.clone(),
        })
    }
}

/// The most enters one batch serves. A script holds its Redis node while it runs (~5 µs per
/// enter measured, docs/benchmarks.md, "The index in the event's slot"), so a surge of
/// thousands queued at once goes in scripts of ~1–2 ms, not one long one.
const MAX_BATCH: usize = 256;

/// Serves the enters waiting on `counter`, batch after batch, until none waits.
async fn hand_out(store: Arc<Store>, counter: Arc<Counter>, replicas: u32, wait: Duration) {
    let mut serving = Serving::new(counter.waiting.clone());
    let probe = format!("{}:replicated", counter.keys.line);
    while let Some(batch) = serving.next(MAX_BATCH) {
        // One layout per event; both kinds in one batch only if an event was created anew.
        let (entries, plain): (Vec<Ask>, Vec<Ask>) =
            batch.into_iter().partition(|a| a.entry.is_some());
        let mut failed = Ok(());
        if !plain.is_empty() {
            failed = numbers(&store, &counter.keys.seq, &probe, replicas, wait, plain).await;
        }
        if !entries.is_empty() {
            failed =
                failed.and(enters(&store, &counter.keys, &probe, replicas, wait, entries).await);
        }
        // A node that did not answer in time, or replicas that did not confirm the batch in
        // time: what queued behind it would wait as long again on the same node and replicas,
        // so it gets the batch's failure now (one deadline or one wait before its 503, not
        // two). Whoever comes after starts a batch of its own, as after any batch.
        if let Err(hung @ (Shortfall::TimedOut(_) | Shortfall::NotReplicated)) = failed {
            for ask in serving.behind() {
                let _ = ask.tx.send(Err(hung.clone()));
            }
        }
    }
}

/// A batch of a line whose index lives in the shards' tags: `INCRBY` as many numbers as it
/// serves.
async fn numbers(
    store: &Store,
    seq: &str,
    probe: &str,
    replicas: u32,
    wait: Duration,
    batch: Vec<Ask>,
) -> Result<(), Shortfall> {
    let k = batch.len() as u64;
    let mut take = redis::cmd("INCRBY");
    take.arg(seq).arg(k);
    let taken: Result<u64, Shortfall> = if replicas == 0 {
        take.query_async(&mut store.conn()).await.map_err(shortfall)
    } else {
        match store
            .waits()
            .wait_replicated_reading(probe, take, replicas, wait.as_millis() as u64)
            .await
        {
            Ok((Some(top), acked)) if acked >= replicas => top
                .parse::<u64>()
                .map_err(|_| Shortfall::Redis(redis::ErrorKind::Client, format!("counter {top}"))),
            Ok((top, acked)) => {
                tracing::warn!(counter = %seq, top = ?top, acked, numbers = k,
                    "a numbered line's arrival numbers did not reach the replicas in time; not used");
                Err(Shortfall::NotReplicated)
            }
            Err(e) => Err(shortfall(e)),
        }
    };
    for (i, ask) in batch.into_iter().enumerate() {
        let answer = match &taken {
            Ok(top) => Ok(Taken {
                n: top - k + 1 + i as u64,
                standing: None,
            }),
            Err(e) => Err(e.clone()),
        };
        // An enter given up meanwhile leaves its number unused (a dead number).
        let _ = ask.tx.send(answer);
    }
    taken.map(|_| ())
}

/// A batch of a line whose index lives in the event's slot: one `lua/nl_enter.lua`.
async fn enters(
    store: &Store,
    keys: &NumberedKeys,
    probe: &str,
    replicas: u32,
    wait: Duration,
    batch: Vec<Ask>,
) -> Result<(), Shortfall> {
    let script = &store.scripts().nl_enter;
    let entries: Vec<&Entry> = batch.iter().filter_map(|a| a.entry.as_ref()).collect();
    let reply = enter_batch(store, script, keys, &entries, probe, replicas, wait).await;
    let answers: Result<Vec<Taken>, Shortfall> = reply.and_then(|r| {
        enter_answers(&r, batch.len())
            .map(|taken| {
                taken
                    .into_iter()
                    .map(|(n, kind, value)| Taken {
                        n,
                        standing: Some((kind, value)),
                    })
                    .collect()
            })
            .ok_or_else(|| {
                Shortfall::Redis(
                    redis::ErrorKind::Client,
                    format!(
                        "nl_enter.lua answered {} values for {} enters: {:?}",
                        r.len(),
                        batch.len(),
                        &r[..r.len().min(8)]
                    ),
                )
            })
    });
    match answers {
        Ok(taken) => {
            for (ask, t) in batch.into_iter().zip(taken) {
                // An enter given up meanwhile keeps its number in the index: sent again, it
                // finds it.
                let _ = ask.tx.send(Ok(t));
            }
            Ok(())
        }
        Err(e) => {
            for ask in batch {
                let _ = ask.tx.send(Err(e.clone()));
            }
            Err(e)
        }
    }
}

/// `(n, kind, value)` for each of `enters` enters from `lua/nl_enter.lua`'s reply: `c`, then
/// each enter's number (negated for a kept place), then `(kind, value)` of each kept place in
/// order. A number sent as it is waits at `max(1, n - c)`. None for a reply of another shape.
pub fn enter_answers(reply: &[i64], enters: usize) -> Option<Vec<(u64, i64, i64)>> {
    let (&c, rest) = reply.split_first()?;
    if rest.len() < enters {
        return None;
    }
    let (numbers, mut kept) = rest.split_at(enters);
    let mut out = Vec::with_capacity(enters);
    for &n in numbers {
        if n > 0 {
            out.push((n as u64, 0, (n - c).max(1)));
        } else {
            let (standing, tail) = kept.split_first_chunk::<2>()?;
            kept = tail;
            out.push((n.unsigned_abs(), standing[0], standing[1]));
        }
    }
    kept.is_empty().then_some(out)
}

/// Runs `lua/nl_enter.lua` for `entries` (with the last one's figures), on the replicas when
/// configured; loads the script once on NOSCRIPT (a node that does not hold it yet).
async fn enter_batch(
    store: &Store,
    script: &redis::Script,
    keys: &NumberedKeys,
    entries: &[&Entry],
    probe: &str,
    replicas: u32,
    wait: Duration,
) -> Result<Vec<i64>, Shortfall> {
    let Some(last) = entries.last() else {
        return Ok(Vec::new());
    };
    let all = keys.all();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(all.len() + entries.len());
    for key in all {
        cmd.arg(key);
    }
    for e in entries {
        cmd.arg(&e.index);
    }
    cmd.arg(now_ms())
        .arg(last.ttl_ms)
        .arg(last.horizon)
        .arg(last.period_ms.max(1));
    for e in entries {
        cmd.arg(&e.member);
    }
    for attempt in 0..2 {
        let reply: Result<Vec<i64>, RedisError> = if replicas == 0 {
            cmd.query_async(&mut store.conn()).await
        } else {
            match store
                .waits()
                .wait_replicated_after(probe, cmd.clone(), replicas, wait.as_millis() as u64)
                .await
            {
                Ok((value, acked)) => {
                    match redis::from_redis_value::<Result<Vec<i64>, RedisError>>(value) {
                        Ok(Ok(_)) if acked < replicas => {
                            tracing::warn!(line = %keys.line, acked, enters = entries.len(),
                            "a numbered line's batch of enters did not reach the replicas in time");
                            return Err(Shortfall::NotReplicated);
                        }
                        Ok(r) => r,
                        Err(e) => Err(e.into()),
                    }
                }
                Err(e) => Err(e),
            }
        };
        match reply {
            Err(e)
                if attempt == 0
                    && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                script
                    .load_async(&mut store.conn())
                    .await
                    .map_err(shortfall)?;
            }
            Err(e) => return Err(shortfall(e)),
            Ok(r) => return Ok(r),
        }
    }
    Err(Shortfall::Redis(
        redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
        "nl_enter.lua could not be loaded".into(),
    ))
}

fn shortfall(e: RedisError) -> Shortfall {
    if e.is_timeout() {
        return Shortfall::TimedOut(e.to_string());
    }
    Shortfall::Redis(e.kind(), e.to_string())
}

/// The answer to an enter whose number did not reach the replicas (503), counted.
fn not_replicated() -> QueueError {
    metrics::counter!(crate::telemetry::NUMBERS_NOT_REPLICATED).increment(1);
    QueueError::Redis(RedisError::from((
        redis::ErrorKind::Io,
        "the arrival number did not reach the replicas in time",
    )))
}

/// Counts a poll of a ticket the instance did not remember by how its place was learned
/// (`waitroom_places_learned_total`).
fn learned(from: &'static str) {
    metrics::counter!(crate::telemetry::PLACES_LEARNED, "from" => from).increment(1);
}

/// `nl_status.lua`'s modes.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Enter,
    Poll,
    Check,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Enter => "enter",
            Mode::Poll => "poll",
            Mode::Check => "check",
        }
    }
}

impl Queue {
    /// The index bucket of `ticket`'s member (see [`Queue::index_key`]).
    pub(super) fn index_of(&self, ev: &Event, ticket: &Ticket) -> String {
        self.index_key(ev, &ev.config.member(ticket))
    }

    /// The index bucket of a member: CRC16 of the member mod the event's buckets, in the
    /// event's slot (`index_in_line`), or, for a line created before, in the tag of shard
    /// `bucket mod shards`, so the index spreads over the primaries as the shards do.
    fn index_key(&self, ev: &Event, member: &str) -> String {
        let cfg = &ev.config;
        let crc = crc16::State::<crc16::XMODEM>::calculate(member.as_bytes());
        let bucket = u32::from(crc) % cfg.index_buckets.max(1);
        if cfg.index_in_line {
            return ev.numbered.index(bucket);
        }
        let tag = &cfg.shard_tags[bucket as usize % cfg.shard_tags.len().max(1)];
        self.store.keys().index_bucket(tag, bucket)
    }

    /// One enter's part of the next batch of `ev` (see [`Durable`]): with `entry`, its number
    /// and standing; without, its number alone.
    async fn batched(&self, ev: &Event, entry: Option<Entry>) -> Result<Taken, QueueError> {
        let d = &self.numbers;
        let counter = d.counter(&ev.numbered);
        let (tx, rx) = oneshot::channel();
        if counter.waiting.push(Ask { entry, tx }) {
            tokio::spawn(hand_out(self.store.clone(), counter, d.replicas, d.wait));
        }
        match rx.await {
            Ok(Ok(taken)) => Ok(taken),
            Ok(Err(Shortfall::NotReplicated)) => Err(not_replicated()),
            Ok(Err(Shortfall::Redis(kind, text))) => {
                Err(RedisError::from((kind, "handing out arrival numbers", text)).into())
            }
            Ok(Err(Shortfall::TimedOut(text))) => {
                Err(
                    RedisError::from((redis::ErrorKind::Io, "handing out arrival numbers", text))
                        .into(),
                )
            }
            Err(_) => Err(QueueError::Redis(RedisError::from((
                redis::ErrorKind::Io,
                "the task handing out arrival numbers ended",
            )))),
        }
    }

    /// Where number `n` stands (`lua/nl_status.lua`); with `n` 0, the number the index holds
    /// for `by_member` (its bucket in the event's slot, and the member).
    async fn number_standing(
        &self,
        ev: &Event,
        n: u64,
        mode: Mode,
        now: u64,
        by_member: Option<(&str, &str)>,
    ) -> Result<Reply, RedisError> {
        let cfg = &ev.config;
        let mut call = with_numbered_keys(&self.store.scripts().nl_status, &ev.numbered);
        if let Some((index, _)) = by_member {
            call.key(index);
        }
        call.arg(n)
            .arg(now)
            .arg(cfg.active_ttl_seconds * 1000)
            .arg(mode.as_str())
            .arg(numbered_horizon(cfg))
            .arg(cfg.record_period_ms())
            .arg(cfg.record_refresh_periods());
        if let Some((_, member)) = by_member {
            call.arg(member);
        }
        call.invoke_async(&mut self.store.conn()).await
    }

    /// The member's number in the index, if any.
    async fn number_of(&self, index: &str, member: &str) -> Result<Option<u64>, RedisError> {
        redis::cmd("HGET")
            .arg(index)
            .arg(member)
            .query_async(&mut self.store.conn())
            .await
    }

    /// Writes `n` as the member's number: when it has none (`expect` None), or when it is still
    /// `expect`. Returns the member's number after the call (`lua/nl_index.lua`).
    async fn write_index(
        &self,
        index: &str,
        member: &str,
        n: u64,
        expect: Option<u64>,
    ) -> Result<u64, RedisError> {
        if expect.is_none() {
            // One plain command for the common case (a first enter): cheaper than a script;
            // the number already there is read only when there is one (a re-entry).
            let set: i64 = redis::cmd("HSETNX")
                .arg(index)
                .arg(member)
                .arg(n)
                .query_async(&mut self.store.conn())
                .await?;
            if set == 1 {
                return Ok(n);
            }
            if let Some(held) = self.number_of(index, member).await? {
                return Ok(held);
            }
            // Removed between the two commands (nothing removes index entries today): the
            // script below writes it if there is still none.
        }
        self.store
            .scripts()
            .nl_index
            .key(index)
            .arg(member)
            .arg(n)
            .arg(expect.map(|e| e.to_string()).unwrap_or_default())
            .invoke_async(&mut self.store.conn())
            .await
    }

    /// Number `n`'s position from the figures this instance holds (reading them when stale),
    /// or `None` when they cannot tell or a script has to run anyway: `n` near the front with
    /// its last-seen record not current for `period` (`recorded`: see [`Place`]), `n` not
    /// waiting as read, or the figures not at hand (src/queue/snapshot.rs). `known`: a
    /// standing script answered for `n` before (a poll's place), so `n` was handed out, and a
    /// counter read below it is a line that began again — its keys unlinked when it was freed
    /// (docs/operations.md, "Free what is finished") — where the script says gone; or figures
    /// read before `n` was handed out. Either way they cannot tell. A number just handed out
    /// (an enter's) is past the counter of figures read before it, and stands behind everyone
    /// they hold as waiting.
    async fn position_from_figures(
        &self,
        ev: &Event,
        place: Place,
        period: u64,
        known: bool,
    ) -> Option<u64> {
        let figures = self.line_figures(ev).await?;
        if known && place.n > figures.seq {
            return None;
        }
        let position = figures.position(place.n)?;
        let near = figures.near_front(place.n, numbered_horizon(&ev.config));
        if near && place.recorded != period + 1 {
            return None;
        }
        Some(position)
    }

    /// The line's figures this instance holds, read when stale (src/queue/snapshot.rs); `None`
    /// when they are off or cannot be read.
    async fn line_figures(&self, ev: &Event) -> Option<Arc<LineFigures>> {
        self.snapshots
            .figures(&ev.numbered.line, |held| async move {
                metrics::counter!(crate::telemetry::LINE_FIGURES_READS).increment(1);
                let mut call = with_numbered_keys(&self.store.scripts().nl_snapshot, &ev.numbered);
                if let Some(held) = &held {
                    for arg in held.held_args() {
                        call.arg(arg);
                    }
                }
                let reply: Vec<redis::Value> =
                    call.invoke_async(&mut self.store.conn()).await.ok()?;
                let Some((figures, received)) = LineFigures::from_reply(reply, held.as_deref())
                else {
                    tracing::warn!(event = %ev.id, "a numbered line's figures could not be read");
                    return None;
                };
                metrics::counter!(crate::telemetry::LINE_FIGURES_BYTES).increment(received.bytes);
                metrics::counter!(crate::telemetry::LINE_FIGURES_BLOCKS_HELD)
                    .increment(received.held);
                Some(figures)
            })
            .await
    }

    /// Remembers where `ticket` stands after a standing script's reply at `period`.
    fn remember(&self, ticket: &Ticket, n: u64, reply: Reply, period: u64) {
        let recorded = if reply.2 == 1 { period + 1 } else { 0 };
        self.places.put(ticket, Place { n, recorded });
    }

    /// Enters `ticket` into a numbered line. Index in the event's slot: the batch's script
    /// does it all (number, index entry, standing; see [`Durable`]). Index in the shards' tags
    /// (lines created before): a number from the counter, then the index write and the
    /// number's standing in one round (the standing from the figures this instance holds, when
    /// far from the front). A re-entry whose place holds keeps it (and, in the shards' tags,
    /// the new number is dropped: `lua/nl_reenter.lua`); one whose place is gone (left, lapsed)
    /// takes a new number at the back.
    pub(super) async fn enter_numbered(
        &self,
        ev: &Event,
        ticket: &Ticket,
    ) -> Result<Standing, QueueError> {
        let cfg = &ev.config;
        let member = cfg.member(ticket);
        let index = self.index_key(ev, &member);
        if cfg.index_in_line {
            let taken = self
                .batched(
                    ev,
                    Some(Entry {
                        index,
                        member,
                        ttl_ms: cfg.active_ttl_seconds * 1000,
                        horizon: numbered_horizon(cfg),
                        period_ms: cfg.record_period_ms(),
                    }),
                )
                .await?;
            let (kind, value) = taken.standing.unwrap_or((2, 0));
            if kind != 2 {
                self.places.put(
                    ticket,
                    Place {
                        n: taken.n,
                        recorded: 0,
                    },
                );
            }
            return standing(kind, value, 1);
        }
        // On a replica before it is used: a failover must not hand it out again.
        let n = self.batched(ev, None).await?.n;
        let now = now_ms();
        let period = now / cfg.record_period_ms();
        // A new number far from the front needs no record: its position is arithmetic.
        let entered = Place { n, recorded: 0 };
        let (held, reply) = match self.position_from_figures(ev, entered, period, false).await {
            Some(position) => (
                self.write_index(&index, &member, n, None).await,
                Ok((0, position as i64, 0, n as i64)),
            ),
            None => {
                tokio::join!(
                    self.write_index(&index, &member, n, None),
                    self.number_standing(ev, n, Mode::Enter, now, None)
                )
            }
        };
        let held = held?;
        if held == n {
            let (kind, value, _, _) = reply?;
            self.places.put(ticket, entered);
            return standing(kind, value, 1);
        }
        // Another number is in the index: this person entered before.
        let reentered = self
            .reenter_numbered(ev, ticket, &index, &member, n, held)
            .await;
        // The spare number departed (or ended): this instance's next positions read afresh.
        self.snapshots.changed(&ev.numbered.line);
        reentered
    }

    /// A re-entry of `ticket`, which took number `n` while the index holds `held` (see
    /// [`Queue::enter_numbered`]). Two rounds at most in practice: a concurrent enter of the
    /// same ticket can write in between once.
    async fn reenter_numbered(
        &self,
        ev: &Event,
        ticket: &Ticket,
        index: &str,
        member: &str,
        n: u64,
        mut held: u64,
    ) -> Result<Standing, QueueError> {
        let cfg = &ev.config;
        let entered = Place { n, recorded: 0 };
        for _ in 0..3 {
            let (keep, kind, value): (i64, i64, i64) =
                with_numbered_keys(&self.store.scripts().nl_reenter, &ev.numbered)
                    .arg(held)
                    .arg(n)
                    .arg(now_ms())
                    .arg(cfg.active_ttl_seconds * 1000)
                    .invoke_async(&mut self.store.conn())
                    .await?;
            if keep == 1 {
                self.places.put(
                    ticket,
                    Place {
                        n: held,
                        recorded: 0,
                    },
                );
                return standing(kind, value, 1);
            }
            let now_held = self.write_index(index, member, n, Some(held)).await?;
            if now_held == n {
                self.places.put(ticket, entered);
                return standing(kind, value, 1);
            }
            held = now_held;
        }
        Err(QueueError::Redis(RedisError::from((
            redis::ErrorKind::Io,
            "the ticket's index entry kept changing under concurrent enters",
        ))))
    }

    /// Where `ticket` stands on a numbered line. With the number this instance remembers for
    /// the ticket: from the figures it holds when it can (no command), else the number's
    /// script alone. The index is read only when this instance knows no number for the
    /// ticket, or the one it knows is gone: a member's index entry changes only after its
    /// number is gone (a re-entry whose place is gone; `enter_numbered`), and a gone number
    /// never comes back (its departure or ended bit stays, `e` and the ticks only advance),
    /// so a number whose script finds it waiting or admitted is still the ticket's.
    pub(super) async fn poll_numbered(
        &self,
        ev: &Event,
        ticket: &Ticket,
        mode_check: bool,
    ) -> Result<Standing, QueueError> {
        let cfg = &ev.config;
        let mode = if mode_check { Mode::Check } else { Mode::Poll };
        let now = now_ms();
        let period = now / cfg.record_period_ms();
        let mut known_gone = None;
        if let Some(place) = self.places.get(ticket) {
            if !mode_check {
                if let Some(position) = self.position_from_figures(ev, place, period, true).await {
                    return Ok(waiting(position, 0));
                }
            }
            let reply = self.number_standing(ev, place.n, mode, now, None).await?;
            if reply.0 != 2 {
                if !mode_check {
                    // A check records nothing: what the instance knew of the record stands.
                    self.remember(ticket, place.n, reply, period);
                }
                return standing(reply.0, reply.1, 1);
            }
            // Gone: the ticket may hold a newer number (it left or lapsed and entered again).
            known_gone = Some(place.n);
        }
        let member = cfg.member(ticket);
        let index = self.index_key(ev, &member);
        // A poll that learns a place this instance does not remember (see PLACES_LEARNED).
        let learning = !mode_check && known_gone.is_none();
        let mut spent = u32::from(known_gone.is_some());
        if learning && cfg.index_in_line && self.far_places_in(ev).await {
            if let Some(n) = self.index_entry(&index, &member).await? {
                spent += 1;
                let place = Place { n, recorded: 0 };
                if let Some(position) = self.position_from_figures(ev, place, period, true).await {
                    self.places.put(ticket, place);
                    learned("index");
                    return Ok(waiting(position, spent));
                }
                // Near the front (its record to keep), admitted, or gone: the number's script.
                let reply = self.number_standing(ev, n, mode, now, None).await?;
                spent += 1;
                if reply.0 != 2 {
                    learned("script");
                    self.remember(ticket, n, reply, period);
                    return standing(reply.0, reply.1, spent);
                }
                // Gone since the read, or before it: the index may hold a newer number.
                known_gone = Some(n);
            }
        }
        let (n, reply, commands) = if cfg.index_in_line {
            // The index is in the script's slot: one script reads it and the number's standing.
            let reply = self
                .number_standing(ev, 0, mode, now, Some((&index, &member)))
                .await?;
            (u64::try_from(reply.3).unwrap_or(0), reply, 1)
        } else {
            let Some(n) = self.number_of(&index, &member).await? else {
                self.places.remove(ticket);
                return Err(QueueError::UnknownTicket);
            };
            if known_gone == Some(n) {
                self.places.remove(ticket);
                return Err(QueueError::UnknownTicket);
            }
            (n, self.number_standing(ev, n, mode, now, None).await?, 2)
        };
        if learning {
            learned("script");
        }
        if n == 0 || known_gone == Some(n) || reply.0 == 2 {
            self.places.remove(ticket);
            if n == 0 || known_gone == Some(n) {
                return Err(QueueError::UnknownTicket);
            }
        } else {
            self.remember(ticket, n, reply, period);
        }
        standing(reply.0, reply.1, commands + spent)
    }

    /// Whether a poll of a ticket this instance does not remember should read its index entry
    /// first ([`Queue::index_entry`]) rather than run the index-reading script: only when the
    /// figures are at hand and the line, as they hold it, reaches beyond the horizon, so that
    /// some tickets are far from the front and answered from the figures without a script.
    /// Where every number is near the front (a short line, or a horizon as long as the line)
    /// each such poll runs a script anyway, and the read would only add a command.
    async fn far_places_in(&self, ev: &Event) -> bool {
        let Some(figures) = self.line_figures(ev).await else {
            return false;
        };
        !figures.near_front(figures.seq, numbered_horizon(&ev.config))
    }

    /// A plain read of a member's index entry in the event's slot, so that a ticket this
    /// instance does not remember is learned without a script on the event's primary, which
    /// takes every enter of the event (a ticket whose enter another instance took, or an
    /// instance started during the sale: ~6 µs of the primary's CPU per poll where the standing
    /// script took 11–16, benchmarks.md, "A poll on a task that did not take the enter"). To a
    /// replica when reads are configured to (`WAITROOM_REDIS_READ_FROM_REPLICAS`): every
    /// answered enter's entry is on one (its batch's `WAIT`), but a replica may be behind or
    /// failing, so there finding nothing, or an error, is `None` and the script decides. On the
    /// primary a failed read is the poll's answer (503), as the script's would be, and nothing
    /// found is an unknown ticket (404): an enter answers only after its batch wrote the entry,
    /// and the service removes none (a freed line's keys go whole), so a flood of made-up
    /// tickets costs the primary a read each, not a script.
    ///
    /// The number read is the member's, or was within the figures' age: an entry changes only
    /// after its number is gone (`poll_numbered`), the age a remembered place is answered at.
    async fn index_entry(&self, index: &str, member: &str) -> Result<Option<u64>, QueueError> {
        let read: Result<Option<u64>, RedisError> = redis::cmd("HGET")
            .arg(index)
            .arg(member)
            .query_async(&mut self.store.reads())
            .await;
        if self.store.reads_replicas() {
            return Ok(read.ok().flatten());
        }
        match read? {
            Some(n) => Ok(Some(n)),
            None => Err(QueueError::UnknownTicket),
        }
    }

    /// Takes `ticket` out of a numbered line, or ends its active session.
    pub(super) async fn leave_numbered(
        &self,
        ev: &Event,
        ticket: &Ticket,
    ) -> Result<(), QueueError> {
        let cfg = &ev.config;
        let member = cfg.member(ticket);
        let index = self.index_key(ev, &member);
        self.places.remove(ticket);
        let Some(n) = self.number_of(&index, &member).await? else {
            return Err(QueueError::UnknownTicket);
        };
        let left: i64 = with_numbered_keys(&self.store.scripts().nl_leave, &ev.numbered)
            .arg(n)
            .arg(now_ms())
            .arg(cfg.active_ttl_seconds * 1000)
            .invoke_async(&mut self.store.conn())
            .await?;
        // The positions behind it moved: this instance's next answers read them afresh.
        self.snapshots.changed(&ev.numbered.line);
        if left == 0 {
            return Err(QueueError::UnknownTicket);
        }
        Ok(())
    }

    /// Waiting, active and admitted of a numbered line (`lua/nl_figures.lua`).
    pub(super) async fn numbered_figures(
        &self,
        keys: &NumberedKeys,
        cfg: &EventConfig,
    ) -> Result<(u64, u64, u64), QueueError> {
        Ok(with_numbered_keys(&self.store.scripts().nl_figures, keys)
            .arg(now_ms())
            .arg(cfg.active_ttl_seconds * 1000)
            .invoke_async(&mut self.store.conn())
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_enter_scripts_reply_gives_each_enter_its_number_and_standing_in_order() {
        // c = 10: new numbers 15 and 16 wait at 5 and 6; a kept place 7 is admitted (kind 1
        // at ms 1234), another kept place 12 waits at 2; a new number at or below c shows 1.
        let reply = [10, 15, -7, 16, -12, 9, 1, 1234, 0, 2];
        assert_eq!(
            enter_answers(&reply, 5),
            Some(vec![
                (15, 0, 5),
                (7, 1, 1234),
                (16, 0, 6),
                (12, 0, 2),
                (9, 0, 1)
            ])
        );
        assert_eq!(enter_answers(&[0], 0), Some(vec![]));
    }

    #[test]
    fn an_enter_reply_of_another_shape_is_refused() {
        // Too few numbers, a kept place without its standing, a standing left over, nothing.
        assert_eq!(enter_answers(&[0, 1], 2), None);
        assert_eq!(enter_answers(&[0, -1, 0], 1), None);
        assert_eq!(enter_answers(&[0, 1, 0, 5], 1), None);
        assert_eq!(enter_answers(&[], 0), None);
    }
}
