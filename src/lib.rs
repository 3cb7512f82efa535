//! # waitroom: a virtual waiting room and seat gate for flash ticket sales
//!
//! ## Layout
//! Modules form a tree: each uses only those below it (docs/architecture.md draws it).
//! - [`config`]: flags and `WAITROOM_*` variables; subcommands.
//! - [`admin_cli`]: `waitroom admin`, the operators' command line over the admin API.
//! - [`startup`]: `Services` (the domain services, wired once), `Application::build` /
//!   `run_until_stopped`, migrations and topic creation in the background, signal handling.
//! - [`http`]: the router, one module per area (`queue`, `seats`, `admin`, `ops`), `ApiError`.
//! - [`booking`]: a hold becoming a booking (`Bookings`), the Kafka producer, the ledger
//!   consumer and its SQL.
//! - [`seats`]: shows, seat maps and holds; the admission leader's seat housekeeping.
//! - [`queue`]: the waiting room — enter, poll, leave, events, and the admission scheduler.
//! - [`redis`]: the cluster/standalone client, the shared `Store`, every key format (`keys`),
//!   the Lua scripts and their typed replies.
//! - [`auth`]: ticket derivation and signed access tokens.
//! - [`ids`]: identifiers validated at the edge.
//! - [`telemetry`]: logging and metric names.
//!
//! Ordering rules (positions, K-way merge) live in the pure crate `waitroom-strategies`; the
//! load generator and benchmarks in `waitroom-bench`, which uses this crate as any client would.

#![forbid(unsafe_code)]
// No `.unwrap()` outside tests: a panic in a request is a 500 (test modules may unwrap).
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

pub mod admin_cli;
pub mod auth;
pub mod booking;
pub mod config;
pub mod http;
pub mod ids;
pub mod queue;
pub mod redis;
pub mod seats;
pub mod startup;
mod sync;
pub mod telemetry;
