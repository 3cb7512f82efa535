//! Numbered lines' figures as this instance last read them, so that a poll far from the front
//! computes its position here and sends no command (docs/numbered-line.md, "Polls without a
//! round trip").
//!
//! A waiting number's position is arithmetic on the line's figures: `n − b + 1` less the
//! departures between the boundary `b` and `n` (`lua/numbered_lib.lua`). One script
//! (`lua/nl_snapshot.lua`) reads the figures and the departure bits of every block from the
//! boundary's on that hold a departure; each instance keeps that reply for at most the
//! configured age (`WAITROOM_NUMBERED_SNAPSHOT_MS`, 100 ms by default) and answers the polls
//! it can from it. A position is then exact as of the read, at most that age ago: what the
//! person would have seen had they polled that much earlier.
//!
//! What a snapshot never answers: a number below the boundary (admitted or gone: the standing
//! script decides), a poll's number past the counter as read (read before the number was handed
//! out, or a line that began again: its keys unlinked), one found departed, a poll whose last-seen
//! record is due (near the front, once a period), and a session check of a hold or a booking. A
//! tick or a leave through this instance forgets the snapshot at once, so this instance's own
//! changes show in its next answer; other instances' show within the age.
//!
//! One poll at a time reads the figures; while they are within three quarters of the age
//! every other poll answers from them, and past it the reading poll alone waits while the
//! others keep answering from the kept figures (still within the age). Only when the figures
//! have aged out or been forgotten do the polls arriving during the read wait for it. So an
//! event costs one script per three quarters of the age per instance, whatever the polls (a
//! failed read is not tried again within the age: the polls take their scripts, which answer
//! for the fault).
//!
//! A read offers the blocks of the instance's last read (within [`HELD_FOR`]), and Redis sends
//! only the blocks whose count of departures changed since: a departure bit is never cleared,
//! so a block with as many departures as the copy holds the same ones. Under a steady stream of
//! polls a read then carries the figures and the blocks that gained a departure in the last
//! three quarters of the age, not every block from the boundary on.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::sync::Guards as _;

/// How long figures are used by default.
pub const DEFAULT_AGE: Duration = Duration::from_millis(100);

/// Numbers per departure block: `BLOCK` in `lua/numbered_lib.lua`.
pub const BLOCK: u64 = 32768;

/// One block of departure bits from the boundary's block on.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    /// Departures in the blocks before this one.
    pub before: u64,
    /// The block's bits as Redis keeps them (bit 0 the high bit of byte 0); empty when the
    /// block holds no departure.
    pub bits: Vec<u8>,
}

/// A numbered line's figures as read at one moment (`lua/nl_snapshot.lua`'s reply).
#[derive(Debug, Clone, PartialEq)]
pub struct LineFigures {
    /// The boundary: the first number not yet admitted.
    pub b: u64,
    /// Departures below the boundary.
    pub gb: u64,
    /// All departures.
    pub t: u64,
    /// The highest block holding a departure (-1: none).
    pub m: i64,
    /// The counter: the last number handed out.
    pub seq: u64,
    /// The boundary's block: `blocks[0]` is this block.
    pub k0: u64,
    /// The furthest edge of the horizon a tick has used (`horizon_edge` in
    /// `lua/numbered_lib.lua`; 0 before any): numbers below it keep last-seen records.
    pub he: u64,
    /// Blocks `k0..=m`.
    pub blocks: Vec<Block>,
}

/// Bits set among the first `count` bits of `bits` (bit 0 the high bit of byte 0); bytes past
/// the end count as zero, as Redis reads a bitmap past its end.
fn ones_before(bits: &[u8], count: u64) -> u64 {
    let whole = (count / 8) as usize;
    let mut ones: u64 = bits
        .iter()
        .take(whole)
        .map(|b| u64::from(b.count_ones()))
        .sum();
    let rest = (count % 8) as u32;
    if rest > 0 {
        if let Some(b) = bits.get(whole) {
            ones += u64::from((b >> (8 - rest)).count_ones());
        }
    }
    ones
}

/// Whether bit `i` of `bits` is set.
fn bit(bits: &[u8], i: u64) -> bool {
    bits.get((i / 8) as usize)
        .is_some_and(|b| (b >> (7 - i % 8)) & 1 == 1)
}

/// What one read of a line's figures received.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Received {
    /// Bytes of departure bits sent by Redis.
    pub bytes: u64,
    /// Blocks with departures not sent, because the instance held them unchanged.
    pub held: u64,
}

impl LineFigures {
    /// Reads `lua/nl_snapshot.lua`'s reply to a read that offered `held` (the arguments of
    /// [`LineFigures::held_args`]): a block answered nil ("keep yours") takes its bits from
    /// `held`, whose copy must hold exactly the departures the reply counts in it. `None`
    /// for a reply that does not add up.
    pub fn from_reply(
        reply: Vec<redis::Value>,
        held: Option<&LineFigures>,
    ) -> Option<(Self, Received)> {
        let int = |v: &redis::Value| match v {
            redis::Value::Int(i) => Some(*i),
            _ => None,
        };
        let head: Vec<i64> = reply.iter().take(7).map(int).collect::<Option<_>>()?;
        let [b, gb, t, m, seq, k0, he] = head.as_slice() else {
            return None;
        };
        let mut figures = LineFigures {
            b: u64::try_from(*b).ok()?,
            gb: u64::try_from(*gb).ok()?,
            t: u64::try_from(*t).ok()?,
            m: *m,
            seq: u64::try_from(*seq).ok()?,
            k0: u64::try_from(*k0).ok()?,
            he: u64::try_from(*he).ok()?,
            blocks: Vec::new(),
        };
        // The blocks' bits, None where the reply says to keep the held copy.
        let mut sent = Vec::new();
        for pair in reply[7..].chunks(2) {
            let [before, bits] = pair else { return None };
            let bits = match bits {
                redis::Value::BulkString(s) => Some(s.clone()),
                redis::Value::Nil => None,
                _ => return None,
            };
            sent.push((u64::try_from(int(before)?).ok()?, bits));
        }
        let expected = (figures.m + 1 - figures.k0 as i64).max(0) as usize;
        if sent.len() != expected {
            return None;
        }
        let mut received = Received::default();
        for i in 0..sent.len() {
            let before = sent[i].0;
            let bits = match sent[i].1.take() {
                Some(bits) => {
                    received.bytes += bits.len() as u64;
                    bits
                }
                None => {
                    let k = figures.k0 + i as u64;
                    let after = sent.get(i + 1).map_or(figures.t, |next| next.0);
                    let copy = held?.block(k)?;
                    if after.checked_sub(before)? != ones_before(&copy.bits, BLOCK) {
                        return None;
                    }
                    received.held += 1;
                    copy.bits.clone()
                }
            };
            figures.blocks.push(Block { before, bits });
        }
        Some((figures, received))
    }

    /// Block `k`, when these figures hold it.
    fn block(&self, k: u64) -> Option<&Block> {
        self.blocks
            .get(usize::try_from(k.checked_sub(self.k0)?).ok()?)
    }

    /// The arguments of a read that offers these figures' blocks (`lua/nl_snapshot.lua`'s
    /// ARGV): the counter, all departures, the first block, and the departures in each block.
    pub fn held_args(&self) -> Vec<u64> {
        let mut args = vec![self.seq, self.t, self.k0];
        args.extend((0..self.blocks.len()).map(|i| self.departures_in(i)));
        args
    }

    /// The departures in the `i`-th block held (block `k0 + i`): those before the next block,
    /// or all of them after the last, less those before this one.
    fn departures_in(&self, i: usize) -> u64 {
        let after = self.blocks.get(i + 1).map_or(self.t, |next| next.before);
        self.blocks
            .get(i)
            .map_or(0, |block| after.saturating_sub(block.before))
    }

    /// Whether `n` is near the front for a line whose horizon is `horizon` numbers now: below
    /// the boundary plus the horizon, or below the furthest edge a tick has used (an edge never
    /// moves back: `horizon_edge` in `lua/numbered_lib.lua`). A poll near the front keeps its
    /// last-seen record, so it runs the number's script once per period.
    pub fn near_front(&self, n: u64, horizon: u64) -> bool {
        n < self.b.saturating_add(horizon).max(self.he)
    }

    /// The position of number `n`, handed out, as of the read: `n − b + 1` less the
    /// departures between the boundary and `n`, as `standing` in `lua/numbered_lib.lua`
    /// computes it (a number handed out after the read counts everyone after the read as
    /// waiting). `None` when the figures cannot tell: `n` was not waiting as read (admitted,
    /// departed).
    pub fn position(&self, n: u64) -> Option<u64> {
        if n < self.b || n == 0 {
            return None;
        }
        let k = n / BLOCK;
        let below = if k as i64 > self.m {
            self.t
        } else {
            let block = self.blocks.get((k - self.k0) as usize)?;
            let at = n - k * BLOCK;
            if bit(&block.bits, at) {
                return None;
            }
            block.before + ones_before(&block.bits, at)
        };
        Some(
            (n - self.b + 1)
                .saturating_sub(below.saturating_sub(self.gb))
                .max(1),
        )
    }
}

/// One event's latest figures.
#[derive(Default)]
struct Slot {
    current: RwLock<Option<Kept>>,
    /// Moved by every change this instance makes (a tick, a leave): figures read before it
    /// are no longer used.
    generation: AtomicU64,
    /// Held by the one request reading the figures; the others wait for its read.
    reading: tokio::sync::Mutex<Option<Instant>>,
    /// The last figures read and when their read began, kept through changes: the next read
    /// offers their blocks, and Redis sends only the blocks that changed since
    /// ([`HELD_FOR`]).
    last: RwLock<Option<(Instant, Arc<LineFigures>)>>,
}

/// How long the last figures read are offered to the next read, at least (twice the age when
/// that is longer, so that figures kept long are still offered when they are read anew). A
/// departure bit is never cleared while a line lives, so a block with as many departures as a
/// copy holds the same ones; the bound (with the script's check that neither the counter nor
/// the departures went back) keeps a copy from outliving its line.
const HELD_FOR: Duration = Duration::from_secs(10);

/// Figures kept: when their read began, the generation then, the figures.
type Kept = (Instant, u64, Arc<LineFigures>);

impl Slot {
    /// True when nothing in the slot would be used again: no read on its way or failed within
    /// `offered_for` (a failure holds reads back for an age, shorter than that), and its last
    /// figures older than `offered_for`, so neither kept (an age is shorter too) nor offered to
    /// the next read. Dropping such a slot changes no answer: a new one reads the figures whole.
    /// Called only on a slot nobody else holds, under the registry's lock.
    fn spent(&self, offered_for: Duration) -> bool {
        let Ok(reading) = self.reading.try_lock() else {
            return false;
        };
        let recent = |at: &Instant| at.elapsed() < offered_for;
        !reading.as_ref().is_some_and(recent)
            && !self
                .last
                .read_guard()
                .as_ref()
                .is_some_and(|(at, _)| recent(at))
    }

    /// The kept figures and their age, while under `max_age` and read since this instance's
    /// last change.
    fn fresh(&self, max_age: Duration) -> Option<(Arc<LineFigures>, Duration)> {
        let generation = self.generation.load(Ordering::Acquire);
        match &*self.current.read_guard() {
            Some((at, g, figures)) if *g == generation => {
                // One clock read per poll: the age decides both freshness and renewal.
                let age = at.elapsed();
                (age < max_age).then(|| (figures.clone(), age))
            }
            _ => None,
        }
    }
}

/// Every numbered line's figures this instance keeps, keyed by the line's key.
pub struct Snapshots {
    max_age: Duration,
    lines: RwLock<HashMap<String, Arc<Slot>>>,
}

impl Snapshots {
    /// Figures used for at most `max_age` (zero: never kept; every poll runs its script).
    pub fn new(max_age: Duration) -> Self {
        Snapshots {
            max_age,
            lines: RwLock::new(HashMap::new()),
        }
    }

    /// The slot of `line`, made the first time. A new slot sweeps out the slots that hold
    /// nothing usable any more ([`Slot::spent`]), so the figures of lines no longer polled here
    /// (an event whose sale ended: up to ~125 KB of departure blocks at a million waiting) do
    /// not stay for the instance's life.
    fn slot(&self, line: &str) -> Arc<Slot> {
        if let Some(s) = self.lines.read_guard().get(line) {
            return s.clone();
        }
        let mut lines = self.lines.write_guard();
        if let Some(s) = lines.get(line) {
            return s.clone();
        }
        let offered_for = self.offered_for();
        lines.retain(|_, s| Arc::strong_count(s) > 1 || !s.spent(offered_for));
        lines.entry(line.to_owned()).or_default().clone()
    }

    /// How long the last figures read are offered to the next read ([`HELD_FOR`]).
    fn offered_for(&self) -> Duration {
        HELD_FOR.max(2 * self.max_age)
    }

    /// Figures past this age are read anew by one caller while the others keep using them.
    fn renew_after(&self) -> Duration {
        self.max_age * 3 / 4
    }

    /// The figures of `line`: the kept ones while fresh, else read with `read` by one caller
    /// while the others wait for its read (one read per age, however many polls). Past three
    /// quarters of the age one caller reads them anew while the others keep answering from the
    /// kept ones, still within the age: under a steady stream of polls only the reader waits
    /// for a read. `None` when snapshots are off or the read failed (then no one reads again
    /// for an age: the polls take their scripts, which answer for the fault themselves).
    ///
    /// `read` is given the last figures read within [`HELD_FOR`], to offer their blocks.
    pub async fn figures<F, R>(&self, line: &str, read: F) -> Option<Arc<LineFigures>>
    where
        F: FnOnce(Option<Arc<LineFigures>>) -> R,
        R: std::future::Future<Output = Option<LineFigures>>,
    {
        if self.max_age.is_zero() {
            return None;
        }
        let slot = self.slot(line);
        if let Some((kept, age)) = slot.fresh(self.max_age) {
            if age < self.renew_after() {
                return Some(kept);
            }
            let Ok(reading) = slot.reading.try_lock() else {
                return Some(kept);
            };
            // Read anew by the caller before, between the look and the lock.
            if let Some((f, age)) = slot.fresh(self.max_age) {
                if age < self.renew_after() {
                    return Some(f);
                }
            }
            // A read that failed: the kept figures while still within the age (a slow
            // failure may have outlasted it).
            return self
                .read_into(&slot, reading, read)
                .await
                .or_else(|| slot.fresh(self.max_age).map(|(f, _)| f));
        }
        let reading = slot.reading.lock().await;
        // Read by the caller before, while this one waited.
        if let Some((f, _)) = slot.fresh(self.max_age) {
            return Some(f);
        }
        self.read_into(&slot, reading, read).await
    }

    /// Reads the figures into `slot` unless a read failed within the age.
    async fn read_into<F, R>(
        &self,
        slot: &Slot,
        mut failed: tokio::sync::MutexGuard<'_, Option<Instant>>,
        read: F,
    ) -> Option<Arc<LineFigures>>
    where
        F: FnOnce(Option<Arc<LineFigures>>) -> R,
        R: std::future::Future<Output = Option<LineFigures>>,
    {
        if failed.is_some_and(|at| at.elapsed() < self.max_age) {
            return None;
        }
        let generation = slot.generation.load(Ordering::Acquire);
        let started = Instant::now();
        let held = match &*slot.last.read_guard() {
            Some((at, f)) if at.elapsed() < self.offered_for() => Some(f.clone()),
            _ => None,
        };
        let Some(figures) = read(held).await else {
            *failed = Some(Instant::now());
            return None;
        };
        *failed = None;
        let figures = Arc::new(figures);
        *slot.last.write_guard() = Some((started, figures.clone()));
        // A change by this instance during the read: these figures may not show it.
        if slot.generation.load(Ordering::Acquire) == generation {
            *slot.current.write_guard() = Some((started, generation, figures.clone()));
        }
        Some(figures)
    }

    /// Forgets `line`'s figures: this instance just changed the line (a tick, a leave).
    pub fn changed(&self, line: &str) {
        if self.max_age.is_zero() {
            return;
        }
        let slot = self.slot(line);
        slot.generation.fetch_add(1, Ordering::AcqRel);
        *slot.current.write_guard() = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line of `seq` numbers from boundary `b` whose departed numbers are `gone`, built the
    /// way lua/numbered_lib.lua keeps it.
    fn line(b: u64, seq: u64, gone: &[u64]) -> LineFigures {
        let t = gone.len() as u64;
        let gb = gone.iter().filter(|&&n| n < b).count() as u64;
        let m = gone.iter().map(|n| (n / BLOCK) as i64).max().unwrap_or(-1);
        let k0 = b / BLOCK;
        let blocks = (k0 as i64..=m)
            .map(|k| {
                let k = k as u64;
                let before = gone.iter().filter(|&&n| n < k * BLOCK).count() as u64;
                let mut bits = vec![0u8; (BLOCK / 8) as usize];
                let mut any = false;
                for &n in gone.iter().filter(|&&n| n / BLOCK == k) {
                    let i = n - k * BLOCK;
                    bits[(i / 8) as usize] |= 0x80 >> (i % 8);
                    any = true;
                }
                Block {
                    before,
                    bits: if any { bits } else { Vec::new() },
                }
            })
            .collect();
        LineFigures {
            b,
            gb,
            t,
            m,
            seq,
            k0,
            he: b + 1000,
            blocks,
        }
    }

    /// The position by definition: the waiting numbers from the boundary up to n.
    fn counted(b: u64, n: u64, gone: &[u64]) -> u64 {
        (b..=n).filter(|x| !gone.contains(x)).count() as u64
    }

    #[test]
    fn positions_count_the_waiting_numbers_ahead() {
        let gone = [3, 9, 10, 40_000, 40_001, 70_000, 100_000];
        for b in [1, 5, 11, 32_768, 40_001, 65_536, 99_999] {
            let l = line(b, 120_000, &gone);
            for n in [
                1, 2, 3, 4, 8, 9, 11, 12, 32_767, 32_768, 39_999, 40_000, 40_002,
            ]
            .into_iter()
            .chain([
                65_535, 65_536, 69_999, 70_001, 99_999, 100_001, 119_999, 120_000,
            ]) {
                let want = (n >= b && !gone.contains(&n)).then(|| counted(b, n, &gone));
                assert_eq!(l.position(n), want, "b {b}, n {n}");
            }
            // Handed out after the read: behind everyone read as waiting.
            assert_eq!(l.position(130_000), Some(counted(b, 130_000, &gone)));
        }
    }

    #[test]
    fn near_the_front_is_below_the_horizon_now_or_the_furthest_edge_reached() {
        let mut l = line(100, 50_000, &[]);
        l.he = 0;
        assert!(l.near_front(1_099, 1_000));
        assert!(!l.near_front(1_100, 1_000));
        // The rate, and with it the horizon, went down since a tick reached 9,100.
        l.he = 9_100;
        assert!(l.near_front(9_099, 1_000));
        assert!(!l.near_front(9_100, 1_000));
        // It went up again, past that edge.
        assert!(l.near_front(19_099, 19_000));
        assert!(!l.near_front(u64::MAX, u64::MAX));
    }

    #[test]
    fn a_block_without_departures_and_the_tail_read_as_the_sums() {
        let gone = [5, 70_000];
        let l = line(1, 200_000, &gone);
        assert!(l.blocks[1].bits.is_empty(), "block 1 holds no departure");
        assert_eq!(l.position(40_000), Some(40_000 - 1));
        assert_eq!(l.position(150_000), Some(150_000 - 2));
    }

    /// `lua/nl_snapshot.lua`'s reply for the line `l`, to a read that offered `held`: a block
    /// with as many departures as the held copy's is answered nil.
    fn reply(l: &LineFigures, held: Option<&LineFigures>) -> Vec<redis::Value> {
        use redis::Value::{BulkString, Int, Nil};
        let held_counts: HashMap<u64, u64> = held
            .map(|h| {
                let args = h.held_args();
                (0..args.len() - 3)
                    .map(|i| (args[2] + i as u64, args[3 + i]))
                    .collect()
            })
            .unwrap_or_default();
        let mut out = vec![
            Int(l.b as i64),
            Int(l.gb as i64),
            Int(l.t as i64),
            Int(l.m),
            Int(l.seq as i64),
            Int(l.k0 as i64),
            Int(l.he as i64),
        ];
        for (i, block) in l.blocks.iter().enumerate() {
            let k = l.k0 + i as u64;
            out.push(Int(block.before as i64));
            let count = l.departures_in(i);
            out.push(if count > 0 && held_counts.get(&k) == Some(&count) {
                Nil
            } else {
                BulkString(block.bits.clone())
            });
        }
        out
    }

    #[test]
    fn a_read_keeps_the_blocks_it_holds_unchanged_and_takes_the_rest() {
        let first = line(40_000, 150_000, &[5, 40_001, 70_000, 100_000, 100_003]);
        let (got, received) = LineFigures::from_reply(reply(&first, None), None).unwrap();
        assert_eq!(got, first);
        assert_eq!(
            received,
            Received {
                bytes: 3 * 4096,
                held: 0
            },
            "blocks 1, 2 and 3"
        );
        // One more departure, in block 2: blocks 1 and 3 are kept, block 2 is sent.
        let second = line(
            40_000,
            150_000,
            &[5, 40_001, 70_000, 70_001, 100_000, 100_003],
        );
        let read_after = |l: &LineFigures, held: &LineFigures| {
            LineFigures::from_reply(reply(l, Some(held)), Some(held)).unwrap()
        };
        let (got, received) = read_after(&second, &first);
        assert_eq!(
            got, second,
            "the kept blocks and the sent one make the line as it is"
        );
        assert_eq!(
            received,
            Received {
                bytes: 4096,
                held: 2
            }
        );
        for n in [40_002, 70_002, 99_999, 100_004, 149_999] {
            assert_eq!(got.position(n), second.position(n), "n {n}");
        }
        // The boundary moved into block 2: block 1 is no longer read, block 2 kept.
        let third = line(
            66_000,
            150_000,
            &[5, 40_001, 70_000, 70_001, 100_000, 100_003],
        );
        let (got, received) = read_after(&third, &second);
        assert_eq!(got, third);
        assert_eq!(received, Received { bytes: 0, held: 2 });
    }

    #[test]
    fn a_kept_block_that_does_not_add_up_fails_the_read() {
        let first = line(1, 100_000, &[5, 70_000]);
        let second = line(1, 100_000, &[5, 6, 70_000]);
        // A nil for block 0 whose held copy holds one departure where the reply counts two.
        let mut wrong = reply(&second, Some(&second));
        assert_eq!(wrong[8], redis::Value::Nil);
        assert!(LineFigures::from_reply(wrong.clone(), Some(&first)).is_none());
        // A nil with nothing held.
        assert!(LineFigures::from_reply(wrong.clone(), None).is_none());
        // A nil for a block the held figures do not reach.
        let short = line(40_000, 100_000, &[70_000]);
        assert!(LineFigures::from_reply(wrong.clone(), Some(&short)).is_none());
        // Any other kind of value.
        wrong[8] = redis::Value::Int(1);
        assert!(LineFigures::from_reply(wrong, Some(&second)).is_none());
    }

    #[test]
    fn bits_are_counted_high_bit_first() {
        let bits = [0b1010_0000u8, 0xff];
        assert_eq!(ones_before(&bits, 0), 0);
        assert_eq!(ones_before(&bits, 1), 1);
        assert_eq!(ones_before(&bits, 2), 1);
        assert_eq!(ones_before(&bits, 3), 2);
        assert_eq!(ones_before(&bits, 12), 6);
        assert_eq!(ones_before(&bits, 100), 10, "past the end reads as zeros");
        assert!(bit(&bits, 0) && !bit(&bits, 1) && bit(&bits, 2) && !bit(&bits, 99));
    }

    /// Reads figures with a read that counts its calls.
    async fn read(s: &Snapshots, reads: &AtomicU64, ok: bool) -> Option<Arc<LineFigures>> {
        s.figures("l", |_| async {
            reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            ok.then(|| line(1, 10, &[]))
        })
        .await
    }

    #[tokio::test]
    async fn one_read_serves_the_polls_waiting_for_it_and_a_change_forgets() {
        let s = Snapshots::new(Duration::from_secs(60));
        let reads = AtomicU64::new(0);
        let got = futures::future::join_all((0..50).map(|_| read(&s, &reads, true))).await;
        assert!(got.iter().all(|f| f.as_ref().is_some_and(|f| f.seq == 10)));
        assert_eq!(reads.load(Ordering::SeqCst), 1, "one read for 50 polls");
        s.changed("l");
        assert!(read(&s, &reads, true).await.is_some());
        assert_eq!(
            reads.load(Ordering::SeqCst),
            2,
            "a change forgets the figures"
        );
    }

    #[tokio::test]
    async fn a_change_during_the_read_keeps_its_figures_out() {
        let s = Arc::new(Snapshots::new(Duration::from_secs(60)));
        let reads = AtomicU64::new(0);
        let (during, changer) = tokio::join!(read(&s, &reads, true), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            s.changed("l");
        });
        let () = changer;
        assert!(during.is_some(), "the caller that read uses its figures");
        assert!(read(&s, &reads, true).await.is_some());
        assert_eq!(reads.load(Ordering::SeqCst), 2, "they were not kept");
    }

    #[tokio::test]
    async fn a_failed_read_is_not_tried_again_within_the_age() {
        let s = Snapshots::new(Duration::from_millis(200));
        let reads = AtomicU64::new(0);
        let got = futures::future::join_all((0..10).map(|_| read(&s, &reads, false))).await;
        assert!(got.iter().all(Option::is_none));
        assert_eq!(
            reads.load(Ordering::SeqCst),
            1,
            "the waiting polls took their scripts"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(
            read(&s, &reads, true).await.is_some(),
            "tried again after the age"
        );
        assert_eq!(reads.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn past_three_quarters_of_the_age_one_poll_reads_and_the_others_keep_the_figures() {
        // An age of 2 s leaves the 20 reads below 400 ms of slack before it (200 ms were
        // enough on an idle machine; a loaded one can pause a test's thread for longer).
        let s = Snapshots::new(Duration::from_millis(2000));
        let reads = AtomicU64::new(0);
        read(&s, &reads, true).await;
        // Past 1,500 ms (three quarters), under 2,000.
        tokio::time::sleep(Duration::from_millis(1600)).await;
        let done = std::sync::atomic::AtomicBool::new(false);
        let reader = s.figures("l", |_| async {
            reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(150)).await;
            done.store(true, Ordering::SeqCst);
            Some(line(1, 11, &[]))
        });
        let others = async {
            // Let the reader take the read first.
            tokio::task::yield_now().await;
            let got = futures::future::join_all((0..20).map(|_| read(&s, &reads, true))).await;
            (got, done.load(Ordering::SeqCst))
        };
        let (new, (old, read_over)) = tokio::join!(reader, others);
        assert_eq!(
            new.map(|f| f.seq),
            Some(11),
            "the reader gets the new figures"
        );
        assert!(
            old.iter().all(|f| f.as_ref().is_some_and(|f| f.seq == 10)),
            "the others answered from the kept figures"
        );
        assert!(!read_over, "without waiting for the read");
        assert_eq!(reads.load(Ordering::SeqCst), 2, "one read anew");
        assert_eq!(read(&s, &reads, true).await.map(|f| f.seq), Some(11));
        assert_eq!(reads.load(Ordering::SeqCst), 2, "the new figures are kept");
    }

    #[tokio::test]
    async fn a_new_line_sweeps_out_the_figures_of_lines_no_longer_polled() {
        let s = Snapshots::new(Duration::from_millis(75));
        for name in ["old", "recent", "held", "never read"] {
            if name != "never read" {
                s.figures(name, |_| async { Some(line(1, 10, &[])) }).await;
            } else {
                s.slot(name);
            }
        }
        let held = s.slot("held");
        // "old" and "held" were last read longer ago than figures are offered to a read.
        let long_ago = Instant::now()
            .checked_sub(s.offered_for() + Duration::from_secs(1))
            .expect("the clock has run that long");
        for name in ["old", "held"] {
            if let Some((at, _)) = s.slot(name).last.write_guard().as_mut() {
                *at = long_ago;
            }
        }
        let names = |s: &Snapshots| {
            let mut names: Vec<String> = s.lines.read_guard().keys().cloned().collect();
            names.sort();
            names
        };
        // A lookup of a line kept sweeps nothing.
        s.slot("old");
        assert_eq!(names(&s), ["held", "never read", "old", "recent"]);
        // A new line does: the figures of "old" and the empty "never read" go; "recent" is
        // still offered to the next read, and "held" is in use.
        s.slot("new");
        assert_eq!(names(&s), ["held", "new", "recent"]);
        assert!(Arc::ptr_eq(&held, &s.slot("held")), "a held slot is kept");
        // A line swept out reads its figures anew when polled again.
        let reads = AtomicU64::new(0);
        let again = s
            .figures("old", |offered| {
                assert!(offered.is_none(), "nothing is offered from a swept slot");
                reads.fetch_add(1, Ordering::SeqCst);
                async { Some(line(1, 12, &[])) }
            })
            .await;
        assert_eq!(again.map(|f| f.seq), Some(12));
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn figures_age_out_and_zero_turns_them_off() {
        // An age well above a loaded machine's pauses (30 ms once failed under a parallel run).
        let s = Snapshots::new(Duration::from_millis(300));
        let reads = AtomicU64::new(0);
        read(&s, &reads, true).await;
        read(&s, &reads, true).await;
        assert_eq!(reads.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(400)).await;
        read(&s, &reads, true).await;
        assert_eq!(reads.load(Ordering::SeqCst), 2, "aged out");
        let off = Snapshots::new(Duration::ZERO);
        assert!(read(&off, &reads, true).await.is_none());
        assert_eq!(reads.load(Ordering::SeqCst), 2, "off: never read");
    }
}
