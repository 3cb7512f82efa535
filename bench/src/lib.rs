//! waitroom-bench: measurement commands (not tests: they report figures, they assert nothing
//! about time). They use the service only through the `waitroom` library's public API or over
//! HTTP, like any other client.
//!
//! - [`ordering`]: `waitroom-bench ordering-bench` — position error and Redis cost of each
//!   ordering strategy on a real Redis, for docs/ordering.md.
//! - [`loadgen`]: `waitroom-bench loadgen` — a sale played over HTTP against a running service.
//! - [`ledger`]: `waitroom-bench ledger-bench` — confirmed seats per second into PostgreSQL
//!   through Kafka, for docs/benchmarks.md.
//! - [`mapflood`]: `waitroom-bench map-flood` — enters and polls with and without a flood of
//!   seat-map reads.
//! - [`merge`]: `waitroom-bench merge` — picks per second of the admission's K-way merge.
//! - [`naive`]: `waitroom-bench naive-server` — the one-sorted-set baseline `scripts/bench`
//!   measures the service against, and `waitroom-bench tickets` for its wrk poll runs.
//! - [`rate`]: `waitroom-bench poll-rate` — polls at a fixed rate, open loop, against the
//!   service or the naive server, for the poll p99 at 10,000/s side by side.
//! - [`numbered`]: `waitroom-bench numbered-server` — a measuring prototype of the numbered line
//!   (docs/numbered-line.md), run beside the naive server by `scripts/bench-instr`.

#![forbid(unsafe_code)]

pub mod client;
pub mod ledger;
pub mod loadgen;
pub mod mapflood;
pub mod merge;
pub mod naive;
pub mod numbered;
pub mod ordering;
pub mod rate;

/// Creates an event (`event_body` as its configuration) and a seated show of about `seats`
/// seats in rows of `per_row` (at most 26 rows) over the admin API; returns the seat ids.
#[allow(clippy::too_many_arguments)]
pub async fn create_sale(
    http: &reqwest::Client,
    url: &str,
    admin_token: &str,
    event: &str,
    event_body: serde_json::Value,
    show: &str,
    seats: usize,
    per_row: usize,
) -> anyhow::Result<Vec<String>> {
    use anyhow::Context as _;
    let put = |path: String, body: serde_json::Value, what: &'static str| async move {
        let r = http
            .put(format!("{url}{path}"))
            .bearer_auth(admin_token)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("creating the {what}"))?;
        anyhow::ensure!(
            r.status().is_success(),
            "creating the {what}: {}",
            r.text().await.unwrap_or_default()
        );
        Ok(())
    };
    put(format!("/admin/v1/events/{event}"), event_body, "event").await?;
    let rows = seats.div_ceil(per_row).clamp(1, 26);
    let last_row = (b'A' + rows as u8 - 1) as char;
    put(
        format!("/admin/v1/shows/{show}"),
        serde_json::json!({"event": event, "rows": format!("A-{last_row}"), "seats_per_row": per_row}),
        "show",
    )
    .await?;
    Ok((0..rows)
        .flat_map(|r| (1..=per_row).map(move |n| format!("{}-{n}", (b'A' + r as u8) as char)))
        .collect())
}
