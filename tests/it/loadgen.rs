//! The load generator's smoke run (correctness only: the figures belong in benchmarks).

use clap::Parser as _;
use waitroom::bench::loadgen::{run, LoadgenArgs};

use crate::common::{spawn_app, ADMIN_TOKEN};

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: LoadgenArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_sale_played_over_http_sells_no_seat_twice_and_confirms_every_201() {
    let app = spawn_app().await;
    let args = Cli::try_parse_from([
        "loadgen",
        "--url",
        &app.base,
        "--admin-token",
        ADMIN_TOKEN,
        "--users",
        "300",
        "--concurrency",
        "64",
        "--buy-share",
        "0.6",
        "--seats",
        "100",
        "--time-compression",
        "20",
        "--max-seconds",
        "60",
    ])
    .unwrap()
    .args;
    let report = run(args).await.unwrap();
    assert!(report.bookings > 0, "somebody bought");
    assert_eq!(report.not_confirmed, 0, "every 201 became confirmed");
    assert_eq!(report.oversold, 0, "no seat in two confirmed bookings");
    assert_eq!(
        report.admitted + report.sold_out + report.gave_up,
        300 - failed_enters(&report)
    );
}

/// Users whose enter was not answered 200 (they never queued).
fn failed_enters(r: &waitroom::bench::loadgen::LoadReport) -> u64 {
    r.routes
        .iter()
        .find(|x| x.route == "enter")
        .map(|x| {
            x.statuses
                .iter()
                .filter(|(s, _)| **s != 200)
                .map(|(_, n)| n)
                .sum()
        })
        .unwrap_or(0)
}
