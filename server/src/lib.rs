//! The `strand` binary's library side: the node configuration (architecture.md §10), boot from
//! disk, the metadata group's pump and effect executor, and the metrics endpoint, so the
//! binary and tests read them the same way.

pub mod boot;
pub mod config;
pub mod metadata_group;
pub mod metrics;
pub mod wiring;

/// Exit status of a node stopped by a fatal failure (the core's `Effect::Fatal`, or a storage
/// failure it cannot survive); the log line before it names the cause.
pub const EXIT_FATAL: u8 = 3;
