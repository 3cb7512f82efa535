//! The waiting room: enter, poll, leave, event administration, and admission.
//!
//! A line is N Redis sorted sets (shards). A ticket lives in shard `crc16(member) mod N` (its
//! member: `EventConfig::member`, 14 characters for events made by this version); each
//! operation on one person runs one Lua script in that shard's slot (`global_counter` numbers
//! go in batches of the enters arriving together: [`counted`]), and a position adds the
//! counts of those ahead in the other shards, read concurrently over the multiplexed
//! connection (one round trip per node). The ordering rules themselves are in the pure
//! `waitroom-strategies` crate.
//!
//! Invariant: a person is in at most one of their shard's two sets (waiting, active), and every
//! move between them is one atomic script — nobody is lost between the two or admitted twice.

pub mod admission;
pub mod event;
mod numbered;
pub use numbered::enter_answers;
mod counted;
mod counts;
pub mod scores;
mod served;
pub mod snapshot;
mod status_json;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::try_join_all;
use redis::{AsyncCommands as _, RedisError};
use serde::Serialize;
use waitroom_strategies::{global_counter, statistical, timestamp, StrategyKind};

use crate::auth::{AccessClaims, Signer};
use crate::ids::{EventId, Ticket, UserId};
use crate::redis::keys::{choose_tags, stats, ShardKeys};
use crate::redis::memory::MemoryGuard;
use crate::redis::replies::ShardStanding;
use crate::redis::{classify, primaries, Fault, RedisConn, Store};
use crate::telemetry;
use event::{Event, EventConfig, EventPatch, EventState, EventStore, LineForm};

/// What can go wrong in the waiting room.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// No such event.
    #[error("unknown event")]
    UnknownEvent,
    /// No such ticket in this event (never entered, left, or its session ended).
    #[error("unknown ticket")]
    UnknownTicket,
    /// The event exists but is paused or closed.
    #[error("the event is {0}")]
    EventClosed(&'static str),
    /// A configuration the caller asked for is not allowed.
    #[error("{0}")]
    Invalid(String),
    /// The change would lose people (e.g. resharding a non-empty line).
    #[error("{0}")]
    Conflict(String),
    /// The stored configuration cannot be read.
    #[error("stored event configuration is unreadable")]
    CorruptConfig,
    /// A key held a value of the wrong type (and was quarantined, if we could).
    #[error("a queue key held the wrong type")]
    WrongType,
    /// Redis could not answer.
    #[error(transparent)]
    Redis(RedisError),
    /// Someone not in the line entered while the memory guard turns new people away
    /// ([`crate::redis::memory`]).
    #[error("the waiting room is full")]
    Full,
}

impl From<RedisError> for QueueError {
    fn from(e: RedisError) -> Self {
        match classify(&e) {
            Fault::WrongType => QueueError::WrongType,
            Fault::Unavailable => QueueError::Redis(e),
        }
    }
}

/// The status of one ticket, as the contract's "queue status object".
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct QueueStatus {
    /// The ticket.
    pub ticket: String,
    /// The event id.
    pub event: String,
    /// `waiting`, `admitted` or `sold_out`.
    #[schema(value_type = String, example = "waiting")]
    pub status: &'static str,
    /// 1-based position while waiting.
    pub position: Option<u64>,
    /// Expected wait, from the measured admission rate.
    pub eta_seconds: Option<f64>,
    /// When to ask again.
    pub next_poll_ms: u64,
    /// Bearer token for the seat endpoints, once admitted.
    pub access_token: Option<String>,
    /// When the active session (and the token) ends, Unix seconds; admitted only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_expires_at: Option<u64>,
    /// When the ticket was admitted, Unix ms (the admission tick's time); admitted only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admitted_at_ms: Option<u64>,
    /// The strategy that computed `position` (exact for `timestamp`); waiting only.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::http::openapi::Strategy>)]
    pub strategy: Option<StrategyKind>,
}

/// Live figures of one event (`GET /admin/v1/events/{event}`).
#[derive(Debug, Clone, Serialize)]
pub struct EventStats {
    /// People waiting, all shards.
    pub waiting: u64,
    /// Active sessions, all shards.
    pub active: u64,
    /// Admitted since the event was created.
    pub admitted_total: u64,
    /// Waiting per shard.
    pub shards: Vec<ShardStats>,
    /// Configured strategy.
    pub strategy: String,
    /// Strategy in use right now (differs under `hybrid`).
    pub effective_strategy: String,
    /// Instance that admits for this event now, if any.
    pub admission_leader: Option<String>,
    /// Admissions per second measured by the leader.
    pub measured_admit_per_second: Option<f64>,
    /// The leader's moving average of the estimated positions' relative error (sampled; none
    /// under `timestamp`, which is exact).
    pub measured_position_error: Option<f64>,
    /// True while the answering instance's memory guard turns people new to this event's line
    /// away: a Redis primary that serves a slot of the line uses
    /// `WAITROOM_REDIS_ENTER_MEMORY_PERCENT` or more of its `maxmemory`
    /// ([`crate::redis::memory`]). An event whose line lives on other primaries shows false.
    pub turning_away: bool,
}

/// Waiting count of one shard.
#[derive(Debug, Clone, Serialize)]
pub struct ShardStats {
    /// Shard index.
    pub shard: usize,
    /// Its hash tag.
    pub tag: String,
    /// People waiting in it.
    pub waiting: u64,
}

/// The waiting room: the shared Redis store, the event cache, the signer of tickets and
/// tokens, and this instance's arrival clock.
pub struct Queue {
    store: Arc<Store>,
    events: EventStore,
    signer: Signer,
    clock: ArrivalClock,
    /// Tickets' scores as this instance last read them, for one-round `timestamp` positions.
    scores: scores::ScoreCache,
    /// Numbered lines' counters: how far each is known to be on a replica.
    numbers: numbered::Durable,
    /// The sorted sets' `global_counter` counters, each with the enters waiting for a number.
    counted: counted::Counted,
    /// Exact positions' counts in the other shards, waiting for the next batch.
    counts: counts::Counts,
    /// Numbered lines' tickets: each one's number as this instance last found it, and the
    /// period its last-seen record is current for.
    places: scores::ScoreCache<numbered::Place>,
    /// Numbered lines' figures as this instance last read them (positions without a command).
    snapshots: snapshot::Snapshots,
    /// Whether new people may enter, by the primaries' memory.
    memory: Arc<MemoryGuard>,
}

impl Queue {
    /// A waiting room on `store`, signing tickets and tokens with `signer`.
    pub fn new(store: Arc<Store>, signer: Signer) -> Self {
        Queue {
            events: EventStore::new(store.keys().clone()),
            store,
            signer,
            clock: ArrivalClock::default(),
            scores: scores::ScoreCache::new(scores::DEFAULT_ENTRIES).named("scores"),
            numbers: numbered::Durable::new(0, std::time::Duration::ZERO),
            counted: counted::Counted::default(),
            counts: counts::Counts::default(),
            places: scores::ScoreCache::new(scores::DEFAULT_ENTRIES).named("places"),
            snapshots: snapshot::Snapshots::new(snapshot::DEFAULT_AGE),
            memory: Arc::new(MemoryGuard::new(0)),
        }
    }

    /// This queue turning new people away while `guard` is closed (see
    /// [`crate::redis::memory`]).
    pub fn with_memory_guard(mut self, guard: Arc<MemoryGuard>) -> Self {
        self.memory = guard;
        self
    }

    /// The memory guard this queue obeys.
    pub fn memory_guard(&self) -> &Arc<MemoryGuard> {
        &self.memory
    }

    /// This queue computing a numbered line's positions from figures at most `age` old when it
    /// can (zero: every poll runs its script). See [`snapshot`].
    pub fn with_numbered_snapshot(mut self, age: std::time::Duration) -> Self {
        self.snapshots = snapshot::Snapshots::new(age);
        self
    }

    /// This instance just changed numbered line `line` (a tick, a leave): its next positions
    /// are read afresh.
    pub(crate) fn numbered_changed(&self, line: &str) {
        self.snapshots.changed(line);
    }

    /// This queue using a numbered line's arrival number only once `replicas` replicas of the
    /// counter's primary hold it, waiting at most `wait` (then the enter answers 503): a
    /// failover can then never hand the same number out twice. 0 replicas: no wait (one Redis
    /// without replicas). See [`numbered::Durable`].
    pub fn with_number_durability(mut self, replicas: u32, wait: std::time::Duration) -> Self {
        self.numbers = numbered::Durable::new(replicas, wait);
        self
    }

    /// This queue remembering at most `entries` tickets' scores (0: none; every `timestamp`
    /// position then takes two round trips). See [`scores`].
    pub fn with_score_cache(mut self, entries: usize) -> Self {
        self.scores = scores::ScoreCache::new(entries).named("scores");
        self.places = scores::ScoreCache::new(entries).named("places");
        self
    }

    /// The shared Redis store.
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The signer of tickets, access tokens and booking ids.
    pub fn signer(&self) -> &Signer {
        &self.signer
    }

    /// The event, from the per-instance cache when fresh.
    pub async fn event(&self, event: &EventId) -> Result<Arc<Event>, QueueError> {
        self.events.get(&mut self.store.conn(), event).await
    }

    /// Every registered event.
    pub async fn registered_events(&self) -> Result<Vec<EventId>, QueueError> {
        self.events.registered(&mut self.store.conn()).await
    }

    /// The shard a ticket lives in: CRC16 of its member ([`EventConfig::member`]) mod the shard
    /// count.
    pub fn shard_of(cfg: &EventConfig, ticket: &Ticket) -> usize {
        Self::shard_of_member(cfg, &cfg.member(ticket))
    }

    /// [`Queue::shard_of`] for a ticket already formatted as its member.
    fn shard_of_member(cfg: &EventConfig, member: &str) -> usize {
        crc16::State::<crc16::XMODEM>::calculate(member.as_bytes()) as usize % cfg.shards as usize
    }

    /// The keys of shard `shard` of an event.
    pub fn shard_keys(&self, cfg: &EventConfig, shard: usize) -> ShardKeys {
        self.store.keys().shard(&cfg.shard_tags[shard])
    }

    /// Enters `user` into the line of `event` (or returns where they already stand).
    #[tracing::instrument(skip_all, fields(event = %event))]
    pub async fn enter(&self, event: &EventId, user: &UserId) -> Result<QueueStatus, QueueError> {
        let ev = self.event(event).await?;
        self.enter_event(event, &ev, user).await
    }

    /// [`Queue::enter`] with the event already read (the enter route reads it first for the
    /// verified entry: one cache lookup per request, not two).
    pub async fn enter_event(
        &self,
        event: &EventId,
        ev: &Event,
        user: &UserId,
    ) -> Result<QueueStatus, QueueError> {
        match ev.config.state {
            EventState::Open => {}
            EventState::Paused => return Err(QueueError::EventClosed("paused")),
            EventState::Closed => return Err(QueueError::EventClosed("closed")),
        }
        ev.metrics.entered.increment(1);
        let ticket = self.signer.ticket(event, user);
        if ev.sold_out {
            // The line has stopped: say so at once instead of queueing people for nothing. Someone
            // already admitted keeps their session (and token) though.
            return match self.standing_now(event, ev, &ticket).await {
                Ok(admitted @ Standing::Admitted { .. }) => {
                    Ok(self.view(event, ev, ticket, admitted))
                }
                Ok(_) | Err(QueueError::UnknownTicket) => {
                    Ok(self.view(event, ev, ticket, Standing::SoldOut))
                }
                Err(e) => Err(e),
            };
        }
        // `closed` first: while all is well an enter pays one atomic load, not the line's slots.
        if self.memory.closed() && self.memory.turns_away(ev.growth_slots()) {
            // Redis is near full where this line grows: the line does not grow, so the sale
            // keeps room to write.
            // Whoever is in it already gets their standing, as an enter again always does.
            return match self.standing_now(event, ev, &ticket).await {
                Ok(standing) => Ok(self.view(event, ev, ticket, standing)),
                Err(QueueError::UnknownTicket) => {
                    ev.metrics.turned_away.increment(1);
                    Err(QueueError::Full)
                }
                Err(e) => Err(e),
            };
        }
        if ev.config.line_form == LineForm::Numbered {
            let standing = self
                .repairing_numbered(event, ev, &ticket, || self.enter_numbered(ev, &ticket))
                .await?;
            return Ok(self.view(event, ev, ticket, standing));
        }
        let arrival = self.clock.next();
        let standing = match ev.config.order_source(arrival) {
            StrategyKind::GlobalCounter => {
                self.repairing(event, &ev.config, || self.enter_counted(ev, &ticket))
                    .await?
            }
            _ => {
                self.repairing(event, &ev.config, || {
                    self.locate(ev, &ticket, Some(arrival), true)
                })
                .await?
            }
        };
        Ok(self.view(event, ev, ticket, standing))
    }

    /// Where `ticket` stands, read without recording a poll (`UnknownTicket` when it is in
    /// no line): for the enters that must not join the line.
    async fn standing_now(
        &self,
        event: &EventId,
        ev: &Event,
        ticket: &Ticket,
    ) -> Result<Standing, QueueError> {
        // Through the repair like every other read of the line: a key of the wrong type would
        // otherwise answer 503 here for as long as the line stays closed.
        match ev.config.line_form {
            LineForm::Numbered => {
                self.repairing_numbered(event, ev, ticket, || self.poll_numbered(ev, ticket, true))
                    .await
            }
            LineForm::SortedSets => {
                self.repairing(event, &ev.config, || self.locate(ev, ticket, None, false))
                    .await
            }
        }
    }

    /// Where `ticket` stands now.
    pub async fn poll(&self, event: &EventId, ticket: &Ticket) -> Result<QueueStatus, QueueError> {
        self.poll_since(event, ticket, None).await
    }

    /// Where `ticket` stands now, for a client that last showed position `last`: an estimated
    /// position that moved back by no more than the event's error budget keeps `last` on
    /// screen (see `statistical::steady`); exact positions are shown as computed.
    ///
    /// Not a span of its own: the poll handler's span already names the event for whatever is
    /// logged inside, and a second span took 0.9 % of the service's CPU samples under a poll
    /// load at the default log level, `info` (docs/benchmarks.md, "The log level's price").
    pub async fn poll_since(
        &self,
        event: &EventId,
        ticket: &Ticket,
        last: Option<u64>,
    ) -> Result<QueueStatus, QueueError> {
        let mut conn = self.store.conn();
        let ev = self.events.get(&mut conn, event).await?;
        ev.metrics.polls.increment(1);
        let standing = match ev.config.line_form {
            LineForm::Numbered => {
                self.repairing_numbered(event, &ev, ticket, || {
                    self.poll_numbered(&ev, ticket, false)
                })
                .await?
            }
            LineForm::SortedSets => {
                self.repairing(event, &ev.config, || self.locate(&ev, ticket, None, true))
                    .await?
            }
        };
        let standing = match standing {
            Standing::Waiting {
                position,
                strategy: StrategyKind::Statistical,
                commands,
            } => Standing::Waiting {
                position: statistical::steady(position, last, ev.config.hybrid_max_error),
                strategy: StrategyKind::Statistical,
                commands,
            },
            other => other,
        };
        if let Standing::Waiting {
            strategy, commands, ..
        } = standing
        {
            ev.metrics
                .commands_per_poll(strategy)
                .record(f64::from(commands));
            if ev.sold_out {
                return Ok(self.view(event, &ev, *ticket, Standing::SoldOut));
            }
        }
        Ok(self.view(event, &ev, *ticket, standing))
    }

    /// Runs `op`; when a key held the wrong type, quarantines the event's bad keys
    /// ([`Queue::repair`]) and runs `op` once more. Every request path goes through here, so a
    /// corrupted key costs one repaired request, never a loop of failures.
    async fn repairing<T, F, Fut>(
        &self,
        event: &EventId,
        cfg: &EventConfig,
        op: F,
    ) -> Result<T, QueueError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueueError>>,
    {
        self.repairing_with(event, cfg, || None, op).await
    }

    /// [`Queue::repairing`] for a request on a numbered line about `ticket`: the index bucket
    /// that holds (or is to hold) its number is checked too. The index is 16,384 keys, too many
    /// to check at every repair; a bad bucket fails exactly the requests of the members it
    /// indexes (and the batches of enters they are in), so those requests repair it. The
    /// bucket's name is worked out only for a repair, not for every request.
    async fn repairing_numbered<T, F, Fut>(
        &self,
        event: &EventId,
        ev: &Event,
        ticket: &Ticket,
        op: F,
    ) -> Result<T, QueueError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueueError>>,
    {
        self.repairing_with(event, &ev.config, || Some(self.index_of(ev, ticket)), op)
            .await
    }

    /// [`Queue::repairing`], the repair also checking the hash `index()` names, if any.
    async fn repairing_with<T, F, Fut>(
        &self,
        event: &EventId,
        cfg: &EventConfig,
        index: impl FnOnce() -> Option<String>,
        op: F,
    ) -> Result<T, QueueError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueueError>>,
    {
        match op().await {
            Err(QueueError::WrongType) => {
                self.repair_keys(event, cfg, index()).await?;
                op().await
            }
            other => other,
        }
    }

    /// Enters with an arrival number from the event's counter, taken in a batch with the
    /// enters arriving together and with the figures of its position ([`counted`]); the shard
    /// is read only with `enter.lua`. A number given to someone already in the line or inside
    /// waits nowhere: it is recorded as a gap ([`record_gap`]), which counted positions do not
    /// count.
    async fn enter_counted(&self, ev: &Event, ticket: &Ticket) -> Result<Standing, QueueError> {
        let drawn = self.draw_number(ev).await?;
        let number = drawn.number;
        let figures = Ahead::Figures {
            number,
            figures: drawn.figures,
            gaps: drawn.gaps,
        };
        let reached = self
            .reach(ev, ticket, Some(number), true, Some(figures))
            .await?;
        let joined =
            matches!(reached.reply, ShardStanding::Waiting { score, .. } if score == number as f64);
        if joined {
            return self.place(ev, ticket, reached).await;
        }
        // The gap is behind this person's own place: their position does not wait for it.
        let (placed, ()) =
            tokio::join!(self.place(ev, ticket, reached), self.record_gap(ev, number));
        placed
    }

    /// Records `number` of `ev`'s counter range as a gap ([`record_gap`]).
    async fn record_gap(&self, ev: &Event, number: u64) {
        let cfg = &ev.config;
        record_gap(
            &self.store,
            &ev.stats_key,
            &ev.gaps_key,
            cfg.counter_start,
            number,
        )
        .await
    }

    /// Where `ticket` stands: `enter.lua` when `arrival` is given (joining the line with that
    /// score if not in it), else the read of [`Queue::read_shard`]; then the position by the
    /// event's strategy. The reads the position will need that do not depend on the own shard's
    /// answer, or whose input can be guessed (the arrival given, or the score this instance last
    /// read), go out in the same round ([`Queue::prefetch`]) when `prefetch` is set.
    async fn locate(
        &self,
        ev: &Event,
        ticket: &Ticket,
        arrival: Option<u64>,
        prefetch: bool,
    ) -> Result<Standing, QueueError> {
        let reached = self.reach(ev, ticket, arrival, prefetch, None).await?;
        self.place(ev, ticket, reached).await
    }

    /// The first half of [`Queue::locate`]: the own shard's answer and the reads that went with
    /// it, or `given`, the reads the caller already made (a counted enter's figures).
    async fn reach(
        &self,
        ev: &Event,
        ticket: &Ticket,
        arrival: Option<u64>,
        prefetch: bool,
        given: Option<Ahead>,
    ) -> Result<Reached, QueueError> {
        let cfg = &ev.config;
        // Formatted once: the shard, the script or the read all take the member.
        let member = cfg.member(ticket);
        let shard = Self::shard_of_member(cfg, &member);
        let k = &ev.shard_keys[shard];
        let own = async {
            match arrival {
                Some(score) => self
                    .store
                    .scripts()
                    .enter
                    .key(&k.waiting)
                    .key(&k.active)
                    .key(&k.seen)
                    .arg(&member)
                    .arg(score)
                    .arg(now_ms())
                    .arg(cfg.active_ttl_seconds * 1000)
                    .arg(horizon(cfg))
                    .invoke_async::<ShardStanding>(&mut self.store.conn())
                    .await
                    .map_err(QueueError::from),
                None => self.read_shard(cfg, ShardNeeds::of(ev), k, &member).await,
            }
        };
        let remembered = match remembers(cfg) && prefetch {
            true => self.scores.get(ticket),
            false => None,
        };
        // A remembered score first: entering again keeps the stored score (`ZADD NX`).
        let guess = remembered.or(arrival.map(|score| score as f64));
        let ahead = async {
            match (given, prefetch) {
                (Some(given), _) => given,
                (None, true) => self.prefetch(ev, shard, guess).await,
                (None, false) => Ahead::Nothing,
            }
        };
        // Both in flight at once; an answer that nobody waits does not wait for the prefetch
        // (dropping it discards its replies).
        futures::pin_mut!(own, ahead);
        let (reply, ahead) = match futures::future::select(own, ahead).await {
            futures::future::Either::Left((reply, ahead)) => match reply {
                Ok(waiting @ ShardStanding::Waiting { .. }) => (Ok(waiting), ahead.await),
                other => (other, Ahead::Nothing),
            },
            futures::future::Either::Right((ahead, own)) => (own.await, ahead),
        };
        Ok(Reached {
            shard,
            reply: reply?,
            ahead,
            remembered,
        })
    }

    /// The second half of [`Queue::locate`]: the standing from the own shard's answer.
    async fn place(
        &self,
        ev: &Event,
        ticket: &Ticket,
        reached: Reached,
    ) -> Result<Standing, QueueError> {
        let Reached {
            shard,
            reply,
            ahead,
            remembered,
        } = reached;
        if remembered.is_some() && !matches!(reply, ShardStanding::Waiting { .. }) {
            self.scores.remove(ticket);
        }
        match reply {
            ShardStanding::Admitted { admitted_at_ms } => {
                ahead.unused(ev);
                Ok(Standing::Admitted { admitted_at_ms })
            }
            ShardStanding::Waiting {
                score,
                rank,
                shard_size,
            } => {
                if remembers(&ev.config) && remembered != Some(score) {
                    self.scores.put(ticket, score);
                }
                self.waiting(ev, shard, score, rank, shard_size, ahead)
                    .await
            }
            ShardStanding::Unknown => {
                ahead.unused(ev);
                Err(QueueError::UnknownTicket)
            }
        }
    }

    /// The reads of a position that can go out with the own shard's, by the event's effective
    /// strategy: under `timestamp`, the other shards' counts ahead of `guess` (the score the
    /// person is expected to have); under `global_counter` with a counter range, the leader's
    /// figures and the gaps ahead of `guess`. A failed count is kept: at the score guessed it is
    /// the position's own error (not sent a second time to a node that just failed); at another
    /// score the position reads again.
    async fn prefetch(&self, ev: &Event, shard: usize, guess: Option<f64>) -> Ahead {
        match ev.effective_strategy() {
            StrategyKind::Timestamp if ev.config.shards > 1 => match guess {
                Some(score) => match self.ahead_batched(&ev.shard_keys, shard, score).await {
                    Ok(counts) => Ahead::Counts { score, counts },
                    Err(e) => Ahead::Failed { score, error: e },
                },
                None => Ahead::NoGuess,
            },
            StrategyKind::GlobalCounter if ev.config.counter_start > 0 => match guess {
                Some(score) => match self.read_counter_figures(ev, score as u64).await {
                    Ok((figures, gaps)) => Ahead::Figures {
                        number: score as u64,
                        figures,
                        gaps,
                    },
                    Err(_) => Ahead::Nothing,
                },
                None => Ahead::NoGuess,
            },
            _ => Ahead::Nothing,
        }
    }

    /// Where `ticket` stands in its shard, read without a script (the poll path): one pipeline of
    /// plain reads of the waiting line and the last-seen record, and only for someone not
    /// waiting a second read of the active set. The line is read before the active set, so a
    /// ticket admitted between the two reads is found in the second. A waiting ticket whose
    /// recorded poll is older than [`seen_refresh_ms`] (or who never polled) is recorded seen
    /// now with `ZADD XX`, which cannot bring back a ticket that has left meanwhile (its
    /// record leaves with it); the admission's abandon bounds allow for the skipped records
    /// (`abandon_bound` in admission.rs). A ticket without a record inside its shard's
    /// [`horizon`] gets its first one from `lua/seen.lua`, which writes only while it still
    /// waits; further back nothing is written. Most polls therefore write nothing, replicate
    /// nothing and run no Lua. A lapsed session reads as unknown; the next admission tick removes it.
    /// The record is not counted in `waitroom_redis_commands_per_poll`, which counts the reads
    /// that find a position.
    ///
    /// The line's score and size are read only where the event's position uses them
    /// ([`ShardNeeds`]): a missing score reads as NaN, a missing size as 0.
    async fn read_shard(
        &self,
        cfg: &EventConfig,
        needs: ShardNeeds,
        k: &ShardKeys,
        member: &str,
    ) -> Result<ShardStanding, QueueError> {
        let now = now_ms();
        let mut conn = self.store.conn();
        let mut pipe = redis::pipe();
        if needs.score {
            pipe.zscore(&k.waiting, member);
        }
        pipe.zrank(&k.waiting, member);
        if needs.size {
            pipe.zcard(&k.waiting);
        }
        pipe.zscore(&k.seen, member);
        let replies: Vec<redis::Value> = pipe.query_async(&mut conn).await?;
        let mut replies = replies.iter();
        let mut next = || {
            replies.next().ok_or_else(|| {
                RedisError::from((redis::ErrorKind::Client, "a pipeline reply is missing"))
            })
        };
        let score: Option<f64> = match needs.score {
            true => redis::from_redis_value_ref(next()?).map_err(RedisError::from)?,
            false => Some(f64::NAN),
        };
        let rank: Option<u64> = redis::from_redis_value_ref(next()?).map_err(RedisError::from)?;
        let shard_size: u64 = match needs.size {
            true => redis::from_redis_value_ref(next()?).map_err(RedisError::from)?,
            false => 0,
        };
        let seen: Option<f64> = redis::from_redis_value_ref(next()?).map_err(RedisError::from)?;
        if let (Some(score), Some(rank)) = (score, rank) {
            let stale = now.saturating_sub(seen_refresh_ms(cfg)) as f64;
            match seen {
                Some(at) if at <= 0.0 || at <= stale => {
                    let _: i64 = redis::cmd("ZADD")
                        .arg(&k.seen)
                        .arg("XX")
                        .arg(now)
                        .arg(member)
                        .query_async(&mut conn)
                        .await?;
                }
                // Inside the horizon without a record: the first one, only while still waiting.
                None if rank < horizon(cfg) => {
                    let _: i64 = self
                        .store
                        .scripts()
                        .seen
                        .key(&k.waiting)
                        .key(&k.seen)
                        .arg(member)
                        .arg(now)
                        .invoke_async(&mut conn)
                        .await?;
                }
                _ => {}
            }
            return Ok(ShardStanding::Waiting {
                score,
                rank,
                shard_size,
            });
        }
        let admitted: Option<f64> = conn.zscore(&k.active, member).await?;
        Ok(match admitted {
            Some(at) if session_live(cfg, at, now) => ShardStanding::Admitted {
                admitted_at_ms: at as u64,
            },
            _ => ShardStanding::Unknown,
        })
    }

    /// The standing of someone waiting at `score` (rank `rank` of `shard_size` in their shard),
    /// with the position computed by the event's effective strategy, from the reads prefetched
    /// in `ahead` where they fit.
    async fn waiting(
        &self,
        ev: &Event,
        shard: usize,
        score: f64,
        rank: u64,
        shard_size: u64,
        ahead: Ahead,
    ) -> Result<Standing, QueueError> {
        let cfg = &ev.config;
        let counted = cfg.counter_start > 0 && score >= cfg.counter_start as f64;
        // Reads beyond the shard's own script, counted for the commands-per-poll metric.
        let mut reads = 0u32;
        let mut ahead = Some(ahead);
        let at = At { shard, score, rank };
        let (strategy, position) = match (ev.effective_strategy(), ev.waiting_total) {
            // One script on the own shard; the line's total from the leader's figures, corrected
            // by the own shard's change since they were published.
            (StrategyKind::Statistical, Some(total)) => {
                let total = match ev.shard_waiting.get(shard) {
                    Some(own) if ev.shard_waiting.len() == cfg.shards as usize => {
                        statistical::live_total(total, *own, shard_size, cfg.shards)
                    }
                    _ => total,
                };
                let estimate = statistical::position(rank, shard_size, total);
                // `hybrid` estimates only where the estimate can keep the event's budget: near
                // the front of the line one rank is N places, so those people are counted.
                let too_wide = cfg.strategy == StrategyKind::Hybrid
                    && !statistical::fits_budget(estimate, total, cfg.shards, cfg.hybrid_max_error);
                if too_wide {
                    (
                        StrategyKind::Timestamp,
                        self.exact(ev, at, &mut ahead, &mut reads).await?,
                    )
                } else {
                    (StrategyKind::Statistical, estimate)
                }
            }
            (StrategyKind::GlobalCounter, _) => {
                let published = if counted {
                    // The figures and the gaps ahead: two commands in one round trip.
                    reads += 2;
                    let number = score as u64;
                    let read = match ahead.take() {
                        Some(Ahead::Figures {
                            number: guessed,
                            figures,
                            gaps,
                        }) if guessed == number => Some((figures, gaps)),
                        other => {
                            match other {
                                Some(Ahead::NoGuess) => {
                                    ev.metrics.prefetch(Prefetch::NoGuess).increment(1)
                                }
                                Some(other) => other.unused(ev),
                                None => {}
                            }
                            None
                        }
                    };
                    let prefetched = read.is_some();
                    let (figures, gaps) = match read {
                        Some(read) => read,
                        None => self.read_counter_figures(ev, number).await?,
                    };
                    let usable = counter_figures(ev, figures, score);
                    if prefetched {
                        let outcome = match usable {
                            Some(_) => Prefetch::Used,
                            None => Prefetch::Unused,
                        };
                        ev.metrics.prefetch(outcome).increment(1);
                    }
                    usable.map(|(carried, first)| (carried, first, gaps))
                } else {
                    None
                };
                let position = match published {
                    Some((carried, first, gaps)) => {
                        global_counter::position(carried, score as u64, first, gaps)
                    }
                    // People from before the counter range (or before the leader has
                    // published): counted exactly, as they drain first.
                    None => self.exact(ev, at, &mut ahead, &mut reads).await?,
                };
                (StrategyKind::GlobalCounter, position)
            }
            // Before the leader has published a total, count exactly (and say so).
            _ => (
                StrategyKind::Timestamp,
                self.exact(ev, at, &mut ahead, &mut reads).await?,
            ),
        };
        if let Some(left) = ahead {
            left.unused(ev);
        }
        Ok(Standing::Waiting {
            position,
            strategy,
            commands: 1 + reads,
        })
    }

    /// The exact position of someone at `at`: the other shards' counts from `ahead` when they
    /// were prefetched for this score, else read now.
    async fn exact(
        &self,
        ev: &Event,
        at: At,
        ahead: &mut Option<Ahead>,
        reads: &mut u32,
    ) -> Result<u64, QueueError> {
        *reads += ev.config.shards - 1;
        match ahead.take() {
            Some(Ahead::Counts { score, counts }) if score == at.score => {
                ev.metrics.prefetch(Prefetch::Used).increment(1);
                return Ok(timestamp::position(at.rank, &counts));
            }
            Some(Ahead::Failed { score, error }) if score == at.score => return Err(error),
            Some(Ahead::NoGuess) => ev.metrics.prefetch(Prefetch::NoGuess).increment(1),
            Some(other @ (Ahead::Counts { .. } | Ahead::Failed { .. })) => {
                // Sent for another score: sent again.
                *reads += ev.config.shards - 1;
                other.unused(ev);
            }
            Some(other) => other.unused(ev),
            None => {}
        }
        let counts = self
            .ahead_batched(&ev.shard_keys, at.shard, at.score)
            .await?;
        Ok(timestamp::position(at.rank, &counts))
    }

    /// For each other shard (`keys`: every shard's, in order), how many wait ahead of a person
    /// at `score` in `shard`.
    pub(crate) async fn ahead_in_other_shards(
        &self,
        via: &RedisConn,
        keys: &[ShardKeys],
        shard: usize,
        score: f64,
    ) -> Result<Vec<u64>, QueueError> {
        // One pipeline per node instead of a round trip per shard (see redis::batch).
        let replies =
            crate::redis::batch::read_grouped(via, count_commands(keys, shard, score)).await?;
        counts_of(&replies)
    }

    /// [`Queue::ahead_in_other_shards`] over the connection for reads, with the counts of the
    /// other requests due at the same time ([`counts`]): a request's position path.
    async fn ahead_batched(
        &self,
        keys: &[ShardKeys],
        shard: usize,
        score: f64,
    ) -> Result<Vec<u64>, QueueError> {
        let replies = self
            .counts
            .read(&self.store, count_commands(keys, shard, score))
            .await?;
        counts_of(&replies)
    }

    /// True while `ticket` holds a live active session in `event`.
    /// One read of the shard's active set: a hold or a booking needs no position.
    pub async fn is_active(&self, event: &EventId, ticket: &Ticket) -> Result<bool, QueueError> {
        let ev = self.events.get(&mut self.store.conn(), event).await?;
        let cfg = &ev.config;
        if cfg.line_form == LineForm::Numbered {
            return match self
                .repairing_numbered(event, &ev, ticket, || self.poll_numbered(&ev, ticket, true))
                .await
            {
                Ok(standing) => Ok(matches!(standing, Standing::Admitted { .. })),
                Err(QueueError::UnknownTicket) => Ok(false),
                Err(e) => Err(e),
            };
        }
        let member = cfg.member(ticket);
        let k = &ev.shard_keys[Self::shard_of_member(cfg, &member)];
        let admitted: Option<f64> = self
            .repairing(event, cfg, || async {
                Ok(self.store.conn().zscore(&k.active, &member).await?)
            })
            .await?;
        Ok(admitted.is_some_and(|at| session_live(cfg, at, now_ms())))
    }

    /// Ends `ticket`'s active session (after a purchase), freeing the slot for the next person.
    pub async fn end_session(&self, event: &EventId, ticket: &Ticket) -> Result<(), QueueError> {
        match self.leave(event, ticket).await {
            Ok(()) | Err(QueueError::UnknownTicket) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Takes `ticket` out of the line or ends its active session.
    #[tracing::instrument(skip_all, fields(event = %event))]
    pub async fn leave(&self, event: &EventId, ticket: &Ticket) -> Result<(), QueueError> {
        let mut conn = self.store.conn();
        let ev = self.events.get(&mut conn, event).await?;
        if ev.config.line_form == LineForm::Numbered {
            return self
                .repairing_numbered(event, &ev, ticket, || self.leave_numbered(&ev, ticket))
                .await;
        }
        let member = ev.config.member(ticket);
        let k = &ev.shard_keys[Self::shard_of_member(&ev.config, &member)];
        let (removed, score): (i64, Option<f64>) = self
            .repairing(event, &ev.config, || async {
                let mut conn = self.store.conn();
                Ok(self
                    .store
                    .scripts()
                    .leave
                    .key(&k.waiting)
                    .key(&k.active)
                    .key(&k.seen)
                    .arg(&member)
                    .invoke_async(&mut conn)
                    .await?)
            })
            .await?;
        self.scores.remove(ticket);
        if removed == 0 {
            return Err(QueueError::UnknownTicket);
        }
        // A counted number that waits no more: positions behind it stop counting it.
        let cfg = &ev.config;
        let counting = cfg.strategy == StrategyKind::GlobalCounter && cfg.counter_start > 0;
        if let Some(score) = score.filter(|s| counting && *s >= cfg.counter_start as f64) {
            self.record_gap(&ev, score as u64).await;
        }
        Ok(())
    }

    fn view(&self, event: &EventId, ev: &Event, ticket: Ticket, standing: Standing) -> QueueStatus {
        let cfg = &ev.config;
        let mut status = QueueStatus {
            ticket: ticket.to_string(),
            event: event.to_string(),
            status: "waiting",
            position: None,
            eta_seconds: None,
            next_poll_ms: 0,
            access_token: None,
            access_expires_at: None,
            admitted_at_ms: None,
            strategy: None,
        };
        match standing {
            Standing::Waiting {
                position, strategy, ..
            } => {
                status.strategy = Some(strategy);
                // An ETA only while people are being let in: a paused line has none.
                let open = cfg.state == EventState::Open;
                let configured = (cfg.admit_per_second > 0.0).then_some(cfg.admit_per_second);
                let rate = ev
                    .measured_rate
                    .filter(|r| *r > 0.0)
                    .or(configured)
                    .filter(|_| open);
                let advice = advise(position, rate, 0.8 + 0.4 * ticket.spread());
                status.position = Some(position);
                status.eta_seconds = advice.eta_seconds;
                status.next_poll_ms = advice.next_poll_ms;
            }
            Standing::SoldOut => {
                status.status = "sold_out";
                // Seats can come back (a lapsed hold, a rejected booking): check now and then.
                status.next_poll_ms = POLL_MAX_MS;
            }
            Standing::Admitted { admitted_at_ms } => {
                let exp = (admitted_at_ms / 1000) + cfg.active_ttl_seconds;
                status.status = "admitted";
                status.next_poll_ms = 30_000;
                status.access_token = Some(self.signer.sign(&AccessClaims {
                    ev: event.to_string(),
                    tkt: ticket.to_string(),
                    exp,
                }));
                status.access_expires_at = Some(exp);
                status.admitted_at_ms = Some(admitted_at_ms);
            }
        }
        status
    }

    /// Creates or updates an event. Returns the stored configuration and whether it was new.
    #[tracing::instrument(skip_all, fields(event = %event))]
    pub async fn put_event(
        &self,
        event: &EventId,
        patch: &EventPatch,
    ) -> Result<(EventConfig, bool), QueueError> {
        let mut conn = self.store.conn();
        let old = self.events.load(&mut conn, event).await?;
        let mut cfg = patch.apply(old.as_ref()).map_err(QueueError::Invalid)?;
        if cfg.shard_tags.is_empty() {
            if let Some(old) = &old {
                // Instances may use a cached configuration for CACHE_TTL; only a line that has
                // stopped taking people can have its shards renamed without losing anyone.
                if old.state == EventState::Open {
                    return Err(QueueError::Conflict(
                        "pause or close the event before changing its shard count".into(),
                    ));
                }
                let stats = self.stats(event, old).await?;
                if stats.waiting > 0 || stats.active > 0 {
                    return Err(QueueError::Conflict(format!(
                        "{} people are waiting or active; the shard count can change only when the line is empty",
                        stats.waiting + stats.active
                    )));
                }
            }
            let placement = primaries(&mut conn).await?;
            cfg.shard_tags = choose_tags(event.as_str(), cfg.shards as usize, &placement);
        }
        let now = now_us();
        // A numbered line orders every strategy by its own counter: a switch moves no order key.
        let sorted = cfg.line_form == LineForm::SortedSets;
        if let Some(old) = old
            .as_ref()
            .filter(|o| sorted && o.strategy != cfg.strategy)
        {
            // Arrivals keep the order key in use now until an instant every instance's cached
            // configuration has passed, then all change together.
            cfg.previous_strategy = Some(old.order_source(now));
            cfg.switch_at_us = now + SWITCH_DELAY.as_micros() as u64;
        }
        let starts_counting = sorted
            && cfg.strategy == StrategyKind::GlobalCounter
            && old
                .as_ref()
                .is_none_or(|o| o.strategy != StrategyKind::GlobalCounter);
        if starts_counting {
            // The counter range begins above every score in the line (and every number handed
            // out before), and not before the switch instant: nobody can be numbered ahead of
            // someone already waiting.
            let highest = self.highest_score(&cfg).await?;
            let counter: Option<u64> = conn.get(self.store.keys().counter(event.as_str())).await?;
            cfg.counter_start = [
                cfg.switch_at_us.max(now),
                highest + 1,
                counter.unwrap_or(0) + 1,
            ]
            .into_iter()
            .max()
            .unwrap_or(now);
        }
        self.events.save(&mut conn, event, &cfg).await?;
        Ok((cfg, old.is_none()))
    }

    /// The highest arrival score waiting in any shard (0 for an empty line).
    async fn highest_score(&self, cfg: &EventConfig) -> Result<u64, QueueError> {
        let lasts = (0..cfg.shards as usize).map(|i| {
            let mut conn = self.store.conn();
            let key = self.shard_keys(cfg, i).waiting;
            async move {
                conn.zrange_withscores::<_, Vec<(String, f64)>>(key, -1, -1)
                    .await
            }
        });
        let lasts = try_join_all(lasts).await?;
        Ok(lasts
            .iter()
            .flatten()
            .map(|(_, s)| *s as u64)
            .max()
            .unwrap_or(0))
    }

    /// The stored configuration (uncached).
    pub async fn event_config(&self, event: &EventId) -> Result<EventConfig, QueueError> {
        self.events
            .load(&mut self.store.conn(), event)
            .await?
            .ok_or(QueueError::UnknownEvent)
    }

    /// Live figures of an event, read from every shard (a numbered line: from its figures,
    /// one script; it has no per-shard sets).
    pub async fn stats(
        &self,
        event: &EventId,
        cfg: &EventConfig,
    ) -> Result<EventStats, QueueError> {
        let numbered = cfg.line_form == LineForm::Numbered;
        let per_shard = (0..cfg.shards as usize).filter(|_| !numbered).map(|i| {
            let mut conn = self.store.conn();
            let k = self.shard_keys(cfg, i);
            async move {
                redis::pipe()
                    .zcard(&k.waiting)
                    .zcard(&k.active)
                    .get(&k.admitted)
                    .query_async::<(u64, u64, Option<u64>)>(&mut conn)
                    .await
            }
        });
        let shards = try_join_all(per_shard).await?;
        let mut conn = self.store.conn();
        type Figures = (Option<f64>, Option<String>, Option<String>);
        let (leader, (rate, mode, error)): (Option<String>, Figures) = redis::pipe()
            .get(self.store.keys().lease(event.as_str()))
            .hmget(
                self.store.keys().event_stats(event.as_str()),
                &[stats::RATE, stats::HYBRID_MODE, stats::POSITION_ERROR],
            )
            .query_async(&mut conn)
            .await?;
        let effective = cfg.positions_by(mode.and_then(|m| m.parse().ok()));
        let (waiting, active, admitted_total) = if numbered {
            self.numbered_figures(&self.store.keys().numbered(event.as_str()), cfg)
                .await?
        } else {
            (
                shards.iter().map(|s| s.0).sum(),
                shards.iter().map(|s| s.1).sum(),
                shards.iter().map(|s| s.2.unwrap_or(0)).sum(),
            )
        };
        Ok(EventStats {
            waiting,
            active,
            admitted_total,
            shards: shards
                .iter()
                .enumerate()
                .map(|(i, s)| ShardStats {
                    shard: i,
                    tag: cfg.shard_tags[i].clone(),
                    waiting: s.0,
                })
                .collect(),
            strategy: cfg.strategy.to_string(),
            effective_strategy: effective.to_string(),
            admission_leader: leader,
            measured_admit_per_second: rate,
            measured_position_error: error.and_then(|e| e.parse().ok()),
            turning_away: self.memory.turns_away(event::growth_slots(
                cfg,
                &self.store.keys().numbered(event.as_str()).line,
                (0..cfg.shards as usize).map(|i| self.shard_keys(cfg, i).slot),
            )),
        })
    }

    /// Quarantines any key of the event's shards that holds the wrong type, so that the next
    /// request works on a fresh key instead of failing forever. The bad value is kept under
    /// `<key>:wrongtype:<ms>` for an operator to look at.
    pub async fn repair(&self, event: &EventId, cfg: &EventConfig) -> Result<(), QueueError> {
        self.repair_keys(event, cfg, None).await
    }

    /// [`Queue::repair`], and the numbered line's index bucket `index` (a hash) when given.
    async fn repair_keys(
        &self,
        event: &EventId,
        cfg: &EventConfig,
        index: Option<String>,
    ) -> Result<(), QueueError> {
        let mut expected: Vec<(String, &str)> = Vec::new();
        expected.extend(index.map(|k| (k, "hash")));
        for i in 0..cfg.shards as usize {
            let k = self.shard_keys(cfg, i);
            expected.extend([
                (k.waiting, "zset"),
                (k.active, "zset"),
                (k.admitted, "string"),
                (k.seen, "zset"),
                (k.op, "string"),
                (k.horizon, "zset"),
            ]);
        }
        // The event's own counter and figures too. Its configuration is read as JSON and a bad
        // one is reported as unreadable, not moved: it cannot be rebuilt from nothing.
        expected.push((self.store.keys().counter(event.as_str()), "string"));
        expected.push((self.store.keys().counter_gaps(event.as_str()), "zset"));
        expected.push((self.store.keys().event_stats(event.as_str()), "hash"));
        if cfg.line_form == LineForm::Numbered {
            let nl = self.store.keys().numbered(event.as_str());
            expected.extend([
                (nl.line, "hash"),
                (nl.gone, "string"),
                (nl.ended, "string"),
                (nl.ticks, "zset"),
                (nl.seen, "string"),
                (nl.seq, "string"),
                (nl.op, "string"),
            ]);
        }
        let mut conn = self.store.conn();
        for (key, want) in expected {
            let found: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await?;
            if found != "none" && found != want {
                let aside = format!("{key}:wrongtype:{}", now_ms());
                tracing::error!(event = %event, key = %key, found = %found, want, aside = %aside,
                    "queue key held the wrong type; moved aside");
                metrics::counter!(telemetry::WRONGTYPE_REPAIRS).increment(1);
                let () = conn.rename(&key, &aside).await?;
            }
        }
        Ok(())
    }
}

/// Where a ticket stands, before it is turned into a [`QueueStatus`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Standing {
    Waiting {
        position: u64,
        strategy: StrategyKind,
        /// Redis commands sent to find the position (the own shard's script included; 0 for a
        /// numbered line's position computed from figures this instance holds).
        commands: u32,
    },
    Admitted {
        admitted_at_ms: u64,
    },
    /// Every show of the event is sold out (the line has stopped).
    SoldOut,
}

/// Advice to a waiting client.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Advice {
    /// Expected wait, seconds (None while admission is held back).
    pub eta_seconds: Option<f64>,
    /// When to ask again, ms.
    pub next_poll_ms: u64,
}

/// Shortest and longest poll interval advised while waiting.
pub const POLL_MIN_MS: u64 = 1_000;
/// See [`POLL_MIN_MS`].
pub const POLL_MAX_MS: u64 = 10_000;

/// Where someone waits: their shard, score and rank in it.
#[derive(Debug, Clone, Copy)]
struct At {
    shard: usize,
    score: f64,
    rank: u64,
}

/// The leader's `global_counter` figures as stored: the counter range's first number they were
/// taken for, people waiting from before the range, the first number still waiting.
type CounterFigures = [Option<u64>; 3];

/// The figures usable for a person at `score`: `(carried, first)`, or `None` when not (yet)
/// published for the event's current range, or when the person is ahead of the first number.
fn counter_figures(ev: &Event, figures: CounterFigures, score: f64) -> Option<(u64, u64)> {
    match figures {
        [Some(start), Some(carried), Some(first)]
            if start == ev.config.counter_start && first as f64 <= score =>
        {
            Some((carried, first))
        }
        _ => None,
    }
}

/// For each other shard than `shard` (`keys`: every shard's, in order), the `ZCOUNT` of those
/// ahead of a person at `score` there, with its key's slot.
fn count_commands(keys: &[ShardKeys], shard: usize, score: f64) -> Vec<(u16, redis::Cmd)> {
    keys.iter()
        .enumerate()
        .filter(|(j, _)| *j != shard)
        .map(|(j, k)| {
            let (inclusive, bound) = timestamp::count_bound(shard, j, score);
            let mut cmd = redis::cmd("ZCOUNT");
            cmd.arg(&k.waiting)
                .arg("-inf")
                .arg(score_bound(bound, inclusive));
            (k.slot, cmd)
        })
        .collect()
}

/// The counts of [`count_commands`]' replies.
fn counts_of(replies: &[redis::Value]) -> Result<Vec<u64>, QueueError> {
    Ok(replies
        .iter()
        .map(|v| redis::from_redis_value_ref::<u64>(v).map_err(RedisError::from))
        .collect::<Result<_, _>>()?)
}

/// Records `number` of an event's counter range (its first number `counter_start`) as a gap
/// (`lua/gap.lua`; `stats` and `gaps`, the event's figures and gaps). A failure is logged, not
/// returned: the person's own request went through, and an unrecorded gap only makes positions
/// behind it one too large until the head passes it.
async fn record_gap(store: &Store, stats: &str, gaps: &str, counter_start: u64, number: u64) {
    let recorded: Result<i64, RedisError> = store
        .scripts()
        .gap
        .key(stats)
        .key(gaps)
        .arg(number)
        .arg(counter_start)
        .invoke_async(&mut store.conn())
        .await;
    if let Err(e) = recorded {
        tracing::warn!(gaps = %gaps, number, error = %e,
            "a counter number that waits nowhere was not recorded as a gap");
        metrics::counter!(telemetry::COUNTER_GAPS_LOST).increment(1);
    }
}

/// Reads of a position sent in the same round as the own shard's ([`Queue::prefetch`]).
enum Ahead {
    /// Nothing was prefetched.
    Nothing,
    /// The other shards' counts ahead of `score`, in shard order without the own shard.
    Counts { score: f64, counts: Vec<u64> },
    /// Those counts failed.
    Failed { score: f64, error: QueueError },
    /// An exact position's counts, with no score to guess them at.
    NoGuess,
    /// The leader's `global_counter` figures, and the recorded gaps below `number` (the number
    /// guessed).
    Figures {
        number: u64,
        figures: CounterFigures,
        gaps: u64,
    },
}

/// What a poll's read of its own shard must return besides the rank, by the position the
/// event's strategy computes ([`Queue::waiting`]). Each reply left out is a command less on
/// every poll.
#[derive(Debug, Clone, Copy)]
struct ShardNeeds {
    /// The person's score: exact and counted positions, and the prefetch's guess.
    score: bool,
    /// The shard's size: estimated positions.
    size: bool,
}

impl ShardNeeds {
    fn of(ev: &Event) -> Self {
        match ev.config.strategy {
            // Estimated from the rank, the shard's size and the published total; counted
            // exactly at the score until a total is published.
            StrategyKind::Statistical => ShardNeeds {
                score: ev.waiting_total.is_none(),
                size: true,
            },
            // Either mode.
            StrategyKind::Hybrid => ShardNeeds {
                score: true,
                size: true,
            },
            StrategyKind::Timestamp | StrategyKind::GlobalCounter => ShardNeeds {
                score: true,
                size: false,
            },
        }
    }
}

/// The own shard's answer to [`Queue::reach`], with what went out beside it.
struct Reached {
    shard: usize,
    reply: ShardStanding,
    ahead: Ahead,
    /// The score this instance remembered for the ticket (the guess the prefetch used).
    remembered: Option<f64>,
}

/// Strategies whose positions read at the person's score: this instance remembers scores for
/// them, so that those reads go out with the own shard's ([`Queue::prefetch`]).
fn remembers(cfg: &EventConfig) -> bool {
    matches!(
        cfg.strategy,
        StrategyKind::Timestamp | StrategyKind::Hybrid | StrategyKind::GlobalCounter
    )
}

impl Ahead {
    /// Counts a prefetch that went unused (the person's score was not the one guessed, or they
    /// were not waiting).
    fn unused(self, ev: &Event) {
        if !matches!(self, Ahead::Nothing | Ahead::NoGuess) {
            ev.metrics.prefetch(Prefetch::Unused).increment(1);
        }
    }
}

/// How a position's prefetch went: `waitroom_position_prefetch_total{outcome}`.
#[derive(Debug, Clone, Copy)]
pub enum Prefetch {
    /// Prefetched and used: the position took one round trip.
    Used,
    /// Prefetched for nothing: another score, or nobody waiting.
    Unused,
    /// A `timestamp` position with no score to guess (first read by this instance).
    NoGuess,
}

impl Prefetch {
    /// The `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Prefetch::Used => "used",
            Prefetch::Unused => "unused",
            Prefetch::NoGuess => "no_guess",
        }
    }
}

/// The poll interval: about a quarter of the expected wait, between 1 and 10 seconds, times a
/// per-client `jitter` factor (0.8–1.2, derived from the ticket) so clients that entered in
/// the same second do not poll in lock-step.
pub fn advise(position: u64, rate: Option<f64>, jitter: f64) -> Advice {
    let eta_seconds = rate.filter(|r| *r > 0.0).map(|r| position as f64 / r);
    let base = match eta_seconds {
        Some(eta) => (eta * 1000.0 / 4.0).clamp(POLL_MIN_MS as f64, POLL_MAX_MS as f64),
        None => POLL_MAX_MS as f64,
    };
    Advice {
        eta_seconds,
        next_poll_ms: (base * jitter).round() as u64,
    }
}

/// How long after a strategy switch arrivals change order key: longer than
/// [`event::CACHE_TTL`], so every instance knows of the switch before it takes effect.
pub const SWITCH_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

/// Current time, µs since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// How stale a recorded poll may be before a poll records itself again (`Queue::read_shard`): a
/// quarter of the event's abandon time. The admission's abandon bounds are pushed back by as much
/// (`admission::abandon_bound`), so a skipped write never makes anyone look gone.
pub fn seen_refresh_ms(cfg: &EventConfig) -> u64 {
    quarter_ms(cfg.abandon_after_seconds)
}

/// A quarter of `seconds`, in ms: the refresh of a last-seen record for an abandon time of
/// `seconds` ([`seen_refresh_ms`]), and so the record period a numbered line is created with
/// (`EventConfig::record_period_ms`).
pub fn quarter_ms(seconds: u64) -> u64 {
    seconds.saturating_mul(250)
}

/// The horizon never holds fewer than this many people per shard.
const HORIZON_FLOOR: u64 = 1000;
/// How many times the people admitted during an abandon bound the horizon holds: the margin for
/// shards of uneven length (a shard's share of the rate is an average).
const HORIZON_MARGIN: f64 = 1.5;
/// Nor more than this: the scripts' Lua numbers print whole only below 10^14.
const HORIZON_CAP: u64 = 1 << 40;

/// The horizon of each shard: how many people from its front keep a last-seen record. Only they
/// can be found abandoned, and everyone further back costs one sorted-set entry instead of two
/// (docs/architecture.md, "Abandoned places"). It holds the people the event admits per shard,
/// at its configured rate, during an abandon bound (`abandon_after_seconds` plus
/// [`seen_refresh_ms`]), times [`HORIZON_MARGIN`], and at least [`HORIZON_FLOOR`]: someone who
/// comes inside (the admission tick records when, one entry per tick: `lua/line_lib.lua`) has
/// that long to poll before reaching the front, so an abandoned place is found before it is
/// admitted, as when everyone had a record.
pub fn horizon(cfg: &EventConfig) -> u64 {
    let bound_s = (cfg.abandon_after_seconds * 1000 + seen_refresh_ms(cfg)) as f64 / 1000.0;
    let per_shard =
        cfg.admit_per_second.max(0.0) * bound_s * HORIZON_MARGIN / f64::from(cfg.shards.max(1));
    (per_shard.ceil().min(HORIZON_CAP as f64) as u64).max(HORIZON_FLOOR)
}

/// True while a session admitted at `admitted_at_ms` (the active set's score) is live at `now`.
fn session_live(cfg: &EventConfig, admitted_at_ms: f64, now: u64) -> bool {
    admitted_at_ms as u64 + cfg.active_ttl_seconds * 1000 > now
}

/// A score as a `ZCOUNT` bound, `(` first when exclusive. Scores are integers (microseconds or
/// counter numbers): those are written as integers, without the shortest-float formatting that
/// a `timestamp` poll's seven bounds spent most of their instructions on. The text is the one
/// `{}` of the `f64` gives.
fn score_bound(score: f64, inclusive: bool) -> String {
    let open = if inclusive { "" } else { "(" };
    // Whole non-negative scores below 2^53 are exact in an f64 (and scores are never negative);
    // anything else keeps the float's own text, -0 included.
    if score.is_sign_positive() && score.fract() == 0.0 && score < 9_007_199_254_740_992.0 {
        format!("{open}{}", score as i64)
    } else {
        format!("{open}{score}")
    }
}

/// Current time, ms since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Arrival scores: microseconds since the epoch, strictly increasing within this instance, so
/// one instance never gives two people the same score and a later enter never scores lower.
/// Across instances the order is that of their clocks (NTP-synchronised in production).
#[derive(Debug, Default)]
struct ArrivalClock {
    last: AtomicU64,
}

impl ArrivalClock {
    fn next(&self) -> u64 {
        let now = now_us();
        let mut prev = self.last.load(Ordering::Relaxed);
        loop {
            let next = now.max(prev + 1);
            match self
                .last
                .compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(p) => prev = p,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advice_polls_sooner_near_the_front_and_later_far_back() {
        let near = advise(5, Some(100.0), 1.0);
        assert_eq!(near.next_poll_ms, POLL_MIN_MS);
        assert_eq!(near.eta_seconds, Some(0.05));
        let far = advise(1_000_000, Some(100.0), 1.0);
        assert_eq!(far.next_poll_ms, POLL_MAX_MS);
        let mid = advise(2_000, Some(100.0), 1.0);
        assert_eq!(mid.next_poll_ms, 5_000);
        let jittered = advise(2_000, Some(100.0), 1.2);
        assert_eq!(jittered.next_poll_ms, 6_000);
    }

    #[test]
    fn the_horizon_holds_an_abandon_bound_of_admissions_per_shard_with_a_floor() {
        let cfg = |rate: f64, shards: u32| {
            let patch = event::EventPatch {
                admit_per_second: Some(rate),
                shards: Some(shards),
                ..Default::default()
            };
            patch.apply(None).unwrap()
        };
        // 5,000/s over 8 shards, bound 60 s + 15 s: 5000 × 75 × 1.5 / 8.
        assert_eq!(horizon(&cfg(5000.0, 8)), 70_313);
        assert_eq!(horizon(&cfg(100.0, 8)), 1407, "100 × 75 × 1.5 / 8");
        assert_eq!(
            horizon(&cfg(50.0, 8)),
            HORIZON_FLOOR,
            "a slow line keeps the floor"
        );
        assert_eq!(
            horizon(&cfg(0.0, 1)),
            HORIZON_FLOOR,
            "and so does a paused one"
        );
        // Beyond what a configuration may ask (1,000,000/s): still a number Lua prints whole.
        let mut unbounded = cfg(1.0, 1);
        unbounded.admit_per_second = 1e12;
        assert_eq!(horizon(&unbounded), HORIZON_CAP);
    }

    #[test]
    fn advice_without_a_rate_has_no_eta_and_polls_slowly() {
        let a = advise(3, None, 1.0);
        assert_eq!(a.eta_seconds, None);
        assert_eq!(a.next_poll_ms, POLL_MAX_MS);
    }

    #[test]
    fn score_bounds_read_as_the_floats_own_text() {
        let scores = [
            0.0,
            -0.0,
            1.0,
            -7.0,
            1_764_633_600_123_456.0,
            9_007_199_254_740_991.0,
            9_007_199_254_740_992.0,
            1.5,
            -2.25,
            1e300,
        ];
        for s in scores {
            assert_eq!(score_bound(s, true), format!("{s}"), "{s}");
            assert_eq!(score_bound(s, false), format!("({s}"), "{s}");
        }
        assert_eq!(
            score_bound(1_764_633_600_123_456.0, false),
            "(1764633600123456"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_score_bound_is_the_floats_own_text(s in proptest::num::f64::NORMAL | proptest::num::f64::ZERO, whole in -(1i64 << 53)..(1i64 << 53)) {
            proptest::prop_assert_eq!(score_bound(s, true), format!("{s}"));
            let w = whole as f64;
            proptest::prop_assert_eq!(score_bound(w, false), format!("({w}"));
        }
    }

    #[test]
    fn arrival_scores_strictly_increase() {
        let c = ArrivalClock::default();
        let mut last = 0;
        for _ in 0..10_000 {
            let n = c.next();
            assert!(n > last);
            last = n;
        }
    }
}
