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

/// Bytes a read asks for once a consumer is seen reading in sequence (decision 421): the
/// following polls are answered from this window, not from the disk.
pub const READ_AHEAD: usize = 4 << 20;

/// Bytes of kept reads one shard holds at most (decision 421); a read that would pass it is
/// not kept (the poll reads what it needs, as without the window).
pub const KEPT_BYTES_MAX: usize = 64 << 20;

thread_local! {
    /// Bytes of kept reads on this thread (a shard's executor).
    static KEPT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A share of [`KEPT_BYTES_MAX`], given back when dropped.
#[derive(Debug)]
struct Charge(usize);

impl Charge {
    fn take(len: usize) -> Option<Charge> {
        KEPT.with(|kept| {
            let now = kept.get().checked_add(len)?;
            (now <= KEPT_BYTES_MAX).then(|| {
                kept.set(now);
                Charge(len)
            })
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        KEPT.with(|kept| kept.set(kept.get().saturating_sub(self.0)));
    }
}

/// Bytes of kept reads on this thread now.
pub fn kept_bytes() -> usize {
    KEPT.with(std::cell::Cell::get)
}

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
            let opening = std::time::Instant::now();
            let file = storage
                .open(&name, OpenMode::Existing)
                .await
                .map_err(fail)?;
            let open_us = u64::try_from(opening.elapsed().as_micros()).unwrap_or(u64::MAX);
            crate::timeline::record_poll(crate::timeline::PollStage::Opened, open_us);
            let reading = std::time::Instant::now();
            // Aligned for O_DIRECT: from the sector holding `position`.
            let from = position / SECTOR as u64 * SECTOR as u64;
            let skip = (position - from) as usize;
            // One read of the whole range into a buffer nobody zeroes; the sector head before
            // `position` is sliced off, not moved (decision 406).
            let buf = storage
                .read_vec(&file, from, sector_ceil((skip + len) as u64) as usize)
                .await
                .map_err(fail)?;
            tracing::debug!(
                target: "strand::timeline",
                open_us,
                read_us = u64::try_from(reading.elapsed().as_micros()).unwrap_or(u64::MAX),
                len = buf.len(),
                "segment read"
            );
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
    /// The last segment read of this partition, kept for the polls that follow it, and the
    /// read ahead of it (decision 421).
    pub recent: Rc<RefCell<Keep>>,
    /// Bumped whenever a mapped segment is replaced or removed (not when one only grows):
    /// a kept read of an older generation is never served.
    pub generation: u64,
    /// The log's [`PartitionLog::rewrite_mark`] at the last refresh (0: none yet).
    pub rewrite_mark: u64,
}

/// Bytes read from a segment file and kept (decision 421): `bytes` are the file's from `at`,
/// all below the written length when read, so they never change while the segment is mapped
/// in the same generation.
#[derive(Debug)]
pub struct RecentRead {
    /// The file.
    pub name: String,
    /// The map's generation when read.
    pub generation: u64,
    /// File position of `bytes[0]`.
    pub at: u64,
    /// The bytes.
    pub bytes: Bytes,
    /// Read as part of a sequential scan (a read ahead follows it).
    sequential: bool,
    /// Its share of the shard's [`KEPT_BYTES_MAX`].
    _charge: Charge,
}

/// A partition's kept read and the read ahead of it (decision 421).
#[derive(Debug, Default)]
pub struct Keep {
    /// The last read, served to the polls it holds.
    pub window: Option<RecentRead>,
    /// The window before it when a read ahead replaced it: a poll's first read starts at the
    /// index entry before its offset, which may lie behind the new window.
    previous: Option<RecentRead>,
    /// The read of the bytes after a sequential window, started before a poll asks for them.
    ahead: Option<Rc<Ahead>>,
}

/// A read ahead: the segment bytes `[at, at + len)` of `name`, read apart from any poll.
#[derive(Debug)]
struct Ahead {
    name: String,
    generation: u64,
    at: u64,
    len: usize,
    state: RefCell<AheadState>,
    charge: RefCell<Option<Charge>>,
}

#[derive(Debug)]
enum AheadState {
    /// In flight; the polls waiting for it.
    Pending(Vec<std::task::Waker>),
    Done(Result<Bytes, ReadError>),
    /// Its future was dropped before it ended (shutdown, or a caller that does not run it).
    Abandoned,
}

impl Ahead {
    fn holds(&self, name: &str, generation: u64, position: u64, len: usize) -> bool {
        self.name == name
            && self.generation == generation
            && position >= self.at
            && position + len as u64 <= self.at + self.len as u64
    }

    fn end(&self, state: AheadState) {
        let old = std::mem::replace(&mut *self.state.borrow_mut(), state);
        if matches!(*self.state.borrow(), AheadState::Abandoned) {
            self.charge.borrow_mut().take();
        }
        if let AheadState::Pending(wakers) = old {
            wakers.into_iter().for_each(std::task::Waker::wake);
        }
    }

    /// Its result once it ends (`None`: abandoned).
    async fn wait(&self) -> Option<Result<Bytes, ReadError>> {
        futures_lite::future::poll_fn(|cx| match &mut *self.state.borrow_mut() {
            AheadState::Pending(wakers) => {
                wakers.push(cx.waker().clone());
                std::task::Poll::Pending
            }
            AheadState::Done(result) => std::task::Poll::Ready(Some(result.clone())),
            AheadState::Abandoned => std::task::Poll::Ready(None),
        })
        .await
    }
}

/// Marks a read ahead abandoned if its future is dropped before it ends.
struct AheadRun(Rc<Ahead>);

impl Drop for AheadRun {
    fn drop(&mut self) {
        if matches!(*self.0.state.borrow(), AheadState::Pending(_)) {
            self.0.end(AheadState::Abandoned);
        }
    }
}

impl RecentRead {
    fn end(&self) -> u64 {
        self.at + self.bytes.len() as u64
    }

    /// The kept bytes of `name` from `position`, at most `len` of them, if at least `least`
    /// are kept.
    fn slice(
        &self,
        name: &str,
        generation: u64,
        position: u64,
        least: usize,
        len: usize,
    ) -> Option<Bytes> {
        if self.name != name || self.generation != generation || position < self.at {
            return None;
        }
        let from = usize::try_from(position - self.at).ok()?;
        let to = from.checked_add(least)?;
        (to <= self.bytes.len()).then(|| self.bytes.slice(from..self.bytes.len().min(from + len)))
    }
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
    /// segment's new index entries), so a flush costs O(its entries). The entries held are
    /// compared with the log's only when its rewrite mark moved (a cut, another log): a
    /// segment of 100 B batches holds thousands of entries, and comparing them all on every
    /// flush cost as much as the batch's own hash (decision 495).
    pub fn refresh<S: Storage>(&mut self, log: &PartitionLog<S>) {
        let mut n = 0;
        let mut replaced = false;
        let appended_only = self.rewrite_mark == log.rewrite_mark();
        self.rewrite_mark = log.rewrite_mark();
        for extent in log.extents() {
            match self.segments.get_mut(n) {
                Some(seg)
                    if seg.base == extent.base
                        && seg.index.len() <= extent.index.len()
                        && seg.name == log.extent_name(extent.base) =>
                {
                    let have = seg.index.len();
                    debug_assert!(
                        !appended_only || extent.index[..have] == seg.index[..],
                        "a log whose rewrite mark did not move changed entries it had"
                    );
                    if !appended_only && extent.index[..have] != seg.index[..] {
                        seg.index = extent.index.to_vec();
                        replaced = true;
                    } else {
                        seg.index.extend_from_slice(&extent.index[have..]);
                    }
                    replaced |= extent.len < seg.len;
                    seg.len = extent.len;
                    seg.end_offset = extent.end_offset;
                }
                _ => {
                    replaced |= n < self.segments.len();
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
        replaced |= n < self.segments.len();
        self.segments.truncate(n);
        if replaced {
            self.generation += 1;
            *self.recent.borrow_mut() = Keep::default();
        }
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
    /// The partition's kept read, the map's generation and the files for a read ahead
    /// (`None`: nothing kept, a boot scan).
    recent: Option<(&'a RefCell<Keep>, u64, Rc<dyn SegmentFiles>)>,
    /// Reads ahead started by this cursor, for the caller to run apart (decision 421).
    started: Vec<(Rc<Ahead>, LocalFuture<()>)>,
    /// Reads answered by a read ahead.
    ahead: u32,
    /// File position of `window[0]`.
    window_at: u64,
    window: Bytes,
    /// File position of the next batch.
    at: u64,
    /// Bytes asked of the next read (at least what the next batch needs).
    read_len: usize,
    /// Time spent awaiting the reads, and their number (the poll timeline, decision 420).
    io: std::time::Duration,
    reads: u32,
    /// Reads answered from the kept read.
    kept: u32,
}

impl<'a> BatchCursor<'a> {
    fn new(files: &'a dyn SegmentFiles, seg: &'a MappedSegment, at: u64, read_len: usize) -> Self {
        BatchCursor {
            files,
            seg,
            recent: None,
            started: Vec::new(),
            ahead: 0,
            window_at: at,
            window: Bytes::new(),
            at,
            read_len: read_len.max(SECTOR),
            io: std::time::Duration::ZERO,
            reads: 0,
            kept: 0,
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
        let written = (self.seg.len - next) as usize;
        let len = want.min(written);
        self.window = if len == 0 {
            rest
        } else {
            let least = (need - rest.len()).min(len);
            let bytes = self.read(next, least, len, written).await?;
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

    /// At least `least` and at most `len` bytes of the segment from `next` (`written` are
    /// below its written end): from the partition's kept read when it holds the first `least`,
    /// else from its read ahead, else `len` read and kept (decision 421). A read that
    /// continues the kept one (a consumer reading in sequence) asks for [`READ_AHEAD`], and a
    /// sequential window starts the read of the next one.
    async fn read(
        &mut self,
        next: u64,
        least: usize,
        len: usize,
        written: usize,
    ) -> Result<Bytes, ReadError> {
        let Some((keep, generation, files)) = self.recent.clone() else {
            return self.read_files(next, len).await;
        };
        let name = self.seg.name.clone();
        let (sequential, ahead) = {
            let kept = keep.borrow();
            let hit = [&kept.window, &kept.previous]
                .into_iter()
                .flatten()
                .find_map(|k| k.slice(&name, generation, next, least, len));
            if let Some(bytes) = hit {
                drop(kept);
                self.kept += 1;
                self.start_ahead(keep, generation, &files);
                return Ok(bytes);
            }
            let sequential = kept.window.as_ref().is_some_and(|k| {
                k.name == name && k.generation == generation && next >= k.at && next <= k.end()
            });
            let ahead = kept
                .ahead
                .clone()
                .filter(|a| a.holds(&name, generation, next, least));
            (sequential, ahead)
        };
        if let Some(ahead) = ahead {
            let issued = std::time::Instant::now();
            // One this poll started itself is not running yet: it runs here.
            if let Some(i) = self.started.iter().position(|(a, _)| Rc::ptr_eq(a, &ahead)) {
                self.started.remove(i).1.await;
            }
            let result = ahead.wait().await;
            self.io += issued.elapsed();
            if let Some(Ok(bytes)) = result {
                // The read ahead becomes the window, with its share of the budget.
                let mut kept = keep.borrow_mut();
                if let Some(charge) = ahead.charge.borrow_mut().take()
                    && kept.ahead.as_ref().is_some_and(|a| Rc::ptr_eq(a, &ahead))
                {
                    kept.ahead = None;
                    kept.previous = kept.window.take();
                    kept.window = Some(RecentRead {
                        name: name.clone(),
                        generation,
                        at: ahead.at,
                        bytes: bytes.clone(),
                        sequential: true,
                        _charge: charge,
                    });
                }
                drop(kept);
                self.ahead += 1;
                let from = usize::try_from(next - ahead.at).unwrap_or(usize::MAX);
                let slice = bytes.slice(from..bytes.len().min(from + len));
                self.start_ahead(keep, generation, &files);
                return Ok(slice);
            }
            // Failed or abandoned: this poll reads for itself (and reports its own error).
        }
        // The windows this read replaces go first, so that their share of the budget is free.
        {
            let mut kept = keep.borrow_mut();
            kept.window.take();
            kept.previous.take();
        }
        let wide = len.max(READ_AHEAD).min(written);
        let (ask, charge) = match sequential.then(|| Charge::take(wide)).flatten() {
            Some(charge) => (wide, Some(charge)),
            None => (len, Charge::take(len)),
        };
        let bytes = self.read_files(next, ask).await?;
        if let Some(charge) = charge {
            keep.borrow_mut().window = Some(RecentRead {
                name,
                generation,
                at: next,
                bytes: bytes.clone(),
                sequential,
                _charge: charge,
            });
            self.start_ahead(keep, generation, &files);
        }
        Ok(bytes)
    }

    /// After a sequential window: starts the read of the bytes after it, unless one is under
    /// way, the segment's written part ends there or the shard's budget is spent.
    fn start_ahead(&mut self, keep: &RefCell<Keep>, generation: u64, files: &Rc<dyn SegmentFiles>) {
        let mut kept = keep.borrow_mut();
        let Some(window) = kept.window.as_ref().filter(|w| w.sequential) else {
            return;
        };
        let at = window.end();
        if at >= self.seg.len || window.name != self.seg.name || window.generation != generation {
            return;
        }
        if kept
            .ahead
            .as_ref()
            .is_some_and(|a| a.name == self.seg.name && a.generation == generation && a.at == at)
        {
            return;
        }
        let len = usize::try_from(self.seg.len - at)
            .unwrap_or(usize::MAX)
            .min(READ_AHEAD);
        kept.ahead = None; // an older one gives its share back first
        let Some(charge) = Charge::take(len) else {
            return;
        };
        let ahead = Rc::new(Ahead {
            name: self.seg.name.clone(),
            generation,
            at,
            len,
            state: RefCell::new(AheadState::Pending(Vec::new())),
            charge: RefCell::new(Some(charge)),
        });
        kept.ahead = Some(ahead.clone());
        let read = files.read(self.seg.name.clone(), at, len);
        let run = AheadRun(ahead.clone());
        self.started.push((
            ahead,
            Box::pin(async move {
                let result = read.await;
                if result.is_err() {
                    run.0.charge.borrow_mut().take();
                }
                run.0.end(AheadState::Done(result));
            }),
        ));
    }

    async fn read_files(&mut self, next: u64, len: usize) -> Result<Bytes, ReadError> {
        let issued = std::time::Instant::now();
        let bytes = self.files.read(self.seg.name.clone(), next, len).await;
        self.io += issued.elapsed();
        self.reads += 1;
        bytes
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

/// What a [`DiskPoll`]'s reads cost, and the reads ahead it started.
#[derive(Default)]
pub struct DiskTimes {
    /// Time spent awaiting the segment files.
    pub io: std::time::Duration,
    /// Reads of the segment files.
    pub reads: u32,
    /// Reads answered from the partition's kept read instead (decision 421).
    pub kept: u32,
    /// Reads answered by a read ahead (the wait for it is in `io`).
    pub ahead: u32,
    /// Reads ahead this poll started: the caller runs them apart from the poll (the node
    /// spawns them on the shard); dropping one abandons it and the next poll reads itself.
    pub started: Vec<LocalFuture<()>>,
}

impl std::fmt::Debug for DiskTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTimes")
            .field("io", &self.io)
            .field("reads", &self.reads)
            .field("kept", &self.kept)
            .field("ahead", &self.ahead)
            .field("started", &self.started.len())
            .finish()
    }
}

/// A poll that starts below the in-memory tail: read from the segments, then continued from
/// the tail batches it carries.
pub struct DiskPoll {
    pub(crate) files: Rc<dyn SegmentFiles>,
    /// The partition's kept read and the map's generation (decision 421).
    pub(crate) recent: Rc<RefCell<Keep>>,
    pub(crate) generation: u64,
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
            recent: map.recent.clone(),
            generation: map.generation,
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
        self.read_timed().await.0
    }

    /// [`DiskPoll::read`], with the time spent awaiting the segment reads, their number and
    /// the reads answered from the partition's kept read (the poll timeline, decisions 420-421).
    pub async fn read_timed(self) -> (Result<Poll, ReadError>, DiskTimes) {
        let mut times = DiskTimes::default();
        let poll = self.read_counting(&mut times).await;
        (poll, times)
    }

    async fn read_counting(self, times: &mut DiskTimes) -> Result<Poll, ReadError> {
        let wanted = |info: &BatchInfo| match self.start {
            Start::Offset(o) => info.end_offset() > o,
            Start::Timestamp(t) => info.base_timestamp >= t,
        };
        let mut reply = PollBuilder::new(Some(self.start), self.count);
        let mut held = 0usize;
        let mut full = false;
        'segments: for (seg, position, read_len) in &self.segments {
            let mut cursor = BatchCursor::new(&*self.files, seg, *position, *read_len);
            cursor.recent = Some((&*self.recent, self.generation, self.files.clone()));
            loop {
                let next = cursor.next().await;
                times.io += std::mem::take(&mut cursor.io);
                times.reads += std::mem::take(&mut cursor.reads);
                times.kept += std::mem::take(&mut cursor.kept);
                times.ahead += std::mem::take(&mut cursor.ahead);
                times
                    .started
                    .extend(cursor.started.drain(..).map(|(_, run)| run));
                let Some((info, bytes)) = next? else { break };
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
