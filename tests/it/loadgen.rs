//! The load generator's smoke run (correctness only: the figures belong in benchmarks).

use clap::Parser as _;
use waitroom_bench::loadgen::{run, LoadgenArgs};

use crate::common::{spawn_app, ADMIN_TOKEN};

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: LoadgenArgs,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_sale_played_over_http_sells_no_seat_twice_and_admits_in_order() {
    small_sale("timestamp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_sale_under_global_counter_admits_in_order_too() {
    small_sale("global_counter").await;
}

/// The same sale on the numbered line (docs/numbered-line.md): holds and bookings check its
/// sessions, a purchase ends one, and admission moves a boundary in number order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_sale_on_the_numbered_line_admits_in_order_too() {
    small_sale_on("global_counter", "numbered").await;
}

/// 300 users, most of them buying from 100 seats: the exact strategies must admit in order.
async fn small_sale(strategy: &str) {
    small_sale_on(strategy, "sorted_sets").await;
}

async fn small_sale_on(strategy: &str, line_form: &str) {
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
        "--strategy",
        strategy,
        "--line-form",
        line_form,
    ])
    .unwrap()
    .args;
    let report = run(args).await.unwrap();
    assert_eq!(
        report.server_errors, 0,
        "no answer 5xx: {:?}",
        report.routes
    );
    assert!(report.bookings > 0, "somebody bought");
    assert_eq!(report.not_confirmed, 0, "every 201 became confirmed");
    assert_eq!(report.oversold, 0, "no seat in two confirmed bookings");
    assert_eq!(
        report.admitted + report.sold_out + report.gave_up,
        300 - failed_enters(&report)
    );
    // Every admitted user's timeline was recorded, and nobody surely behind another was let in
    // by an earlier admission tick.
    assert!(report.admitted > 0);
    assert_eq!(report.inversions.users, report.admitted);
    assert!(
        report.inversions.known_pairs > 0,
        "some pairs had a certain order: {:?}",
        report.inversions
    );
    assert_eq!(
        report.inversions.pairs, 0,
        "{strategy}: {:?}",
        report.inversions
    );
}

/// Users whose enter was not answered 200 (they never queued).
fn failed_enters(r: &waitroom_bench::loadgen::LoadReport) -> u64 {
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
