//! Durable storage for Strand: the metadata prepare journal and superblock, the per-shard
//! partition WAL with group commit, segments with offset and timestamp indexes, consumer
//! offsets, and state-transfer artifacts.
//!
//! It never makes protocol decisions: recovery reports what it found (valid, torn, corrupt,
//! missing slots, what must be repaired from peers) and the consensus core decides. Corrupt
//! input from disk is a typed error, never a panic; environmental failures (a failed write or
//! sync) are returned to the caller, which fail-stops.
//!
//! Map:
//! - [`storage`]: the `Storage` trait (sector-aligned positional IO, `async fn`) and helpers.
//! - [`mem`]: the in-memory backend with deterministic fault injection (the simulator's disks:
//!   `tests/src/storage.rs` runs these layouts on it).
//! - [`mod@file`]: the std-file backend (`O_DIRECT` + `fdatasync`, aligned buffers, no `unsafe`).
//! - `dma` (feature `glommio`): the glommio DMA backend (io_uring, `O_DIRECT`, `DmaBuffer`).
//! - [`prepare`]: verification of stored prepare frames (identity and body digest via `wire`).
//! - [`superblock`]: four redundant copies of the durable VSR state, pure choice at open.
//! - [`metadata`]: the metadata prepare journal (fixed slots + header ring) and the pure
//!   recovery classification of every slot.
//! - [`recover`]: boot of the metadata plane (superblock, then journal), the snapshot pairing
//!   rule, and the checkpoint sequence (snapshot, superblock, journal floor).
//! - [`wal`]: the per-shard partition WAL with group commit, and its durable-end record.
//! - [`boot`]: the server's boot of a data directory: format, geometry and pairing checks,
//!   faulty op ranges per group recorded before the first append, reclaim behind segments.
//! - [`batch`]: verification of stamped SendMessages batches.
//! - [`segment`]: partition segments, sparse offset/timestamp index, flush policy, reads.
//! - [`partition`]: boot of one partition group (superblock, segments, offsets, next offset).
//! - [`pingpong`]: a small record replaced atomically (two alternating copies).
//! - [`artifact`]: state-transfer artifacts (ICT2, ICO1, segment logs, snapshot), their stores,
//!   manifests with checksums, and the partition offer / install.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod artifact;
pub mod batch;
pub mod boot;
#[cfg(feature = "glommio")]
pub mod dma;
pub mod file;
pub mod mem;
pub mod metadata;
pub mod partition;
pub mod pingpong;
pub mod prepare;
pub mod recover;
pub mod segment;
pub mod storage;
pub mod superblock;
pub mod wal;

pub use artifact::{
    ArtifactError, ClientEntry, Offer, OffsetStore, OffsetTable, Snapshot, SnapshotStore,
};
pub use boot::{
    BootError, FaultRecord, FaultyOps, MetadataBoot, ReclaimGuard, ShardBoot, boot_metadata,
    boot_shard,
};
pub use file::{AlignedBuf, FileStorage};
pub use mem::{CrashMode, FailOp, MemStorage, Prng};
pub use metadata::{JournalConfig, JournalError, MetadataJournal, Recovery, SlotState};
pub use partition::{PartitionBoot, PartitionError, recover_partition};
pub use prepare::{FrameFault, Header};
pub use recover::{
    CheckpointError, PairingError, RecoverError, Recovered, check_pairing, checkpoint,
    formatted_state, recover_metadata,
};
pub use segment::{FlushPolicy, PartitionLog, SegmentError, SegmentRecovery};
pub use storage::{OpenMode, SECTOR, Storage, StorageError, block_on};
pub use superblock::{Identity, Superblock, SuperblockError, VsrState};
pub use wal::{GroupReplay, PartitionWal, WalConfig, WalError, WalRecord, WalRecovery};
