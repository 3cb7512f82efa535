//! Integration tests: the real service against a real Redis Cluster (scripts/stack up),
//! plus private Redis processes where a test must kill one.

mod admission;
mod booking_failover;
mod booking_faults;
mod common;
mod errors;
mod failover;
mod instances;
mod ledger;
mod loadgen;
mod memory;
mod numbered;
mod openapi;
mod ops;
mod queue;
mod reads;
mod redis_client;
mod seats;
mod security;
mod standalone;
mod strategies;
mod tls;
