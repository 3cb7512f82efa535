//! Measurement commands (not tests: they report figures, they assert nothing about time).
//!
//! - [`ordering`]: `waitroom ordering-bench` — position error and Redis cost of each ordering
//!   strategy on a real Redis, for docs/ordering.md.
//! - [`loadgen`]: `waitroom loadgen` — a sale played over HTTP against a running service.
//! - [`ledger`]: `waitroom ledger-bench` — confirmed seats per second into PostgreSQL through
//!   Kafka, for docs/benchmarks.md.

pub mod ledger;
pub mod loadgen;
pub mod ordering;
