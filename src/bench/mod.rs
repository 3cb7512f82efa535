//! Measurement commands (not tests: they report figures, they assert nothing about time).
//!
//! - [`ordering`]: `waitroom ordering-bench` — position error and Redis cost of each ordering
//!   strategy on a real Redis, for docs/ordering.md.

pub mod ordering;
