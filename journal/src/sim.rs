//! The simulator's disk for one replica: the metadata superblock and journal on a
//! [`MemStorage`], driven synchronously (the in-memory backend completes on the first poll), so
//! the simulator turns the consensus core's storage effects into calls here and feeds the
//! results back as completions. Crashes and faults go to [`SimDisk::storage`], deterministic
//! given the simulator's seed.

use crate::mem::{CrashMode, MemStorage, Prng};
use crate::metadata::{JournalConfig, JournalError, MetadataJournal, Recovery};
use crate::recover::{RecoverError, recover_metadata};
use crate::storage::block_on;
use crate::superblock::{Identity, Superblock, SuperblockError, VsrState};

/// One replica's metadata disk.
#[derive(Debug)]
pub struct SimDisk {
    storage: MemStorage,
    identity: Identity,
    config: JournalConfig,
    superblock: Option<Superblock<MemStorage>>,
    journal: Option<MetadataJournal<MemStorage>>,
}

/// What boot found (consensus.md §9.1 inputs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    /// The durable VSR state, `None` on a fresh disk.
    pub state: Option<VsrState>,
    /// Slots, intact headers in op order, head, repair ranges, chain breaks.
    pub recovery: Recovery,
}

/// A storage call on a disk that is not booted (crashed, or boot refused).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimDiskError {
    /// Boot first.
    #[error("disk not booted")]
    NotBooted,
    /// The journal refused or failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The superblock refused or failed.
    #[error(transparent)]
    Superblock(#[from] SuperblockError),
}

impl SimDisk {
    /// A fresh, empty disk. Call [`SimDisk::boot`] before anything else.
    pub fn new(identity: Identity, config: JournalConfig) -> SimDisk {
        SimDisk {
            storage: MemStorage::new(),
            identity,
            config,
            superblock: None,
            journal: None,
        }
    }

    /// The underlying disk, for fault injection (`flip_bit`, `zero_sector`, `fail_next`, ...).
    pub fn storage(&self) -> &MemStorage {
        &self.storage
    }

    /// Recovers the superblock and the journal. An error means the replica must not start.
    pub fn boot(&mut self) -> Result<Boot, RecoverError> {
        self.superblock = None;
        self.journal = None;
        let recovered = block_on(recover_metadata(
            self.storage.clone(),
            self.identity,
            self.config,
        ))?;
        self.superblock = Some(recovered.superblock);
        self.journal = Some(recovered.journal);
        Ok(Boot {
            state: recovered.state,
            recovery: recovered.recovery,
        })
    }

    /// Power loss: unsynced writes are treated per `mode`; the disk must boot again.
    pub fn crash(&mut self, mode: CrashMode, prng: &mut Prng) {
        self.superblock = None;
        self.journal = None;
        self.storage.crash(mode, prng);
    }

    fn journal(&mut self) -> Result<&mut MetadataJournal<MemStorage>, SimDiskError> {
        self.journal.as_mut().ok_or(SimDiskError::NotBooted)
    }

    /// `Effect::Append`: durable on `Ok` (then `Completion::Appended`).
    pub fn append(&mut self, frame: &[u8]) -> Result<(), SimDiskError> {
        Ok(block_on(self.journal()?.append(frame))?)
    }

    /// Truncate the journal from `op` (view-change reconciliation), durably.
    pub fn truncate_from(&mut self, op: u64) -> Result<usize, SimDiskError> {
        Ok(block_on(self.journal()?.truncate_from(op))?)
    }

    /// `Effect::Read`: the verified frame of `op`.
    pub fn read(&mut self, op: u64) -> Result<Vec<u8>, SimDiskError> {
        Ok(block_on(self.journal()?.read(op))?)
    }

    /// Persist the VSR state (then `Completion::VsrStatePersisted`).
    pub fn persist(&mut self, state: &VsrState) -> Result<(), SimDiskError> {
        let superblock = self.superblock.as_mut().ok_or(SimDiskError::NotBooted)?;
        Ok(block_on(superblock.write(state))?)
    }

    /// Raise the journal floor after a durable checkpoint.
    pub fn set_checkpoint(&mut self, op: u64) -> Result<(), SimDiskError> {
        Ok(self.journal()?.set_checkpoint(op)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prepare::tests::prepare;
    use crate::prepare::verify_frame;
    use crate::storage::SECTOR;

    #[test]
    fn a_replica_disk_survives_crashes_with_everything_acknowledged() {
        let identity = Identity {
            cluster: 42,
            replica_id: 2,
            replica_count: 3,
        };
        let config = JournalConfig {
            slot_count: 64,
            slot_size: 2 * SECTOR as u64,
        };
        let mut disk = SimDisk::new(identity, config);
        let mut prng = Prng::new(11);
        assert!(disk.boot().unwrap().state.is_none());
        let (mut acked, mut parent) = (0u64, 0u128);
        for round in 0..30 {
            for _ in 0..prng.below(5) {
                let frame = prepare(acked + 1, parent, prng.below(3000) as usize, 0);
                disk.append(&frame).unwrap();
                acked += 1;
                parent = verify_frame(&frame, true).unwrap().identity();
            }
            let state = VsrState {
                cluster: 42,
                replica_id: 2,
                replica_count: 3,
                view: round,
                log_view: round,
                op_head: acked,
                ..VsrState::default()
            };
            disk.persist(&state).unwrap();
            disk.crash(CrashMode::TornPrefix, &mut prng);
            assert_eq!(disk.append(&[0; 256]), Err(SimDiskError::NotBooted));
            let boot = disk.boot().unwrap();
            assert_eq!(boot.state.unwrap().view, round);
            assert_eq!(boot.recovery.op_head, acked);
            assert!(boot.recovery.is_clean());
            if acked > 0 {
                assert!(disk.read(acked).is_ok());
            }
        }
    }
}
