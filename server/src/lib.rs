//! The `strand` binary's library side: the node configuration (architecture.md §10), so the
//! binary, tests and later tools read it the same way; the client plane's codecs
//! ([`client`]); the metadata state machine and its lock-free read handle ([`metadata`]).

pub mod client;
pub mod config;
pub mod metadata;
