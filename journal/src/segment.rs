//! Partition segments: committed batches materialized per the topic's flush policy
//! (journal.md §4, §5), with a sparse offset + timestamp index, and reads by offset and by
//! timestamp for polls. A batch may also be written ahead of its commit, once, at the tail
//! ([`PartitionLog::reserve`], [`PartitionLog::flush_synced`]; decision 414): the tail past
//! the committed end then holds prepared batches, which a view change cuts back
//! ([`PartitionLog::rewind`]) and a boot keeps only where the WAL vouches for them
//! ([`PartitionLog::settle`]; see the `ahead` module).
//!
//! Files per partition (names carry the partition's prefix, e.g. `p42-`):
//! - `{prefix}{base:020}.log`: stamped batches back to back (the PrepareHeader stripped),
//!   zero-padded to a sector at the end of each flush (the next flush rewrites that last
//!   sector: the log is sector-aligned for `O_DIRECT`).
//! - `{prefix}{base:020}.index`: one 24-byte entry per flush: `offset u64, timestamp u64,
//!   position u64` (LE) of the flush's first batch; zero-padded to a sector. Without
//!   `enforce_fsync` the file is written when its entries fill a sector, the segment fills, the
//!   log runs `INDEX_LAG_BYTES_MAX` (16 MiB) past it, or at [`PartitionLog::sync`] (decision
//!   491); a boot indexes the batches past its last entry (one entry per batch).
//!
//! Durability: a flush writes the committed prefix; with `enforce_fsync` it also
//! `fdatasync`s both files before returning. Without it the segment may lose recent flushes at
//! a crash; since Strand's partition prepares are durable in the shard WAL (G7 strengthened),
//! the WAL must not be reclaimed above [`PartitionLog::synced_offset`].
//! Recovery re-verifies the batches after the last index entry, cuts a torn tail, drops index
//! entries past the log end, and sweeps `.staging` files of an interrupted state transfer.

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;

use crate::batch::{self, BatchFault, BatchInfo};
use crate::file::AlignedBuf;
use crate::storage::{OpenMode, SECTOR, Storage, StorageError, read_exact_at, sector_ceil};

const INDEX_ENTRY: usize = 24;
/// Without `enforce_fsync`, a flush writes the index only when its entries fill a sector, the
/// segment fills, or the log holds this many bytes past the first entry not yet written
/// (decision 491): a boot rescans at most this much to rebuild the entries a crash took.
const INDEX_LAG_BYTES_MAX: u64 = 16 << 20;
/// How far past a segment's end its blocks are kept reserved at most (decision 514): a
/// durable append into reserved blocks writes no allocation bitmap, one device round trip fewer
/// on the path of the acknowledgement. Topped up when less than half of it is left, so one
/// `fallocate` per 8 MiB appended once a segment holds 16 MiB.
const RESERVE_AHEAD_MAX: u64 = 16 << 20;
/// How far ahead a segment reserves at least (decision 515). Between this and
/// [`RESERVE_AHEAD_MAX`] a segment reserves as far ahead as it holds, so a partition that
/// writes little holds little reserved: a node with ten thousand quiet partitions reserves
/// 2.5 GiB, not the 160 GiB a fixed 16 MiB would.
const RESERVE_AHEAD_MIN: u64 = 256 << 10;

/// Where a segment of `size` bytes at most, reserved up to `reserved` and about to hold `end`
/// bytes, should have its blocks reserved to now, if it should be topped up (decisions
/// 514-515): `end` plus as much as it holds, 256 KiB to 16 MiB, once less than half of that is
/// left, never past `size` (nor below `end`).
pub fn reservation_due(reserved: u64, end: u64, size: u64) -> Option<u64> {
    let ahead = end.clamp(RESERVE_AHEAD_MIN, RESERVE_AHEAD_MAX);
    (reserved < size && reserved < end + ahead / 2).then(|| (end + ahead).min(size.max(end)))
}

/// The topic's message durability policy (journal.md §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushPolicy {
    /// `fdatasync` segment and index writes (and offset files).
    pub enforce_fsync: bool,
    /// Flush when this many messages are held.
    pub messages_required_to_save: u64,
    /// Flush when this many bytes are held.
    pub size_of_messages_required_to_save: u64,
    /// Segment rotation size (soft: a segment seals after the flush that reaches it).
    pub segment_size: u64,
}

impl Default for FlushPolicy {
    fn default() -> Self {
        FlushPolicy {
            enforce_fsync: false,
            messages_required_to_save: 1024,
            size_of_messages_required_to_save: 1024 * 1024,
            segment_size: 1024 * 1024 * 1024,
        }
    }
}

/// Why a segment call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// The storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A batch given to commit is not intact.
    #[error("batch refused: {0}")]
    Batch(#[from] BatchFault),
    /// A committed batch whose base offset is not the next offset (G8).
    #[error("batch base offset {base_offset}, expected {expected}")]
    Offset {
        /// In the batch.
        base_offset: u64,
        /// Next offset of the partition.
        expected: u64,
    },
    /// A stored batch no longer verifies.
    #[error("segment {base} position {position}: {fault}")]
    Corrupt {
        /// Segment base offset.
        base: u64,
        /// Byte position.
        position: u64,
        /// What failed.
        fault: BatchFault,
    },
}

/// One index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset of the first message of the flush's first batch.
    pub offset: u64,
    /// Its base timestamp.
    pub timestamp: u64,
    /// Byte position in the `.log`.
    pub position: u64,
}

#[derive(Debug)]
struct Segment<F> {
    base: u64,
    end_offset: u64,
    len: u64,
    index: Vec<IndexEntry>,
    /// How many of `index`'s entries the `.index` file holds (written, maybe not synced).
    idx_written: usize,
    /// Shared with a [`SealJob`] syncing the segment apart from the flushes.
    log: Rc<F>,
    idx: Rc<F>,
    /// The `.log`'s blocks reserved so far by this process ([`Storage::reserve_blocks`]).
    reserved: u64,
}

/// What opening a partition's segments found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SegmentRecovery {
    /// Segments loaded.
    pub segments: usize,
    /// Next offset after the recovered data.
    pub next_offset: u64,
    /// Bytes cut from the last segment's tail (a torn or unsynced flush).
    pub tail_cut: u64,
    /// Index entries dropped because they pointed past the log end.
    pub index_dropped: usize,
    /// Staging files swept.
    pub staging_swept: usize,
    /// Damage inside a segment before its last index entry (data the WAL or peers must refill).
    pub damage: Vec<(u64, u64)>,
}

/// The segments of one partition.
#[derive(Debug)]
pub struct PartitionLog<S: Storage> {
    storage: S,
    prefix: String,
    policy: FlushPolicy,
    segments: Vec<Segment<S::File>>,
    pending: VecDeque<(BatchInfo, Bytes)>,
    pending_messages: u64,
    pending_bytes: u64,
    next_offset: u64,
    synced_offset: u64,
    /// The active segment's last partial sector as the last flush wrote it: `(segment base,
    /// byte offset of the sector, its bytes)`. The next flush rewrites that sector with more
    /// data after it, and takes its head from here instead of reading it back from the disk.
    tail: Option<(u64, u64, Box<[u8; SECTOR]>)>,
    /// Sealing apart from the flushes (decision 355) and the timings of segment syncs.
    seal: seal::SealState,
    /// Held batches include bodies reserved ahead of their commit ([`PartitionLog::reserve`]).
    ahead: bool,
    /// How many of the held batches are reserved ones.
    ahead_count: usize,
    /// See [`PartitionLog::rewrite_mark`].
    rewrite_mark: u64,
    /// Reservations that failed since [`PartitionLog::take_reserve_failures`] last took them.
    reserve_failures: Vec<ReserveFailure>,
}

/// A segment whose blocks could not be reserved ahead (decision 515): its appends allocate as
/// they go, and it does not ask again.
#[derive(Debug)]
pub struct ReserveFailure {
    /// The segment's base offset.
    pub segment: u64,
    /// How far the reservation was to reach.
    pub len: u64,
    /// What the storage answered.
    pub error: StorageError,
}

/// Name of a segment's log file.
pub fn log_name(prefix: &str, base: u64) -> String {
    format!("{prefix}{base:020}.log")
}

/// Name of a segment's index file.
pub fn index_name(prefix: &str, base: u64) -> String {
    format!("{prefix}{base:020}.index")
}

/// Index entries as the `.index` file holds them, back to back.
fn encode_entries<'a>(entries: impl Iterator<Item = &'a IndexEntry>) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.size_hint().0 * INDEX_ENTRY);
    for e in entries {
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.timestamp.to_le_bytes());
        out.extend_from_slice(&e.position.to_le_bytes());
    }
    out
}

/// Whether `count` entries reach past the sector that entry `written` starts in: the file
/// holds `written` entries, and a write now would complete that sector.
fn index_fills_a_sector(written: usize, count: usize) -> bool {
    count * INDEX_ENTRY >= (written * INDEX_ENTRY / SECTOR + 1) * SECTOR
}

/// The index write that brings a file holding `written` of `held`'s entries up to `held`
/// followed by `next`: its byte offset and its sectors. The sectors start where entry
/// `written` does, which need not be an entry boundary (a sector holds 170 and 2/3 entries):
/// the entries from the one that straddles it are encoded, and the bytes from there on taken.
fn index_image(held: &[IndexEntry], written: usize, next: &IndexEntry) -> (u64, AlignedBuf) {
    let count = held.len() + 1;
    let idx_at = written * INDEX_ENTRY / SECTOR * SECTOR;
    let mut idx_buf =
        AlignedBuf::zeroed(sector_ceil((count * INDEX_ENTRY - idx_at) as u64) as usize);
    let first = idx_at / INDEX_ENTRY;
    let entries = encode_entries(held.iter().chain([next]).skip(first));
    let tail = &entries[idx_at - first * INDEX_ENTRY..];
    idx_buf.as_mut_slice()[..tail.len()].copy_from_slice(tail);
    (idx_at as u64, idx_buf)
}

async fn read_all<S: Storage>(storage: &S, file: &S::File) -> Result<Vec<u8>, StorageError> {
    let len = storage.len(file).await?;
    let mut bytes = vec![0u8; sector_ceil(len) as usize];
    let n = read_exact_at(storage, file, 0, &mut bytes).await?;
    bytes.truncate(n);
    Ok(bytes)
}

/// Reads the sector at `at` into `out[..SECTOR]` and keeps its first `keep` bytes (the rest
/// zeroed): a write that starts mid-sector carries them along.
async fn carry_sector<S: Storage>(
    storage: &S,
    log: &S::File,
    at: u64,
    keep: usize,
    out: &mut [u8],
) -> Result<(), StorageError> {
    let sector = &mut out[..SECTOR];
    read_exact_at(storage, log, at, sector).await?;
    sector[keep..].fill(0);
    Ok(())
}

impl<S: Storage> PartitionLog<S> {
    /// Opens a partition's segments, recovering each (see the module docs). `offset_frontier`
    /// from the group superblock lifts the next offset (G8).
    pub async fn open(
        storage: S,
        prefix: &str,
        policy: FlushPolicy,
        offset_frontier: u64,
    ) -> Result<(PartitionLog<S>, SegmentRecovery), SegmentError> {
        Self::open_inner(storage, prefix, policy, offset_frontier, true).await
    }

    pub(crate) async fn open_inner(
        storage: S,
        prefix: &str,
        policy: FlushPolicy,
        offset_frontier: u64,
        sweep: bool,
    ) -> Result<(PartitionLog<S>, SegmentRecovery), SegmentError> {
        let mut recovery = SegmentRecovery::default();
        let mut bases = Vec::new();
        let staging = format!("staging-{prefix}");
        for name in storage.list().await? {
            if name.starts_with(&staging) && sweep {
                storage.remove(&name).await?;
                recovery.staging_swept += 1;
                continue;
            }
            let Some(rest) = name.strip_prefix(prefix) else {
                continue;
            };
            if rest.ends_with(".staging") {
                storage.remove(&name).await?;
                recovery.staging_swept += 1;
            } else if let Some(base) = rest.strip_suffix(".log").and_then(|b| b.parse().ok()) {
                bases.push(base);
            }
        }
        bases.sort_unstable();
        let mut segments = Vec::new();
        for base in bases {
            let log = storage
                .open(&log_name(prefix, base), OpenMode::Existing)
                .await?;
            let idx = storage
                .open(&index_name(prefix, base), OpenMode::Create)
                .await?;
            let log_bytes = read_all(&storage, &log).await?;
            let idx_bytes = read_all(&storage, &idx).await?;
            let mut index: Vec<IndexEntry> = idx_bytes
                .chunks_exact(INDEX_ENTRY)
                .map(|e| IndexEntry {
                    offset: u64::from_le_bytes(e[0..8].try_into().expect("8")),
                    timestamp: u64::from_le_bytes(e[8..16].try_into().expect("8")),
                    position: u64::from_le_bytes(e[16..24].try_into().expect("8")),
                })
                .collect();
            // Keep the entries that point at an intact batch with the offset they claim.
            let before = index.len();
            let mut valid = 0;
            for (i, e) in index.iter().enumerate() {
                let ok = log_bytes
                    .get(e.position as usize..)
                    .and_then(|b| batch::verify(b).ok())
                    .is_some_and(|b| b.base_offset == e.offset && b.base_timestamp == e.timestamp)
                    && (i == 0 || e.position > index[i - 1].position);
                if !ok {
                    break;
                }
                valid = i + 1;
            }
            index.truncate(valid);
            recovery.index_dropped += before - valid;
            // Scan forward from the last indexed batch to the end of intact data. Batches past
            // it get entries here (the file lags by design, decision 491); the next index write
            // records them.
            let mut at = index.last().map_or(0, |e| e.position as usize);
            let mut end_offset = index.last().map_or(base, |e| e.offset);
            while let Ok(info) = batch::verify(&log_bytes[at.min(log_bytes.len())..]) {
                if index.last().is_none_or(|e| e.position < at as u64) {
                    index.push(IndexEntry {
                        offset: info.base_offset,
                        timestamp: info.base_timestamp,
                        position: at as u64,
                    });
                }
                at += info.len as usize;
                end_offset = info.end_offset();
            }
            let tail = &log_bytes[at.min(log_bytes.len())..];
            if tail.iter().any(|b| *b != 0) {
                recovery.tail_cut += tail.len() as u64;
            }
            segments.push(Segment {
                base,
                end_offset,
                len: at as u64,
                index,
                idx_written: valid,
                log: Rc::new(log),
                idx: Rc::new(idx),
                reserved: 0,
            });
        }
        // A segment starts where the previous one ends. An empty later segment after a lost
        // unsynced tail is dropped (its flushes never landed); data after a hole is damage.
        let mut i = 1;
        while i < segments.len() {
            let end = segments[i - 1].end_offset;
            if segments[i].base != end {
                if segments[i].len == 0 && i + 1 == segments.len() {
                    let seg = segments.remove(i);
                    storage.remove(&log_name(prefix, seg.base)).await?;
                    storage.remove(&index_name(prefix, seg.base)).await?;
                    continue;
                }
                recovery.damage.push((end, segments[i].base));
            }
            i += 1;
        }
        recovery.segments = segments.len();
        let data_end = segments.last().map_or(0, |s| s.end_offset);
        let next_offset = data_end.max(offset_frontier);
        recovery.next_offset = next_offset;
        let mut log = PartitionLog {
            storage,
            prefix: prefix.to_owned(),
            policy,
            segments,
            pending: VecDeque::new(),
            pending_messages: 0,
            pending_bytes: 0,
            next_offset,
            synced_offset: data_end,
            tail: None,
            seal: seal::SealState::default(),
            ahead: false,
            ahead_count: 0,
            rewrite_mark: extents::fresh_mark(),
            reserve_failures: Vec::new(),
        };
        if let Some(last) = log.segments.last() {
            // Zero the cut tail so the next flush starts clean.
            let len = last.len;
            if recovery.tail_cut > 0 || data_end < next_offset {
                log.rewrite_tail(len).await?;
            }
            if data_end < next_offset {
                // The frontier is ahead of the data: start a new segment there.
                log.start_segment(next_offset).await?;
            }
        }
        Ok((log, recovery))
    }

    /// Writes the active segment's index entries its file does not hold yet (decision 491).
    async fn write_index_lag(&mut self) -> Result<(), SegmentError> {
        let Some(seg) = self.segments.last_mut() else {
            return Ok(());
        };
        let Some((last, held)) = seg.index.split_last() else {
            return Ok(());
        };
        if seg.idx_written == seg.index.len() {
            return Ok(());
        }
        let (at, buf) = index_image(held, seg.idx_written, last);
        self.storage.write_at(&seg.idx, at, buf.as_slice()).await?;
        seg.idx_written = seg.index.len();
        Ok(())
    }

    async fn rewrite_tail(&mut self, len: u64) -> Result<(), SegmentError> {
        self.tail = None;
        let last = self.segments.last().expect("a segment");
        let at = len / SECTOR as u64 * SECTOR as u64;
        let mut buf = AlignedBuf::zeroed(SECTOR);
        let keep = (len - at) as usize;
        carry_sector(&self.storage, &last.log, at, keep, buf.as_mut_slice()).await?;
        self.storage.write_at(&last.log, at, buf.as_slice()).await?;
        self.storage.set_len(&last.log, sector_ceil(len)).await?;
        self.storage.sync(&last.log).await?;
        // The truncation freed the blocks reserved past the new end (decision 514): the next
        // flush reserves again.
        self.segments.last_mut().expect("a segment").reserved = 0;
        Ok(())
    }

    async fn start_segment(&mut self, base: u64) -> Result<(), SegmentError> {
        self.tail = None;
        let log = self
            .storage
            .open(&log_name(&self.prefix, base), OpenMode::Create)
            .await?;
        let idx = self
            .storage
            .open(&index_name(&self.prefix, base), OpenMode::Create)
            .await?;
        self.segments.push(Segment {
            base,
            end_offset: base,
            len: 0,
            index: Vec::new(),
            idx_written: 0,
            log: Rc::new(log),
            idx: Rc::new(idx),
            reserved: 0,
        });
        Ok(())
    }

    /// The next offset to mint (G8).
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The offset up to which segments are written and synced.
    pub fn synced_offset(&self) -> u64 {
        self.synced_offset
    }

    /// Base offsets of the segments.
    pub fn segment_bases(&self) -> Vec<u64> {
        self.segments.iter().map(|s| s.base).collect()
    }

    /// Hands a committed batch to the log (kept in memory until a flush). Its base offset must
    /// be the next offset. A `Vec` or shared `Bytes` (the node's in-memory copy) is kept as is,
    /// without a copy.
    pub fn commit_batch(&mut self, bytes: impl Into<Bytes>) -> Result<(), SegmentError> {
        let bytes: Bytes = bytes.into();
        let info = batch::verify(&bytes)?;
        self.hold(info, bytes)
    }

    /// [`PartitionLog::commit_batch`] for a batch whose messages the caller has verified: the
    /// body of a committed prepare, whose checksum covers these bytes and which the primary
    /// verified message by message when it admitted the request (consensus.md §14). Only the
    /// header is read here (offsets, count, length, which must be the whole of `bytes`); the
    /// messages are not hashed a third time. Batches read back from a segment are still
    /// verified whole before they are served.
    pub fn commit_verified_batch(&mut self, bytes: Bytes) -> Result<(), SegmentError> {
        let info = batch::peek(&bytes).ok_or(BatchFault::Truncated)?;
        if info.len != bytes.len() as u64 {
            return Err(BatchFault::Layout.into());
        }
        self.hold(info, bytes)
    }

    /// Takes the body of a prepare that is not committed yet, to be written with the next
    /// [`PartitionLog::flush_synced`] (decision 414: a batch is written once, at its segment's
    /// tail, before the prepare is acknowledged). Returns where it will be, `(segment base,
    /// byte position)`, or `None` when it cannot go there now: it does not start at the next
    /// offset (an op that arrived out of order, or a re-sent one), or a full segment waits
    /// for its seal. Like [`PartitionLog::commit_verified_batch`] only its header is read.
    pub fn reserve(&mut self, bytes: Bytes) -> Option<(u64, u64)> {
        let info = batch::peek(&bytes)?;
        if info.len != bytes.len() as u64
            || info.base_offset != self.next_offset
            || self.seal.sealing.is_some()
        {
            return None;
        }
        let at = match self.segments.last() {
            Some(seg) => (seg.base, seg.len + self.pending_bytes),
            // `flush` starts the first segment at the first held batch.
            None => (
                self.pending
                    .front()
                    .map_or(info.base_offset, |(i, _)| i.base_offset),
                self.pending_bytes,
            ),
        };
        self.hold(info, bytes).ok()?;
        self.ahead = true;
        self.ahead_count += 1;
        Some(at)
    }

    /// Gives back the last reservation, of the batch starting at `base_offset`, when its
    /// prepare could not be journaled: it is dropped before anything is written, and the
    /// next offset goes back to it. `false` (nothing changed) when the last held batch is not
    /// that one or was not reserved.
    pub fn unreserve(&mut self, base_offset: u64) -> bool {
        let last = self.pending.back().map(|(info, _)| *info);
        match last {
            Some(info) if self.ahead && info.base_offset == base_offset => {
                self.pending.pop_back();
                self.pending_bytes -= info.len;
                self.pending_messages -= info.message_count as u64;
                self.next_offset = base_offset;
                self.ahead = !self.pending.is_empty() && self.ahead_count > 1;
                self.ahead_count -= 1;
                true
            }
            _ => false,
        }
    }

    /// Whether held batches include bodies reserved ahead ([`PartitionLog::reserve`]): the
    /// caller must [`PartitionLog::flush_synced`] before it acknowledges them.
    pub fn has_reserved(&self) -> bool {
        self.ahead
    }

    fn hold(&mut self, info: BatchInfo, bytes: Bytes) -> Result<(), SegmentError> {
        if info.base_offset != self.next_offset {
            return Err(SegmentError::Offset {
                base_offset: info.base_offset,
                expected: self.next_offset,
            });
        }
        self.next_offset = info.end_offset();
        self.pending_messages += info.message_count as u64;
        self.pending_bytes += info.len;
        self.pending.push_back((info, bytes));
        Ok(())
    }

    /// The flush policy's verdict: the held messages or bytes (committed here plus the
    /// caller's uncommitted tail) reach a threshold, or the active segment is full.
    pub fn should_flush(&self, uncommitted_messages: u64, uncommitted_bytes: u64) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        let active = self.segments.last().map_or(0, |s| s.len);
        self.pending_messages + uncommitted_messages >= self.policy.messages_required_to_save
            || self.pending_bytes + uncommitted_bytes
                >= self.policy.size_of_messages_required_to_save
            || active + self.pending_bytes >= self.policy.segment_size
    }

    /// Writes every held committed batch to the active segment with one index entry, syncing
    /// both files when the policy enforces fsync, and rotates a full segment. On error the
    /// batches stay held for a retry (the caller fail-stops in practice).
    pub async fn flush(&mut self) -> Result<(), SegmentError> {
        self.flush_inner(false).await
    }

    /// [`PartitionLog::flush`], then the `.log`'s `fdatasync` whatever the policy, so that
    /// everything held (bodies reserved ahead included) is durable when it returns. When the
    /// log held nothing unsynced, its write is a durable one instead, with no sync after it
    /// (decision 496). A
    /// segment it fills is sealed inline (its log is synced already: only the index's sync is
    /// added). The WAL window that references the reserved bodies is acknowledged after this.
    pub async fn flush_synced(&mut self) -> Result<(), SegmentError> {
        if !self.pending.is_empty() {
            return self.flush_inner(true).await;
        }
        // Nothing held: still sync what an unsynced flush wrote since the last sync.
        match self.segments.last() {
            Some(seg) if self.seal.dirty > 0 && self.seal.sealing.is_none() => {
                let started = Instant::now();
                self.storage.sync(&seg.log).await?;
                self.synced_offset = seg.end_offset;
                let bytes = self.seal.dirty;
                self.seal.timed(started.elapsed(), bytes);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    async fn flush_inner(&mut self, synced: bool) -> Result<(), SegmentError> {
        if self.ahead && self.seal.sealing.is_some() {
            // `reserve` refuses while a seal runs, and only a flush starts one: reserved
            // bodies can never wait here (they would be acknowledged unwritten).
            return Err(SegmentError::Offset {
                base_offset: self.pending.front().map_or(0, |(i, _)| i.base_offset),
                expected: self.seal.sealing.unwrap_or(0),
            });
        }
        if self.pending.is_empty() || self.seal.sealing.is_some() {
            // While a sealed segment syncs apart, the batches stay held (decision 355).
            return Ok(());
        }
        if self.segments.is_empty() {
            let base = self.pending.front().expect("non-empty").0.base_offset;
            self.start_segment(base).await?;
        }
        {
            let seg = self.segments.last_mut().expect("a segment");
            let end = seg.len + self.pending_bytes;
            if let Some(to) = reservation_due(seg.reserved, end, self.policy.segment_size) {
                // A hint (decision 514): where it fails (a filesystem without it, no space to
                // reserve) appends allocate as they go, and this segment does not ask again.
                seg.reserved = match self.storage.reserve_blocks(&seg.log, to).await {
                    Ok(()) => to,
                    Err(error) => {
                        self.reserve_failures.push(ReserveFailure {
                            segment: seg.base,
                            len: to,
                            error,
                        });
                        u64::MAX
                    }
                };
            }
        }
        let seg = self.segments.last().expect("a segment");
        let first = self.pending.front().expect("non-empty").0;
        let at = seg.len / SECTOR as u64 * SECTOR as u64;
        let keep = (seg.len - at) as usize;
        let total = keep + self.pending_bytes as usize;
        let end = seg.len + self.pending_bytes;
        let tail_at = end / SECTOR as u64 * SECTOR as u64;
        // The sector the write starts in: its first `keep` bytes are carried along, from the
        // last flush's copy or read back; after the write it holds the new partial tail.
        let mut sector = match self.tail.take() {
            Some((base, cached_at, sector)) if base == seg.base && cached_at == at => sector,
            other => {
                let mut sector = other.map_or_else(|| Box::new([0u8; SECTOR]), |(_, _, s)| s);
                if keep > 0 {
                    carry_sector(&self.storage, &seg.log, at, keep, &mut sector[..]).await?;
                }
                sector
            }
        };
        let pending = &self.pending;
        let fill = |buf: &mut [u8]| {
            buf[..keep].copy_from_slice(&sector[..keep]);
            let mut cursor = keep;
            for (info, bytes) in pending {
                buf[cursor..cursor + info.len as usize].copy_from_slice(bytes);
                cursor += info.len as usize;
            }
            // The buffer holds an earlier write's bytes past the batches: the sector's tail
            // is written as zeros, as a fresh buffer would have it.
            buf[cursor..].fill(0);
            if tail_at < end {
                let from = (tail_at - at) as usize;
                sector.copy_from_slice(&buf[from..from + SECTOR]);
            }
        };
        // The batches are gathered straight into the buffer the write goes out from. When
        // this flush must be synced and the log holds nothing unsynced before it, the write
        // is a durable one and needs no sync after it (decision 496).
        let enforce = self.policy.enforce_fsync;
        let durable = synced && !enforce && self.seal.dirty == 0;
        let len = sector_ceil(total as u64) as usize;
        let started = Instant::now();
        if durable {
            self.storage
                .write_filled_durable(&seg.log, at, len, fill)
                .await?;
        } else {
            self.storage.write_filled(&seg.log, at, len, fill).await?;
        }
        let written_durably = durable.then(|| started.elapsed());
        let entry = IndexEntry {
            offset: first.base_offset,
            timestamp: first.base_timestamp,
            position: seg.len,
        };
        // The index is not what makes the batches durable (recovery rebuilds what it lacks by
        // a scan), so without `enforce_fsync` it is written only when its entries fill a
        // sector, the segment fills (its seal syncs the index), or the log runs far ahead of
        // it (decision 491): one write per 170 flushes instead of one per flush.
        let lag_from = seg
            .index
            .get(seg.idx_written)
            .map_or(entry.position, |e| e.position);
        let write_index = enforce
            || index_fills_a_sector(seg.idx_written, seg.index.len() + 1)
            || end - lag_from >= INDEX_LAG_BYTES_MAX
            || end >= self.policy.segment_size;
        let idx_image = write_index.then(|| index_image(&seg.index, seg.idx_written, &entry));
        // The index entry goes out beside the log's sync, not before it, and only once the
        // log's bytes are written, as before. One device round trip fewer on the path of the
        // acknowledgement.
        let storage = &self.storage;
        let index = async {
            let Some((idx_at, idx_buf)) = &idx_image else {
                return Ok(());
            };
            storage
                .write_at(&seg.idx, *idx_at, idx_buf.as_slice())
                .await?;
            if enforce {
                storage.sync(&seg.idx).await?;
            }
            Ok::<(), StorageError>(())
        };
        let log = async {
            if !(enforce || synced) || durable {
                return Ok(written_durably);
            }
            let started = Instant::now();
            storage.sync(&seg.log).await?;
            Ok::<_, StorageError>(Some(started.elapsed()))
        };
        let (indexed, log_synced) = futures_lite::future::zip(index, log).await;
        indexed?;
        let log_synced = log_synced?;
        self.seal.dirty += self.pending_bytes;
        if let Some(elapsed) = log_synced {
            let bytes = self.seal.dirty;
            self.seal.timed(elapsed, bytes);
        }
        let last = self.pending.back().expect("non-empty").0;
        let seg = self.segments.last_mut().expect("a segment");
        seg.len += self.pending_bytes;
        seg.end_offset = last.end_offset();
        seg.index.push(entry);
        if idx_image.is_some() {
            seg.idx_written = seg.index.len();
        }
        if tail_at < seg.len {
            self.tail = Some((seg.base, tail_at, sector));
        }
        self.pending.clear();
        self.pending_bytes = 0;
        self.pending_messages = 0;
        self.ahead = false;
        self.ahead_count = 0;
        if self.policy.enforce_fsync || synced {
            self.synced_offset = seg.end_offset;
        }
        if seg.len >= self.policy.segment_size {
            // A sealed segment is synced before the next one exists, so a crash never leaves
            // data after a hole (once per segment, whatever the policy).
            let next = seg.end_offset;
            if synced && !self.policy.enforce_fsync {
                self.storage.sync(&seg.idx).await?;
            } else if !self.policy.enforce_fsync {
                if self.seal.apart {
                    // The sync runs as a [`SealJob`]; the next segment is created when it is
                    // done (decision 355).
                    self.seal.sealing = Some(next);
                    return Ok(());
                }
                self.sync_sealed().await?;
            }
            self.start_segment(next).await?;
        }
        Ok(())
    }

    /// Syncs the active segment's files (a forced flush point: shutdown, a state-transfer
    /// offer, WAL reclamation) and returns the synced offset.
    pub async fn sync(&mut self) -> Result<u64, SegmentError> {
        if let Some(next) = self.seal.sealing {
            // A forced point does not wait for the job: the seal is finished here, the job's
            // later answer is stale and ignored.
            self.sync_sealed().await?;
            self.seal.sealing = None;
            self.seal.job = None;
            self.start_segment(next).await?;
        }
        self.flush().await?;
        let started = Instant::now();
        let unsynced = self.unsynced_bytes();
        self.write_index_lag().await?;
        for seg in self.segments.iter().rev().take(2) {
            self.storage.sync(&seg.log).await?;
            self.storage.sync(&seg.idx).await?;
        }
        self.seal.timed(started.elapsed(), unsynced);
        self.synced_offset = self.segments.last().map_or(0, |s| s.end_offset);
        Ok(self.synced_offset)
    }

    /// Up to `bytes_max` bytes of whole batches starting with the batch that holds `offset`
    /// (at least one batch if any holds it). Every batch is verified before it is returned.
    pub async fn read_from_offset(
        &self,
        offset: u64,
        bytes_max: u64,
    ) -> Result<Vec<u8>, SegmentError> {
        self.read_where(|info| info.end_offset() > offset, bytes_max)
            .await
    }

    /// Up to `bytes_max` bytes of whole batches from the first batch with
    /// `base_timestamp >= timestamp`.
    pub async fn read_from_timestamp(
        &self,
        timestamp: u64,
        bytes_max: u64,
    ) -> Result<Vec<u8>, SegmentError> {
        self.read_where(|info| info.base_timestamp >= timestamp, bytes_max)
            .await
    }

    async fn read_where(
        &self,
        wanted: impl Fn(&BatchInfo) -> bool,
        bytes_max: u64,
    ) -> Result<Vec<u8>, SegmentError> {
        let mut out = Vec::new();
        for seg in &self.segments {
            if seg.len == 0 || (!out.is_empty() && out.len() as u64 >= bytes_max) {
                continue;
            }
            let last = BatchInfo {
                base_offset: seg.end_offset.saturating_sub(1),
                base_timestamp: u64::MAX,
                message_count: 1,
                len: 0,
            };
            if out.is_empty() && !wanted(&last) {
                continue;
            }
            // The last index entry whose batch is not yet wanted bounds the scan's start.
            let start = if out.is_empty() {
                let probe = |e: &IndexEntry| {
                    !wanted(&BatchInfo {
                        base_offset: e.offset,
                        base_timestamp: e.timestamp,
                        message_count: 1,
                        len: 0,
                    })
                };
                let i = seg.index.partition_point(probe);
                seg.index[..i].last().map_or(0, |e| e.position)
            } else {
                0
            };
            let from = start / SECTOR as u64 * SECTOR as u64;
            let mut bytes = vec![0u8; sector_ceil(seg.len - from) as usize];
            read_exact_at(&self.storage, &seg.log, from, &mut bytes).await?;
            let mut at = (start - from) as usize;
            let end = (seg.len - from) as usize;
            while at < end {
                let info =
                    batch::verify(&bytes[at..end]).map_err(|fault| SegmentError::Corrupt {
                        base: seg.base,
                        position: from + at as u64,
                        fault,
                    })?;
                if !out.is_empty() || wanted(&info) {
                    if !out.is_empty() && out.len() as u64 + info.len > bytes_max {
                        return Ok(out);
                    }
                    out.extend_from_slice(&bytes[at..at + info.len as usize]);
                }
                at += info.len as usize;
            }
        }
        for (info, bytes) in &self.pending {
            if !out.is_empty() && out.len() as u64 + info.len > bytes_max {
                break;
            }
            if !out.is_empty() || wanted(info) {
                out.extend_from_slice(bytes);
            }
        }
        Ok(out)
    }

    /// The raw `.log` bytes of the segment at `base` (a SEGMENT_LOG artifact): flushed data
    /// only, without the sector padding.
    pub async fn segment_bytes(&self, base: u64) -> Result<Option<Vec<u8>>, SegmentError> {
        let Some(seg) = self.segments.iter().find(|s| s.base == base) else {
            return Ok(None);
        };
        let mut bytes = vec![0u8; sector_ceil(seg.len) as usize];
        read_exact_at(&self.storage, &seg.log, 0, &mut bytes).await?;
        bytes.truncate(seg.len as usize);
        Ok(Some(bytes))
    }
}

mod ahead;
mod extents;
mod install;
mod seal;
pub use ahead::{Expected, ExpectedBatch, Settled};
pub use extents::Extent;
pub use install::install_from_file;
pub use seal::{SealDone, SealJob, SyncTiming};

#[cfg(test)]
mod tests;
