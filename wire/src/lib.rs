//! Byte-exact frames of the replica plane of the Iggy binary protocol 0.11.0.
//!
//! This crate knows bytes and nothing else: it never does IO, never logs, never reads a clock
//! and never draws randomness (nonces come in from the caller). Everything a peer can send is
//! answered with a typed error, never a panic.
//!
//! Map:
//! - [`batch`]: the SendMessages batch layout (client-plane.md §8.1).
//! - [`header`]: zero-copy views of the 256-byte header for every command, with their layouts.
//! - [`command`], [`operation`]: the command and operation registries.
//! - [`integrity`]: frame seal, prepare identity, body digests.
//! - [`cluster`], [`group`]: cluster id and group keys.
//! - [`encode`]: the common region and the last stamping step (size, body digest, checksum).
//! - [`decode`]: the stateless receive checks of wire.md §6 for the replica and client planes.
//! - [`suffix`]: the DoViewChange / StartView suffix body.
//! - [`manifest`]: the state-transfer manifest codec.
//! - [`handshake`]: the replica handshake as IO-free acceptor and dialer state machines.
//! - [`framer`]: bytes in, whole frames out.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod batch;
pub mod cluster;
pub mod command;
pub mod decode;
pub mod encode;
pub mod framer;
pub mod group;
pub mod handshake;
pub mod header;
pub mod integrity;
pub mod manifest;
pub mod operation;
pub mod suffix;

pub use cluster::cluster_id;
pub use command::{Command, Integrity};
pub use decode::{DecodeError, Disposition, Message, Stage, decode_replica};
pub use encode::{Sender, finish, finish_header};
pub use group::{GroupError, GroupId, GroupKind, PartitionKey};
pub use header::Layout;
pub use operation::Operation;

/// Size of every header, and the minimum frame size.
pub const HEADER_SIZE: usize = 256;

/// Default `message_bus.max_message_size`: the largest frame, header included (64 MiB).
pub const MAX_MESSAGE_SIZE_DEFAULT: usize = 64 * 1024 * 1024;
