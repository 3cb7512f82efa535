//! # waitroom: a virtual waiting room and seat gate for flash ticket sales
//!
//! ## Layout
//! - [`config`]: flags and `WAITROOM_*` variables; subcommands.
//! - [`startup`]: `Application::build` / `run_until_stopped`, signal handling.
//! - [`http`]: the router, one module per area (`queue`, `admin`, `ops`), `ApiError`.
//! - [`queue`]: the waiting room — enter, poll, leave, events, and the admission scheduler.
//! - [`redis`]: the cluster/standalone client, every key format (`keys`), the Lua scripts.
//! - [`auth`]: ticket derivation and signed access tokens.
//! - [`ids`]: identifiers validated at the edge.
//! - [`telemetry`]: logging and metric names.
//!
//! Ordering rules (positions, K-way merge) live in the pure crate `waitroom-strategies`.

#![forbid(unsafe_code)]

pub mod auth;
pub mod bench;
pub mod booking;
pub mod config;
pub mod http;
pub mod ids;
pub mod queue;
pub mod redis;
pub mod seats;
pub mod startup;
pub mod telemetry;
