//! The numbered line (docs/numbered-line.md): an event created with `"line_form": "numbered"`
//! keeps no sorted set per person. Everyone gets an arrival number from the event's counter;
//! an index of small hashes maps a ticket's member to its number; departures are a bitmap by
//! number with prefix sums per block; admission advances a boundary. A position is arithmetic
//! on those figures: exact, a few commands whatever the line's size (`lua/numbered_lib.lua`).
//!
//! Round trips: an enter takes a number, waits until a replica holds it ([`Durable`]; shared
//! by the enters arriving together), then writes the index and reads the standing in one round
//! (a re-entry adds one or two); a poll reads the index, then the standing, or both in one
//! round when this instance remembers the ticket's number.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::RedisError;
use waitroom_strategies::StrategyKind;

use super::event::{Event, EventConfig};
use super::{horizon, now_ms, seen_refresh_ms, Queue, QueueError, Standing};
use crate::ids::Ticket;
use crate::redis::keys::NumberedKeys;
use crate::redis::scripts::with_numbered_keys;

/// A standing script's reply: `{kind, value}` (lua/nl_status.lua).
type Reply = (i64, i64);

/// The standing a numbered script reported.
fn standing(kind: i64, value: i64) -> Result<Standing, QueueError> {
    match kind {
        0 => Ok(Standing::Waiting {
            position: value.max(1) as u64,
            strategy: StrategyKind::GlobalCounter,
            reads: 0,
        }),
        1 => Ok(Standing::Admitted {
            admitted_at_ms: value.max(0) as u64,
        }),
        _ => Err(QueueError::UnknownTicket),
    }
}

/// The horizon of a numbered line, in numbers: the sorted line's horizon per shard times the
/// shards (the same people near the front, counted over the whole line).
pub(super) fn numbered_horizon(cfg: &EventConfig) -> u64 {
    horizon(cfg).saturating_mul(u64::from(cfg.shards.max(1)))
}

/// How far each numbered line's counter is known to be on its replicas, and the one `WAIT` at a
/// time that moves it (a group commit).
///
/// Redis replicates asynchronously: a failover of the counter's primary can promote a replica
/// whose counter is behind numbers already handed out, and the next enters would get them again
/// (two people, one number, one place; docs/numbered-line.md, "Risks"). So a number is used only
/// once a replica holds the counter at or past it. One `WAIT` answers for every number the
/// counter had given when it ran ([`crate::redis::RedisConn::wait_replicated_reading`]: a probe
/// write, a `GET` of the counter and the `WAIT`, on the connection kept for waits), so enters
/// arriving together share it: each waits for at most the one running and the next.
pub(crate) struct Durable {
    replicas: u32,
    wait: Duration,
    events: Mutex<HashMap<String, Arc<Counter>>>,
}

/// One counter's state in [`Durable`].
#[derive(Default)]
struct Counter {
    /// Every number up to this one is on `replicas` replicas.
    upto: AtomicU64,
    /// `WAIT`s started so far (their ids: 1, 2, …).
    started: AtomicU64,
    /// The id of the last `WAIT` that did not confirm its numbers (0: none).
    failed: AtomicU64,
    /// Held while this counter's `WAIT` runs.
    running: tokio::sync::Mutex<()>,
}

impl Durable {
    pub(crate) fn new(replicas: u32, wait: Duration) -> Self {
        Durable {
            replicas,
            wait,
            events: Mutex::new(HashMap::new()),
        }
    }

    /// The counter's state; its key is copied only the first time (an enter calls this).
    fn counter(&self, seq: &str) -> Arc<Counter> {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = events.get(seq) {
            return c.clone();
        }
        events.entry(seq.to_owned()).or_default().clone()
    }
}

/// The answer to an enter whose number did not reach the replicas (503), counted.
fn not_replicated() -> QueueError {
    metrics::counter!(crate::telemetry::NUMBERS_NOT_REPLICATED).increment(1);
    QueueError::Redis(RedisError::from((
        redis::ErrorKind::Io,
        "the arrival number did not reach the replicas in time",
    )))
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
    /// The index bucket of a member: CRC16 of the member mod the event's buckets, in the tag
    /// of shard `bucket mod shards`, so the index spreads over the primaries as the shards do.
    fn index_key(&self, cfg: &EventConfig, member: &str) -> String {
        let crc = crc16::State::<crc16::XMODEM>::calculate(member.as_bytes());
        let bucket = u32::from(crc) % cfg.index_buckets.max(1);
        let tag = &cfg.shard_tags[bucket as usize % cfg.shard_tags.len().max(1)];
        self.store.keys().index_bucket(tag, bucket)
    }

    /// Returns once number `n` of the counter `seq` is on the configured replicas; an error
    /// (answered 503) when they did not take it within the wait, or when the node that answered
    /// has a counter below `n` (a failover took the number with the old primary).
    async fn durable(&self, ev: &Event, n: u64) -> Result<(), QueueError> {
        let d = &self.numbers;
        if d.replicas == 0 {
            return Ok(());
        }
        let seq = &ev.numbered.seq;
        let counter = d.counter(seq);
        if counter.upto.load(Ordering::Acquire) >= n {
            return Ok(());
        }
        let asked = counter.started.load(Ordering::Acquire);
        let _running = counter.running.lock().await;
        // The WAIT that ran meanwhile may cover this number already; one that started after
        // this number was taken and failed failed for it too: answered at once, so a replica
        // outage does not queue every enter behind a wait of its own.
        if counter.upto.load(Ordering::Acquire) >= n {
            return Ok(());
        }
        if counter.failed.load(Ordering::Acquire) > asked {
            return Err(not_replicated());
        }
        let attempt = counter.started.fetch_add(1, Ordering::AcqRel) + 1;
        let mut read = redis::cmd("GET");
        read.arg(seq);
        let waited = self
            .store
            .waits()
            .wait_replicated_reading(
                &format!("{}:replicated", ev.numbered.line),
                read,
                d.replicas,
                d.wait.as_millis() as u64,
            )
            .await;
        let (value, acked) = match waited {
            Ok(w) => w,
            Err(e) => {
                counter.failed.fetch_max(attempt, Ordering::AcqRel);
                return Err(e.into());
            }
        };
        let held = value.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        if acked >= d.replicas && held >= n {
            counter.upto.fetch_max(held, Ordering::AcqRel);
            return Ok(());
        }
        counter.failed.fetch_max(attempt, Ordering::AcqRel);
        tracing::warn!(event = %ev.id, number = n, counter = held, acked,
            "a numbered line's arrival number did not reach the replicas in time; not used");
        Err(not_replicated())
    }

    /// Where number `n` stands (`lua/nl_status.lua`).
    async fn number_standing(&self, ev: &Event, n: u64, mode: Mode) -> Result<Reply, RedisError> {
        let cfg = &ev.config;
        with_numbered_keys(&self.store.scripts().nl_status, &ev.numbered)
            .arg(n)
            .arg(now_ms())
            .arg(cfg.active_ttl_seconds * 1000)
            .arg(mode.as_str())
            .arg(numbered_horizon(cfg))
            .arg(seen_refresh_ms(cfg).max(1))
            .invoke_async(&mut self.store.conn())
            .await
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

    /// Enters `ticket` into a numbered line: a number from the counter, then the index write
    /// and the number's standing in one round. A re-entry whose place holds keeps it and the
    /// new number is dropped (`lua/nl_reenter.lua`); one whose place is gone (left, lapsed)
    /// takes the new number at the back.
    pub(super) async fn enter_numbered(
        &self,
        ev: &Event,
        ticket: &Ticket,
    ) -> Result<Standing, QueueError> {
        let cfg = &ev.config;
        let member = cfg.member(ticket);
        let index = self.index_key(cfg, &member);
        let n: u64 = redis::cmd("INCR")
            .arg(&ev.numbered.seq)
            .query_async(&mut self.store.conn())
            .await?;
        // Not used before a replica has it: a failover must not hand it out again.
        self.durable(ev, n).await?;
        let (held, reply) = tokio::join!(
            self.write_index(&index, &member, n, None),
            self.number_standing(ev, n, Mode::Enter)
        );
        let mut held = held?;
        if held == n {
            let (kind, value) = reply?;
            self.scores.put(ticket, n as f64);
            return standing(kind, value);
        }
        // Another number is in the index: this person entered before. Two rounds at most in
        // practice: a concurrent enter of the same ticket can write in between once.
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
                self.scores.put(ticket, held as f64);
                return standing(kind, value);
            }
            let now_held = self.write_index(&index, &member, n, Some(held)).await?;
            if now_held == n {
                self.scores.put(ticket, n as f64);
                return standing(kind, value);
            }
            held = now_held;
        }
        Err(QueueError::Redis(RedisError::from((
            redis::ErrorKind::Io,
            "the ticket's index entry kept changing under concurrent enters",
        ))))
    }

    /// Where `ticket` stands on a numbered line. With the number this instance last saw for
    /// the ticket, the index read and the standing go out in one round.
    pub(super) async fn poll_numbered(
        &self,
        ev: &Event,
        ticket: &Ticket,
        mode_check: bool,
    ) -> Result<Standing, QueueError> {
        let cfg = &ev.config;
        let member = cfg.member(ticket);
        let index = self.index_key(cfg, &member);
        let mode = if mode_check { Mode::Check } else { Mode::Poll };
        let guess = self.scores.get(ticket).map(|g| g as u64);
        let (n, guessed) = match guess {
            Some(g) => {
                let (n, reply) = tokio::join!(
                    self.number_of(&index, &member),
                    self.number_standing(ev, g, mode)
                );
                (n?, Some((g, reply)))
            }
            None => (self.number_of(&index, &member).await?, None),
        };
        let Some(n) = n else {
            self.scores.remove(ticket);
            return Err(QueueError::UnknownTicket);
        };
        let (kind, value) = match guessed {
            Some((g, reply)) if g == n => reply?,
            _ => {
                self.scores.put(ticket, n as f64);
                self.number_standing(ev, n, mode).await?
            }
        };
        standing(kind, value)
    }

    /// Takes `ticket` out of a numbered line, or ends its active session.
    pub(super) async fn leave_numbered(
        &self,
        ev: &Event,
        ticket: &Ticket,
    ) -> Result<(), QueueError> {
        let cfg = &ev.config;
        let member = cfg.member(ticket);
        let index = self.index_key(cfg, &member);
        self.scores.remove(ticket);
        let Some(n) = self.number_of(&index, &member).await? else {
            return Err(QueueError::UnknownTicket);
        };
        let left: i64 = with_numbered_keys(&self.store.scripts().nl_leave, &ev.numbered)
            .arg(n)
            .arg(now_ms())
            .arg(cfg.active_ttl_seconds * 1000)
            .invoke_async(&mut self.store.conn())
            .await?;
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
