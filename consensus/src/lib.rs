//! The sans-IO Viewstamped Replication core (one `Replica` per group).
//!
//! Empty until the consensus issue lands: nothing here is implemented yet, and nothing pretends
//! to be. See `../shared/spec/consensus.md` and `../shared/DESIGN.md` section 1.
#![forbid(unsafe_code)]
