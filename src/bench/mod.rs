//! Measurement commands (not tests: they report figures, they assert nothing about time).
//!
//! - [`ordering`]: `waitroom ordering-bench` — position error and Redis cost of each ordering
//!   strategy on a real Redis, for docs/ordering.md.
//! - [`ledger`]: `waitroom ledger-bench` — confirmed seats per second into PostgreSQL through
//!   Kafka, for docs/benchmarks.md.

pub mod ledger;
pub mod ordering;
