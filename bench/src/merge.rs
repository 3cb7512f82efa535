//! `waitroom-bench merge`: picks per second of the admission's K-way merge, beside the
//! scanning merge it replaced (every pick compared the head of every shard and cloned a member
//! string), on the same heads in the same run.

use std::time::Instant;

use clap::Args;
use waitroom_strategies::merge::{group_by_shard, merge_heads, ShardHeads};
use waitroom_strategies::OrderKey;

/// Options of `waitroom-bench merge`.
#[derive(Debug, Clone, Args)]
pub struct MergeArgs {
    /// Shard counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "8,64")]
    pub shards: Vec<usize>,
    /// People picked per merge (one admission tick's budget).
    #[arg(long, default_value_t = 5000)]
    pub take: usize,
    /// Merges timed per row.
    #[arg(long, default_value_t = 200)]
    pub rounds: usize,
}

/// Prints one row per shard count: picks per second of the scanning baseline and of the heap
/// merge, and their ratio.
pub fn run(args: &MergeArgs) {
    println!("| shards | picks per merge | scan (before) picks/s | heap picks/s | heap ÷ scan |");
    println!("|---:|---:|---:|---:|---:|");
    for &n in &args.shards {
        let heads = heads(n, args.take);
        let scan = rate(args, || scanning_merge(&heads, args.take).len());
        let heap = rate(args, || {
            let picks = merge_heads(&heads, args.take);
            group_by_shard(&heads, &picks);
            picks.len()
        });
        println!(
            "| {n} | {} | {scan:.0} | {heap:.0} | {:.1} |",
            args.take,
            heap / scan
        );
    }
}

/// Picks per second of `merge` over `args.rounds` runs (after one warm-up run).
fn rate(args: &MergeArgs, mut merge: impl FnMut() -> usize) -> f64 {
    let mut picked = merge();
    let started = Instant::now();
    for _ in 0..args.rounds {
        picked = std::hint::black_box(merge());
    }
    (picked * args.rounds) as f64 / started.elapsed().as_secs_f64()
}

/// Heads as the scheduler reads them: `take` people spread evenly over `n` shards by a hash,
/// each shard's prefix long enough for the whole tick, members shaped like tickets.
fn heads(n: usize, take: usize) -> Vec<ShardHeads> {
    let mut shards = vec![ShardHeads::default(); n];
    for i in 0..take * 2 {
        let member = format!(
            "{:032x}",
            (i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
        );
        let shard = (i.wrapping_mul(2_654_435_761)) % n;
        shards[shard]
            .heads
            .push((1_700_000_000_000_000.0 + i as f64, member));
    }
    for s in &mut shards {
        s.complete = true;
    }
    shards
}

/// The merge as it was before the heap: every pick scans every shard's head and clones the
/// best member. Kept here only as the baseline of this benchmark.
fn scanning_merge(shards: &[ShardHeads], take: usize) -> Vec<OrderKey> {
    let mut cursor = vec![0usize; shards.len()];
    let mut out = Vec::with_capacity(take);
    while out.len() < take {
        let mut best: Option<OrderKey> = None;
        for (i, s) in shards.iter().enumerate() {
            match s.heads.get(cursor[i]) {
                Some((score, member)) => {
                    let key = OrderKey {
                        score: *score,
                        shard: i,
                        member: member.clone(),
                    };
                    if best.as_ref().is_none_or(|b| key < *b) {
                        best = Some(key);
                    }
                }
                None if !s.complete => return out,
                None => {}
            }
        }
        match best {
            Some(k) => {
                cursor[k.shard] += 1;
                out.push(k);
            }
            None => break,
        }
    }
    out
}
