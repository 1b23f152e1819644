//! Boot of one partition group (journal.md §4.1 and §6): its superblock, its journaled prepares
//! (handed in from the shard WAL's [`crate::wal::GroupReplay`]), its segments, its consumer
//! offsets, and the next offset to mint (G8):
//! `max(end of recovered segments, offset_frontier, max over replayed SendMessages of
//! base_offset + message_count)`.

use std::collections::BTreeMap;

use wire::{HEADER_SIZE, Operation};

use crate::artifact::{ArtifactError, OffsetStore, OffsetTable};
use crate::batch;
use crate::segment::{
    Expected, ExpectedBatch, FlushPolicy, PartitionLog, SegmentError, SegmentRecovery,
};
use crate::storage::Storage;
use crate::superblock::{Identity, Superblock, SuperblockError, VsrState};
use crate::wal::BodyRef;

/// Why the group cannot boot (an unreadable superblock tombstones this partition; the rest of
/// the node boots).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionError {
    /// The group superblock.
    #[error("superblock: {0}")]
    Superblock(#[from] SuperblockError),
    /// The segments.
    #[error("segments: {0}")]
    Segment(#[from] SegmentError),
    /// The offsets file.
    #[error("offsets: {0}")]
    Offsets(#[from] ArtifactError),
}

/// What a partition group recovered.
#[derive(Debug)]
pub struct PartitionBoot<S: Storage> {
    /// The group superblock (for the next `(view, log_view)` write).
    pub superblock: Superblock<S>,
    /// Its state, `None` for a group that never wrote one (or was only formatted).
    pub state: Option<VsrState>,
    /// The segments, open for appends.
    pub log: PartitionLog<S>,
    /// What the segment scan found.
    pub segments: SegmentRecovery,
    /// The consumer-offset store, open for writes.
    pub offset_store: OffsetStore<S>,
    /// The offsets, clamped to the recovered data.
    pub offsets: OffsetTable,
    /// Whether an offsets copy was damaged (the older table was used).
    pub offsets_damaged: bool,
    /// The next offset to mint (G8).
    pub next_offset: u64,
    /// The replayed prepares, whole: those held in the WAL and those whose referenced body
    /// was found intact in the segments (decision 414).
    pub frames: BTreeMap<u64, Vec<u8>>,
    /// Ops whose referenced body was not found intact: neither present nor nacked (the caller
    /// records them faulty, durably, before the group journals anything).
    pub unresolved: Vec<u64>,
    /// Bytes of the segment tail no replayed prepare vouched for, cut.
    pub tail_cut: u64,
}

/// The end offset of the SendMessages batch a prepare carries, if it carries one.
pub fn send_messages_end(frame: &[u8]) -> Option<u64> {
    if frame.get(208) != Some(&Operation::SendMessages.byte()) {
        return None;
    }
    batch::peek(frame.get(HEADER_SIZE..)?).map(|info| info.end_offset())
}

/// Boots the partition group stored under `prefix`; `prepares` are its replayed WAL entries
/// (the header alone for an op in `bodies`, whose body is in the segments where its
/// [`BodyRef`] says: decision 414).
pub async fn recover_partition<S: Storage + Clone>(
    storage: S,
    prefix: &str,
    identity: Identity,
    policy: FlushPolicy,
    mut prepares: BTreeMap<u64, Vec<u8>>,
    bodies: &BTreeMap<u64, BodyRef>,
) -> Result<PartitionBoot<S>, PartitionError> {
    // A fresh group is formatted (its first superblock before its first data).
    let (superblock, state) =
        crate::recover::open_formatted(storage.clone(), prefix, identity).await?;
    let frontier = state.map_or(0, |s| s.offset_frontier);
    let (mut log, segments) = PartitionLog::open(storage.clone(), prefix, policy, frontier).await?;
    // The segment tail past the frontier is kept only where the replayed prepares vouch for
    // it, in op order (`PartitionLog::settle`).
    let mut expected = Vec::new();
    for (op, frame) in &prepares {
        let batch = match bodies.get(op) {
            Some(body) => Some(ExpectedBatch {
                op: *op,
                base_offset: body.base_offset,
                expected: Expected::Referenced {
                    len: body.len,
                    hash: body.hash,
                },
            }),
            None => send_messages_body(frame).and_then(|body| {
                Some(ExpectedBatch {
                    op: *op,
                    base_offset: batch::peek(body)?.base_offset,
                    expected: Expected::Held(body),
                })
            }),
        };
        expected.extend(batch);
    }
    let settled = log.settle(frontier, &expected).await?;
    drop(expected);
    let mut found: BTreeMap<u64, bytes::Bytes> = settled.bodies.into_iter().collect();
    let mut unresolved = Vec::new();
    for (op, at) in bodies {
        let body = match found.remove(op) {
            Some(body) => Some(body.to_vec()),
            // At or below the checkpoint (its WAL record not reclaimed yet): committed and
            // synced below the frontier, where the walk does not go; read and checked there.
            None if at.end_offset <= frontier => below_frontier(&log, at).await,
            None => None,
        };
        match (body, prepares.get_mut(op)) {
            (Some(body), Some(frame)) => frame.extend_from_slice(&body),
            (None, Some(_)) => {
                prepares.remove(op);
                unresolved.push(*op);
            }
            _ => {}
        }
    }
    let replayed = prepares
        .values()
        .filter_map(|f| send_messages_end(f))
        .chain(bodies.values().map(|b| b.end_offset))
        .max()
        .unwrap_or(0);
    let next_offset = log.next_offset().max(frontier).max(replayed);
    let (offset_store, mut offsets, offsets_damaged) = OffsetStore::open(storage, prefix).await?;
    let last = next_offset.saturating_sub(1);
    for offset in offsets
        .consumers
        .values_mut()
        .chain(offsets.groups.values_mut())
    {
        *offset = (*offset).min(last);
    }
    Ok(PartitionBoot {
        superblock,
        state,
        log,
        segments,
        offset_store,
        offsets,
        offsets_damaged,
        next_offset,
        frames: prepares,
        unresolved,
        tail_cut: settled.cut,
    })
}

/// The body `at` names when the segments hold exactly it below the offset frontier (one
/// batch of its length and hash at its base offset); `None` otherwise, a read error included
/// (the op is then unresolved, as a body the tail lost is).
async fn below_frontier<S: Storage>(log: &PartitionLog<S>, at: &BodyRef) -> Option<Vec<u8>> {
    let bytes = log.read_from_offset(at.base_offset, at.len).await.ok()?;
    let info = batch::peek(&bytes)?;
    (bytes.len() as u64 == at.len
        && info.base_offset == at.base_offset
        && wire::integrity::xxh3(&bytes) == at.hash)
        .then_some(bytes)
}

/// The SendMessages batch a whole prepare frame carries, if it carries one.
fn send_messages_body(frame: &[u8]) -> Option<&[u8]> {
    if frame.get(208) != Some(&Operation::SendMessages.byte()) {
        return None;
    }
    frame.get(HEADER_SIZE..)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::build;
    use crate::mem::MemStorage;
    use crate::storage::block_on;

    #[test]
    fn the_next_offset_never_falls_below_wal_segments_or_frontier() {
        let disk = MemStorage::new();
        let id = Identity {
            cluster: 1,
            replica_id: 0,
            replica_count: 3,
        };
        block_on(async {
            let policy = FlushPolicy::default();
            let mut boot = recover_partition(
                disk.clone(),
                "g7-",
                id,
                policy,
                BTreeMap::new(),
                &BTreeMap::new(),
            )
            .await
            .unwrap();
            assert_eq!(boot.next_offset, 0);
            // The group's first superblock before its first data: a later boot must not find
            // segments without one (it would refuse to format over them).
            let formatted = VsrState {
                cluster: 1,
                replica_count: 3,
                ..VsrState::default()
            };
            boot.superblock.write(&formatted).await.unwrap();
            boot.log
                .commit_batch(build(7, 0, 1, &[b"a", b"b"]))
                .unwrap();
            boot.log.sync().await.unwrap();
            // The checkpoint that covers them (segment data past the frontier is kept only
            // where a replayed prepare vouches for it: decision 414).
            let checkpointed = VsrState {
                offset_frontier: 2,
                ..formatted
            };
            boot.superblock.write(&checkpointed).await.unwrap();
            let mut table = OffsetTable::default();
            table.consumers.insert(1, 99);
            boot.offset_store.write(&table, true).await.unwrap();
            // A replayed SendMessages prepare whose batch ends at offset 5.
            let mut frame = vec![0u8; HEADER_SIZE];
            frame[208] = Operation::SendMessages.byte();
            frame.extend_from_slice(&build(7, 2, 2, &[b"c", b"d", b"e"]));
            let prepares: BTreeMap<u64, Vec<u8>> = [(1, frame)].into_iter().collect();
            let boot = recover_partition(
                disk.clone(),
                "g7-",
                id,
                policy,
                prepares.clone(),
                &BTreeMap::new(),
            )
            .await
            .unwrap();
            assert_eq!(boot.log.next_offset(), 2);
            assert_eq!(boot.next_offset, 5);
            assert_eq!(
                boot.offsets.consumers[&1], 4,
                "clamped to the recovered data"
            );
            let mut sb = boot.superblock;
            let state = VsrState {
                cluster: 1,
                replica_count: 3,
                offset_frontier: 50,
                ..VsrState::default()
            };
            sb.write(&state).await.unwrap();
            let boot = recover_partition(
                disk.clone(),
                "g7-",
                id,
                policy,
                prepares.clone(),
                &BTreeMap::new(),
            )
            .await
            .unwrap();
            assert_eq!(boot.next_offset, 50);
        });
    }

    /// A prepare at or below the checkpoint whose WAL record is not reclaimed yet (reclaim
    /// follows the slowest group) and whose body is referenced: its body lies below the
    /// offset frontier, committed and synced, so it is found there, not taken for a body
    /// the segments lost (which would record a committed op faulty at every boot).
    #[test]
    fn a_referenced_body_below_the_frontier_is_resolved_not_faulty() {
        let disk = MemStorage::new();
        let id = Identity {
            cluster: 1,
            replica_id: 0,
            replica_count: 3,
        };
        let policy = FlushPolicy::default();
        block_on(async {
            let mut boot = recover_partition(
                disk.clone(),
                "g7-",
                id,
                policy,
                BTreeMap::new(),
                &BTreeMap::new(),
            )
            .await
            .unwrap();
            let formatted = VsrState {
                cluster: 1,
                replica_count: 3,
                ..VsrState::default()
            };
            boot.superblock.write(&formatted).await.unwrap();
            let mut header = vec![0u8; HEADER_SIZE];
            header[208] = Operation::SendMessages.byte();
            let mut prepares = BTreeMap::new();
            let mut bodies = BTreeMap::new();
            for op in 1..=2u64 {
                let body = build(7, boot.log.next_offset(), 1, &[&[op as u8; 3000], b"x"]);
                let info = batch::peek(&body).unwrap();
                let (segment, position) = boot.log.reserve(body.clone().into()).unwrap();
                prepares.insert(op, header.clone());
                bodies.insert(
                    op,
                    BodyRef {
                        segment,
                        position,
                        len: body.len() as u64,
                        hash: wire::integrity::xxh3(&body),
                        base_offset: info.base_offset,
                        end_offset: info.end_offset(),
                    },
                );
            }
            boot.log.flush_synced().await.unwrap();
            // Op 1 checkpointed: the frontier is its end.
            let checkpointed = VsrState {
                checkpoint_op: 1,
                offset_frontier: bodies[&1].end_offset,
                ..formatted
            };
            boot.superblock.write(&checkpointed).await.unwrap();
            drop(boot);
            let boot = recover_partition(disk.clone(), "g7-", id, policy, prepares, &bodies)
                .await
                .unwrap();
            assert_eq!(boot.unresolved, Vec::<u64>::new(), "both bodies are intact");
            for op in [1, 2] {
                assert_eq!(
                    boot.frames[&op].len() as u64,
                    HEADER_SIZE as u64 + bodies[&op].len,
                    "op {op} whole"
                );
            }
            assert_eq!(boot.tail_cut, 0);
        });
    }
}
