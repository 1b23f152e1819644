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
    /// The replayed prepares from the checkpoint op up, whole: those held in the WAL and
    /// those whose referenced body was found intact in the segments (decision 414). Those
    /// below the checkpoint op are covered by the checkpoint and left out, their bodies
    /// unread (decision 450).
    pub frames: BTreeMap<u64, Vec<u8>>,
    /// Ops from the checkpoint op up whose referenced body was not found intact: neither
    /// present nor nacked (the caller records them faulty, durably, before the group
    /// journals anything).
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
/// [`BodyRef`] says: decision 414). Only the ops from the checkpoint op up are kept and
/// resolved (decision 450).
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
    let checkpoint_op = state.map_or(0, |s| s.checkpoint_op);
    // The ops below the checkpoint op are in the checkpoint (their WAL records wait for the
    // slowest group's reclaim): the group restarts from the checkpoint op, so their bodies
    // are not read. Their offsets still count towards the next offset (G8).
    let kept = prepares.split_off(&checkpoint_op);
    let below_end = prepares.values().filter_map(|f| send_messages_end(f)).max();
    let mut prepares = kept;
    let (mut log, segments) = PartitionLog::open(storage.clone(), prefix, policy, frontier).await?;
    // The segment tail past the frontier is kept only where the replayed prepares vouch for
    // it, in op order (`PartitionLog::settle`).
    let mut expected = Vec::new();
    for (op, frame) in &prepares {
        let batch = match bodies.get(op) {
            Some(body) => Some(ExpectedBatch {
                op: *op,
                base_offset: body.base_offset,
                expected: Expected::Referenced(*body),
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
    for (op, at) in bodies.range(checkpoint_op..) {
        let body = match found.remove(op) {
            Some(body) => Some(body.to_vec()),
            // Below the frontier (the checkpoint op's own body, its WAL record not reclaimed
            // yet): committed and synced where the walk does not go; read and checked where
            // its record says, exactly its bytes (decision 450).
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
        .chain(below_end)
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

/// The body `at` names when the segments hold exactly it below the offset frontier: the
/// `len` bytes at its segment and position, one batch at its base offset with its hash. Only
/// those bytes are read (whole sectors), so resolving `n` references reads about the sum of
/// their lengths, not `n` segment tails (decision 450). `None` otherwise, a read error
/// included (the op is then unresolved, as a body the tail lost is).
async fn below_frontier<S: Storage>(log: &PartitionLog<S>, at: &BodyRef) -> Option<Vec<u8>> {
    let bytes = log
        .read_span(at.segment, at.position, at.len)
        .await
        .ok()
        .flatten()?;
    let info = batch::peek(&bytes)?;
    (info.base_offset == at.base_offset && at.names(&bytes)).then_some(bytes)
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
    use crate::storage::{SECTOR, block_on};

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
                let (segment, position) = boot.log.reserve(body.clone().into()).unwrap();
                prepares.insert(op, header.clone());
                bodies.insert(op, BodyRef::of(segment, position, &body).unwrap());
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

    const ID: Identity = Identity {
        cluster: 1,
        replica_id: 0,
        replica_count: 3,
    };

    /// Group `g7-` on `disk` holding `n` referenced bodies (ops `1..=n`, about `payload` bytes
    /// each) written ahead, synced in one flush (one index entry for all of them), and a
    /// checkpoint at `checkpoint_op` whose offset frontier is the end of the last one: the
    /// prepares' headers and body references as the WAL replays them (nothing reclaimed).
    fn referenced_bodies(
        disk: &MemStorage,
        n: u64,
        payload: usize,
        checkpoint_op: u64,
    ) -> (BTreeMap<u64, Vec<u8>>, BTreeMap<u64, BodyRef>) {
        block_on(async {
            let mut boot = recover_partition(
                disk.clone(),
                "g7-",
                ID,
                FlushPolicy::default(),
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
            for op in 1..=n {
                let fill = vec![op as u8; payload];
                let body = build(7, boot.log.next_offset(), op, &[&fill, b"x"]);
                let (segment, position) = boot.log.reserve(body.clone().into()).unwrap();
                prepares.insert(op, header.clone());
                bodies.insert(op, BodyRef::of(segment, position, &body).unwrap());
            }
            boot.log.flush_synced().await.unwrap();
            let checkpointed = VsrState {
                checkpoint_op,
                offset_frontier: bodies[&n].end_offset,
                ..formatted
            };
            boot.superblock.write(&checkpointed).await.unwrap();
            (prepares, bodies)
        })
    }

    /// Bytes `recover_partition` reads beyond what booting the same group without any
    /// replayed prepare reads (superblock, segments scan, offsets), and the boot.
    fn extra_bytes_read(
        disk: &MemStorage,
        prepares: BTreeMap<u64, Vec<u8>>,
        bodies: &BTreeMap<u64, BodyRef>,
    ) -> (u64, PartitionBoot<MemStorage>) {
        let policy = FlushPolicy::default();
        let boot =
            |prepares, bodies| recover_partition(disk.clone(), "g7-", ID, policy, prepares, bodies);
        let none = BTreeMap::new();
        let before = disk.bytes_read();
        drop(block_on(boot(BTreeMap::new(), &none)).unwrap());
        let baseline = disk.bytes_read() - before;
        let before = disk.bytes_read();
        let booted = block_on(boot(prepares, bodies)).unwrap();
        (disk.bytes_read() - before - baseline, booted)
    }

    /// Decision 450: each referenced body below the offset frontier is read once, exactly its
    /// bytes (whole sectors), not the segment from an index entry on. Many of them (a slow
    /// group holding the WAL's reclaim back) cost a boot the sum of their lengths.
    #[test]
    fn resolving_bodies_below_the_frontier_reads_each_once() {
        let disk = MemStorage::new();
        let n = 64;
        let (prepares, bodies) = referenced_bodies(&disk, n, 8000, 1);
        let (extra, boot) = extra_bytes_read(&disk, prepares, &bodies);
        assert_eq!(boot.unresolved, Vec::<u64>::new());
        assert_eq!(boot.frames.len() as u64, n, "ops from the checkpoint op up");
        for (op, at) in &bodies {
            assert_eq!(boot.frames[op].len() as u64, HEADER_SIZE as u64 + at.len);
        }
        let lens: u64 = bodies.values().map(|b| b.len).sum();
        let bound = lens + n * 2 * SECTOR as u64;
        assert!(
            extra <= bound,
            "resolving {n} bodies of {lens} bytes read {extra} bytes (bound {bound})"
        );
    }

    /// Decision 450: the ops below the checkpoint op are left out and their bodies not read
    /// (the group restarts from the checkpoint op): one whose body no longer matches is not
    /// taken for a fault, and the next offset still counts them.
    #[test]
    fn bodies_below_the_checkpoint_op_are_not_read_nor_faulty() {
        let disk = MemStorage::new();
        let n = 32;
        let (prepares, mut bodies) = referenced_bodies(&disk, n, 8000, n);
        bodies.get_mut(&1).unwrap().hash ^= 1;
        let end = bodies[&n].end_offset;
        let (extra, boot) = extra_bytes_read(&disk, prepares, &bodies);
        assert_eq!(
            boot.unresolved,
            Vec::<u64>::new(),
            "op 1 is in the checkpoint"
        );
        assert_eq!(boot.frames.keys().copied().collect::<Vec<_>>(), vec![n]);
        assert_eq!(
            boot.frames[&n].len() as u64,
            HEADER_SIZE as u64 + bodies[&n].len
        );
        assert_eq!(boot.next_offset, end);
        let bound = bodies[&n].len + 2 * SECTOR as u64;
        assert!(extra <= bound, "read {extra} bytes, bound {bound}");
    }

    /// A reference below the frontier is resolved only by the batch it names: another hash,
    /// another batch at its position, or a position no segment holds leave the op unresolved
    /// (faulty, repaired from peers), never a panic.
    #[test]
    fn a_body_below_the_frontier_that_does_not_match_its_reference_is_unresolved() {
        let disk = MemStorage::new();
        let (prepares, mut bodies) = referenced_bodies(&disk, 6, 3000, 1);
        // Op 2: the bytes at its position are another batch than its record names.
        bodies.get_mut(&2).unwrap().hash ^= 1;
        // Op 3: its position holds op 4's batch (same length, its hash): not at op 3's offset.
        let four = bodies[&4];
        let three = bodies.get_mut(&3).unwrap();
        (three.position, three.hash) = (four.position, four.hash);
        // Op 4: a segment that does not exist; op 5: past the end; op 6: a position that
        // overflows with its length.
        bodies.get_mut(&4).unwrap().segment = 1 << 40;
        bodies.get_mut(&5).unwrap().position = 1 << 40;
        bodies.get_mut(&6).unwrap().position = u64::MAX - 100;
        let (_, boot) = extra_bytes_read(&disk, prepares, &bodies);
        assert_eq!(boot.unresolved, vec![2, 3, 4, 5, 6]);
        assert_eq!(boot.frames.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(boot.tail_cut, 0, "below the frontier nothing is cut");
    }
}
