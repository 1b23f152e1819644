//! Deterministic simulator and end-to-end tests.
//!
//! The simulator runs real consensus `Replica`s in one thread over a simulated network, disk and
//! clock. One `u64` seed drives everything; every concern draws from its own salted stream
//! ([`prng`]). Checkers ([`check`]) run after every tick and draw no randomness. A failure prints
//! its seed; `cargo run --release -p tests --bin strand-sim -- --seed N` replays it bit for bit.
//!
//! Map:
//! - [`prng`]: xoshiro256** streams salted per concern.
//! - [`clock`]: virtual ticks and per-replica drifting realtime clocks.
//! - [`net`]: per-peer send queues with drop-on-overrun, lossy/duplicating/reordering links,
//!   symmetric and one-way partitions, clogs.
//! - [`storage`]: per-replica journal and superblock with delayed completions, crash semantics,
//!   torn and corrupted entries.
//! - [`check`]: the invariant checkers.
//! - [`machine`]: the replicated state machine (digest + applied log) and request bodies.
//! - [`swarm`]: the per-seed cluster shape and fault mix.
//! - [`sim`]: the simulator driving real replicas.
//! - [`dsl`]: scenario stories over the simulator.
//! - [`runner`]: seed runs and summaries (the `strand-sim` binary and the seed tests).
#![forbid(unsafe_code)]

pub mod check;
pub mod clock;
pub mod dsl;
pub mod machine;
pub mod net;
pub mod prng;
pub mod runner;
pub mod sim;
pub mod storage;
pub mod swarm;
