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

#![forbid(unsafe_code)]

pub mod ledger;
pub mod loadgen;
pub mod mapflood;
pub mod merge;
pub mod ordering;
