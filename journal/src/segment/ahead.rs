//! Bodies written ahead of their commit (decision 414): what a view change and a boot do with
//! a segment tail that holds prepares not known committed.
//!
//! With [`PartitionLog::reserve`] a prepare's batch is written once, at its segment's tail,
//! and synced before the prepare is acknowledged; the shard WAL keeps only the prepare's header
//! and where its body is. So a segment's tail may hold bodies of prepares a view change then
//! truncates ([`PartitionLog::rewind`], after the truncation is durable in the WAL), and at a
//! boot bytes that no surviving WAL record vouches for: a body whose WAL window never became
//! durable, or one a crash tore. [`PartitionLog::settle`] walks the tail from the checkpoint's
//! offset frontier over the replayed prepares in op order, keeps what each of them says is
//! there, and cuts the rest, so that nothing past the frontier is ever taken for data that no
//! record vouches for.

use bytes::Bytes;

use super::{PartitionLog, SegmentError, encode_entries, index_name, log_name};
use crate::batch::{self, BatchFault};
use crate::file::AlignedBuf;
use crate::storage::{SECTOR, Storage, read_exact_at, sector_ceil};
use crate::wal::BodyRef;

/// What a replayed prepare says its batch is, for [`PartitionLog::settle`].
#[derive(Debug, Clone, Copy)]
pub enum Expected<'a> {
    /// A body-reference record: the body it names ([`BodyRef::names`]; its place is the
    /// walk's, not the record's).
    Referenced(BodyRef),
    /// A whole prepare in the WAL: its body.
    Held(&'a [u8]),
}

/// One replayed SendMessages prepare, in op order, for [`PartitionLog::settle`].
#[derive(Debug, Clone, Copy)]
pub struct ExpectedBatch<'a> {
    /// The op.
    pub op: u64,
    /// The batch's base offset.
    pub base_offset: u64,
    /// What its bytes must be.
    pub expected: Expected<'a>,
}

/// What [`PartitionLog::settle`] found.
#[derive(Debug, Default)]
pub struct Settled {
    /// Bodies of referenced prepares found intact, by op.
    pub bodies: Vec<(u64, Bytes)>,
    /// The offset the verified tail ends at; the log was cut there.
    pub end: u64,
    /// Bytes cut.
    pub cut: u64,
}

impl<S: Storage> PartitionLog<S> {
    /// `(segment index, byte position)` of the batch that starts at `offset`, or of the end
    /// of the written data when it ends there; `None` if no batch boundary is at `offset`.
    async fn locate(&self, offset: u64) -> Result<Option<(usize, u64)>, SegmentError> {
        let Some(i) = self.segments.iter().rposition(|s| s.base <= offset) else {
            return Ok(None);
        };
        let seg = &self.segments[i];
        if offset >= seg.end_offset {
            return Ok((offset == seg.end_offset).then_some((i, seg.len)));
        }
        let from = seg
            .index
            .iter()
            .rev()
            .find(|e| e.offset <= offset)
            .map_or(0, |e| e.position);
        let aligned = from / SECTOR as u64 * SECTOR as u64;
        let mut bytes = vec![0u8; sector_ceil(seg.len - aligned) as usize];
        let n = read_exact_at(&self.storage, &seg.log, aligned, &mut bytes).await?;
        bytes.truncate(n.min((seg.len - aligned) as usize));
        let mut at = (from - aligned) as usize;
        while at < bytes.len() {
            let info = batch::peek(&bytes[at..]).ok_or(SegmentError::Corrupt {
                base: seg.base,
                position: aligned + at as u64,
                fault: BatchFault::Truncated,
            })?;
            if info.base_offset == offset {
                return Ok(Some((i, aligned + at as u64)));
            }
            if info.base_offset > offset || info.len == 0 {
                return Ok(None);
            }
            at += info.len as usize;
        }
        Ok(None)
    }

    /// Exactly the `len` bytes at byte `position` of the segment whose base offset is
    /// `segment`, read as the whole sectors that cover them and nothing more; `None` when no
    /// segment has that base or its written data does not hold them (`position` and `len`
    /// may come from an untrusted record: nothing is allocated past the written data). The
    /// bytes are not checked: the caller knows what they must be (decision 450).
    pub async fn read_span(
        &self,
        segment: u64,
        position: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, SegmentError> {
        match self.segments.iter().position(|s| s.base == segment) {
            Some(i) => self.span(i, position, len).await,
            None => Ok(None),
        }
    }

    /// [`PartitionLog::read_span`] of segment `i`.
    async fn span(
        &self,
        i: usize,
        position: u64,
        len: u64,
    ) -> Result<Option<Vec<u8>>, SegmentError> {
        let seg = &self.segments[i];
        match position.checked_add(len) {
            Some(end) if end <= seg.len => {}
            _ => return Ok(None),
        }
        let aligned = position / SECTOR as u64 * SECTOR as u64;
        let mut buf = vec![0u8; sector_ceil(position + len - aligned) as usize];
        let n = read_exact_at(&self.storage, &seg.log, aligned, &mut buf).await?;
        let from = (position - aligned) as usize;
        let to = from + len as usize;
        if n < to {
            return Ok(None); // the file is shorter than its recovered length says
        }
        buf.copy_within(from..to, 0);
        buf.truncate(len as usize);
        Ok(Some(buf))
    }

    /// Cuts the written data back to `offset`, a batch boundary: the bodies reserved ahead
    /// for prepares a view change truncated (the caller made the truncation durable first,
    /// and never passes an offset below what it committed). Held batches are written and
    /// everything is synced first; segments that start past `offset` are removed, the one
    /// that holds it is cut there (its index with it), and the next batch is written there.
    pub async fn rewind(&mut self, offset: u64) -> Result<(), SegmentError> {
        if offset >= self.next_offset {
            return Ok(());
        }
        self.sync().await?;
        let Some((i, position)) = self.locate(offset).await? else {
            return Err(SegmentError::Offset {
                base_offset: offset,
                expected: self.next_offset,
            });
        };
        self.cut_at(i, offset, position).await
    }

    /// Keeps segment `i` up to `position` (where `offset` starts) and nothing after it.
    async fn cut_at(&mut self, i: usize, offset: u64, position: u64) -> Result<(), SegmentError> {
        // Before any change: a reader that copied the extents must compare, not append.
        self.rewrite_mark = super::extents::fresh_mark();
        while self.segments.len() > i + 1 {
            let seg = self.segments.pop().expect("counted");
            drop(seg.log);
            drop(seg.idx);
            self.storage
                .remove(&log_name(&self.prefix, seg.base))
                .await?;
            self.storage
                .remove(&index_name(&self.prefix, seg.base))
                .await?;
        }
        let seg = self.segments.last_mut().expect("segment i");
        seg.len = position;
        seg.end_offset = offset;
        seg.index.retain(|e| e.position < position);
        // The index is rewritten whole (one entry per flush: kilobytes), so no stale entry
        // past the cut survives on disk.
        let entries = encode_entries(seg.index.iter());
        let mut idx_buf =
            AlignedBuf::zeroed(sector_ceil(entries.len() as u64).max(SECTOR as u64) as usize);
        idx_buf.as_mut_slice()[..entries.len()].copy_from_slice(&entries);
        let idx = std::rc::Rc::clone(&seg.idx);
        seg.idx_written = seg.index.len();
        self.storage.write_at(&idx, 0, idx_buf.as_slice()).await?;
        self.storage
            .set_len(&idx, sector_ceil(entries.len() as u64))
            .await?;
        self.storage.sync(&idx).await?;
        // Zeroes the cut sector's tail, truncates and syncs the log.
        self.rewrite_tail(position).await?;
        self.next_offset = offset;
        self.synced_offset = offset;
        Ok(())
    }

    /// At a boot, before the first write: keeps the written data past `frontier` (the
    /// checkpoint's offset frontier, below which everything is committed and synced) only as
    /// far as `expected`, the group's replayed SendMessages prepares in op order, vouch for
    /// it, and cuts the rest. A referenced body is kept when its bytes have the length and
    /// hash its record names; a prepare held whole in the WAL when the segment holds exactly
    /// its body. The walk stops at the first prepare that does not start at the walk's offset
    /// or does not match: later referenced bodies are then not returned (their prepares are
    /// faulty, repaired from peers).
    pub async fn settle(
        &mut self,
        frontier: u64,
        expected: &[ExpectedBatch<'_>],
    ) -> Result<Settled, SegmentError> {
        let mut settled = Settled {
            end: frontier,
            ..Settled::default()
        };
        let written = self.segments.last().map_or(0, |s| s.end_offset);
        if written <= frontier {
            settled.end = self.next_offset;
            return Ok(settled);
        }
        let Some((mut i, mut position)) = self.locate(frontier).await? else {
            // The frontier is not a batch boundary of the data: the segments disagree with
            // the checkpoint, and cutting anywhere could drop committed data.
            return Err(SegmentError::Offset {
                base_offset: frontier,
                expected: written,
            });
        };
        let mut cursor = frontier;
        for e in expected {
            if e.base_offset < cursor {
                continue; // a batch below the walk (an op at or below the checkpoint)
            }
            if e.base_offset != cursor {
                break;
            }
            if position >= self.segments[i].len
                && i + 1 < self.segments.len()
                && self.segments[i + 1].base == cursor
            {
                i += 1;
                position = 0;
            }
            let want = match e.expected {
                Expected::Referenced(at) => at.len,
                Expected::Held(body) => body.len() as u64,
            };
            let Some(body) = self.span(i, position, want).await? else {
                break;
            };
            let intact = match e.expected {
                Expected::Referenced(at) => at.names(&body),
                Expected::Held(held) => body == held,
            };
            let Some(info) = batch::peek(&body).filter(|i| intact && i.base_offset == cursor)
            else {
                break;
            };
            if matches!(e.expected, Expected::Referenced(_)) {
                settled.bodies.push((e.op, Bytes::from(body)));
            }
            cursor = info.end_offset();
            position += want;
        }
        settled.end = cursor;
        if written > cursor {
            let before: u64 = self.segments.iter().map(|s| s.len).sum();
            self.cut_at(i, cursor, position).await?;
            let after: u64 = self.segments.iter().map(|s| s.len).sum();
            settled.cut = before - after;
        }
        Ok(settled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::build;
    use crate::mem::{CrashMode, MemStorage, Prng};
    use crate::segment::FlushPolicy;
    use crate::storage::block_on;

    /// No fsync of its own: only `flush_synced` makes the reserved bodies durable.
    const POLICY: FlushPolicy = FlushPolicy {
        enforce_fsync: false,
        messages_required_to_save: 1 << 20,
        size_of_messages_required_to_save: 1 << 30,
        segment_size: 16 * 1024,
    };

    fn batch_at(offset: u64, salt: u8) -> Bytes {
        let payloads: Vec<Vec<u8>> = (0..3)
            .map(|i| vec![(offset as u8).wrapping_add(i).wrapping_mul(salt); 700])
            .collect();
        let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
        Bytes::from(build(1, offset, 1_000 + offset, &refs))
    }

    fn open(disk: &MemStorage) -> PartitionLog<MemStorage> {
        let (log, _) = block_on(PartitionLog::open(disk.clone(), "p1-", POLICY, 0)).unwrap();
        log
    }

    /// A reserved body: its op, batch and where `reserve` put it.
    #[derive(Clone)]
    struct Ahead {
        op: u64,
        batch: Bytes,
        at: (u64, u64),
    }

    fn reserve(log: &mut PartitionLog<MemStorage>, op: u64, salt: u8) -> Ahead {
        let batch = batch_at(log.next_offset(), salt);
        let at = log.reserve(batch.clone()).expect("contiguous");
        Ahead { op, batch, at }
    }

    fn referenced(a: &Ahead) -> ExpectedBatch<'static> {
        ExpectedBatch {
            op: a.op,
            base_offset: batch::peek(&a.batch).unwrap().base_offset,
            expected: Expected::Referenced(BodyRef::of(0, 0, &a.batch).unwrap()),
        }
    }

    fn end_of(a: &Ahead) -> u64 {
        batch::peek(&a.batch).unwrap().end_offset()
    }

    /// Every body synced by `flush_synced` survives any crash and comes back from `settle`
    /// byte for byte where `reserve` said it would be; what survives past it is only ever a
    /// prefix of what was written after, and `settle` never keeps bytes no record names.
    #[test]
    fn bodies_synced_ahead_survive_every_crash_and_settle_keeps_only_what_records_name() {
        for mode in [
            CrashMode::LoseUnsynced,
            CrashMode::TornPrefix,
            CrashMode::Reorder,
            CrashMode::TornLast,
        ] {
            for seed in 0..24 {
                let disk = MemStorage::new();
                let mut log = open(&disk);
                let mut prng = Prng::new(seed);
                let mut all = Vec::new();
                let mut synced = 0;
                for op in 1..=30 {
                    all.push(reserve(&mut log, op, 7));
                    if prng.below(3) == 0 {
                        block_on(log.flush_synced()).unwrap();
                        assert!(!log.has_reserved());
                        synced = all.len();
                        assert_eq!(log.synced_offset(), end_of(all.last().unwrap()));
                    }
                }
                // The rest written but not synced (a window whose sync the crash beat).
                block_on(log.flush()).unwrap();
                disk.crash(mode, &mut prng);
                let mut log = open(&disk);
                let expected: Vec<_> = all.iter().map(referenced).collect();
                let settled = block_on(log.settle(0, &expected)).unwrap();
                assert!(
                    settled.bodies.len() >= synced,
                    "{mode:?} seed {seed}: {} of {synced} synced bodies back",
                    settled.bodies.len()
                );
                for ((op, body), a) in settled.bodies.iter().zip(&all) {
                    assert_eq!((*op, body), (a.op, &a.batch), "{mode:?} seed {seed}");
                }
                let kept = settled.bodies.len();
                let end = all[..kept].last().map_or(0, end_of);
                assert_eq!((settled.end, log.next_offset()), (end, end));
                let read = block_on(log.read_from_offset(0, u64::MAX)).unwrap();
                let want: Vec<u8> = all[..kept].iter().flat_map(|a| a.batch.to_vec()).collect();
                assert!(
                    read == want,
                    "{mode:?} seed {seed}: the log holds other bytes"
                );
                // The next body goes where the first unkept one went.
                if let Some(next) = all.get(kept) {
                    let again = reserve(&mut log, next.op, 9);
                    assert_eq!(again.at, next.at, "{mode:?} seed {seed}");
                }
            }
        }
    }

    /// A reservation whose prepare could not be journaled is given back before anything is
    /// written; only the last one can be.
    #[test]
    fn a_reservation_given_back_is_never_written() {
        let disk = MemStorage::new();
        let mut log = open(&disk);
        let a = reserve(&mut log, 1, 3);
        let b = reserve(&mut log, 2, 3);
        let base = |x: &Ahead| batch::peek(&x.batch).unwrap().base_offset;
        assert!(!log.unreserve(base(&a)), "not the last one");
        assert!(log.unreserve(base(&b)));
        assert_eq!(log.next_offset(), end_of(&a));
        assert!(log.has_reserved());
        let c = reserve(&mut log, 2, 4);
        assert_eq!(c.at, b.at, "the next batch takes its place");
        assert!(log.unreserve(base(&c)));
        block_on(log.flush_synced()).unwrap();
        let mut log = open(&disk);
        assert_eq!(log.next_offset(), end_of(&a));
        let settled = block_on(log.settle(0, &[referenced(&a)])).unwrap();
        assert_eq!((settled.bodies.len(), settled.cut), (1, 0));
    }

    #[test]
    fn a_body_that_does_not_match_its_record_stops_the_walk_and_is_cut() {
        let disk = MemStorage::new();
        let mut log = open(&disk);
        let all: Vec<Ahead> = (1..=4).map(|op| reserve(&mut log, op, 3)).collect();
        block_on(log.flush_synced()).unwrap();
        let mut expected: Vec<_> = all.iter().map(referenced).collect();
        if let Expected::Referenced(at) = &mut expected[1].expected {
            at.hash ^= 1;
        }
        let mut log = open(&disk);
        let settled = block_on(log.settle(0, &expected)).unwrap();
        assert_eq!(settled.bodies.len(), 1, "later bodies are not vouched for");
        assert_eq!(settled.end, end_of(&all[0]));
        assert!(settled.cut > 0);
        let log = open(&disk);
        assert_eq!(log.next_offset(), end_of(&all[0]), "the cut is durable");
    }

    #[test]
    fn prepares_held_whole_vouch_by_their_bytes() {
        let disk = MemStorage::new();
        let mut log = open(&disk);
        let a = batch_at(0, 5);
        let b = batch_at(3, 5);
        log.commit_batch(a.clone()).unwrap();
        log.commit_batch(b.clone()).unwrap();
        block_on(log.sync()).unwrap();
        let held = |bytes: &'static [u8], op| ExpectedBatch {
            op,
            base_offset: batch::peek(bytes).unwrap().base_offset,
            expected: Expected::Held(bytes),
        };
        let (a, b): (&'static [u8], &'static [u8]) = (a.to_vec().leak(), b.to_vec().leak());
        let mut log = open(&disk);
        let settled = block_on(log.settle(0, &[held(a, 1), held(b, 2)])).unwrap();
        assert_eq!((settled.end, settled.cut), (6, 0));
        assert!(settled.bodies.is_empty(), "held prepares have their bodies");
        let other: &'static [u8] = batch_at(3, 6).to_vec().leak();
        let settled = block_on(log.settle(0, &[held(a, 1), held(other, 2)])).unwrap();
        assert_eq!(settled.end, 3, "different bytes at op 2's offsets are cut");
    }

    /// Truncated prepares' bodies go, also across a rotation; the next body is written where
    /// the first truncated one was, and a crash after the rewind keeps it.
    #[test]
    fn a_rewind_cuts_back_across_a_rotation_and_the_next_body_goes_there() {
        let disk = MemStorage::new();
        let mut log = open(&disk);
        let mut all = Vec::new();
        for op in 1..=20 {
            all.push(reserve(&mut log, op, 11));
            block_on(log.flush_synced()).unwrap();
        }
        let bases = log.segment_bases();
        assert!(bases.len() >= 3, "rotated: {bases:?}");
        let to = &all[4];
        let from = batch::peek(&to.batch).unwrap().base_offset;
        block_on(log.rewind(from)).unwrap();
        assert_eq!(log.next_offset(), from);
        assert!(log.segment_bases().iter().all(|b| *b <= from));
        let names = block_on(disk.list()).unwrap();
        assert!(
            names.iter().all(|n| !bases
                .iter()
                .any(|b| *b > from && n.contains(&format!("{b:020}")))),
            "segments past the rewind are removed: {names:?}"
        );
        let again = reserve(&mut log, 5, 12);
        assert_eq!(again.at, to.at);
        block_on(log.flush_synced()).unwrap();
        disk.crash(CrashMode::LoseUnsynced, &mut Prng::new(1));
        let mut log = open(&disk);
        let mut expected: Vec<_> = all[..4].iter().map(referenced).collect();
        expected.push(referenced(&again));
        let settled = block_on(log.settle(0, &expected)).unwrap();
        assert_eq!(settled.bodies.len(), 5);
        assert_eq!(settled.bodies[4].1, again.batch);
        assert_eq!(settled.cut, 0);
    }
}
