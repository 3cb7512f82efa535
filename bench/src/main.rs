//! The `waitroom-bench` binary: measurement commands that report figures about a running
//! waitroom or its parts. Nothing here is part of the service.

#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};

/// The same allocator as the service, so the load generator's own cost is measured alike.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "waitroom-bench", version, about = "Benchmarks of waitroom")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Play a sale against a running service over HTTP and report throughput and the audit.
    Loadgen(Box<waitroom_bench::loadgen::LoadgenArgs>),
    /// Measure confirmed seats per second into PostgreSQL through Kafka (docs/benchmarks.md).
    LedgerBench(Box<waitroom_bench::ledger::LedgerBenchArgs>),
    /// Measure each ordering strategy's position error and Redis cost (docs/ordering.md).
    OrderingBench(Box<waitroom_bench::ordering::OrderingBenchArgs>),
    /// Enters and polls with and without a flood of seat-map reads (docs/benchmarks.md).
    MapFlood(Box<waitroom_bench::mapflood::MapFloodArgs>),
    /// Picks per second of the admission's K-way merge at 8 and 64 shards.
    Merge(waitroom_bench::merge::MergeArgs),
    /// The naive one-set server waitroom is compared with (scripts/bench).
    NaiveServer(waitroom_bench::naive::NaiveArgs),
    /// A measuring prototype of the numbered line's enter and poll (docs/numbered-line.md).
    NumberedServer(waitroom_bench::numbered::NumberedArgs),
    /// The numbered tickets of the users a wrk enter run made against the prototype.
    NumberedTickets(waitroom_bench::numbered::NumberedTicketsArgs),
    /// Polls of random tickets at a fixed rate, open loop (scripts/bench-pair).
    PollRate(waitroom_bench::rate::PollRateArgs),
    /// The tickets of the users a wrk enter run made (scripts/bench).
    Tickets(waitroom_bench::naive::TicketsArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    waitroom::telemetry::init_tracing();
    match Cli::parse().command {
        Command::Loadgen(args) => waitroom_bench::loadgen::run(*args).await.map(|_| ()),
        Command::LedgerBench(args) => waitroom_bench::ledger::run(*args).await.map(|_| ()),
        Command::OrderingBench(args) => waitroom_bench::ordering::run(*args).await.map(|_| ()),
        Command::MapFlood(args) => waitroom_bench::mapflood::run(*args).await.map(|_| ()),
        Command::NaiveServer(args) => waitroom_bench::naive::run(args).await,
        Command::NumberedServer(args) => waitroom_bench::numbered::run(args).await,
        Command::NumberedTickets(args) => waitroom_bench::numbered::numbered_tickets(args).await,
        Command::PollRate(args) => waitroom_bench::rate::run(args).await.map(|_| ()),
        Command::Tickets(args) => waitroom_bench::naive::tickets(&args),
        Command::Merge(args) => {
            waitroom_bench::merge::run(&args);
            Ok(())
        }
    }
}
