//! Thread-per-core shards: executors, group routing, the shard mesh, peer connections and fd
//! handoff (DESIGN.md §3, spec architecture.md).
//!
//! - [`cores`]: core lists (`--cores 0-3`) and the CPUs a thread may run on;
//! - [`mapping`]: group -> lane -> shard (spec README decision 2);
//! - [`runtime`]: one glommio executor per shard, pinned or not, with the buffer-registration
//!   probe;
//! - [`mesh`]: bounded lock-free channels between shards, drops counted by reason;
//! - [`owner`]: the owner table, the only mutable state shards share;
//! - [`pump`]: the pump skeleton (stop, 10 ms tick, main lane, reply lane);
//! - [`net`]: the replica plane on `tcp_replica` (dialing, handshake, TLS, lane handoff, receive
//!   checks, bounded vectored send).
//!
//! Not here yet: consensus effects turned into I/O.

pub mod cores;
pub mod mapping;
pub mod mesh;
pub mod owner;
pub mod pump;
pub mod runtime;

pub use cores::CoreList;
pub use mapping::{lane, shard_of};
pub use mesh::{DropReason, Envelope, Lane, Mesh, MeshCapacity, MeshCounters, SendError, ShardId};
pub use owner::OwnerTable;
pub use runtime::{
    BufferRegistration, Runtime, RuntimeConfig, RuntimeError, RuntimeStats, ShardContext, Sharding,
    StopSignal,
};

pub mod net;
