//! The replica plane on `tcp_replica` (spec wire.md, handshake.md, architecture.md sections
//! 3-5; DESIGN.md section 3; decisions 110-119).
//!
//! - lanes: group -> lane -> shard is [`crate::mapping`] (spec README decision 2).
//! - [`config`]: the validated settings of the plane.
//! - [`tls`]: rustls configurations (CA or self-signed), ALPN, the exporter.
//! - [`handshake`]: TLS then the `wire::handshake` machines over a socket, bounded by the
//!   caller's `handshake_grace`.
//! - [`receive`]: the receive checks of wire.md section 6 on a framed frame, as a pure function.
//! - [`socket`]: listeners and dials with an operator-chosen TCP congestion control.
//! - [`counters`]: every refusal, close, failed handshake and send drop, by reason.
//! - [`plane`]: one shard's endpoint: accept loop, reconnect sweep, handoff by lane, the
//!   registry of connections, reader and writer tasks, bounded per-peer queues.
//!
//! Nothing here knows consensus: inbound frames that pass every check go to a [`plane::Sink`],
//! outbound frames come in as shared [`bytes::Bytes`].

pub mod config;
pub mod counters;
pub mod handshake;
pub mod io;
pub mod plane;
pub mod receive;
pub mod socket;
pub mod tls;

pub use config::{NetConfig, Peer};
pub use counters::Counters;
pub use plane::{Origin, Plane, SendError, Sink};
pub use socket::CongestionControl;
