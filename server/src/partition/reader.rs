//! The partition read path beyond the in-memory tail (decisions 280-283).
//!
//! A partition's state machine keeps only a bounded tail of committed batches in memory
//! ([`crate::partition::machine::PartitionStateMachine`]); everything the storage task has
//! written to the segments may leave it. The storage task publishes where that data is in a
//! [`SegmentMap`] shared with the machine (same shard, same thread): per segment its file name,
//! written length, end offset and sparse index. From it:
//! - a poll older than the tail becomes a [`DiskPoll`], which the client core awaits: it reads
//!   the segment files by chunk through the shard's [`SegmentFiles`] (the journal's `Storage`,
//!   `O_DIRECT` reads on the executor, never `std::fs`), verifies every batch, and builds the
//!   same reply the tail would have built;
//! - a boot streams the segments once ([`scan`]) to rebuild the tail and the running checksum
//!   of the SEGMENT_LOG, holding one chunk and the tail at a time.
//!
//! Segment data is untrusted: a batch that does not verify is a typed [`ReadError`] and a log
//! line at the caller, never a panic.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;

use bytes::Bytes;
use journal::batch::{self, BatchFault, BatchInfo};
use journal::segment::{IndexEntry, PartitionLog};
use journal::storage::{OpenMode, SECTOR, Storage, StorageError, sector_ceil};
use xxhash_rust::xxh3::Xxh3Default;

use crate::partition::{Poll, PollBuilder, Start};

/// Bytes read from a segment file per storage call.
pub const READ_CHUNK: usize = 256 << 10;

/// Size of a batch header (the part `batch::peek` needs).
const BATCH_HEAD: usize = crate::client::request::BATCH_HEADER_SIZE;

/// Why a read from the segments failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The storage failed.
    #[error("segment {name}: {error}")]
    Storage {
        /// The file.
        name: String,
        /// What failed.
        error: StorageError,
    },
    /// A stored batch does not verify, or does not follow the one before it.
    #[error("segment {name} position {position}: {fault}")]
    Corrupt {
        /// The file.
        name: String,
        /// Byte position in it.
        position: u64,
        /// What is wrong.
        fault: String,
    },
}

/// A future the read path awaits on the shard's executor.
pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// Reads of a partition directory's files, object safe so that the (non-generic) host can hand
/// a poll's reads to the client core.
pub trait SegmentFiles {
    /// Up to `len` bytes of `name` from `position` (fewer at the end of the file), in one
    /// buffer the caller shares out by slices.
    fn read(
        &self,
        name: String,
        position: u64,
        len: usize,
    ) -> LocalFuture<Result<Bytes, ReadError>>;
}

/// [`SegmentFiles`] over a journal [`Storage`] (`DmaStorage` on the node).
#[derive(Debug, Clone)]
pub struct StorageFiles<S>(pub S);

impl<S: Storage + Clone + 'static> SegmentFiles for StorageFiles<S> {
    fn read(
        &self,
        name: String,
        position: u64,
        len: usize,
    ) -> LocalFuture<Result<Bytes, ReadError>> {
        let storage = self.0.clone();
        Box::pin(async move {
            let fail = |error| ReadError::Storage {
                name: name.clone(),
                error,
            };
            let file = storage
                .open(&name, OpenMode::Existing)
                .await
                .map_err(fail)?;
            // Aligned for O_DIRECT: from the sector holding `position`.
            let from = position / SECTOR as u64 * SECTOR as u64;
            let skip = (position - from) as usize;
            // One read of the whole range into a buffer nobody zeroes; the sector head before
            // `position` is sliced off, not moved (decision 406).
            let buf = storage
                .read_vec(&file, from, sector_ceil((skip + len) as u64) as usize)
                .await
                .map_err(fail)?;
            let end = buf.len().min(skip + len);
            Ok(Bytes::from(buf).slice(skip.min(end)..end))
        })
    }
}

/// One segment in a [`SegmentMap`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedSegment {
    /// Its `.log` file name in the partition directory.
    pub name: String,
    /// Base offset.
    pub base: u64,
    /// Written bytes of whole batches.
    pub len: u64,
    /// The offset after its last written batch.
    pub end_offset: u64,
    /// Sparse index (one entry per flush).
    pub index: Vec<IndexEntry>,
}

/// Where a partition's written batches are, as the storage task last published it.
#[derive(Clone, Default)]
pub struct SegmentMap {
    /// Segments, oldest first.
    pub segments: Vec<MappedSegment>,
    /// Reads of the files (`None`: nothing to read, every batch stays in memory).
    pub files: Option<Rc<dyn SegmentFiles>>,
    /// The partition directory, for a state-transfer offer's chunk reads (`None`: in-memory
    /// storage; then nothing leaves memory either).
    pub dir: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for SegmentMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentMap")
            .field("segments", &self.segments.len())
            .field("end_offset", &self.end_offset())
            .finish()
    }
}

/// A map shared by a group's storage task (writer) and its state machine (reader).
pub type SharedMap = Rc<RefCell<SegmentMap>>;

impl SegmentMap {
    /// The offset after the last written batch (`None`: nothing written).
    pub fn end_offset(&self) -> Option<u64> {
        self.segments
            .iter()
            .rev()
            .find(|s| s.len > 0)
            .map(|s| s.end_offset)
    }

    /// The first offset written (`None`: nothing written).
    pub fn first_offset(&self) -> Option<u64> {
        self.segments.iter().find(|s| s.len > 0).map(|s| s.base)
    }

    /// Brings the map up to `log`'s extents: only what changed is copied (the active
    /// segment's new index entries), so a flush costs O(its entries).
    pub fn refresh<S: Storage>(&mut self, log: &PartitionLog<S>) {
        let mut n = 0;
        for extent in log.extents() {
            match self.segments.get_mut(n) {
                Some(seg)
                    if seg.base == extent.base
                        && seg.index.len() <= extent.index.len()
                        && seg.name == log.extent_name(extent.base) =>
                {
                    let have = seg.index.len();
                    if extent.index[..have] != seg.index[..] {
                        seg.index = extent.index.to_vec();
                    } else {
                        seg.index.extend_from_slice(&extent.index[have..]);
                    }
                    seg.len = extent.len;
                    seg.end_offset = extent.end_offset;
                }
                _ => {
                    self.segments.truncate(n);
                    self.segments.push(MappedSegment {
                        name: log.extent_name(extent.base),
                        base: extent.base,
                        len: extent.len,
                        end_offset: extent.end_offset,
                        index: extent.index.to_vec(),
                    });
                }
            }
            n += 1;
        }
        self.segments.truncate(n);
    }

    /// Where a read for `start` begins: the segments from the first one that may hold it, the
    /// first starting at the last index entry before `start` (0 when none). With each, the
    /// bytes its first read asks for (decision 407): from an offset, up to the first index
    /// entry at or past `start + count` (no batch there holds a wanted message), so that a
    /// poll is one read per segment; at most `bytes_max`; [`READ_CHUNK`] from a timestamp.
    fn plan(&self, start: Start, count: u32, bytes_max: usize) -> Vec<(MappedSegment, u64, usize)> {
        let wanted = |offset: u64, timestamp: u64| match start {
            Start::Offset(o) => offset >= o,
            Start::Timestamp(t) => timestamp >= t,
        };
        let read_len = |seg: &MappedSegment, position: u64| match start {
            Start::Offset(o) => {
                let end = o.saturating_add(u64::from(count.max(1)));
                let stop = seg
                    .index
                    .iter()
                    .find(|e| e.offset >= end && e.position > position)
                    .map_or(seg.len, |e| e.position);
                usize::try_from(stop.saturating_sub(position))
                    .unwrap_or(usize::MAX)
                    .clamp(SECTOR, bytes_max.max(SECTOR))
            }
            Start::Timestamp(_) => READ_CHUNK,
        };
        let mut out = Vec::new();
        for seg in self.segments.iter().filter(|s| s.len > 0) {
            if out.is_empty() {
                if let Start::Offset(o) = start
                    && seg.end_offset <= o
                {
                    continue;
                }
                let i = seg
                    .index
                    .partition_point(|e| !wanted(e.offset, e.timestamp));
                let position = seg.index[..i].last().map_or(0, |e| e.position);
                out.push((seg.clone(), position, read_len(seg, position)));
            } else {
                if let Start::Offset(o) = start
                    && seg.base >= o.saturating_add(u64::from(count.max(1)))
                {
                    break; // holds no wanted message
                }
                out.push((seg.clone(), 0, read_len(seg, 0)));
            }
        }
        out
    }
}

/// Whole verified batches read in order from a segment, by chunk; each batch is a slice of
/// the read that holds it (no copy), unless it straddles two reads.
struct BatchCursor<'a> {
    files: &'a dyn SegmentFiles,
    seg: &'a MappedSegment,
    /// File position of `window[0]`.
    window_at: u64,
    window: Bytes,
    /// File position of the next batch.
    at: u64,
    /// Bytes asked of the next read (at least what the next batch needs).
    read_len: usize,
}

impl<'a> BatchCursor<'a> {
    fn new(files: &'a dyn SegmentFiles, seg: &'a MappedSegment, at: u64, read_len: usize) -> Self {
        BatchCursor {
            files,
            seg,
            window_at: at,
            window: Bytes::new(),
            at,
            read_len: read_len.max(SECTOR),
        }
    }

    fn corrupt(&self, fault: impl std::fmt::Display) -> ReadError {
        ReadError::Corrupt {
            name: self.seg.name.clone(),
            position: self.at,
            fault: fault.to_string(),
        }
    }

    /// Makes `window` hold `need` bytes from `at` (never past the written length).
    async fn fill(&mut self, need: usize) -> Result<(), ReadError> {
        let have_from = (self.at - self.window_at) as usize;
        if self.window.len() >= have_from + need {
            return Ok(());
        }
        // Keep the unread part, read the rest.
        let rest = self.window.slice(have_from.min(self.window.len())..);
        self.window_at = self.at;
        let next = self.window_at + rest.len() as u64;
        let want = (need - rest.len()).max(self.read_len);
        let len = want.min((self.seg.len - next) as usize);
        self.window = if len == 0 {
            rest
        } else {
            let bytes = self.files.read(self.seg.name.clone(), next, len).await?;
            if rest.is_empty() {
                bytes
            } else {
                // A batch across two reads: only then are its bytes joined.
                let mut joined = Vec::with_capacity(rest.len() + bytes.len());
                joined.extend_from_slice(&rest);
                joined.extend_from_slice(&bytes);
                Bytes::from(joined)
            }
        };
        if self.window.len() < need {
            return Err(self.corrupt("the segment ends inside a batch"));
        }
        Ok(())
    }

    /// The next batch (its info and bytes), verified; `None` at the written end.
    async fn next(&mut self) -> Result<Option<(BatchInfo, Bytes)>, ReadError> {
        if self.at >= self.seg.len {
            return Ok(None);
        }
        let head = BATCH_HEAD.min((self.seg.len - self.at) as usize);
        self.fill(head).await?;
        let from = (self.at - self.window_at) as usize;
        let info =
            batch::peek(&self.window[from..]).ok_or_else(|| self.corrupt(BatchFault::Truncated))?;
        let len = usize::try_from(info.len).map_err(|_| self.corrupt("batch length"))?;
        if info.len > self.seg.len - self.at {
            return Err(self.corrupt("a batch runs past the written end"));
        }
        self.fill(len).await?;
        let from = (self.at - self.window_at) as usize;
        let bytes = self.window.slice(from..from + len);
        // Segment data is untrusted: every batch read is verified, once (decision 405).
        let info = batch::verify(&bytes).map_err(|f| self.corrupt(f))?;
        self.at += info.len;
        Ok(Some((info, bytes)))
    }
}

/// A poll that starts below the in-memory tail: read from the segments, then continued from
/// the tail batches it carries.
pub struct DiskPoll {
    pub(crate) files: Rc<dyn SegmentFiles>,
    pub(crate) segments: Vec<(MappedSegment, u64, usize)>,
    /// Batches from this offset on come from `tail`.
    pub(crate) tail_first: u64,
    pub(crate) tail: Vec<Bytes>,
    pub(crate) partition: u32,
    pub(crate) current: Option<u64>,
    pub(crate) start: Start,
    pub(crate) count: u32,
    pub(crate) bytes_max: usize,
}

impl std::fmt::Debug for DiskPoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskPoll")
            .field("start", &self.start)
            .field("tail_first", &self.tail_first)
            .field("count", &self.count)
            .finish()
    }
}

impl DiskPoll {
    pub(crate) fn new(
        map: &SegmentMap,
        files: Rc<dyn SegmentFiles>,
        start: Start,
        tail_first: u64,
        tail: Vec<Bytes>,
        (partition, current, count, bytes_max): (u32, Option<u64>, u32, usize),
    ) -> DiskPoll {
        DiskPoll {
            files,
            segments: map.plan(start, count, bytes_max),
            tail_first,
            tail,
            partition,
            current,
            start,
            count,
            bytes_max,
        }
    }

    /// Reads the batches and builds the reply (client-plane.md §8.3), exactly as the tail
    /// would have: whole batches from the one holding the start, at most `bytes_max` bytes
    /// (one batch at least), at most `count` messages. Batches read from the segments are
    /// verified once, as they are read; the tail's batches were verified at commit.
    pub async fn read(self) -> Result<Poll, ReadError> {
        let wanted = |info: &BatchInfo| match self.start {
            Start::Offset(o) => info.end_offset() > o,
            Start::Timestamp(t) => info.base_timestamp >= t,
        };
        let mut reply = PollBuilder::new(Some(self.start), self.count);
        let mut held = 0usize;
        let mut full = false;
        'segments: for (seg, position, read_len) in &self.segments {
            let mut cursor = BatchCursor::new(&*self.files, seg, *position, *read_len);
            while let Some((info, bytes)) = cursor.next().await? {
                if info.base_offset >= self.tail_first {
                    break 'segments;
                }
                if held > 0 || wanted(&info) {
                    if held > 0 && held + bytes.len() > self.bytes_max {
                        full = true;
                        break 'segments;
                    }
                    reply.push(&info, &bytes);
                    held += bytes.len();
                    if !reply.wants_more() {
                        full = true;
                        break 'segments;
                    }
                }
            }
        }
        if !full {
            for b in &self.tail {
                let Some(info) = batch::peek(b) else { break };
                if held > 0 && held + b.len() > self.bytes_max {
                    break;
                }
                if held == 0 && !wanted(&info) {
                    continue;
                }
                reply.push(&info, b);
                held += b.len();
                if !reply.wants_more() {
                    break;
                }
            }
        }
        Ok(reply.finish(self.partition, self.current))
    }
}

/// What a boot's pass over the segments found.
#[derive(Clone)]
pub struct Scan {
    /// The last batches, oldest first, at most `tail_bytes` (one at least when any).
    pub tail: VecDeque<Bytes>,
    /// XXH3 streaming state over every batch from the first (the SEGMENT_LOG's checksum).
    pub hasher: Xxh3Default,
    /// Bytes hashed.
    pub len: u64,
    /// The first batch's base offset.
    pub first: Option<u64>,
    /// The offset after the last batch read.
    pub end: Option<u64>,
}

/// Streams every written batch below `until` (whole batches only, contiguous offsets), chunk
/// by chunk: the tail of at most `tail_bytes` and the running checksum come back; memory is
/// one chunk and the tail.
pub async fn scan(
    map: &SegmentMap,
    files: &dyn SegmentFiles,
    until: u64,
    tail_bytes: usize,
) -> Result<Scan, ReadError> {
    let mut scan = Scan {
        tail: VecDeque::new(),
        hasher: Xxh3Default::new(),
        len: 0,
        first: None,
        end: None,
    };
    let mut held = 0usize;
    'segments: for seg in map.segments.iter().filter(|s| s.len > 0) {
        let mut cursor = BatchCursor::new(files, seg, 0, READ_CHUNK);
        while let Some((info, bytes)) = cursor.next().await? {
            if info.end_offset() > until {
                break 'segments;
            }
            if scan.end.is_some_and(|e| e != info.base_offset) {
                return Err(ReadError::Corrupt {
                    name: seg.name.clone(),
                    position: cursor.at - info.len,
                    fault: format!(
                        "batch at offset {} does not follow offset {}",
                        info.base_offset,
                        scan.end.unwrap_or(0)
                    ),
                });
            }
            scan.first.get_or_insert(info.base_offset);
            scan.end = Some(info.end_offset());
            scan.hasher.update(&bytes);
            scan.len += info.len;
            scan.tail.push_back(bytes.clone());
            held += bytes.len();
            while held > tail_bytes && scan.tail.len() > 1 {
                held -= scan.tail.pop_front().map_or(0, |b| b.len());
            }
        }
    }
    Ok(scan)
}

#[cfg(test)]
mod tests;
