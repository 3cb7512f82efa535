//! The other shards' counts of exact positions, read in batches across requests.
//!
//! An exact position under `timestamp` (and a counted one that falls back to counting) reads
//! one `ZCOUNT` per other shard, grouped into one pipeline per node ([`read_grouped`]). Each
//! request used to send its own pipelines: with 8 shards over 3 primaries, three per request.
//! Here the requests whose counts are due while one batch is on its way queue for the next
//! ([`super::served`]), and the batch sends all their counts through one [`read_grouped`]: one
//! pipeline per node for them all. Redis answers the same commands; the service sends and
//! reads fewer pipelines, and each count still reads the line at the moment it runs.
//!
//! A batch fails whole: a node out of reach fails every request whose counts went with it. The
//! error's kind and text reach every request of it, so a key of the wrong type is still
//! repaired by the request that met it. One batch is in flight at a time, for every event of
//! the instance: while it waits on a node that does not answer, the requests queued behind it
//! wait too, and when it times out they get its failure with it
//! ([`super::served::fail_batch`]): one deadline before their 503, not two. The price of one
//! queue per instance: a request whose counts touch only nodes that answer fails with a batch
//! it shares with one that does not. With 8 shards over 3 primaries nearly every request's
//! counts touch every primary, so its own counts would have met the hung node anyway.

use std::sync::Arc;

use redis::{Cmd, Value};
use tokio::sync::oneshot;

use super::served::{answered, fail_batch, Answer, Served, Serving};
use super::QueueError;
use crate::redis::batch::read_grouped;
use crate::redis::store::Store;

/// The most requests one batch serves: at 8 shards, 7 counts each, ~450 commands.
const MAX_BATCH: usize = 64;

/// Requests waiting for their counts to be read (over the connection for reads).
pub(crate) struct Counts {
    waiting: Arc<Served<Ask>>,
}

/// One request's counts (each with its key's slot) and where their replies go.
struct Ask {
    cmds: Vec<(u16, Cmd)>,
    tx: Answer<Vec<Value>>,
}

impl Default for Counts {
    fn default() -> Self {
        Counts {
            waiting: Served::new(),
        }
    }
}

impl Counts {
    /// The replies to `cmds`, in order, read with the next batch.
    pub(crate) async fn read(
        &self,
        store: &Arc<Store>,
        cmds: Vec<(u16, Cmd)>,
    ) -> Result<Vec<Value>, QueueError> {
        let (tx, rx) = oneshot::channel();
        if self.waiting.push(Ask { cmds, tx }) {
            tokio::spawn(serve(store.clone(), self.waiting.clone()));
        }
        answered(rx.await, "counting ahead")
    }
}

/// Reads the counts queued, batch after batch, until none is left.
async fn serve(store: Arc<Store>, waiting: Arc<Served<Ask>>) {
    let mut serving = Serving::new(waiting);
    while let Some(batch) = serving.next(MAX_BATCH) {
        let mut cmds = Vec::with_capacity(batch.iter().map(|a| a.cmds.len()).sum());
        let mut answers = Vec::with_capacity(batch.len());
        for ask in batch {
            answers.push((ask.cmds.len(), ask.tx));
            cmds.extend(ask.cmds);
        }
        let sent = cmds.len();
        match read_grouped(&store.reads(), cmds).await {
            Ok(values) if values.len() == sent => {
                let mut values = values.into_iter();
                for (n, tx) in answers {
                    let _ = tx.send(Ok(values.by_ref().take(n).collect()));
                }
            }
            Ok(values) => {
                let text = format!("{} replies for {sent} counts", values.len());
                for (_, tx) in answers {
                    let _ = tx.send(Err((redis::ErrorKind::Client, text.clone())));
                }
            }
            Err(e) => fail_batch(
                &mut serving,
                answers.into_iter().map(|(_, tx)| tx),
                &e,
                |a| a.tx,
            ),
        }
    }
}
