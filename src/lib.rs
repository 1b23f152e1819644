//! Strand: a thread-per-core replica server for the Iggy binary protocol 0.11.0.
//!
//! This root package only re-exports the workspace crates; each crate's own docs describe it.
//! See `README.md` for the status of each part.

pub use wire;
