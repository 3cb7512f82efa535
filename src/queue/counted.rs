//! Arrival numbers of the sorted sets' `global_counter`, handed out in batches.
//!
//! A counted enter needs a number from the event's counter and, for its position, the
//! leader's figures and the recorded gaps below that number: all three in the event's slot.
//! Taken one enter at a time that was a script for the number, then a pipeline of two reads
//! beside the shard's script: three commands on the event's node per enter, the node every
//! enter of the event shares. Here the enters arriving while one batch is on its way queue for
//! the next ([`super::served`]), and one `lua/next_numbers.lua` serves them all: an `INCRBY` of
//! as many numbers, the figures, and the gaps below the first number, which are the gaps below
//! each of the batch's numbers (none of them was handed out before). Numbers are handed out in
//! the order the enters queued at this instance.
//!
//! A number whose enter was given up before the batch answered (a dropped request) waits
//! nowhere: it is recorded as a gap at once, so counted positions behind it do not count it.
//! Before batching such a number went unrecorded until the head passed it.
//!
//! One batch is in flight per event: while it waits on a primary that does not answer, the
//! enters queued behind it wait too, and when it times out they get its failure (a 503) with it
//! ([`super::served::fail_batch`]) instead of sending a batch of their own to the same node:
//! one deadline before the 503, not two.
//!
//! Polls read the same figures and their own gaps count. Those reads go in batches too: the
//! polls of an event that arrive while one read is on its way share the next, one pipeline of
//! the figures' `HMGET` and a gaps `ZCOUNT` per poll, over the connection for reads (a replica's
//! when replica reads are on), instead of a pipeline of both per poll.

use std::sync::{Arc, Mutex};

use redis::RedisError;
use tokio::sync::oneshot;

use super::event::Event;
use super::served::{answered, fail_batch, kept, Answer, Served, Serving};
use super::{record_gap, CounterFigures, Queue, QueueError};
use crate::redis::keys::stats;
use crate::redis::store::Store;

/// The most enters one batch serves. The script's cost does not grow with the batch; the bound
/// keeps one surge from making the first enter's answer wait for the last's reply to be read.
const MAX_BATCH: usize = 1024;

/// The counters of this instance's `global_counter` events on the sorted sets, each with the
/// enters waiting for its next batch.
#[derive(Default)]
pub(crate) struct Counted {
    /// By the event's figures key (one per event; the event already holds it, so a lookup
    /// allocates nothing).
    events: Mutex<foldhash::HashMap<String, Arc<Counter>>>,
}

/// One event's counter and the enters waiting for a number from it, and the polls waiting for
/// its figures.
struct Counter {
    waiting: Arc<Served<Ask>>,
    reading: Arc<Served<Read>>,
    /// The counter, the figures and the gaps (all in the event's slot).
    seq: String,
    stats: String,
    gaps: String,
}

/// One enter's part of a batch.
struct Ask {
    /// The first number of the event's counter range as this enter's configuration has it.
    counter_start: u64,
    tx: Answer<Drawn>,
}

/// One poll's part of a read of the figures: the number it holds, and where the answer goes.
struct Read {
    number: u64,
    tx: Answer<(CounterFigures, u64)>,
}

/// What a batch gave one enter: its number, the leader's figures and the gaps below it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drawn {
    pub number: u64,
    pub figures: CounterFigures,
    pub gaps: u64,
}

/// `lua/next_numbers.lua`'s reply: the top number, the figures as stored, the gaps.
type Reply = (u64, String, String, String, u64);

impl Counted {
    fn counter(&self, store: &Store, ev: &Event) -> Arc<Counter> {
        kept(&self.events, &ev.stats_key, || Counter {
            waiting: Served::new(),
            reading: Served::new(),
            seq: store.keys().counter(ev.id.as_str()),
            stats: ev.stats_key.clone(),
            gaps: ev.gaps_key.clone(),
        })
    }
}

/// The number, figures and gaps of one batch's `i`-th of `k` enters.
fn drawn(reply: &Reply, k: usize, i: usize) -> Drawn {
    let (top, start, carried, first, gaps) = reply;
    let figure = |v: &String| v.parse::<u64>().ok();
    Drawn {
        number: top - k as u64 + 1 + i as u64,
        figures: [figure(start), figure(carried), figure(first)],
        gaps: *gaps,
    }
}

/// Serves the enters waiting on `counter`, batch after batch, until none waits.
async fn hand_out(store: Arc<Store>, counter: Arc<Counter>) {
    let mut serving = Serving::new(counter.waiting.clone());
    while let Some(batch) = serving.next(MAX_BATCH) {
        let k = batch.len();
        // The newest range wins: a number above it is above every older one too.
        let start = batch.iter().map(|a| a.counter_start).max().unwrap_or(0);
        let reply: Result<Reply, RedisError> = store
            .scripts()
            .next_numbers
            .key(&counter.seq)
            .key(&counter.stats)
            .key(&counter.gaps)
            .arg(start.saturating_sub(1))
            .arg(k)
            .invoke_async(&mut store.conn())
            .await;
        match reply {
            Ok(reply) => {
                let mut given_up = Vec::new();
                for (i, ask) in batch.into_iter().enumerate() {
                    let d = drawn(&reply, k, i);
                    if ask.tx.send(Ok(d)).is_err() {
                        given_up.push(d.number);
                    }
                }
                // Recorded once every enter of the batch has its answer: the number waits nowhere.
                for number in given_up {
                    record_gap(&store, &counter.stats, &counter.gaps, start, number).await;
                }
            }
            Err(e) => fail_batch(&mut serving, batch.into_iter().map(|a| a.tx), &e, |a| a.tx),
        }
    }
}

/// Reads the figures for the polls queued on `counter`, batch after batch, until none is left.
async fn read_figures(store: Arc<Store>, counter: Arc<Counter>) {
    let mut serving = Serving::new(counter.reading.clone());
    while let Some(batch) = serving.next(MAX_BATCH) {
        let mut pipe = redis::pipe();
        pipe.hmget(
            &counter.stats,
            &[stats::GC_START, stats::GC_CARRIED, stats::GC_FIRST],
        );
        for read in &batch {
            pipe.zcount(&counter.gaps, "-inf", format!("({}", read.number));
        }
        let reply: Result<(Vec<Option<String>>, Vec<u64>), RedisError> = pipe
            .query_async::<Vec<redis::Value>>(&mut store.reads())
            .await
            .and_then(|replies| {
                // The HMGET's three fields, then one count per poll.
                let mut replies = replies.into_iter();
                let figures = match replies.next() {
                    Some(v) => redis::from_redis_value(v)?,
                    None => Vec::new(),
                };
                let counts = replies
                    .map(redis::from_redis_value)
                    .collect::<Result<Vec<u64>, _>>()?;
                Ok((figures, counts))
            });
        match reply {
            Ok((figures, counts)) if figures.len() == 3 && counts.len() == batch.len() => {
                let figure = |i: usize| figures[i].as_deref().and_then(|v| v.parse::<u64>().ok());
                let figures = [figure(0), figure(1), figure(2)];
                for (read, gaps) in batch.into_iter().zip(counts) {
                    let _ = read.tx.send(Ok((figures, gaps)));
                }
            }
            Ok((figures, counts)) => {
                let text = format!(
                    "{} figures and {} gap counts for {} polls",
                    figures.len(),
                    counts.len(),
                    batch.len()
                );
                for read in batch {
                    let _ = read.tx.send(Err((redis::ErrorKind::Client, text.clone())));
                }
            }
            Err(e) => fail_batch(&mut serving, batch.into_iter().map(|r| r.tx), &e, |r| r.tx),
        }
    }
}

impl Queue {
    /// The leader's per-tick figures for `global_counter` positions, as stored (the counter
    /// range they were taken for, people waiting from before it, the first number still
    /// waiting), and the recorded gaps below `number`, read with the polls arriving together
    /// (see the module's header). Every recorded gap is at or after the published first number
    /// (`lua/gap.lua`), so the count is the gaps between the head and `number`.
    pub(super) async fn read_counter_figures(
        &self,
        ev: &Event,
        number: u64,
    ) -> Result<(CounterFigures, u64), QueueError> {
        let counter = self.counted.counter(&self.store, ev);
        let (tx, rx) = oneshot::channel();
        if counter.reading.push(Read { number, tx }) {
            tokio::spawn(read_figures(self.store.clone(), counter));
        }
        answered(rx.await, "reading the counter's figures")
    }

    /// A number for an enter of `ev` (`global_counter` on the sorted sets), with the figures of
    /// its position, from the next batch (see the module's header).
    pub(super) async fn draw_number(&self, ev: &Event) -> Result<Drawn, QueueError> {
        let counter = self.counted.counter(&self.store, ev);
        let (tx, rx) = oneshot::channel();
        let ask = Ask {
            counter_start: ev.config.counter_start,
            tx,
        };
        if counter.waiting.push(ask) {
            tokio::spawn(hand_out(self.store.clone(), counter));
        }
        answered(rx.await, "handing out arrival numbers")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_hands_out_its_numbers_in_order_with_the_same_figures() {
        let reply: Reply = (110, "100".into(), "7".into(), "".into(), 3);
        let all: Vec<Drawn> = (0..3).map(|i| drawn(&reply, 3, i)).collect();
        assert_eq!(
            all.iter().map(|d| d.number).collect::<Vec<_>>(),
            vec![108, 109, 110]
        );
        for d in &all {
            assert_eq!(d.figures, [Some(100), Some(7), None]);
            assert_eq!(d.gaps, 3);
        }
    }
}
