//! Durable storage: the metadata prepare journal and superblock, partition logs and offsets.
//!
//! Empty until the journal issue lands: nothing here is implemented yet, and nothing pretends
//! to be. See `../shared/spec/journal.md` and `../shared/DESIGN.md` section 2.
#![forbid(unsafe_code)]
