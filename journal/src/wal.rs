//! The per-shard partition write-ahead log with group commit (DESIGN.md §2, journal.md §6).
//!
//! One WAL per shard multiplexes the shard's partition groups. Prepares are submitted into an
//! in-memory window; [`PartitionWal::commit`] writes the whole window with one durable
//! (`O_DSYNC`) write, after which every record in it is durable (its lsn `<=`
//! [`PartitionWal::durable_lsn`]) and the core may send its PrepareOk. The window is bounded
//! by bytes ([`WalConfig::window_bytes_max`]: [`PartitionWal::is_window_full`]) and by time
//! ([`WalConfig::window_us_max`]: [`PartitionWal::is_window_due`]); the shard pump commits when
//! either says so. Time is passed in (sans-IO).
//!
//! Files `wal.{seq:010}`, each set to [`WalConfig::file_size_max`] bytes when created (it reads
//! as zeros past the log), so that a lost file tail is told from a torn write by the file's
//! length. A file created by this process has its blocks written with zeros ahead of its
//! windows (decision 471), so that a window's sync needs no file-system journal commit.
//! A window starts on a sector boundary, and the same write carries a tail marker in the sector
//! right after it:
//!
//! ```text
//! window header (64 B): magic "PWIN" | count u32 | lsn_first u64 | bytes u64 (header and
//!                       records, without padding) | version u8 | seal u8 | reserved 6 |
//!                       lost_lsn_first u64 | reserved 16 | XXH3-64 of bytes 0..56
//! record (64 B + payload padded to 8 with zeros): magic "PREC" | len u32 | lsn u64 |
//!                       group u64 | XXH3-64(payload) u64 | kind u8 (0 prepare, 1 truncate,
//!                       2 body reference) | reserved 23 | XXH3-64 of bytes 0..56
//! zero padding to the next sector
//! tail marker (one sector, 64 B used): magic "PTAL" | version u8 | reserved 3 | file seq u64 |
//!                       window offset u64 | lsn_first u64 | lsn_last u64 | window header
//!                       XXH3 u64 | window bytes u64 | XXH3-64 of bytes 0..56
//! ```
//!
//! The payload is the whole prepare frame of the group (partition prepares carry no body digest,
//! so the record checksum covers the body), or for kind 2 the prepare's 256-byte header and a
//! [`BodyRef`] (48 bytes) naming where its body was written in the group's segments and its
//! XXH3-64 (decision 414: a large batch is written once, at its segment's tail). Window `n + 1` is written only after window `n` is
//! synced, and starts at window `n`'s tail marker (overwriting it), so only the last window has
//! a live marker; the last window of a rotated file keeps its marker, followed by zeros. A
//! window never uses the last sector of a file, which is reserved for its marker.
//!
//! Recovery (docs/decisions.md item 43):
//! - a damaged window followed by a valid later window is interior damage of acknowledged data
//!   (reported in [`WalRecovery::damage`] with its lsn range, for repair from peers);
//! - a damaged last window with no valid marker naming it is a torn, never-acknowledged tail:
//!   it is cut (zeroed and synced) and the log continues from it. Writes land as a prefix of
//!   their sectors or sector by sector; an acknowledged window's marker reached the disk before
//!   its durable write returned, so a single fault cannot destroy both the window and its marker;
//! - a damaged last window whose marker is valid was written whole by the writer. If the sector
//!   the window starts at still holds the previous window's marker, the window's head never
//!   landed (never acknowledged): torn tail, cut. If every sector of the window reads non-zero,
//!   the whole write landed and was damaged afterwards: [`WalRecovery::damage`]. Otherwise (a
//!   zero sector inside it) it is either an acknowledged window that lost a sector or a write
//!   torn by a crash on a disk that reorders sector writes; recovery cannot tell which and
//!   reports it in [`WalRecovery::unverified`], which the caller treats as damage (the lsns may
//!   have been acknowledged: repair them, never nack them). In both cases the lsns are not
//!   reused: recovery writes a *seal* in the window's place, an empty window (count 0) that
//!   names the lost lsn range and its kind, so every later open reports the same range.
//!
//! The durable end (docs/decisions.md item 90): a record outside the files (`wal-end`, see the
//! `end` submodule) names the files in use, the reclaim floor and an lsn up to which everything
//! was durable. It is rewritten after a rotation's preallocation is synced, before reclaim
//! removes files, at every open, and every [`END_EVERY_DEFAULT`] commits (or when the pump
//! calls [`PartitionWal::record_end`]): no extra `fdatasync` for the other commits. At open, a
//! named file that is short or gone ([`WalRecovery::truncated`], [`WalRecovery::missing`]),
//! lsns between the floor and the first window, and lsns up to the recorded durable one that
//! no window accounts for (a last window that lost both head and marker) are reported in
//! [`WalRecovery::damage`]; the last kind is sealed like a damaged last window. A fresh
//! directory writes a first record naming no file before it creates its first file, so WAL
//! files beside no record (absent or cut to nothing) refuse to open (decision 481).

use wire::HEADER_SIZE;
use wire::integrity::xxh3;

pub use end::{END_FILE, EndFault, EndRecord, WalEnd, open as open_end};
pub use layout::WAL_FORMAT_VERSION;
use layout::{
    MarkedTail, Marker, WindowBuf, WindowHead, classify_marked_tail, file_name, finish_head,
    head_checksum, parse_window_records, seal_head, u64_at, window_write,
};

use crate::file::AlignedBuf;
use crate::storage::{
    OpenMode, SECTOR, Storage, StorageError, is_zero, read_exact_at, sector_ceil,
};

const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"PREC");
const HEAD: usize = 64;
/// The tail marker: one sector after each window, in the same write.
const MARKER: usize = SECTOR;
const ZERO_CHUNK: usize = 1024 * 1024;
/// A fresh WAL file's blocks are written with zeros this far ahead of its windows, beside a
/// window's own write (decision 471): a window then overwrites written blocks, so its
/// sync is a device flush alone instead of a file-system journal commit for the blocks
/// it allocated. Once per this many bytes of windows, one more write of this size.
const ZERO_AHEAD: u64 = 1024 * 1024;
const KIND_PREPARE: u8 = 0;
const KIND_TRUNCATE: u8 = 1;
/// A prepare whose body lives in its group's segment (decision 414): the payload is the
/// prepare's header and a [`BodyRef`] whose hash is the XXH3-64 of the whole body
/// ([`BodyHash::WholeBody`]). Written by builds before decision 498, still read.
const KIND_BODY_REF: u8 = 2;
/// The same, the hash being the batch's own checksum ([`BodyHash::BatchChecksum`], decision
/// 498). A build before it does not parse the record: it takes the window for damaged, and a
/// node with no peer to repair from then cuts the segment data the window vouched for. No
/// downgrade: the stamp's `data_format` (decision 499) makes later builds refuse instead.
const KIND_BODY_REF_BATCH: u8 = 3;
/// A window header that is not a seal.
const SEAL_NONE: u8 = 0;
/// A seal over a window that landed whole and was damaged ([`WalRecovery::damage`]).
const SEAL_DAMAGE: u8 = 1;
/// A seal over a window that may have been acknowledged ([`WalRecovery::unverified`]).
const SEAL_UNVERIFIED: u8 = 2;
/// The largest payload a record holds (a frame of `max_message_size`).
pub const RECORD_PAYLOAD_MAX: usize = 64 * 1024 * 1024;
const _: () = assert!(HEAD <= MARKER);
const _: () = assert!(MARKER.is_multiple_of(SECTOR));

/// WAL sizing and the group-commit window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalConfig {
    /// Largest file before rotation (a sector multiple, at least one full window).
    pub file_size_max: u64,
    /// A window at or above this many bytes should be committed now.
    pub window_bytes_max: usize,
    /// A window older than this should be committed now.
    pub window_us_max: u64,
}

impl Default for WalConfig {
    fn default() -> Self {
        WalConfig {
            file_size_max: 64 * 1024 * 1024,
            window_bytes_max: 4 * 1024 * 1024,
            window_us_max: 500,
        }
    }
}

/// Why a WAL call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalError {
    /// The storage failed (environmental: fail-stop).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A payload larger than [`RECORD_PAYLOAD_MAX`] or than a file.
    #[error("record of {0} bytes is too large")]
    TooLarge(usize),
    /// Unusable configuration.
    #[error("wal config {0:?}")]
    Config(WalConfig),
    /// The durable-end record cannot be trusted (docs/decisions.md item 90): the WAL may have
    /// lost what the record would have told, so it refuses to open.
    #[error("wal durable-end record wal-end: {0}")]
    EndRecord(end::EndFault),
    /// The open window plus this record would not fit in one file: commit the window first.
    #[error("window of {window} bytes cannot take a record of {record} more: commit first")]
    WindowFull {
        /// Bytes in the open window.
        window: usize,
        /// The record's payload.
        record: usize,
    },
}

/// One record handed to the recovery visitor.
#[derive(Debug, Clone, Copy)]
pub struct WalRecord<'a> {
    /// Log sequence number (1-based, consecutive across the shard).
    pub lsn: u64,
    /// The partition group.
    pub group: u64,
    /// The prepare frame (empty for a truncation).
    pub frame: &'a [u8],
    /// `Some(op)`: not a prepare but the durable truncation of the group's ops `>= op`
    /// (view-change reconciliation); replay drops the group's earlier entries from `op` on.
    pub truncate_from: Option<u64>,
    /// `Some`: `frame` is the prepare's header alone, and its body is in the group's segment
    /// where this says (decision 414).
    pub body: Option<BodyRef>,
}

/// Where a prepare's body was written in its group's segments, and what it holds: the record
/// a body-reference WAL entry carries instead of the body (decision 414). Untrusted on replay:
/// the body found there is checked against `len`, `hash` ([`BodyRef::names`]) and the offsets
/// before it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyRef {
    /// What `hash` is: the record kind says.
    pub by: BodyHash,
    /// Base offset of the segment the body was written to.
    pub segment: u64,
    /// Byte position of the body in that segment's `.log`.
    pub position: u64,
    /// Body length in bytes (the prepare's `size` minus its header).
    pub len: u64,
    /// The body's hash, of the kind `by` says.
    pub hash: u64,
    /// The batch's base offset.
    pub base_offset: u64,
    /// One past the batch's last offset.
    pub end_offset: u64,
}

impl BodyRef {
    /// Encoded length.
    pub const LEN: usize = 48;

    /// The reference to `body`, a message batch written at `position` of the segment based at
    /// `segment`: its length, batch checksum and offsets. No pass over the body: the batch
    /// checksum already covers every message's checksum, and a reader verifies the batch whole
    /// (decision 498). `None` when `body` has no batch header.
    pub fn of(segment: u64, position: u64, body: &[u8]) -> Option<BodyRef> {
        let header = crate::batch::peek_header(body)?;
        Some(BodyRef {
            by: BodyHash::BatchChecksum,
            segment,
            position,
            len: body.len() as u64,
            hash: header.checksum,
            base_offset: header.base_offset,
            end_offset: header.end_offset(),
        })
    }

    /// Whether `body` is exactly the body this reference names (its length and hash; the
    /// caller checks the offsets).
    pub fn names(&self, body: &[u8]) -> bool {
        body.len() as u64 == self.len && self.by.names(self.hash, body)
    }

    fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        for (i, v) in [
            self.segment,
            self.position,
            self.len,
            self.hash,
            self.base_offset,
            self.end_offset,
        ]
        .into_iter()
        .enumerate()
        {
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    fn decode(by: BodyHash, bytes: &[u8]) -> BodyRef {
        BodyRef {
            by,
            segment: u64_at(bytes, 0),
            position: u64_at(bytes, 8),
            len: u64_at(bytes, 16),
            hash: u64_at(bytes, 24),
            base_offset: u64_at(bytes, 32),
            end_offset: u64_at(bytes, 40),
        }
    }
}

/// What a body reference's hash is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyHash {
    /// The batch's own `batch_checksum` (decision 498, record kind 3): it binds the reference
    /// to the batch without a pass over the body, which the storage task used to make on every
    /// node between taking an append and submitting its segment write.
    BatchChecksum,
    /// The XXH3-64 of the whole body (record kind 2, written before decision 498).
    WholeBody,
}

impl BodyHash {
    /// The WAL record kind of a reference with this hash.
    fn kind(self) -> u8 {
        match self {
            BodyHash::WholeBody => KIND_BODY_REF,
            BodyHash::BatchChecksum => KIND_BODY_REF_BATCH,
        }
    }

    /// The hash a body-reference record of `kind` holds.
    fn of_kind(kind: u8) -> Option<BodyHash> {
        [BodyHash::WholeBody, BodyHash::BatchChecksum]
            .into_iter()
            .find(|by| by.kind() == kind)
    }

    /// Whether `body` is the body a reference with `hash` of this kind names. A batch
    /// checksum names a batch of exactly `body.len()` bytes with that checksum that verifies
    /// whole: every message checksum, then the batch checksum, so every byte is covered.
    pub fn names(self, hash: u64, body: &[u8]) -> bool {
        match self {
            BodyHash::BatchChecksum => crate::batch::peek_header(body).is_some_and(|header| {
                header.checksum == hash
                    && header.length == body.len() as u64
                    && crate::batch::verify(body).is_ok()
            }),
            BodyHash::WholeBody => wire::integrity::xxh3(body) == hash,
        }
    }
}

/// Interior damage: acknowledged records that no longer verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalDamage {
    /// File sequence.
    pub file: u64,
    /// Byte offset of the damaged window.
    pub offset: u64,
    /// First lsn that may be lost.
    pub lsn_first: u64,
    /// Last lsn that may be lost.
    pub lsn_last: u64,
}

/// What the WAL scan found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WalRecovery {
    /// Records delivered to the visitor.
    pub records: u64,
    /// Windows scanned intact (seals included).
    pub windows: u64,
    /// The last lsn delivered.
    pub lsn_last: u64,
    /// A torn tail window that was cut: `(file, offset)`.
    pub torn_tail: Option<(u64, u64)>,
    /// Damage to acknowledged records (records of these lsns were lost; the groups must repair
    /// them): a damaged window before an intact one, or a last window that landed whole and was
    /// damaged afterwards. `lsn_last == u64::MAX`: lost up to an unknown lsn (a truncated file).
    pub damage: Vec<WalDamage>,
    /// Files shorter than their preallocated size (a lost tail). Reported by this open only:
    /// the file is restored to its size and the log continues at the cut, so the caller must
    /// make its reaction durable (refuse boot, or mark the groups as having lost state) before
    /// it appends, or a second crash forgets the loss. Interior damage before an intact window
    /// is found again at every open; a damaged last window is sealed (see `unverified`).
    pub truncated: Vec<u64>,
    /// Last windows whose tail marker is valid but which do not verify and hold a zero sector:
    /// an acknowledged window that lost a sector, or a write torn by a crash on a disk that
    /// reorders sector writes (never acknowledged). Recovery cannot tell them apart, so the
    /// caller must treat these lsns as possibly acknowledged: repair them, never nack them.
    /// Reported again at every open (the seal persists them) until reclaimed.
    pub unverified: Vec<WalDamage>,
    /// Files the durable-end record names (between its oldest and newest) that are gone. Their
    /// lsns are reported in `damage` (up to `u64::MAX` when the newest file is gone: it may
    /// have held windows past the record).
    pub missing: Vec<u64>,
}

impl WalRecovery {
    /// Whether nothing that may have been acknowledged was found damaged.
    pub fn is_clean(&self) -> bool {
        self.damage.is_empty()
            && self.truncated.is_empty()
            && self.unverified.is_empty()
            && self.missing.is_empty()
    }
}

#[derive(Debug)]
struct WalFile<F> {
    seq: u64,
    file: F,
    lsn_last: u64,
}

/// A file [`PartitionWal::release`] took out of the WAL, for its caller to remove.
#[derive(Debug)]
pub struct Released<F> {
    /// Its name in the WAL's storage.
    pub name: String,
    /// The open file.
    pub file: F,
}

/// The partition WAL of one shard.
#[derive(Debug)]
pub struct PartitionWal<S: Storage> {
    storage: S,
    config: WalConfig,
    files: Vec<WalFile<S::File>>,
    offset: u64,
    window: WindowBuf,
    window_count: u32,
    window_lsn_first: u64,
    window_started_us: u64,
    next_lsn: u64,
    durable_lsn: u64,
    /// The durable-end record, and the first lsn the WAL holds (what it says of reclaim).
    end: end::EndRecord<S::File>,
    floor: u64,
    /// Commits between durable-end records (0: only at rotation, reclaim and open).
    end_every: u32,
    commits_since_end: u32,
    /// When the last window's write returned: the node's timeline splits a commit into write
    /// and sync with it. A window's write is durable when it returns (decision 496), so the
    /// sync part is only what follows it in the commit.
    last_written_at: Option<std::time::Instant>,
    /// How far the active file's blocks are written (by windows or by zeros), when this
    /// process created the file and so knows it reads as zeros past `offset`; `None` for a
    /// file found at open, which is never zeroed ahead (decision 471).
    zeroed_to: Option<u64>,
}

/// Commits between two durable-end records by default: one extra `fdatasync` per this many.
pub const END_EVERY_DEFAULT: u32 = 64;

impl<S: Storage> PartitionWal<S> {
    /// Opens the WAL, scanning every file in order and handing every intact record to `visit`
    /// (in lsn order). A torn tail window is cut durably; damage is reported, and a damaged last
    /// window that its tail marker names is sealed (see the module docs).
    pub async fn open(
        storage: S,
        config: WalConfig,
        mut visit: impl FnMut(WalRecord<'_>),
    ) -> Result<(PartitionWal<S>, WalRecovery), WalError> {
        // A file holds at least one window sector and its marker.
        if config.file_size_max < (SECTOR + MARKER) as u64
            || !config.file_size_max.is_multiple_of(SECTOR as u64)
            || (config.window_bytes_max + MARKER) as u64 > config.file_size_max
        {
            return Err(WalError::Config(config));
        }
        let mut seqs: Vec<u64> = storage
            .list()
            .await?
            .iter()
            .filter_map(|n| n.strip_prefix("wal.").and_then(|s| s.parse().ok()))
            .collect();
        seqs.sort_unstable();
        let mut record = end::open(&storage).await?.map_err(WalError::EndRecord)?;
        let recorded = match record.end() {
            Some(r) => r,
            // A fresh directory records that it names no file before it creates its first, so
            // WAL files beside no record are never a crash during formatting: the record was
            // lost (or cut to nothing), and nothing tells a lost file or tail from a reclaimed
            // or fresh WAL. Refuse rather than guess.
            None if !seqs.is_empty() => return Err(WalError::EndRecord(EndFault::Missing)),
            None => {
                let none = WalEnd {
                    oldest: 1,
                    newest: 0,
                    floor: 1,
                    durable: 0,
                };
                record.write(&storage, none).await?;
                none
            }
        };
        let mut recovery = WalRecovery::default();
        // Files below the record's oldest were reclaimed (a crash came between the record and
        // their removal); files it names must all be there.
        for seq in seqs.iter().filter(|s| **s < recorded.oldest) {
            storage.remove(&file_name(*seq)).await?;
        }
        seqs.retain(|s| *s >= recorded.oldest);
        recovery.missing = (recorded.oldest..=recorded.newest)
            .filter(|s| seqs.binary_search(s).is_err())
            .collect();
        let floor = recorded.floor;
        let mut files = Vec::new();
        // Whether the active file is created here (it reads as zeros past the log: decision 471).
        let mut fresh = false;
        let mut offset = 0;
        // The last lsn accounted for (delivered, or named lost by a seal). Below the floor
        // everything was reclaimed.
        let mut lsn_last = floor - 1;
        let mut cut: Option<(usize, u64)> = None;
        // Windows found by file index: scan all files, remember the first damaged window.
        let mut pending_damage: Option<(u64, u64)> = None; // (file, offset)
        // The marker of the last intact window, and a valid marker naming the pending damage.
        let mut last_window: Option<Marker> = None;
        let mut marked: Option<Marker> = None;
        // The newest valid marker past the pending damage that names a later window: that
        // window was written after every window before it had synced, so every lsn from the
        // damage to its own was acknowledged (a second damaged window, e.g. across a rotation).
        let mut later: Option<Marker> = None;
        let mut images = Vec::new();
        for (index, seq) in seqs.iter().enumerate() {
            let file = storage.open(&file_name(*seq), OpenMode::Existing).await?;
            let len = storage.len(&file).await?;
            // Read straight into an aligned image (no bounce copy under O_DIRECT).
            let whole = sector_ceil(len).min(config.file_size_max) as usize;
            let mut image = AlignedBuf::zeroed(config.file_size_max as usize);
            let bytes = &mut image.as_mut_slice()[..whole];
            match read_exact_at(&storage, &file, 0, bytes).await {
                Ok(_) => {}
                Err(e) if e.is_media() => {
                    // Read sector by sector; unreadable sectors read as damage (0xff).
                    for (i, chunk) in bytes.chunks_mut(SECTOR).enumerate() {
                        match storage.read_at(&file, (i * SECTOR) as u64, chunk).await {
                            Ok(_) => {}
                            Err(e) if e.is_media() => chunk.fill(0xff),
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
            let short = len != config.file_size_max;
            let bytes = image.as_mut_slice();
            if short {
                bytes[whole..].fill(0xff);
                let unnamed = *seq > recorded.newest;
                if index + 1 == seqs.len() && unnamed && is_zero(&bytes[..whole]) {
                    // The last file, never written: the crash hit its preallocation. (Windows
                    // are written only after the preallocation is durable, so a short file
                    // holding anything but zeros lost a tail; a damaged first window must not
                    // pass for an empty file. A file the durable-end record names was
                    // preallocated durably before it was named: short is a lost tail.)
                    bytes.fill(0);
                    storage.set_len(&file, config.file_size_max).await?;
                    storage.sync(&file).await?;
                } else {
                    // Files are preallocated to their full size: a shorter one lost its tail.
                    recovery.truncated.push(*seq);
                }
            }
            let mut at = 0usize;
            // The end of the last intact window of this file.
            let mut file_end = 0usize;
            let mut file_lsn_last = lsn_last;
            while at + HEAD <= bytes.len() {
                if bytes[at..at + HEAD].iter().all(|b| *b == 0)
                    && bytes[at..].iter().all(|b| *b == 0)
                {
                    // End of this file's windows: the preallocated rest is zeros.
                    break;
                }
                if let Some((w, records)) = parse_window_records(&bytes[at..])
                    && w.lsn_accounted() > lsn_last
                {
                    let first = w.lsn_accounted();
                    // A gap is loss: the durable-end record says where reclaim stopped.
                    let gap = first > lsn_last + 1;
                    let pending = pending_damage.take();
                    // A damaged stretch that held no lsn (a rotated file's last marker) lost
                    // nothing.
                    if (gap || pending.is_some()) && first > lsn_last + 1 {
                        let (file, off) = pending.unwrap_or((*seq, at as u64));
                        recovery.damage.push(WalDamage {
                            file,
                            offset: off,
                            lsn_first: lsn_last + 1,
                            lsn_last: first - 1,
                        });
                    }
                    if w.seal != SEAL_NONE {
                        let lost = WalDamage {
                            file: *seq,
                            offset: at as u64,
                            lsn_first: w.lost_lsn_first,
                            lsn_last: w.lsn_first - 1,
                        };
                        if w.seal == SEAL_DAMAGE {
                            recovery.damage.push(lost);
                        } else {
                            recovery.unverified.push(lost);
                        }
                    }
                    for (lsn, group, payload, kind) in records {
                        let (frame, truncate_from, body) = match (kind, BodyHash::of_kind(kind)) {
                            (KIND_TRUNCATE, _) => {
                                let op = u64::from_le_bytes(payload.try_into().expect("8"));
                                (&payload[..0], Some(op), None)
                            }
                            // The length was checked by `parse_record`.
                            (_, Some(by)) => (
                                &payload[..HEADER_SIZE],
                                None,
                                Some(BodyRef::decode(by, &payload[HEADER_SIZE..])),
                            ),
                            _ => (payload, None, None),
                        };
                        visit(WalRecord {
                            lsn,
                            group,
                            frame,
                            truncate_from,
                            body,
                        });
                        recovery.records += 1;
                        recovery.lsn_last = lsn;
                    }
                    recovery.windows += 1;
                    lsn_last = w.lsn_last();
                    file_lsn_last = lsn_last;
                    last_window = Some(Marker::of(*seq, at as u64, &w));
                    at = sector_ceil(at as u64 + w.bytes) as usize;
                    file_end = at;
                    cut = None;
                    marked = None;
                    later = None;
                    continue;
                }
                if pending_damage.is_none() {
                    // The marker of the window just before, then zeros: the end of the windows.
                    let trailing = file_end > 0
                        && last_window.is_some_and(|m| {
                            m.at() == at as u64 && bytes[at..at + HEAD] == m.encode()
                        })
                        && bytes[at + HEAD..].iter().all(|b| *b == 0);
                    if trailing {
                        break;
                    }
                    pending_damage = Some((*seq, at as u64));
                    cut = Some((index, at as u64));
                } else if let Some(m) = Marker::parse(&bytes[at..]) {
                    // A marker naming the damaged window: that window was written whole.
                    let names_damage =
                        pending_damage == Some((*seq, m.offset)) && m.at() == at as u64;
                    let follows = recovery.windows == 0 || m.lsn_first == lsn_last + 1;
                    if names_damage && follows && marked.is_none() {
                        marked = Some(m);
                    } else if !names_damage
                        && m.seq == *seq
                        && m.at() == at as u64
                        && m.lsn_first > lsn_last + 1
                        && later.is_none_or(|l| m.lsn_last > l.lsn_last)
                    {
                        later = Some(m);
                    }
                }
                at += SECTOR; // probe the next sector boundary for a window
            }
            if cut.is_none() {
                offset = file_end as u64;
            }
            files.push(WalFile {
                seq: *seq,
                file,
                lsn_last: file_lsn_last,
            });
            if cut.is_some() {
                images.push((index, image));
            } else {
                images.clear();
            }
        }
        // A recorded file newer than every file left: it may have held windows past the
        // record's durable lsn, so the loss is unbounded.
        let newest_missing = recovery
            .missing
            .last()
            .copied()
            .filter(|m| seqs.last().is_none_or(|l| m > l));
        // A damaged last window that its marker names: `(seal kind, marker)`.
        let mut seal = None;
        if let Some((index, at)) = cut {
            let seq = files[index].seq;
            let image = &images
                .iter()
                .find(|(i, _)| *i == index)
                .expect("the cut file's image is kept")
                .1
                .as_slice();
            if recovery.truncated.contains(&seq) {
                // The damage is a lost file tail, not a torn write: acknowledged windows may
                // be gone. Report it; the lsns lost are unknown past the last intact one.
                recovery.damage.push(WalDamage {
                    file: seq,
                    offset: at,
                    lsn_first: lsn_last + 1,
                    lsn_last: u64::MAX,
                });
                storage
                    .set_len(&files[index].file, config.file_size_max)
                    .await?;
            } else if let Some(l) = later.filter(|l| marked.is_none_or(|m| l.lsn_last > m.lsn_last))
            {
                // Acknowledged windows from the damage up to a later marked one are lost.
                let lost = Marker {
                    seq,
                    offset: at,
                    lsn_first: lsn_last + 1,
                    lsn_last: l.lsn_last,
                    head_checksum: 0,
                    bytes: HEAD as u64,
                };
                seal = Some((SEAL_DAMAGE, lost));
            } else if let Some(m) = marked {
                let span = &image[at as usize..m.at() as usize];
                let previous = last_window
                    .filter(|w| w.seq == seq && w.at() == at)
                    .map(|w| w.encode());
                seal = match classify_marked_tail(span, previous.as_ref()) {
                    MarkedTail::Torn => None,
                    MarkedTail::Damage => Some((SEAL_DAMAGE, m)),
                    MarkedTail::Unverified => Some((SEAL_UNVERIFIED, m)),
                };
            }
            if seal.is_none() {
                // Damage with nothing intact after it and no marker naming it: a torn tail,
                // never acknowledged.
                recovery.torn_tail = Some((seq, at));
            }
            if recorded.newest > seq && files.len() > index + 1 {
                // The record stops naming the files about to go first, so that a crash in
                // between does not read them as lost.
                let end = WalEnd {
                    newest: seq,
                    ..recorded
                };
                record.write(&storage, end).await?;
            }
            for f in files.drain(index + 1..) {
                storage.remove(&file_name(f.seq)).await?;
            }
            let mut zero_from = at;
            if let Some((kind, m)) = seal {
                // Seal first, then zero the rest: a crash in between must not erase the only
                // evidence of the lost lsns (a torn seal leaves the damaged window's marker, or
                // its own, naming the same offset and lsns).
                let (head, encoded) = seal_head(kind, &m);
                let buf = window_write(&encoded, &head, seq, at);
                storage
                    .write_at(&files[index].file, at, buf.as_slice())
                    .await?;
                storage.sync(&files[index].file).await?;
                zero_from = at + buf.len() as u64;
                offset = at + SECTOR as u64;
                lsn_last = m.lsn_last;
                files[index].lsn_last = lsn_last;
                last_window = Some(Marker::of(seq, at, &head));
            } else {
                offset = at;
            }
            // Zero the rest (the file keeps its preallocated size) and continue the log there.
            let zero = AlignedBuf::zeroed(ZERO_CHUNK);
            let mut chunk = zero_from as usize;
            while chunk < config.file_size_max as usize {
                let end = (chunk + ZERO_CHUNK).min(config.file_size_max as usize);
                if image[chunk..end].iter().any(|b| *b != 0) {
                    let file = &files[index].file;
                    storage
                        .write_at(file, chunk as u64, &zero.as_slice()[..end - chunk])
                        .await?;
                }
                chunk = end;
            }
            storage.sync(&files[index].file).await?;
        } else if let Some((file, off)) = pending_damage {
            recovery.damage.push(WalDamage {
                file,
                offset: off,
                lsn_first: lsn_last + 1,
                lsn_last: u64::MAX,
            });
        }
        if files.is_empty() {
            // Fresh, or every file is gone: a new file after every one the record named.
            let seq = recorded.newest + 1;
            let file = storage.open(&file_name(seq), OpenMode::Create).await?;
            storage.set_len(&file, config.file_size_max).await?;
            storage.sync(&file).await?;
            fresh = true;
            files.push(WalFile {
                seq,
                file,
                lsn_last,
            });
            offset = 0;
        }
        let mut wal = PartitionWal {
            storage,
            config,
            files,
            offset,
            window: WindowBuf::new(),
            window_count: 0,
            window_lsn_first: lsn_last + 1,
            window_started_us: 0,
            next_lsn: lsn_last + 1,
            durable_lsn: lsn_last,
            end: record,
            floor,
            end_every: END_EVERY_DEFAULT,
            commits_since_end: 0,
            last_written_at: None,
            zeroed_to: fresh.then_some(offset),
        };
        if let Some((kind, m)) = seal {
            let lost = WalDamage {
                file: m.seq,
                offset: m.offset,
                lsn_first: m.lsn_first,
                lsn_last: m.lsn_last,
            };
            if kind == SEAL_DAMAGE {
                recovery.damage.push(lost);
            } else {
                recovery.unverified.push(lost);
            }
        }
        if let Some(m) = last_window {
            wal.restore_marker(m).await?;
        }
        if let Some(seq) = newest_missing {
            recovery.damage.push(WalDamage {
                file: seq,
                offset: 0,
                lsn_first: wal.durable_lsn + 1,
                lsn_last: u64::MAX,
            });
        }
        if recorded.durable > wal.durable_lsn {
            // Lsns the record says were durable and nothing accounts for: a lost tail, file,
            // or last window (head and marker both gone). Reported, and sealed so that they
            // are never reused and every later open reports them again.
            let (first, last) = (wal.durable_lsn + 1, recorded.durable);
            let covered = recovery
                .damage
                .iter()
                .chain(&recovery.unverified)
                .any(|d| d.lsn_first <= first && d.lsn_last >= last);
            let (file, offset) = wal.layout_end();
            if !covered {
                recovery.damage.push(WalDamage {
                    file,
                    offset,
                    lsn_first: first,
                    lsn_last: last,
                });
            }
            wal.seal_lost(first, last).await?;
        }
        // What was read back is durable once synced (a kill keeps unsynced pages readable);
        // then the record moves to the recovered end. Only the newest file can hold lsns past
        // the record: every rotation records the end of the file before.
        let newest = &wal.files.last().expect("one file at least").file;
        wal.storage.sync(newest).await?;
        wal.write_end().await?;
        Ok((wal, recovery))
    }

    /// The newest file's seq and the offset the next window goes to.
    fn layout_end(&self) -> (u64, u64) {
        (
            self.files.last().expect("one file at least").seq,
            self.offset,
        )
    }

    /// Recovery: writes a seal naming `first..=last` lost at the log's end (the lsns the
    /// durable-end record vouches for and no window accounts for).
    async fn seal_lost(&mut self, first: u64, last: u64) -> Result<(), WalError> {
        let (head, encoded) = finish_head(WindowHead {
            count: 0,
            lsn_first: last + 1,
            bytes: HEAD as u64,
            seal: SEAL_DAMAGE,
            lost_lsn_first: first,
            checksum: 0,
        });
        if self.offset + (SECTOR + MARKER) as u64 > self.config.file_size_max {
            self.rotate().await?;
        }
        let file = self.files.last().expect("one file at least");
        let buf = window_write(&encoded, &head, file.seq, self.offset);
        self.storage
            .write_at(&file.file, self.offset, buf.as_slice())
            .await?;
        self.storage.sync(&file.file).await?;
        self.offset += SECTOR as u64;
        self.files.last_mut().expect("one").lsn_last = last;
        self.durable_lsn = last;
        self.next_lsn = last + 1;
        self.window_lsn_first = last + 1;
        Ok(())
    }

    /// Writes the durable-end record for the WAL as it stands (one write, one `fdatasync`).
    async fn write_end(&mut self) -> Result<(), WalError> {
        let end = WalEnd {
            oldest: self.files.first().expect("one file at least").seq,
            newest: self.files.last().expect("one file at least").seq,
            floor: self.floor,
            // Never below what the record already vouched for (a seal or rotation at open
            // writes before the log has caught up with it).
            durable: self
                .durable_lsn
                .max(self.end.end().map_or(0, |e| e.durable)),
        };
        self.end.write(&self.storage, end).await?;
        self.commits_since_end = 0;
        Ok(())
    }

    /// Records the durable end now (the shard pump calls this when the WAL goes idle, so that
    /// the last window before a pause is covered; see [`PartitionWal::end_lag`]).
    pub async fn record_end(&mut self) -> Result<(), WalError> {
        if self.end_lag() > 0 {
            self.write_end().await?;
        }
        Ok(())
    }

    /// Lsns durable but not yet vouched for by the durable-end record: damage that destroys
    /// both a last window's head and its marker goes undetected only within this lag.
    pub fn end_lag(&self) -> u64 {
        self.durable_lsn
            - self
                .end
                .end()
                .map_or(0, |e| e.durable.min(self.durable_lsn))
    }

    /// Sets how many commits pass between durable-end records (0: only at rotation, reclaim,
    /// open and [`PartitionWal::record_end`]). Default [`END_EVERY_DEFAULT`].
    pub fn set_end_interval(&mut self, commits: u32) {
        self.end_every = commits;
    }

    /// Adds a record to the open window (no IO) and returns its lsn; it is durable once
    /// [`PartitionWal::durable_lsn`] reaches it.
    pub fn submit(&mut self, group: u64, frame: &[u8], now_us: u64) -> Result<u64, WalError> {
        self.submit_kind(group, frame, KIND_PREPARE, now_us)
    }

    /// Adds a prepare whose body its caller writes to the group's segment (decision 414): the
    /// record holds `header` (the prepare's 256 bytes) and `body`, a few hundred bytes whatever
    /// the body's size. Durable like [`PartitionWal::submit`]'s records; the body is durable
    /// once the caller has synced the segment.
    pub fn submit_ref(
        &mut self,
        group: u64,
        header: &[u8; HEADER_SIZE],
        body: &BodyRef,
        now_us: u64,
    ) -> Result<u64, WalError> {
        let mut payload = [0u8; HEADER_SIZE + BodyRef::LEN];
        payload[..HEADER_SIZE].copy_from_slice(header);
        payload[HEADER_SIZE..].copy_from_slice(&body.encode());
        self.submit_kind(group, &payload, body.by.kind(), now_us)
    }

    /// Adds the truncation of `group`'s ops `>= from_op` to the open window (the partition
    /// plane's `Effect::Truncate`); it takes effect for replay once committed, and orders before
    /// every later record of the group.
    pub fn submit_truncate(
        &mut self,
        group: u64,
        from_op: u64,
        now_us: u64,
    ) -> Result<u64, WalError> {
        self.submit_kind(group, &from_op.to_le_bytes(), KIND_TRUNCATE, now_us)
    }

    fn submit_kind(
        &mut self,
        group: u64,
        frame: &[u8],
        kind: u8,
        now_us: u64,
    ) -> Result<u64, WalError> {
        let record_len = HEAD + frame.len().next_multiple_of(8);
        if frame.len() > RECORD_PAYLOAD_MAX
            || (HEAD + record_len + MARKER) as u64 > self.config.file_size_max
        {
            return Err(WalError::TooLarge(frame.len()));
        }
        // A window is one write into one file (with its tail marker after it): it never grows
        // past what a file holds.
        let window_after = self.window.len.max(HEAD) + record_len;
        if sector_ceil(window_after as u64) + MARKER as u64 > self.config.file_size_max {
            return Err(WalError::WindowFull {
                window: self.window.len,
                record: frame.len(),
            });
        }
        let hint = self.window_buf_hint();
        if self.window.is_empty() {
            self.window.reserve(HEAD + record_len, hint);
            self.window.push(&[0u8; HEAD], 8);
            self.window_started_us = now_us;
            self.window_lsn_first = self.next_lsn;
        } else {
            self.window.reserve(record_len, hint);
        }
        let lsn = self.next_lsn;
        let mut head = [0u8; HEAD];
        head[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        head[4..8].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        head[8..16].copy_from_slice(&lsn.to_le_bytes());
        head[16..24].copy_from_slice(&group.to_le_bytes());
        head[24..32].copy_from_slice(&xxh3(frame).to_le_bytes());
        head[32] = kind;
        let checksum = head_checksum(&head);
        head[56..64].copy_from_slice(&checksum.to_le_bytes());
        self.window.push(&head, 8);
        self.window.push(frame, 8);
        self.window_count += 1;
        self.next_lsn += 1;
        Ok(lsn)
    }

    /// The window buffer's first size: the byte bound and its sector padding (a record that
    /// crosses the bound doubles it, once).
    fn window_buf_hint(&self) -> usize {
        sector_ceil((self.config.window_bytes_max + HEAD) as u64) as usize + SECTOR + MARKER
    }

    /// Bytes in the open window.
    pub fn window_bytes(&self) -> usize {
        self.window.len
    }

    /// Whether the window reached its byte bound.
    pub fn is_window_full(&self) -> bool {
        self.window.len >= self.config.window_bytes_max
    }

    /// Whether the window is older than its time bound.
    pub fn is_window_due(&self, now_us: u64) -> bool {
        !self.window.is_empty()
            && now_us.saturating_sub(self.window_started_us) >= self.config.window_us_max
    }

    /// When the last committed window's (durable) write returned.
    pub fn last_written_at(&self) -> Option<std::time::Instant> {
        self.last_written_at
    }

    /// The highest durable lsn.
    pub fn durable_lsn(&self) -> u64 {
        self.durable_lsn
    }

    /// Writes the open window with one durable write (decision 496); returns the durable lsn.
    /// On error nothing of the window is durable and the caller must fail-stop.
    pub async fn commit(&mut self) -> Result<u64, WalError> {
        if self.window.is_empty() {
            return Ok(self.durable_lsn);
        }
        if cfg!(feature = "bug-ack-early")
            && let Some(file) = self.files.last()
        {
            // BUG KNOB: the previous commit's fdatasync, after it was acknowledged.
            self.storage.sync(&file.file).await?;
        }
        self.write_window().await
    }

    /// Writes the open window and its tail marker with one durable write.
    async fn write_window(&mut self) -> Result<u64, WalError> {
        let (head, encoded) = finish_head(WindowHead {
            count: self.window_count,
            lsn_first: self.window_lsn_first,
            bytes: self.window.len as u64,
            seal: SEAL_NONE,
            lost_lsn_first: 0,
            checksum: 0,
        });
        self.window.as_mut_slice()[..HEAD].copy_from_slice(&encoded);
        let padded = sector_ceil(head.bytes);
        // The marker's sector is reserved: a window never ends a file.
        if self.offset + padded + MARKER as u64 > self.config.file_size_max {
            self.rotate().await?;
        }
        let file = self.files.last().expect("one file at least");
        let marker = Marker::of(file.seq, self.offset, &head).encode();
        let window_end = self.offset + padded + MARKER as u64;
        // Zeros past this window's end only (never over the last window's marker), in a file
        // that reads as zeros there: the bytes do not change, only the blocks get written.
        let zeros = self.zeroed_to.and_then(|zeroed| {
            let from = zeroed.max(window_end);
            let to = (from + ZERO_AHEAD).min(self.config.file_size_max);
            (window_end + ZERO_AHEAD / 2 > zeroed && from < to).then_some((from, to))
        });
        let storage = &self.storage;
        let (offset, sealed) = (self.offset, self.window.sealed(&marker));
        // One durable write: the window is durable when it returns (decision 496).
        let window = async {
            if cfg!(feature = "bug-ack-early") {
                storage.write_at(&file.file, offset, sealed).await
            } else {
                storage.write_durable(&file.file, offset, sealed).await
            }
        };
        let ahead = async {
            match zeros {
                Some((from, to)) => {
                    storage
                        .write_filled(&file.file, from, (to - from) as usize, |b| b.fill(0))
                        .await
                }
                None => Ok(()),
            }
        };
        let (written, zeroed) = futures_lite::future::zip(window, ahead).await;
        written?;
        zeroed?;
        self.zeroed_to = self
            .zeroed_to
            .map(|z| z.max(window_end).max(zeros.map_or(0, |(_, to)| to)));
        self.last_written_at = Some(std::time::Instant::now());
        self.offset += padded;
        let last = head.lsn_last();
        self.files.last_mut().expect("one").lsn_last = last;
        self.durable_lsn = last;
        self.next_lsn = last + 1;
        let keep = 2 * self.window_buf_hint();
        self.window.clear(keep);
        self.window_count = 0;
        self.commits_since_end += 1;
        if self.end_every > 0 && self.commits_since_end >= self.end_every {
            self.write_end().await?;
        }
        Ok(self.durable_lsn)
    }

    /// Recovery: rewrites the last window's tail marker when it is gone (zeroed, damaged or cut
    /// with a torn tail), so that damage to that window stays detectable.
    async fn restore_marker(&mut self, m: Marker) -> Result<(), WalError> {
        let Some(file) = self.files.iter().find(|f| f.seq == m.seq) else {
            return Ok(()); // reclaimed
        };
        let mut buf = AlignedBuf::zeroed(MARKER);
        match read_exact_at(&self.storage, &file.file, m.at(), buf.as_mut_slice()).await {
            Ok(_) if buf.as_slice()[..HEAD] == m.encode() => return Ok(()),
            Ok(_) => {}
            Err(e) if e.is_media() => {}
            Err(e) => return Err(e.into()),
        }
        let slice = buf.as_mut_slice();
        slice.fill(0);
        slice[..HEAD].copy_from_slice(&m.encode());
        self.storage
            .write_at(&file.file, m.at(), buf.as_slice())
            .await?;
        self.storage.sync(&file.file).await?;
        Ok(())
    }

    /// Submits and commits one record: one durable write per append (the baseline).
    pub async fn append(&mut self, group: u64, frame: &[u8], now_us: u64) -> Result<u64, WalError> {
        let lsn = self.submit(group, frame, now_us)?;
        self.commit().await?;
        Ok(lsn)
    }

    async fn rotate(&mut self) -> Result<(), WalError> {
        let seq = self.files.last().map_or(1, |f| f.seq + 1);
        let file = self.storage.open(&file_name(seq), OpenMode::Create).await?;
        self.storage
            .set_len(&file, self.config.file_size_max)
            .await?;
        self.storage.sync(&file).await?;
        self.files.push(WalFile {
            seq,
            file,
            lsn_last: self.durable_lsn,
        });
        self.offset = 0;
        self.zeroed_to = Some(0);
        // The new file is preallocated durably before the record names it: from here on a
        // short or missing file of this seq is a loss.
        self.write_end().await?;
        Ok(())
    }

    /// Removes whole files whose records are all below `lsn` (every group's segments and
    /// offsets durably hold them: the caller's G4 analogue). The active file stays.
    /// [`PartitionWal::release`], then each file [`Storage::retire`]d in order.
    pub async fn reclaim(&mut self, lsn: u64) -> Result<usize, WalError> {
        let released = self.release(lsn).await?;
        let count = released.len();
        for file in released {
            self.storage.retire(file.file, &file.name).await?;
        }
        Ok(count)
    }

    /// Takes whole files whose records are all below `lsn` out of the WAL and hands them to the
    /// caller to remove ([`Storage::retire`]) whenever it likes (decision 400). The durable-end
    /// record names the new oldest file and floor before this returns, so the WAL never reads
    /// them again, a released file is never taken for a missing one, and one still there at a
    /// crash is removed by the next [`PartitionWal::open`]. The active file stays.
    pub async fn release(&mut self, lsn: u64) -> Result<Vec<Released<S::File>>, WalError> {
        let count = self
            .files
            .iter()
            .take(self.files.len() - 1)
            .take_while(|f| f.lsn_last < lsn)
            .count();
        if count == 0 {
            return Ok(Vec::new());
        }
        let removed: Vec<WalFile<S::File>> = self.files.drain(..count).collect();
        self.floor = removed.last().expect("count > 0").lsn_last + 1;
        self.write_end().await?;
        Ok(removed
            .into_iter()
            .map(|f| Released {
                name: file_name(f.seq),
                file: f.file,
            })
            .collect())
    }

    /// The storage the WAL's files live in.
    pub fn storage(&self) -> &S {
        &self.storage
    }

    /// The lowest lsn the WAL holds: the first record replayed at open, then one past the last
    /// record of the files [`PartitionWal::reclaim`] removed. A reopen replays from exactly here
    /// (the crash tests check it), past a sealed range that starts here (its lsns are accounted
    /// lost or unverified, with no record to replay).
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// Files in use.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// The files in use, oldest first, and the byte offset in the newest where the next window
    /// goes (for fault injection in tests and the simulator).
    pub fn layout(&self) -> (Vec<String>, u64) {
        let names = self.files.iter().map(|f| file_name(f.seq)).collect();
        (names, self.offset)
    }
}

/// Replay of the WAL per partition group: prepares by op, with truncations applied in log
/// order, so each group gets the journal state its consensus core last made durable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupReplay {
    /// Group → op → prepare frame (the header alone for an op in `bodies`).
    pub groups: std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, Vec<u8>>>,
    /// Group → op → where the body of a body-reference record is (decision 414): the group's
    /// boot reads and checks it ([`crate::recover_partition`]).
    pub bodies: std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, BodyRef>>,
    /// Records that are not a decodable prepare (ignored, counted).
    pub undecodable: u64,
}

impl GroupReplay {
    /// Applies one record (hand this to [`PartitionWal::open`]'s visitor).
    pub fn apply(&mut self, record: WalRecord<'_>) {
        let ops = self.groups.entry(record.group).or_default();
        let bodies = self.bodies.entry(record.group).or_default();
        if let Some(from) = record.truncate_from {
            ops.split_off(&from);
            bodies.split_off(&from);
            return;
        }
        let expected = |body: Option<BodyRef>| match body {
            Some(b) => (HEADER_SIZE as u64).checked_add(b.len),
            None => Some(record.frame.len() as u64),
        };
        match crate::prepare::verify_header(record.frame) {
            Ok(header) if Some(u64::from(header.size())) == expected(record.body) => {
                ops.insert(header.op(), record.frame.to_vec());
                match record.body {
                    Some(body) => bodies.insert(header.op(), body),
                    None => bodies.remove(&header.op()),
                };
            }
            _ => self.undecodable += 1,
        }
    }

    /// Takes `group`'s replayed ops: the frames (headers alone where a body is referenced)
    /// and the body references.
    pub fn take(
        &mut self,
        group: u64,
    ) -> (
        std::collections::BTreeMap<u64, Vec<u8>>,
        std::collections::BTreeMap<u64, BodyRef>,
    ) {
        (
            self.groups.remove(&group).unwrap_or_default(),
            self.bodies.remove(&group).unwrap_or_default(),
        )
    }

    /// Keeps `group`'s ops for which `keep` holds.
    pub fn retain(&mut self, group: u64, mut keep: impl FnMut(u64) -> bool) {
        if let Some(ops) = self.groups.get_mut(&group) {
            ops.retain(|op, _| keep(*op));
        }
        if let Some(bodies) = self.bodies.get_mut(&group) {
            bodies.retain(|op, _| keep(*op));
        }
    }
}

mod end;
mod layout;
#[cfg(test)]
mod tests;
