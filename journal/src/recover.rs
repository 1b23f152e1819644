//! Metadata-plane recovery at boot: the superblock first (an unreadable one refuses boot, G5;
//! another cluster's refuses boot, G6), then the journal scan with the superblock's checkpoint as
//! the floor and its `op_head` as the head the scan may never fall below (G3).

use crate::artifact::{ArtifactError, Snapshot, SnapshotStore};
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
    /// The durable VSR state (`None` on a fresh directory, or one only formatted: see
    /// [`formatted_state`]).
    pub state: Option<VsrState>,
    /// Slots, intact headers in op order, head, repair ranges, chain breaks.
    pub recovery: Recovery,
}

/// The state a group's first superblock holds when it is formatted: the identity, everything
/// else zero. As the first generation (sequence 1) it means no state at all (the core never
/// wrote one), so the recover functions report it as `None`; the same bytes written later by
/// the core are a state (a restarted replica is not a fresh one).
pub fn formatted_state(identity: Identity) -> VsrState {
    VsrState {
        cluster: identity.cluster,
        replica_id: identity.replica_id,
        replica_count: identity.replica_count,
        ..VsrState::default()
    }
}

/// Opens `"{prefix}superblock"`; a fresh one (no journal data beside it, or
/// [`Superblock::open`] refuses) is formatted at once, so that journal data never exists
/// without a superblock (docs/decisions.md item 91). Returns it with its state, `None` when
/// only formatted (generation 1 holding [`formatted_state`]).
pub(crate) async fn open_formatted<S: Storage>(
    storage: S,
    prefix: &str,
    identity: Identity,
) -> Result<(Superblock<S>, Option<VsrState>), SuperblockError> {
    let mut superblock = Superblock::open(storage, prefix, identity).await?;
    let formatted = formatted_state(identity);
    if superblock.state().is_none() {
        superblock.write(&formatted).await?;
    }
    let only_formatted = superblock.sequence() == 1 && superblock.state() == Some(&formatted);
    let state = superblock.state().copied().filter(|_| !only_formatted);
    Ok((superblock, state))
}

/// Opens the superblock (formatting a fresh directory) and the metadata journal of `storage`
/// and classifies every slot.
pub async fn recover_metadata<S: Storage + Clone>(
    storage: S,
    identity: Identity,
    config: JournalConfig,
) -> Result<Recovered<S>, RecoverError> {
    let (superblock, state) = open_formatted(storage.clone(), "", identity).await?;
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

/// Why the snapshot and the superblock do not pair (journal.md §3.5 step 3): boot must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PairingError {
    /// The superblock names a checkpoint newer than the snapshot on disk (a lost snapshot).
    #[error("superblock names checkpoint {checkpoint_op}, snapshot is at {snapshot_op:?}")]
    SnapshotBehind {
        /// In the superblock.
        checkpoint_op: u64,
        /// On disk.
        snapshot_op: Option<u64>,
    },
    /// Same op, different bytes.
    #[error("checkpoint {op}: the snapshot's checksum differs from the superblock's")]
    Checksum {
        /// The op.
        op: u64,
    },
}

/// The pairing rule as a pure function: a superblock behind a complete newer snapshot is
/// accepted (crash between the snapshot write and the superblock write); a superblock ahead of
/// the snapshot, or naming other bytes at the same op, is refused.
pub fn check_pairing(
    state: Option<&VsrState>,
    snapshot: Option<&Snapshot>,
) -> Result<(), PairingError> {
    let checkpoint_op = state.map_or(0, |s| s.checkpoint_op);
    match snapshot {
        None if checkpoint_op == 0 => Ok(()),
        None => Err(PairingError::SnapshotBehind {
            checkpoint_op,
            snapshot_op: None,
        }),
        Some(snap) if snap.op < checkpoint_op => Err(PairingError::SnapshotBehind {
            checkpoint_op,
            snapshot_op: Some(snap.op),
        }),
        Some(snap) if snap.op == checkpoint_op && checkpoint_op > 0 => {
            let expected = state.map_or(0, |s| s.checkpoint_checksum);
            if snap.checksum() == expected {
                Ok(())
            } else {
                Err(PairingError::Checksum { op: snap.op })
            }
        }
        Some(_) => Ok(()),
    }
}

/// Why a checkpoint could not be completed (each step is durable before the next; a failed
/// step stops the sequence and the caller fail-stops or retries later).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Writing the snapshot failed (F4).
    #[error("snapshot: {0}")]
    Snapshot(#[from] ArtifactError),
    /// Writing the superblock failed (F3).
    #[error("superblock: {0}")]
    Superblock(#[from] SuperblockError),
    /// Raising the journal floor was refused.
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
}

/// A metadata checkpoint in the order G4 demands (`Effect::Checkpoint`, and the install of a
/// transferred snapshot): the snapshot is written durably, then the superblock names it
/// (`checkpoint_op`, `checkpoint_checksum`, carried forward from `state`), then the journal's
/// floor rises so the slots at or below it may be reused. Returns the state written.
pub async fn checkpoint<S: Storage>(
    snapshots: &mut SnapshotStore<S>,
    superblock: &mut Superblock<S>,
    journal: &mut MetadataJournal<S>,
    snapshot: &Snapshot,
    state: VsrState,
) -> Result<VsrState, CheckpointError> {
    snapshots.write(snapshot).await?;
    let state = VsrState {
        checkpoint_op: snapshot.op,
        checkpoint_checksum: snapshot.checksum(),
        op_head: state.op_head.max(journal.op_head()).max(snapshot.op),
        ..state
    };
    superblock.write(&state).await?;
    journal.set_checkpoint(snapshot.op)?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemStorage;
    use crate::prepare::tests::prepare;
    use crate::storage::{SECTOR, block_on};
    use crate::superblock::COPY_BYTES;

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
    fn a_formatted_directory_reads_as_fresh_but_a_state_the_core_wrote_does_not() {
        let disk = MemStorage::new();
        block_on(async {
            let mut r = recover_metadata(disk.clone(), ID, CONFIG).await.unwrap();
            assert_eq!((r.state, r.superblock.sequence()), (None, 1));
            r.journal.append(&prepare(1, 0, 10, 0)).await.unwrap();
            let r = recover_metadata(disk.clone(), ID, CONFIG).await.unwrap();
            assert_eq!(
                r.state, None,
                "formatted, journal data beside it: not refused"
            );
            // The core writes the same bytes: a restarted replica, not a fresh one (taking it
            // for fresh broke agreement in simulator seed 933).
            let mut sb = r.superblock;
            sb.write(&formatted_state(ID)).await.unwrap();
            let r = recover_metadata(disk.clone(), ID, CONFIG).await.unwrap();
            assert_eq!(r.state, Some(formatted_state(ID)));
        });
    }

    #[test]
    fn checkpoints_pair_and_a_lost_snapshot_refuses() {
        let disk = MemStorage::new();
        block_on(async {
            let mut r = recover_metadata(disk.clone(), ID, CONFIG).await.unwrap();
            let (mut snapshots, none) = SnapshotStore::open(disk.clone()).await.unwrap();
            assert!(check_pairing(r.state.as_ref(), none.as_ref()).is_ok());
            let mut parent = 0;
            for op in 1..=10 {
                let frame = prepare(op, parent, 10, 0);
                r.journal.append(&frame).await.unwrap();
                parent = crate::prepare::verify_frame(&frame, true)
                    .unwrap()
                    .identity();
            }
            let base = VsrState {
                cluster: 42,
                replica_count: 3,
                ..VsrState::default()
            };
            for op in [4, 8] {
                let snapshot = Snapshot {
                    op,
                    payload: vec![op as u8; 100],
                };
                checkpoint(
                    &mut snapshots,
                    &mut r.superblock,
                    &mut r.journal,
                    &snapshot,
                    base,
                )
                .await
                .unwrap();
            }
            let r = recover_metadata(disk.clone(), ID, CONFIG).await.unwrap();
            let (_, snap) = SnapshotStore::open(disk.clone()).await.unwrap();
            assert!(check_pairing(r.state.as_ref(), snap.as_ref()).is_ok());
            assert_eq!(r.recovery.checkpoint_op, 8);
            assert_eq!(r.recovery.chain_end(), 10);
            // The newest snapshot copy (generation 2, file snapshot.0) rots: the older one
            // (op 4) is behind the superblock's checkpoint 8: refuse.
            disk.flip_bit("snapshot.0", 40, 2).unwrap();
            let (_, snap) = SnapshotStore::open(disk.clone()).await.unwrap();
            assert_eq!(
                check_pairing(r.state.as_ref(), snap.as_ref()),
                Err(PairingError::SnapshotBehind {
                    checkpoint_op: 8,
                    snapshot_op: Some(4)
                })
            );
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
            disk.flip_bit("superblock", 2 * COPY_BYTES as u64 + 9, 0)
                .unwrap();
            disk.flip_bit("superblock", 3 * COPY_BYTES as u64 + 9, 0)
                .unwrap();
            assert!(matches!(
                recover_metadata(disk.clone(), ID, CONFIG).await,
                Err(RecoverError::Superblock(SuperblockError::Unreadable { .. }))
            ));
        });
    }
}
