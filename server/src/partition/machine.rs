//! The partition group's replicated state machine (consensus.md §14, journal.md §4): committed
//! SendMessages batches (already stamped by the primary, so every replica applies the same
//! bytes) and the consumer-offset table.
//!
//! The core owns the machine and hands the driver only `&self`, while the segments and the
//! offsets file are written by the shard's storage task (async, and in emission order with the
//! group's other storage effects). So `apply` changes the in-memory state only and records what
//! storage must do next in an outbox the driver drains after every step
//! ([`PartitionStateMachine::take_storage`]): each committed batch for the segments, the
//! offsets table after a store, an installed state to write in place of the old one.
//!
//! Reads (polls, consumer offsets) are answered from a bounded in-memory tail of committed
//! batches (decision 280): a batch leaves it once the storage task has written it to the
//! segments (the shared [`SegmentMap`](crate::partition::reader::SegmentMap)) and the tail holds more than its budget. A poll below
//! the tail is a [`DiskPoll`] the caller awaits; a state-transfer offer reads the evicted part
//! from the segment files by chunk (decision 282).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::rc::Rc;

use bytes::Bytes;
use consensus::{Artifact, Frame, InstallError, ReplicaId, StateMachine, TransferError};
use journal::artifact::OffsetTable;
use journal::batch;
use wire::header::{Layout, PrepareHeader, ReplyHeader};
use wire::manifest::{ArtifactKind, ManifestEntry};
use wire::{Command, GroupId, Operation};

use crate::client::codec::Consumer;
use crate::client::reply::{
    ConsumerOffsetReply, RESULT_OK, SendConfirmation, encode_send_reply, read_result,
    result_rejected,
};
use crate::client::request::PollMessages;
use crate::client::status;
use crate::groups::ReplySink;
use crate::partition::reader::{DiskPoll, SharedMap};
use crate::partition::{
    Poll, PollAnswer, PollBuilder, Start, apply_store_consumer_offset, consumer_offset_reply,
    current_offset, resolve_start, stored_offset,
};

/// What the storage task must do for a group after an apply or an install, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageWork {
    /// A committed batch for the segments (its base offset is the segments' next offset).
    Batch(Bytes),
    /// The offsets table after a committed store.
    Offsets(OffsetTable),
    /// A transferred state replaced everything: these batches (contiguous, from their first
    /// base offset), or the staged file, and this table become the group's segments and
    /// offsets.
    Install {
        /// The batches (empty when `staged` holds them).
        batches: Vec<Bytes>,
        /// The table.
        offsets: OffsetTable,
        /// The SEGMENT_LOG left in a file of the partition directory (decision 284): the
        /// storage task writes it into the segments by chunk and removes it.
        staged: Option<StagedLog>,
    },
}

/// A verified SEGMENT_LOG in a file of the partition directory, for the storage task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedLog {
    /// Its name in the partition directory.
    pub name: String,
    /// The base offset of its first batch.
    pub frontier: u64,
    /// Its length (whole batches).
    pub len: u64,
}

/// A partition group's state machine.
#[derive(Debug)]
pub struct PartitionStateMachine {
    group: GroupId,
    /// Committed batches by base offset.
    batches: BTreeMap<u64, Bytes>,
    /// The next offset after everything applied.
    next_offset: u64,
    offsets: OffsetTable,
    storage: RefCell<Vec<StorageWork>>,
    /// Where a receiving transfer stages the SEGMENT_LOG (the shard's partition directory);
    /// `None` stages it in memory (in-memory storage, tests).
    staging_dir: Option<PathBuf>,
    /// Frozen images served to requesters (decision 220).
    offers: BTreeMap<u8, Image>,
    /// The transfer being received.
    staged: Option<Staged>,
    /// Bytes of the batches in `batches` (the tail).
    tail_bytes: usize,
    /// The tail's budget: batches the segments hold leave it beyond this (decision 280).
    cache_budget: usize,
    /// The shard's current share per group (decision 424): the tail holds at most the less of
    /// this and `cache_budget`.
    tail_share: Option<Rc<Cell<usize>>>,
    /// Where the storage task has written this group's batches (`None`: nothing leaves memory).
    disk: Option<SharedMap>,
    /// The SEGMENT_LOG's running checksum and length, from `log_first` to `next_offset`. In a
    /// cell so the pump can pay the hash it owes through the replica's shared borrow.
    log: RefCell<LogHash>,
}

/// The running XXH3 of every committed batch from the first held (the SEGMENT_LOG of an
/// offer), so an offer needs no pass over the data.
///
/// A committed batch is counted at once but hashed later (decision 493): hashing 1 MB takes
/// about 0.15 ms, which on the commit path delayed every reply of the step. The pump hashes
/// what is owed when its inbox is empty ([`PartitionStateMachine::hash_owed`]), and a digest
/// hashes the rest first, so the checksum an offer names is the same either way.
struct LogHash {
    hasher: xxhash_rust::xxh3::Xxh3Default,
    /// Batches counted in `len`, not yet in `hasher`, oldest first. They share the tail's
    /// buffers; a batch evicted from the tail stays alive here until hashed, so their bytes are
    /// bounded by [`UNHASHED_BYTES_MAX`].
    owed: std::collections::VecDeque<Bytes>,
    owed_bytes: usize,
    len: u64,
    first: Option<u64>,
}

/// At most this many bytes of committed batches wait for the running hash: past it, `add`
/// hashes the oldest at once (a pump that is never idle still keeps its memory bounded).
const UNHASHED_BYTES_MAX: usize = 32 << 20;

impl LogHash {
    fn new() -> LogHash {
        LogHash {
            hasher: xxhash_rust::xxh3::Xxh3Default::new(),
            owed: std::collections::VecDeque::new(),
            owed_bytes: 0,
            len: 0,
            first: None,
        }
    }

    /// Hashes `bytes` now (boots and installs, off the commit path).
    fn add(&mut self, base_offset: u64, bytes: &[u8]) {
        self.settle();
        self.first.get_or_insert(base_offset);
        self.hasher.update(bytes);
        self.len += bytes.len() as u64;
    }

    /// Counts `bytes` now and hashes it later.
    fn add_later(&mut self, base_offset: u64, bytes: Bytes) {
        self.first.get_or_insert(base_offset);
        self.len += bytes.len() as u64;
        self.owed_bytes += bytes.len();
        self.owed.push_back(bytes);
        while self.owed_bytes > UNHASHED_BYTES_MAX {
            self.hash_one();
        }
    }

    /// Hashes the oldest owed batch; false when none was owed.
    fn hash_one(&mut self) -> bool {
        let Some(bytes) = self.owed.pop_front() else {
            return false;
        };
        self.hasher.update(&bytes);
        self.owed_bytes -= bytes.len();
        true
    }

    fn settle(&mut self) {
        while self.hash_one() {}
    }

    /// The checksum of all `len` bytes.
    fn digest(&mut self) -> u64 {
        self.settle();
        self.hasher.digest()
    }
}

impl std::fmt::Debug for LogHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHash")
            .field("len", &self.len)
            .field("owed_bytes", &self.owed_bytes)
            .field("first", &self.first)
            .finish()
    }
}

/// The default tail budget per partition (`partition.read_cache_bytes`, decision 424).
pub const READ_CACHE_BYTES: usize = 256 << 20;

/// The default budget of every tail of one shard together
/// (`partition.read_cache_shard_bytes`, decision 424).
pub const READ_CACHE_SHARD_BYTES: usize = 1 << 30;

/// A frozen image of the state for one requester: the batches are the machine's own `Bytes`
/// (shared, never copied), so an offer costs a pointer per batch and the encoded offsets table.
#[derive(Debug)]
struct Image {
    /// The SEGMENT_LOG's first `disk_len` bytes: segment files (open, so a later install's
    /// unlink leaves them readable) and the bytes of each taken.
    disk: Vec<(std::fs::File, u64)>,
    disk_len: u64,
    /// The SEGMENT_LOG's batches after `disk_len`, in offset order (empty with no disk part:
    /// no SEGMENT_LOG artifact).
    batches: Vec<Bytes>,
    /// `ends[i]`: the byte just past batch `i` within the SEGMENT_LOG.
    ends: Vec<u64>,
    /// The CONSUMER_OFFSETS artifact.
    offsets: Vec<u8>,
}

impl Image {
    fn read(&self, index: usize, offset: u64, len: usize, buf: &mut Vec<u8>) -> Option<()> {
        let segment = usize::from(!self.batches.is_empty() || self.disk_len > 0);
        if index == segment {
            let start = usize::try_from(offset).ok()?;
            buf.extend_from_slice(self.offsets.get(start..start.checked_add(len)?)?);
            return Some(());
        }
        if index != 0 || segment == 0 {
            return None;
        }
        let end = offset.checked_add(len as u64)?;
        if end > self.disk_len + self.ends.last().copied().unwrap_or(0) {
            return None;
        }
        let mut offset = offset;
        while offset < end.min(self.disk_len) {
            // From the segment files: a bounded pread (consensus reads chunks synchronously;
            // decision 282).
            let (mut file_start, mut i) = (0u64, 0);
            while file_start + self.disk[i].1 <= offset {
                file_start += self.disk[i].1;
                i += 1;
            }
            let (file, file_len) = &self.disk[i];
            let take = (end.min(self.disk_len).min(file_start + file_len) - offset) as usize;
            let from = buf.len();
            buf.resize(from + take, 0);
            if let Err(error) = std::os::unix::fs::FileExt::read_exact_at(
                file,
                &mut buf[from..],
                offset - file_start,
            ) {
                tracing::warn!(%error, "reading a segment file for a state-transfer offer");
                buf.truncate(from);
                return None;
            }
            offset += take as u64;
        }
        if offset == end {
            return Some(());
        }
        let (offset, end) = (offset - self.disk_len, end - self.disk_len);
        let mut at = offset;
        let mut i = self.ends.partition_point(|e| *e <= at);
        while at < end {
            let batch_start = if i == 0 { 0 } else { self.ends[i - 1] };
            let from = (at - batch_start) as usize;
            let to = (end.min(self.ends[i]) - batch_start) as usize;
            buf.extend_from_slice(&self.batches[i][from..to]);
            at = batch_start + to as u64;
            i += 1;
        }
        Some(())
    }
}

/// A transfer being received: the manifest and each artifact's bytes so far.
#[derive(Debug)]
struct Staged {
    entries: Vec<ManifestEntry>,
    sinks: Vec<Sink>,
}

/// Where one staged artifact's bytes go.
#[derive(Debug)]
enum Sink {
    /// The SEGMENT_LOG, in a temporary file of the partition directory.
    File {
        path: PathBuf,
        file: std::fs::File,
        written: u64,
    },
    /// In memory (the offsets table, or no staging directory).
    Memory(Vec<u8>),
}

impl Sink {
    fn len(&self) -> u64 {
        match self {
            Sink::File { written, .. } => *written,
            Sink::Memory(bytes) => bytes.len() as u64,
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for sink in &self.sinks {
            if let Sink::File { path, .. } = sink {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// Poll replies carry at most this many bytes of batches (one whole batch at least).
pub const POLL_BYTES_MAX: usize = 8 << 20;

impl PartitionStateMachine {
    /// The machine of `group` restored from its segments (`batches`, whole verified batches in
    /// offset order, as `PartitionLog::read_from_offset(0, ..)` returns them) and its offsets
    /// table. `Err` names the first batch that does not verify or does not follow the one
    /// before it.
    pub fn restore(group: GroupId, stored: &[u8], offsets: OffsetTable) -> Result<Self, String> {
        let mut batches = BTreeMap::new();
        let mut next = None;
        let mut at = 0;
        let mut log = LogHash::new();
        while at < stored.len() {
            let info = batch::verify(&stored[at..])
                .map_err(|f| format!("stored batch at byte {at}: {f:?}"))?;
            if next.is_some_and(|n| n != info.base_offset) {
                return Err(format!(
                    "stored batch at byte {at} starts at offset {}, expected {}",
                    info.base_offset,
                    next.unwrap_or(0)
                ));
            }
            let len = info.len as usize;
            log.add(info.base_offset, &stored[at..at + len]);
            batches.insert(
                info.base_offset,
                Bytes::copy_from_slice(&stored[at..at + len]),
            );
            next = Some(info.end_offset());
            at += len;
        }
        let next_offset = next.unwrap_or(0).max(offsets.next_offset);
        let mut offsets = offsets;
        offsets.next_offset = next_offset;
        Ok(PartitionStateMachine {
            group,
            batches,
            next_offset,
            offsets,
            storage: RefCell::default(),
            staging_dir: None,
            offers: BTreeMap::new(),
            staged: None,
            tail_bytes: stored.len(),
            cache_budget: usize::MAX,
            tail_share: None,
            disk: None,
            log: RefCell::new(log),
        })
    }

    /// The machine of `group` restored from a boot's pass over its segments (decision 283):
    /// the tail the pass kept, the running checksum over everything before it; the older
    /// batches are read from the segments `disk` maps. `Err` when the tail does not end at a
    /// batch boundary the offsets table accepts.
    pub fn from_scan(
        group: GroupId,
        scan: crate::partition::reader::Scan,
        offsets: OffsetTable,
        disk: SharedMap,
        cache_bytes: usize,
    ) -> Result<Self, String> {
        let mut batches = BTreeMap::new();
        let mut tail_bytes = 0;
        for b in scan.tail {
            let info = batch::peek(&b).ok_or("a scanned batch does not parse")?;
            tail_bytes += b.len();
            batches.insert(info.base_offset, b);
        }
        let next_offset = scan.end.unwrap_or(0).max(offsets.next_offset);
        let mut offsets = offsets;
        offsets.next_offset = next_offset;
        Ok(PartitionStateMachine {
            group,
            batches,
            next_offset,
            offsets,
            storage: RefCell::default(),
            staging_dir: None,
            offers: BTreeMap::new(),
            staged: None,
            tail_bytes,
            cache_budget: cache_bytes,
            tail_share: None,
            disk: Some(disk),
            log: RefCell::new(LogHash {
                hasher: scan.hasher,
                owed: std::collections::VecDeque::new(),
                owed_bytes: 0,
                len: scan.len,
                first: scan.first,
            }),
        })
    }

    /// Reads batches the storage task has written from the segments `disk` maps, keeping at
    /// most `cache_bytes` of the newest in memory (decision 280).
    pub fn with_disk(mut self, disk: SharedMap, cache_bytes: usize) -> Self {
        self.disk = Some(disk);
        self.cache_budget = cache_bytes;
        self.evict();
        self
    }

    /// Bytes of every committed batch the partition holds, in memory or in its segments
    /// (GetStats' `messages_size_bytes`, decision 380).
    pub fn stored_bytes(&self) -> u64 {
        self.log.borrow().len
    }

    /// Segment files of this group (GetStats' `segments_count`, decision 380): those the
    /// storage task last published with written batches, and at least the open one (a
    /// partition on disk always has it, as the reference's always has a segment); 0 for a
    /// machine with no disk (in-memory storage).
    pub fn segments_count(&self) -> usize {
        self.disk
            .as_ref()
            .map_or(0, |m| m.borrow().segments.len().max(1))
    }

    /// Bytes of committed batches held in memory (`strand_partition_cache_bytes`).
    pub fn cache_bytes(&self) -> usize {
        self.tail_bytes
    }

    /// Bounds the tail by the shard's share per group too (decision 424).
    pub fn with_tail_share(mut self, share: Rc<Cell<usize>>) -> Self {
        self.tail_share = Some(share);
        self.evict();
        self
    }

    /// What the tail may hold now.
    fn budget(&self) -> usize {
        self.tail_share
            .as_ref()
            .map_or(self.cache_budget, |s| s.get().min(self.cache_budget))
    }

    /// Drops the oldest tail batches the segments hold while the tail exceeds its budget.
    fn evict(&mut self) {
        let budget = self.budget();
        if self.tail_bytes <= budget {
            return;
        }
        let Some(map) = self.disk.as_ref() else {
            return;
        };
        let map = map.borrow();
        if map.files.is_none() || map.dir.is_none() {
            return;
        }
        let written = map.end_offset().unwrap_or(0);
        while self.tail_bytes > budget {
            let Some(entry) = self.batches.first_entry() else {
                break;
            };
            match batch::peek(entry.get()) {
                Some(info) if info.end_offset() <= written => {
                    self.tail_bytes -= entry.remove().len();
                }
                _ => break,
            }
        }
    }

    /// Stages received SEGMENT_LOG artifacts in temporary files of `dir` (the shard's
    /// partition directory) instead of memory.
    /// A staging file a crash left behind (staging is not durable) is removed here.
    pub fn with_staging_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.staging_dir = dir;
        // An install a crash interrupted left its handed-over file (decision 284).
        let handed = format!("t{:016x}-", self.group.0);
        let entries = self
            .staging_dir
            .as_ref()
            .and_then(|d| std::fs::read_dir(d).ok());
        for entry in entries.into_iter().flatten().flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(&handed) && name.ends_with(".install") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        if let Some(path) = self.staging_path(0) {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "removed an interrupted transfer's staging file")
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => tracing::warn!(%error, path = %path.display(), "staging file"),
            }
        }
        self
    }

    /// Hashes the oldest committed batch the running log hash still owes (decision 493); false
    /// when it owes none. The pump calls it while its inbox is empty, one batch at a time.
    pub fn hash_owed(&self) -> bool {
        self.log.borrow_mut().hash_one()
    }

    /// Bytes of committed batches the running log hash has still to take
    /// (`strand_partition_hash_owed_bytes`).
    pub fn hash_owed_bytes(&self) -> usize {
        self.log.borrow().owed_bytes
    }

    /// Offers held for requesters (tests, observability).
    pub fn offers_held(&self) -> usize {
        self.offers.len()
    }

    fn staging_path(&self, index: usize) -> Option<PathBuf> {
        // Not `p{group}-...`: the boot's directory listing must not take it for a group's file.
        // Only the SEGMENT_LOG (index 0, first in the manifest) is staged in a file.
        self.staging_dir
            .as_ref()
            .map(|d| d.join(format!("t{:016x}-{index}.staging", self.group.0)))
    }

    /// Validates the artifacts of a transfer or a checkpoint and, only if all are sound,
    /// replaces the state with them.
    fn install_whole(
        &mut self,
        artifacts: &[(ArtifactKind, u64, Bytes)],
    ) -> Result<(), InstallError> {
        let (index, table) = artifacts
            .iter()
            .enumerate()
            .find(|(_, a)| a.0 == ArtifactKind::CONSUMER_OFFSETS)
            .ok_or(InstallError::Missing)?;
        let table = OffsetTable::decode(&table.2).map_err(|_| InstallError::Decode { index })?;
        let mut batches = BTreeMap::new();
        let mut next: Option<u64> = None;
        for (index, (_, frontier, bytes)) in artifacts
            .iter()
            .enumerate()
            .filter(|(_, a)| a.0 == ArtifactKind::SEGMENT_LOG)
        {
            if next.is_some_and(|n| n != *frontier) {
                return Err(InstallError::Decode { index });
            }
            let mut at = 0;
            let mut expected = *frontier;
            while at < bytes.len() {
                let info =
                    batch::verify(&bytes[at..]).map_err(|_| InstallError::Decode { index })?;
                if info.base_offset != expected {
                    return Err(InstallError::Decode { index });
                }
                let len = info.len as usize;
                // A slice of the artifact's buffer: the batches share it, nothing is copied.
                batches.insert(info.base_offset, bytes.slice(at..at + len));
                expected = info.end_offset();
                at += len;
            }
            next = Some(expected);
        }
        let end = next.unwrap_or(table.next_offset);
        if end > table.next_offset {
            return Err(InstallError::Decode { index });
        }
        self.next_offset = table.next_offset;
        self.offsets = table.clone();
        self.batches = batches;
        self.tail_bytes = self.batches.values().map(Bytes::len).sum();
        if let Some(map) = &self.disk {
            // The old segments go; the storage task maps the installed ones once written.
            map.borrow_mut().segments.clear();
        }
        let log = self.log.get_mut();
        *log = LogHash::new();
        for (base, b) in &self.batches {
            log.add(*base, b);
        }
        let mut storage = self.storage.borrow_mut();
        storage.clear();
        storage.push(StorageWork::Install {
            batches: self.batches.values().cloned().collect(),
            offsets: table,
            staged: None,
        });
        Ok(())
    }

    /// An empty partition.
    pub fn new(group: GroupId) -> Self {
        Self::restore(group, &[], OffsetTable::default()).expect("nothing to verify")
    }

    /// The storage work recorded since the last call, in apply order.
    pub fn take_storage(&self) -> Vec<StorageWork> {
        std::mem::take(&mut *self.storage.borrow_mut())
    }

    /// The consumer-offset table (its `next_offset` is the partition's).
    pub fn offsets(&self) -> &OffsetTable {
        &self.offsets
    }

    /// Messages committed (the highest committed offset + 1).
    pub fn committed_offset_end(&self) -> u64 {
        self.next_offset
    }

    /// Answers a PollMessages from the committed batches (decision 127): from the tail, or,
    /// when it starts below the tail, as a read of the segments (decision 281).
    pub fn poll(&self, partition: u32, request: &PollMessages) -> Result<PollAnswer, u32> {
        let current = current_offset(self.next_offset);
        let stored = stored_offset(&self.offsets, &request.consumer);
        let start = resolve_start(request.strategy, request.count, current, stored);
        if let Some(start) = start
            && let Some(poll) = self.disk_poll(start, (partition, current, request.count))
        {
            return Ok(PollAnswer::Disk(poll));
        }
        self.poll_tail(partition, current, start, request.count)
            .map(PollAnswer::Ready)
    }

    /// The read of the segments a poll from `start` needs when older data left the tail and
    /// the start may lie in it; it carries the tail's batches up to one reply's bytes.
    fn disk_poll(&self, start: Start, reply: (u32, Option<u64>, u32)) -> Option<DiskPoll> {
        let map = self.disk.as_ref()?.borrow();
        let files = map.files.clone()?;
        let tail_first = self
            .batches
            .keys()
            .next()
            .copied()
            .unwrap_or(self.next_offset);
        if self
            .log
            .borrow()
            .first
            .is_none_or(|first| first >= tail_first)
        {
            return None; // nothing evicted
        }
        let below = match start {
            Start::Offset(o) => o < tail_first,
            Start::Timestamp(t) => self
                .batches
                .values()
                .next()
                .and_then(|b| batch::peek(b))
                .is_none_or(|info| info.base_timestamp >= t),
        };
        if !below {
            return None;
        }
        let mut held = 0;
        let tail = self
            .batches
            .values()
            .take_while(|b| {
                let more = held < POLL_BYTES_MAX;
                held += b.len();
                more
            })
            .cloned()
            .collect();
        let (partition, current, count) = reply;
        Some(DiskPoll::new(
            &map,
            files,
            start,
            tail_first,
            tail,
            (partition, current, count, POLL_BYTES_MAX),
        ))
    }

    /// A poll answered from the tail. Its batches are shared, not copied, and not verified
    /// again: this node verified each before it committed it (decision 262), and the tail
    /// holds the committed `Bytes` themselves (decision 405).
    fn poll_tail(
        &self,
        partition: u32,
        current: Option<u64>,
        start: Option<Start>,
        count: u32,
    ) -> Result<Poll, u32> {
        let first = match start {
            None => None,
            Some(Start::Offset(o)) => self
                .batches
                .range(..=o)
                .next_back()
                .map(|(b, _)| *b)
                .or_else(|| self.batches.keys().next().copied()),
            Some(Start::Timestamp(_)) => self.batches.keys().next().copied(),
        };
        let mut reply = PollBuilder::new(start, count);
        let mut held = 0usize;
        if let Some(first) = first {
            for batch in self.batches.range(first..).map(|(_, b)| b) {
                if !reply.wants_more() {
                    break;
                }
                if held > 0 && held + batch.len() > POLL_BYTES_MAX {
                    break;
                }
                // Committed batches are whole (`apply_batch` checked the header's length).
                let info = batch::peek(batch).ok_or(status::ERROR)?;
                if reply.push(&info, batch) {
                    held += batch.len();
                }
            }
        }
        Ok(reply.finish(partition, current))
    }

    /// Answers a GetConsumerOffset.
    pub fn consumer_offset(
        &self,
        partition: u32,
        consumer: &Consumer,
    ) -> Option<ConsumerOffsetReply> {
        consumer_offset_reply(&self.offsets, consumer, partition)
    }

    /// Applies a committed batch. `body` is the frame's body; `shared`, when given, is the same
    /// bytes as a shared slice of the journaled frame, kept without a copy (decision 261).
    fn apply_batch(&mut self, body: &[u8], shared: Option<Bytes>, reply: &mut Vec<u8>) {
        // The core verified every message and the batch checksum before it journaled the
        // prepare (admission on the primary, the stamp check on backups, repair, recovery), so
        // only the header is read back here (decision 262); a body not shaped like one batch is
        // a deterministic rejection on every replica.
        let info = match batch::peek(body) {
            Some(info) if info.len as usize == body.len() => info,
            _ => {
                reply.extend_from_slice(&result_rejected(status::INVALID_COMMAND));
                return;
            }
        };
        if info.end_offset() <= self.next_offset {
            // Already held: restored from segments flushed after the checkpoint this replica
            // restarted from, and replayed from the WAL again.
        } else if info.base_offset != self.next_offset {
            reply.extend_from_slice(&result_rejected(status::INVALID_COMMAND));
            return;
        } else {
            let bytes = shared.unwrap_or_else(|| Bytes::copy_from_slice(body));
            self.log
                .get_mut()
                .add_later(info.base_offset, bytes.clone());
            self.tail_bytes += bytes.len();
            self.batches.insert(info.base_offset, bytes.clone());
            self.next_offset = info.end_offset();
            self.offsets.next_offset = self.next_offset;
            self.storage.borrow_mut().push(StorageWork::Batch(bytes));
            self.evict();
        }
        let key = self.group.fields();
        reply.extend_from_slice(&RESULT_OK);
        encode_send_reply(
            &[SendConfirmation {
                stream: key.stream,
                topic: key.topic,
                partition: key.partition,
                base_offset: info.base_offset,
            }],
            reply,
        );
    }
}

impl StateMachine for PartitionStateMachine {
    fn apply_frame(&mut self, header: &PrepareHeader, frame: &Frame, reply: &mut Vec<u8>) {
        if Operation::from_byte(header.operation) == Some(Operation::SendMessages) {
            let shared = frame.shared().slice(wire::HEADER_SIZE.min(frame.len())..);
            self.apply_batch(frame.body(), Some(shared), reply);
        } else {
            self.apply(header, frame.body(), reply);
        }
    }

    fn apply(&mut self, header: &PrepareHeader, body: &[u8], reply: &mut Vec<u8>) {
        match Operation::from_byte(header.operation) {
            Some(Operation::SendMessages) => self.apply_batch(body, None, reply),
            Some(Operation::StoreConsumerOffset) => {
                let before = self.offsets.clone();
                reply.extend_from_slice(&apply_store_consumer_offset(&mut self.offsets, body));
                if self.offsets != before {
                    self.storage
                        .borrow_mut()
                        .push(StorageWork::Offsets(self.offsets.clone()));
                }
            }
            Some(Operation::DeleteConsumerOffset) => {
                let before = self.offsets.clone();
                reply.extend_from_slice(&super::apply_delete_consumer_offset(
                    &mut self.offsets,
                    body,
                ));
                if self.offsets != before {
                    self.storage
                        .borrow_mut()
                        .push(StorageWork::Offsets(self.offsets.clone()));
                }
            }
            _ => reply.extend_from_slice(&result_rejected(status::INVALID_COMMAND)),
        }
    }

    /// The image is the segment files for the part that left the tail (opened now, read by
    /// chunk later) and the tail's own `Bytes` (shared, never copied); the checksum is the
    /// running one, so an offer reads no data (decision 282).
    fn offer(
        &mut self,
        requester: ReplicaId,
        commit_op: u64,
    ) -> Result<Vec<ManifestEntry>, TransferError> {
        let batches: Vec<Bytes> = self.batches.values().cloned().collect();
        let mut ends = Vec::with_capacity(batches.len());
        let mut total = 0u64;
        for b in &batches {
            total += b.len() as u64;
            ends.push(total);
        }
        let log = self.log.get_mut();
        let disk_len = log.len - total;
        let mut disk = Vec::new();
        if disk_len > 0 {
            let map = self.disk.as_ref().ok_or(TransferError::Io)?.borrow();
            let dir = map.dir.as_ref().ok_or(TransferError::Io)?;
            let mut left = disk_len;
            for seg in map.segments.iter().filter(|s| s.len > 0) {
                if left == 0 {
                    break;
                }
                let path = dir.join(&seg.name);
                let file = std::fs::File::open(&path).map_err(|error| {
                    tracing::warn!(%error, path = %path.display(), "opening a segment for an offer");
                    TransferError::Io
                })?;
                let take = left.min(seg.len);
                disk.push((file, take));
                left -= take;
            }
            if left > 0 {
                tracing::warn!(
                    missing = left,
                    "the segments hold less than the evicted part of the log; no offer"
                );
                return Err(TransferError::Io);
            }
        }
        let mut entries = Vec::with_capacity(2);
        if let Some(first) = log.first {
            entries.push(ManifestEntry {
                kind: ArtifactKind::SEGMENT_LOG,
                frontier: first,
                len: log.len,
                checksum: log.digest(),
            });
        }
        let offsets = self.offsets.encode();
        entries.push(ManifestEntry {
            kind: ArtifactKind::CONSUMER_OFFSETS,
            frontier: commit_op,
            len: offsets.len() as u64,
            checksum: wire::manifest::artifact_checksum(&offsets),
        });
        self.offers.insert(
            requester.0,
            Image {
                disk,
                disk_len,
                batches,
                ends,
                offsets,
            },
        );
        Ok(entries)
    }

    fn read_chunk(
        &mut self,
        requester: ReplicaId,
        index: usize,
        offset: u64,
        len: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), TransferError> {
        self.offers
            .get(&requester.0)
            .and_then(|image| image.read(index, offset, len, buf))
            .ok_or(TransferError::NoOffer)
    }

    fn release_offer(&mut self, requester: ReplicaId) {
        self.offers.remove(&requester.0);
    }

    /// The SEGMENT_LOG goes to a temporary file of the partition directory (when there is
    /// one), the offsets table to memory. Staging is not durable (decision 170): a crash
    /// leaves the old state, and the next `stage_begin` of the group truncates the file.
    fn stage_begin(&mut self, entries: &[ManifestEntry]) -> Result<(), TransferError> {
        self.staged = None;
        let mut sinks = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let path = (entry.kind == ArtifactKind::SEGMENT_LOG)
                .then(|| self.staging_path(index))
                .flatten();
            sinks.push(match path {
                Some(path) => {
                    let file = std::fs::OpenOptions::new()
                        .create(true)
                        .write(true)
                        .read(true)
                        .truncate(true)
                        .open(&path)
                        .map_err(|error| {
                            tracing::warn!(%error, path = %path.display(), "transfer staging");
                            TransferError::Io
                        })?;
                    Sink::File {
                        path,
                        file,
                        written: 0,
                    }
                }
                None => Sink::Memory(Vec::new()),
            });
        }
        self.staged = Some(Staged {
            entries: entries.to_vec(),
            sinks,
        });
        Ok(())
    }

    fn stage_chunk(
        &mut self,
        index: usize,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), TransferError> {
        let sink = self
            .staged
            .as_mut()
            .and_then(|s| s.sinks.get_mut(index))
            .ok_or(TransferError::NoOffer)?;
        if sink.len() != offset {
            return Err(TransferError::NoOffer);
        }
        match sink {
            Sink::File {
                file,
                written,
                path,
            } => {
                file.write_all(bytes).map_err(|error| {
                    tracing::warn!(%error, path = %path.display(), "transfer staging");
                    TransferError::Io
                })?;
                *written += bytes.len() as u64;
            }
            Sink::Memory(buf) => buf.extend_from_slice(bytes),
        }
        Ok(())
    }

    /// Reads each staged artifact back once into one buffer the installed batches share
    /// (decision 163 holds them in memory; nothing is copied twice), validates everything,
    /// then replaces the state and queues the disk install; the temporary files go.
    fn install_staged(&mut self, commit_op: u64) -> Result<(), InstallError> {
        let mut staged = self.staged.take().ok_or(InstallError::Missing)?;
        if self.staging_dir.is_some()
            && self
                .disk
                .as_ref()
                .is_some_and(|d| d.borrow().files.is_some())
        {
            return self.install_streaming(&mut staged, commit_op);
        }
        let mut artifacts = Vec::with_capacity(staged.entries.len());
        for (index, (entry, sink)) in staged.entries.iter().zip(&mut staged.sinks).enumerate() {
            let bytes = match sink {
                Sink::Memory(buf) => Bytes::from(std::mem::take(buf)),
                Sink::File {
                    file,
                    path,
                    written,
                } => {
                    let mut buf = Vec::with_capacity(*written as usize);
                    let read =
                        std::io::Seek::rewind(file).and_then(|()| file.read_to_end(&mut buf));
                    if let Err(error) = read {
                        tracing::warn!(%error, path = %path.display(), "reading a staged artifact");
                        return Err(InstallError::Decode { index });
                    }
                    Bytes::from(buf)
                }
            };
            if bytes.len() as u64 != entry.len {
                return Err(InstallError::Decode { index });
            }
            artifacts.push((entry.kind, entry.frontier, bytes));
        }
        drop(staged);
        self.install_whole(&artifacts)
    }

    fn next_offset(&self) -> u64 {
        self.next_offset
    }
}

impl PartitionStateMachine {
    /// The install of a machine reading from the segments (decision 284): the staged
    /// SEGMENT_LOG is verified by chunk (batches, contiguity, the manifest's length and
    /// checksum) keeping only the tail, renamed for the storage task, and mapped so polls read
    /// it until the storage task has written it into the segments. The heap grows by a chunk
    /// and the tail, not by the partition.
    fn install_streaming(
        &mut self,
        staged: &mut Staged,
        commit_op: u64,
    ) -> Result<(), InstallError> {
        let (index, table) = staged
            .entries
            .iter()
            .position(|e| e.kind == ArtifactKind::CONSUMER_OFFSETS)
            .and_then(|i| match &staged.sinks[i] {
                Sink::Memory(bytes) => Some((i, bytes)),
                Sink::File { .. } => None,
            })
            .ok_or(InstallError::Missing)?;
        let table = OffsetTable::decode(table).map_err(|_| InstallError::Decode { index })?;
        if staged.entries[index].len != staged.sinks[index].len() {
            return Err(InstallError::Decode { index });
        }
        let mut log = LogHash::new();
        let mut tail: std::collections::VecDeque<Bytes> = std::collections::VecDeque::new();
        let mut tail_bytes = 0usize;
        let mut end = None;
        let mut mapped = None;
        for (index, (entry, sink)) in staged.entries.iter().zip(&mut staged.sinks).enumerate() {
            if entry.kind != ArtifactKind::SEGMENT_LOG {
                continue;
            }
            if mapped.is_some() || sink.len() != entry.len {
                // One SEGMENT_LOG (what `offer` produces), complete.
                return Err(InstallError::Decode { index });
            }
            let Sink::File { file, path, .. } = sink else {
                return Err(InstallError::Decode { index });
            };
            let mut next = entry.frontier;
            let fault = |what: &str| {
                tracing::warn!(path = %path.display(), what, "a staged SEGMENT_LOG is refused");
                InstallError::Decode { index }
            };
            if std::io::Seek::rewind(file).is_err() {
                return Err(fault("rewind"));
            }
            let mut reader = std::io::BufReader::with_capacity(STAGED_CHUNK, &*file);
            let mut read = 0u64;
            let mut head = [0u8; crate::client::request::BATCH_HEADER_SIZE];
            while read < entry.len {
                if entry.len - read < head.len() as u64 || reader.read_exact(&mut head).is_err() {
                    return Err(fault("truncated"));
                }
                let info = batch::peek(&head).ok_or_else(|| fault("header"))?;
                if info.len > entry.len - read || info.base_offset != next {
                    return Err(fault("length or offset"));
                }
                let mut bytes = vec![0u8; info.len as usize];
                bytes[..head.len()].copy_from_slice(&head);
                if reader.read_exact(&mut bytes[head.len()..]).is_err() {
                    return Err(fault("truncated"));
                }
                batch::verify(&bytes).map_err(|_| fault("batch"))?;
                // The running hash of the installed log is the artifact's checksum too: the
                // log is fresh and only one SEGMENT_LOG is taken.
                log.add(info.base_offset, &bytes);
                read += info.len;
                next = info.end_offset();
                tail_bytes += bytes.len();
                tail.push_back(Bytes::from(bytes));
                while tail_bytes > self.budget() && tail.len() > 1 {
                    tail_bytes -= tail.pop_front().map_or(0, |b| b.len());
                }
            }
            if log.digest() != entry.checksum {
                return Err(fault("checksum"));
            }
            end = Some(next);
            mapped = Some((path.clone(), entry.frontier, entry.len, next));
        }
        if end.is_some_and(|e| e > table.next_offset) {
            return Err(InstallError::Decode { index });
        }
        // Sound: hand the file over under a name of its own (a later transfer stages anew).
        let staged_log = match mapped {
            Some((path, frontier, len, end_offset)) => {
                let name = format!("t{:016x}-{commit_op}.install", self.group.0);
                let target = path.with_file_name(&name);
                if let Err(error) = std::fs::rename(&path, &target) {
                    tracing::warn!(%error, path = %path.display(), "handing a staged log over");
                    return Err(InstallError::Decode { index: 0 });
                }
                if let Some(map) = &self.disk {
                    map.borrow_mut().segments = vec![crate::partition::reader::MappedSegment {
                        name: name.clone(),
                        base: frontier,
                        len,
                        end_offset,
                        index: Vec::new(),
                    }];
                }
                Some(StagedLog {
                    name,
                    frontier,
                    len,
                })
            }
            None => {
                if let Some(map) = &self.disk {
                    map.borrow_mut().segments.clear();
                }
                None
            }
        };
        self.batches = tail
            .into_iter()
            .filter_map(|b| Some((batch::peek(&b)?.base_offset, b)))
            .collect();
        self.tail_bytes = tail_bytes;
        self.log = RefCell::new(log);
        self.next_offset = table.next_offset;
        self.offsets = table.clone();
        let mut storage = self.storage.borrow_mut();
        storage.clear();
        storage.push(StorageWork::Install {
            batches: Vec::new(),
            offsets: table,
            staged: staged_log,
        });
        Ok(())
    }
}

/// Bytes read from a staged SEGMENT_LOG per call at the install.
const STAGED_CHUNK: usize = 256 << 10;

impl crate::metadata_group::Checkpointable for PartitionStateMachine {
    /// One SEGMENT_LOG of every held batch (frontier: its first base offset), then
    /// CONSUMER_OFFSETS (frontier: `commit_op`), as `journal::artifact::partition_offer`
    /// lays them out. Only the in-memory tail: a machine reading from the segments
    /// (decision 280) is checkpointed by the storage task and transferred by `offer`; this
    /// serves machines that hold everything (tests, in-memory storage).
    fn checkpoint_artifacts(&self, commit_op: u64) -> Vec<Artifact> {
        let mut out = Vec::new();
        if let Some(first) = self.batches.keys().next() {
            let mut bytes = Vec::with_capacity(self.batches.values().map(Bytes::len).sum());
            for b in self.batches.values() {
                bytes.extend_from_slice(b);
            }
            out.push(Artifact {
                kind: ArtifactKind::SEGMENT_LOG,
                frontier: *first,
                bytes,
            });
        }
        out.push(Artifact {
            kind: ArtifactKind::CONSUMER_OFFSETS,
            frontier: commit_op,
            bytes: self.offsets.encode(),
        });
        out
    }

    fn restore(&mut self, commit_op: u64, artifacts: &[Artifact]) -> Result<(), InstallError> {
        let _ = commit_op;
        let artifacts: Vec<(ArtifactKind, u64, Bytes)> = artifacts
            .iter()
            .map(|a| (a.kind, a.frontier, Bytes::copy_from_slice(&a.bytes)))
            .collect();
        self.install_whole(&artifacts)
    }
}

/// The client-plane form of a partition group's reply (client-plane.md §3, §4.1). The state
/// machine answers every op with a result section (deterministic, the same bytes on every
/// replica and in the client table), but SendMessages replies are raw: a success carries the
/// confirmations alone, and a rejection travels in the header `status` with an empty body (a
/// result section `[1][0][code]` would read as one garbled confirmation, i.e. success).
/// StoreConsumerOffset and DeleteConsumerOffset refusals (InvalidOffset, ConsumerOffsetNotFound)
/// travel in the header `status` with an empty body too, the channel client-plane.md §4.1 names
/// for partition denials (the SDK reads a status-0 result section as success; decision 383);
/// their successes pass unchanged. Every other frame passes unchanged.
pub fn client_reply(frame: Frame) -> Frame {
    let Some(header) = frame.header_bytes().and_then(|h| ReplyHeader::view(h)) else {
        return frame;
    };
    let offsets = [
        Operation::StoreConsumerOffset.byte(),
        Operation::DeleteConsumerOffset.byte(),
    ];
    let send = header.operation == Operation::SendMessages.byte();
    if frame.command() != Some(Command::Reply)
        || !(send || offsets.contains(&header.operation))
        || header.status.get() != 0
    {
        return frame;
    }
    let (status, body) = match read_result(frame.body()) {
        Ok(Ok(payload)) if send => (0, payload),
        Ok(Ok(_)) => return frame,
        Ok(Err(code)) => (code, &[][..]),
        // Already raw (or empty: zero confirmations).
        Err(_) => return frame,
    };
    let mut header = *header;
    header.status.set(status);
    if wire::encode::finish_header(&mut header, body).is_err() {
        return frame;
    }
    let mut bytes = Vec::with_capacity(wire::HEADER_SIZE + body.len());
    bytes.extend_from_slice(header.bytes());
    bytes.extend_from_slice(body);
    Frame::new(bytes)
}

/// A partition pump's [`ReplySink`]: the shard's reply sink behind [`client_reply`].
pub struct ClientReplies(pub Rc<dyn ReplySink>);

impl ReplySink for ClientReplies {
    fn reply(&self, client: u128, frame: Frame) {
        self.0.reply(client, client_reply(frame));
    }
}

#[cfg(test)]
mod tests;
