//! Thread-per-core shards: executors, group routing, peer connections and fd handoff.
//!
//! Empty until its issue lands: nothing here is implemented yet, and nothing pretends to be.
//! See `../shared/DESIGN.md` section 3.

pub mod net;
