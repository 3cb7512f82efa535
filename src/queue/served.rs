//! A queue of requests that one task at a time serves in batches: whoever queues onto an idle
//! queue starts the task, and the task takes what queued, batch after batch, until it finds
//! nothing. Requests arriving while one batch is on its way to Redis wait for the next, so a
//! surge costs one round trip per batch instead of one per request. Used for arrival numbers,
//! the numbered line's ([`super::numbered`]) and the sorted sets' `global_counter` numbers and
//! figures ([`super::counted`]), and for exact positions' counts in the other shards
//! ([`super::counts`]).
//!
//! Invariant: items are served in the order they were queued, each at most once, and a queue
//! is never left with items and no task to serve them (a task that ends early drops what is
//! queued, so its waiters answer at once instead of waiting for nobody).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use redis::RedisError;
use tokio::sync::oneshot;

use super::QueueError;
use crate::sync::Guard as _;

/// A batch's failure as each of its requests gets it: a `RedisError` is not `Clone`, so its
/// kind and text.
pub(super) type Failure = (redis::ErrorKind, String);

/// Where one request of a batch gets its answer.
pub(super) type Answer<T> = oneshot::Sender<Result<T, Failure>>;

/// A batch's answer as the request's result: the Redis error rebuilt from its kind and text (a
/// WRONGTYPE still reads as one, `crate::redis::classify`), or the serving task's end.
pub(super) fn answered<T>(
    answer: Result<Result<T, Failure>, oneshot::error::RecvError>,
    what: &'static str,
) -> Result<T, QueueError> {
    match answer {
        Ok(Ok(t)) => Ok(t),
        Ok(Err((kind, text))) => Err(RedisError::from((kind, what, text)).into()),
        Err(_) => Err(QueueError::Redis(RedisError::from((
            redis::ErrorKind::Io,
            "the task serving a batch ended",
        )))),
    }
}

/// Sends `e` to every request of a failed batch.
pub(super) fn fail_all<T>(replies: impl IntoIterator<Item = Answer<T>>, e: &RedisError) {
    let failure: Failure = (e.kind(), e.to_string());
    for tx in replies {
        let _ = tx.send(Err(failure.clone()));
    }
}

/// Sends `e` to every request of a failed batch and, when its node did not answer in time
/// (`e` a timeout), to every request queued behind it as well ([`Serving::behind`]).
pub(super) fn fail_batch<T, A>(
    serving: &mut Serving<T>,
    batch: impl IntoIterator<Item = Answer<A>>,
    e: &RedisError,
    answer_of: impl Fn(T) -> Answer<A>,
) {
    fail_all(batch, e);
    if e.is_timeout() {
        fail_all(serving.behind().into_iter().map(answer_of), e);
    }
}

/// How many keys a registry holds before an insert drops the idle ones ([`kept`]).
const SWEEP_AT: usize = 1024;

/// The value kept under `key` in `map` (a registry of queues by key), made by `make` the first
/// time. A lookup allocates nothing: only the first insert copies the key.
///
/// A registry would otherwise keep one entry for every event the instance ever served. When an
/// insert finds [`SWEEP_AT`] keys, the values nobody else holds go first: a value is cloned out
/// of the map under its lock, and every request waiting on a queue and every task serving one
/// holds a clone, so a value held only by the map has nothing queued and no task. The next
/// request for its key makes a new one. The values kept here hold queues and key names, no
/// figure that a new one would lack.
pub(super) fn kept<V>(
    map: &Mutex<foldhash::HashMap<String, Arc<V>>>,
    key: &str,
    make: impl FnOnce() -> V,
) -> Arc<V> {
    let mut kept = map.guard();
    if let Some(v) = kept.get(key) {
        return v.clone();
    }
    if kept.len() >= SWEEP_AT {
        kept.retain(|_, v| Arc::strong_count(v) > 1);
    }
    kept.entry(key.to_owned())
        .or_insert_with(|| Arc::new(make()))
        .clone()
}

/// A queue that at most one task serves at a time: whoever queues onto an idle one starts the
/// task ([`Served::push`]), and the task takes what queued until it finds nothing
/// ([`Serving::next`]).
pub(super) struct Served<T> {
    items: Mutex<Vec<T>>,
    /// True while a task serves this queue.
    running: AtomicBool,
}

impl<T> Served<T> {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Served {
            items: Mutex::new(Vec::new()),
            running: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<T>> {
        self.items.guard()
    }

    /// Queues `item`; true when no task serves the queue: the caller is to start one.
    pub(super) fn push(&self, item: T) -> bool {
        self.lock().push(item);
        !self.running.swap(true, Ordering::AcqRel)
    }
}

/// A task's hold on a [`Served`] queue. Should the task end without finding the queue empty (a
/// panic), what is queued is dropped (an enter's sender dropped: a 503) and the next push starts
/// a task again, instead of every later enter waiting for a task that is gone.
pub(super) struct Serving<T> {
    queue: Arc<Served<T>>,
    armed: bool,
}

impl<T> Serving<T> {
    pub(super) fn new(queue: Arc<Served<T>>) -> Self {
        Serving { queue, armed: true }
    }

    /// The next items, the first `max` to queue, in order; None when none is left and the task
    /// is to end.
    pub(super) fn next(&mut self, max: usize) -> Option<Vec<T>> {
        loop {
            let taken = {
                let mut items = self.queue.lock();
                if items.len() <= max {
                    std::mem::take(&mut *items)
                } else {
                    items.drain(..max).collect()
                }
            };
            if !taken.is_empty() {
                return Some(taken);
            }
            // Ending: `running` is this task's to clear or another's to keep.
            self.queue.running.store(false, Ordering::Release);
            // Something may have queued after the take and seen this task still running.
            if self.queue.lock().is_empty() || self.queue.running.swap(true, Ordering::AcqRel) {
                self.armed = false;
                return None;
            }
        }
    }

    /// Everything queued now, taken out of the queue, for a batch whose node did not answer
    /// in time (or, for the numbered enters, whose replicas did not confirm it in time). The
    /// requests behind it would wait for it and then for their own batch on the same node:
    /// two deadlines before their 503, where answering them the batch's failure now makes it
    /// one (a request that arrives later starts a batch of its own, as after any batch). The
    /// task goes on serving.
    pub(super) fn behind(&mut self) -> Vec<T> {
        std::mem::take(&mut *self.queue.lock())
    }
}

impl<T> Drop for Serving<T> {
    fn drop(&mut self) {
        if self.armed {
            self.queue.lock().clear();
            self.queue.running.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batch bound of these tests.
    const MAX: usize = 256;

    #[test]
    fn a_full_registry_drops_only_the_values_nobody_holds() {
        let map = Mutex::new(foldhash::HashMap::default());
        // Every tenth value is in use: a request or a task holds a clone of it.
        let held: Vec<Arc<usize>> = (0..SWEEP_AT)
            .filter_map(|i| {
                let v = kept(&map, &format!("event-{i}"), || i);
                (i % 10 == 0).then_some(v)
            })
            .collect();
        assert_eq!(map.guard().len(), SWEEP_AT, "no sweep below the bound");
        // A lookup of a key kept is no insert: nothing is dropped.
        let again = kept(&map, "event-1", || usize::MAX);
        assert_eq!(*again, 1);
        drop(again);
        assert_eq!(map.guard().len(), SWEEP_AT);
        // The next new key sweeps: the held values stay (the same ones), the idle ones go.
        let new = kept(&map, "event-new", || usize::MAX);
        assert_eq!(*new, usize::MAX);
        assert_eq!(map.guard().len(), held.len() + 1);
        for v in &held {
            let key = format!("event-{v}");
            assert!(
                Arc::ptr_eq(v, &kept(&map, &key, || usize::MAX)),
                "{key} was replaced"
            );
        }
        // An idle key that was dropped comes back as a new value when asked for again.
        assert_eq!(*kept(&map, "event-1", || 7), 7);
    }

    #[test]
    fn a_surge_goes_in_batches_of_at_most_max_batch_first_come_first() {
        let queue = Served::new();
        let started: Vec<bool> = (0..600).map(|i| queue.push(i)).collect();
        // Only the first push finds no task: it starts the one that serves them all.
        assert_eq!(started.iter().filter(|s| **s).count(), 1);
        assert!(started[0]);
        let mut serving = Serving::new(queue.clone());
        let mut served = Vec::new();
        let mut sizes = Vec::new();
        while let Some(batch) = serving.next(MAX) {
            sizes.push(batch.len());
            served.extend(batch);
        }
        assert_eq!(sizes, vec![MAX, MAX, 600 - 2 * MAX]);
        assert_eq!(served, (0..600).collect::<Vec<_>>());
        // The task ended: the next push starts one again, and it takes what is there.
        assert!(queue.push(1));
        assert!(!queue.push(2));
        let mut serving = Serving::new(queue.clone());
        assert_eq!(serving.next(MAX), Some(vec![1, 2]));
        assert_eq!(serving.next(MAX), None);
    }

    type Waiter = (u32, Answer<u32>);

    /// A batch of one fails with `e` while two more wait behind it. Returns the kind of error
    /// each of the three was answered with (None: not answered), and the task serving the
    /// queue.
    fn fail_one_batch_with(
        e: &RedisError,
    ) -> (
        Vec<Option<redis::ErrorKind>>,
        Arc<Served<Waiter>>,
        Serving<Waiter>,
    ) {
        let queue = Served::new();
        let mut answers = Vec::new();
        let (tx, rx) = oneshot::channel();
        answers.push(rx);
        assert!(queue.push((1, tx)));
        let mut serving = Serving::new(queue.clone());
        let batch = serving.next(MAX).expect("the first batch");
        for i in 2..=3 {
            let (tx, rx) = oneshot::channel();
            answers.push(rx);
            assert!(!queue.push((i, tx)), "the task is still serving");
        }
        fail_batch(
            &mut serving,
            batch.into_iter().map(|(_, tx)| tx),
            e,
            |(_, tx)| tx,
        );
        let kinds = answers
            .iter_mut()
            .map(|rx| rx.try_recv().ok().map(|a| a.expect_err("a failure").0))
            .collect();
        (kinds, queue, serving)
    }

    #[test]
    fn what_queued_behind_a_hung_batch_is_answered_with_its_failure_and_the_task_goes_on() {
        let timeout = RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no answer",
        ));
        let (kinds, queue, mut serving) = fail_one_batch_with(&timeout);
        assert_eq!(kinds, vec![Some(redis::ErrorKind::Io); 3]);
        // The task still serves: the next push does not start another, and it finds the item.
        let (tx, _rx) = oneshot::channel();
        assert!(!queue.push((4, tx)));
        assert_eq!(serving.next(MAX).map(|b| b.len()), Some(1));
        assert!(serving.next(MAX).is_none());
    }

    #[test]
    fn a_batch_that_failed_otherwise_leaves_the_queue_to_the_next_batch() {
        let loading = redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading);
        let (kinds, _queue, mut serving) =
            fail_one_batch_with(&RedisError::from((loading, "loading")));
        assert_eq!(kinds, vec![Some(loading), None, None]);
        assert_eq!(serving.next(MAX).map(|b| b.len()), Some(2));
    }

    #[test]
    fn a_task_that_ends_without_emptying_its_queue_lets_the_next_push_start_one() {
        let queue = Served::new();
        assert!(queue.push(1));
        {
            let mut serving = Serving::new(queue.clone());
            assert_eq!(serving.next(1), Some(vec![1]));
            assert!(!queue.push(2));
            // Dropped here, as a task that panicked drops it: 2 is never served by it.
        }
        assert!(
            queue.lock().is_empty(),
            "what was queued is dropped (its enters answer 503)"
        );
        assert!(queue.push(3), "the next push starts a task");
        let mut serving = Serving::new(queue.clone());
        assert_eq!(serving.next(MAX), Some(vec![3]));
        assert_eq!(serving.next(MAX), None);
    }
}
