//! The `strand` binary's library side: the node configuration (architecture.md §10), so the
//! binary, tests and later tools read it the same way.

pub mod config;
