//! Metadata-plane recovery at boot: the superblock first (an unreadable one refuses boot, G5;
//! another cluster's refuses boot, G6), then the journal scan with the superblock's checkpoint as
//! the floor and its `op_head` as the head the scan may never fall below (G3).

use crate::metadata::{JournalConfig, JournalError, MetadataJournal, Recovery};
use crate::storage::Storage;
use crate::superblock::{Identity, Superblock, SuperblockError, VsrState};

/// Why boot must stop.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoverError {
    /// The superblock is unreadable, of another identity or version, or its storage failed.
    #[error("superblock: {0}")]
    Superblock(#[from] SuperblockError),
    /// The journal could not be scanned (storage failure or bad config).
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
}

/// Everything the consensus core needs back at boot (consensus.md §9.1).
#[derive(Debug)]
pub struct Recovered<S: Storage> {
    /// The superblock, ready for the next write.
    pub superblock: Superblock<S>,
    /// The journal, ready for appends.
    pub journal: MetadataJournal<S>,
    /// The durable VSR state (`None` on a fresh directory).
    pub state: Option<VsrState>,
    /// Slots, intact headers in op order, head, repair ranges, chain breaks.
    pub recovery: Recovery,
}

/// Opens the superblock and the metadata journal of `storage` and classifies every slot.
pub async fn recover_metadata<S: Storage + Clone>(
    storage: S,
    identity: Identity,
    config: JournalConfig,
) -> Result<Recovered<S>, RecoverError> {
    let superblock = Superblock::open(storage.clone(), "", identity).await?;
    let state = superblock.state().copied();
    let (checkpoint_op, op_head) = state.map_or((0, 0), |s| (s.checkpoint_op, s.op_head));
    let (journal, recovery) =
        MetadataJournal::open(storage, config, checkpoint_op, op_head).await?;
    Ok(Recovered {
        superblock,
        journal,
        state,
        recovery,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemStorage;
    use crate::prepare::tests::prepare;
    use crate::storage::{SECTOR, block_on};

    const ID: Identity = Identity {
        cluster: 42,
        replica_id: 0,
        replica_count: 3,
    };
    const CONFIG: JournalConfig = JournalConfig {
        slot_count: 16,
        slot_size: 2 * SECTOR as u64,
    };

    #[test]
    fn boot_from_fresh_then_from_state() {
        let disk = MemStorage::new();
        block_on(async {
            let mut r = recover_metadata(disk.clone(), ID, CONFIG).await.unwrap();
            assert!(r.state.is_none());
            r.journal.append(&prepare(1, 0, 10, 0)).await.unwrap();
            let state = VsrState {
                cluster: 42,
                replica_count: 3,
                view: 2,
                log_view: 2,
                op_head: 1,
                commit_max: 1,
                ..VsrState::default()
            };
            r.superblock.write(&state).await.unwrap();
            let r = recover_metadata(disk.clone(), ID, CONFIG).await.unwrap();
            assert_eq!(r.state, Some(state));
            assert_eq!(r.recovery.op_head, 1);
            assert!(r.recovery.is_clean());
        });
    }

    #[test]
    fn an_unreadable_superblock_refuses_boot() {
        let disk = MemStorage::new();
        block_on(async {
            let mut r = recover_metadata(disk.clone(), ID, CONFIG).await.unwrap();
            let state = VsrState {
                cluster: 42,
                replica_count: 3,
                view: 1,
                ..VsrState::default()
            };
            r.superblock.write(&state).await.unwrap();
            // Generation 1 lives in copies 2 and 3.
            disk.flip_bit("superblock", 2 * SECTOR as u64 + 9, 0)
                .unwrap();
            disk.flip_bit("superblock", 3 * SECTOR as u64 + 9, 0)
                .unwrap();
            assert!(matches!(
                recover_metadata(disk.clone(), ID, CONFIG).await,
                Err(RecoverError::Superblock(SuperblockError::Unreadable { .. }))
            ));
        });
    }
}
