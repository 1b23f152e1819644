//! The sans-IO Viewstamped Replication core: one [`Replica`] per consensus group (the metadata
//! group `1 << 63`, or one partition group), as a synchronous state machine.
//!
//! It never does IO: no clocks, sockets, files, async, or OS randomness. The driver (a glommio
//! shard in production, the deterministic simulator in tests) feeds [`Input`]s to
//! [`Replica::step`] and executes the [`Effect`]s it finds in its [`Outbox`], in order. Time
//! comes in as [`Now`] and ticks; jitter and nonces come from a PRNG seeded by
//! `(cluster, replica, group, incarnation)`. Durability comes in as [`Completion`]s: see the
//! durability model in [`io`].
//!
//! Committed ops are applied to a caller-supplied [`StateMachine`]. Bodies of uncommitted ops
//! (and recently committed ones) stay in memory; older committed bodies are read back with
//! [`Effect::Read`].
//!
//! Map (spec: `shared/spec/consensus.md`; choices: `docs/decisions.md` 12-27):
//! - [`config`]: [`RawConfig`] → [`Config`] validation; [`constants`]: limits and defaults.
//! - [`io`]: [`Input`], [`Completion`], [`Effect`], [`Outbox`], [`Recovered`].
//! - [`replica`]: the [`Replica`] state, `new` (recovery), `step`, accessors, invariants.
//! - `normal`: admission, prepare, chain replication, PrepareOk, commit, apply, reply,
//!   heartbeats, retransmission, abdication.
//! - `view_change`: SVC, DVC, StartView, log reconciliation, the durable gate's re-sends;
//!   `merge`: the §8.6 merge as a pure, property-tested function.
//! - `recovery`: Recovering, RequestStartView probes, incarnation guard, election fallback.
//! - `repair`: RequestPrepares / RepairPrepare / RepairDone / RangeEvicted, both sides.
//! - `transfer`: state transfer, both sides; `client_table`: sessions (§12); `forward`: §13;
//!   `partition`: the SendMessages batch, stamp and re-derivation (§5.6).
//! - [`quorum`]: the flexible quorums of §4; `testing` (feature `testing`): a tiny reference driver (one thread,
//!   perfect or lossy network, immediate storage) for tests and benchmarks.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod constants;
pub mod io;
pub mod quorum;
pub mod replica;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

mod client_table;
mod forward;
mod frames;
mod ignored;
mod journal;
mod merge;
mod normal;
mod partition;
mod pipeline;
mod recovery;
mod repair;
mod state_machine;
mod timer;
mod transfer;
mod types;
mod view_change;

#[cfg(test)]
mod backlog_tests;
#[cfg(test)]
mod capacity_tests;
#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod test_support;

/// Whether this build runs the core's invariant sweep after every step: always in debug
/// builds, in release builds only with the `invariants` feature (the simulator enables it).
pub const INVARIANT_SWEEP: bool = cfg!(any(debug_assertions, feature = "invariants"));

#[cfg(feature = "bug-knobs")]
pub use config::BugKnobs;
pub use config::{Config, ConfigError, RawConfig};
pub use frames::codes;
pub use ignored::Ignored;
pub use io::{ClientRequest, Completion, Effect, FatalReason, Input, Outbox, Recovered};
pub use partition::{build_batch, build_send_messages_request};
pub use replica::{Replica, apply_storage_pressure};
pub use state_machine::{
    Artifact, Buffered, DigestMachine, DigestStateMachine, InstallError, Projection, StateMachine,
    TransferError, WholeArtifacts,
};
pub use transfer::TransferStage;
pub use types::{ClientId, Frame, GroupId, Now, Plane, ReplicaId, Status, VsrState};
