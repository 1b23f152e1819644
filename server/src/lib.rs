//! The `strand` binary's library side: the node configuration (architecture.md §10), so the
//! binary, tests and later tools read it the same way; the client plane's codecs
//! ([`client`]); the metadata state machine and its lock-free read handle ([`metadata`]); the
//! partition plane's poll and consumer-offset logic ([`partition`]).

pub mod client;
pub mod config;
pub mod metadata;
pub mod partition;
