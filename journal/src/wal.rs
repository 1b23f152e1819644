//! The per-shard partition write-ahead log with group commit (DESIGN.md §2, journal.md §6).
//!
//! One WAL per shard multiplexes the shard's partition groups. Prepares are submitted into an
//! in-memory window; [`PartitionWal::commit`] writes the whole window with one write and one
//! `fdatasync`, after which every record in it is durable (its lsn `<=`
//! [`PartitionWal::durable_lsn`]) and the core may send its PrepareOk. The window is bounded
//! by bytes ([`WalConfig::window_bytes_max`]: [`PartitionWal::is_window_full`]) and by time
//! ([`WalConfig::window_us_max`]: [`PartitionWal::is_window_due`]); the shard pump commits when
//! either says so. Time is passed in (sans-IO).
//!
//! Files `wal.{seq:010}`, each preallocated (zero-filled) to [`WalConfig::file_size_max`] bytes,
//! so that a lost file tail is told from a torn write by the file's length. A window starts on
//! a sector boundary:
//!
//! ```text
//! window header (64 B): magic "PWIN" | count u32 | lsn_first u64 | bytes u64 (header and
//!                       records, without padding) | reserved 32 | XXH3-64 of bytes 0..56
//! record (64 B + payload padded to 8): magic "PREC" | len u32 | lsn u64 | group u64 |
//!                       XXH3-64(payload) u64 | kind u8 (0 prepare, 1 truncate) | reserved 23 |
//!                       XXH3-64 of bytes 0..56
//! zero padding to the next sector
//! ```
//!
//! The payload is the whole prepare frame of the group (partition prepares carry no body digest,
//! so the record checksum covers the body). Window `n + 1` is written only after window `n` is
//! synced, so at recovery a damaged window followed by a valid later window is interior damage
//! of acknowledged data (reported with its lsn range, for repair from peers), and a damaged
//! last window is a torn, never-acknowledged tail: it is cut (the file is truncated there and
//! synced) and the log continues from it.

use wire::integrity::xxh3;

use crate::file::AlignedBuf;
use crate::storage::{OpenMode, SECTOR, Storage, StorageError, read_exact_at, sector_ceil};

const WINDOW_MAGIC: u32 = u32::from_le_bytes(*b"PWIN");
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"PREC");
const HEAD: usize = 64;
const ZERO_CHUNK: usize = 1024 * 1024;
const KIND_PREPARE: u8 = 0;
const KIND_TRUNCATE: u8 = 1;
/// The largest payload a record holds (a frame of `max_message_size`).
pub const RECORD_PAYLOAD_MAX: usize = 64 * 1024 * 1024;

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
    /// Windows scanned intact.
    pub windows: u64,
    /// The last lsn delivered.
    pub lsn_last: u64,
    /// A torn tail window that was cut: `(file, offset)`.
    pub torn_tail: Option<(u64, u64)>,
    /// Interior damage (records of these lsns were lost; the groups must repair them).
    /// `lsn_last == u64::MAX`: lost up to an unknown lsn (a truncated file).
    pub damage: Vec<WalDamage>,
    /// Files shorter than their preallocated size (a lost tail).
    pub truncated: Vec<u64>,
}

impl WalRecovery {
    /// Whether nothing acknowledged was found damaged.
    pub fn is_clean(&self) -> bool {
        self.damage.is_empty() && self.truncated.is_empty()
    }
}

#[derive(Debug)]
struct WalFile<F> {
    seq: u64,
    file: F,
    lsn_last: u64,
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
}

/// The open window, built in place in a sector-aligned buffer kept across commits: a commit
/// writes it as it stands (one aligned write, no per-commit allocation and no copy), and the
/// storage can hand it to an `O_DIRECT` write directly.
#[derive(Debug)]
struct WindowBuf {
    buf: AlignedBuf,
    len: usize,
}

impl WindowBuf {
    fn new() -> WindowBuf {
        WindowBuf {
            buf: AlignedBuf::zeroed(0),
            len: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes room for `more` bytes and the sector padding after them, growing at least twofold
    /// (and at once to `hint` bytes) so that a window is copied at most a few times as it grows.
    fn reserve(&mut self, more: usize, hint: usize) {
        let need = sector_ceil((self.len + more) as u64) as usize;
        if need > self.buf.len() {
            let capacity = need.max(2 * self.buf.len()).max(hint);
            let mut grown = AlignedBuf::zeroed(capacity);
            grown.as_mut_slice()[..self.len].copy_from_slice(&self.buf.as_slice()[..self.len]);
            self.buf = grown;
        }
    }

    /// Appends `bytes` (room reserved), then zeros up to the next multiple of `align`.
    fn push(&mut self, bytes: &[u8], align: usize) {
        let end = self.len + bytes.len();
        let padded = end.next_multiple_of(align);
        let target = &mut self.buf.as_mut_slice()[self.len..padded];
        target[..bytes.len()].copy_from_slice(bytes);
        target[bytes.len()..].fill(0);
        self.len = padded;
    }

    /// The window zero-padded to whole sectors, as written.
    fn sealed(&mut self) -> &[u8] {
        let padded = sector_ceil(self.len as u64) as usize;
        let bytes = self.buf.as_mut_slice();
        bytes[self.len..padded].fill(0);
        &bytes[..padded]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[..self.len]
    }

    /// Empties the window; a buffer grown past `keep` bytes (by a huge record) is released.
    fn clear(&mut self, keep: usize) {
        self.len = 0;
        if self.buf.len() > keep {
            self.buf = AlignedBuf::zeroed(0);
        }
    }
}

fn file_name(seq: u64) -> String {
    format!("wal.{seq:010}")
}

fn head_checksum(head: &[u8]) -> u64 {
    xxh3(&head[..56])
}

struct WindowHead {
    count: u32,
    lsn_first: u64,
    bytes: u64,
}

fn parse_window(bytes: &[u8]) -> Option<WindowHead> {
    let head = bytes.get(..HEAD)?;
    let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4"));
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8"));
    if u32_at(0) != WINDOW_MAGIC || u64_at(56) != head_checksum(head) {
        return None;
    }
    let w = WindowHead {
        count: u32_at(4),
        lsn_first: u64_at(8),
        bytes: u64_at(16),
    };
    (w.bytes >= HEAD as u64 && w.lsn_first > 0).then_some(w)
}

/// Parses the record at the start of `bytes`: `(lsn, group, payload, kind, record length)`.
fn parse_record(bytes: &[u8]) -> Option<(u64, u64, &[u8], u8, usize)> {
    let head = bytes.get(..HEAD)?;
    let u32_at = |at: usize| u32::from_le_bytes(head[at..at + 4].try_into().expect("4"));
    let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8"));
    if u32_at(0) != RECORD_MAGIC || u64_at(56) != head_checksum(head) {
        return None;
    }
    let len = u32_at(4) as usize;
    let payload = bytes.get(HEAD..HEAD + len)?;
    if xxh3(payload) != u64_at(24) {
        return None;
    }
    let kind = head[32];
    if kind > KIND_TRUNCATE || (kind == KIND_TRUNCATE && len != 8) {
        return None;
    }
    Some((
        u64_at(8),
        u64_at(16),
        payload,
        kind,
        HEAD + len.next_multiple_of(8),
    ))
}

/// Verifies a whole window at the start of `bytes` and returns its records, or `None`.
/// `(lsn, group, payload, kind)` of each record of a window.
type WindowRecords<'a> = Vec<(u64, u64, &'a [u8], u8)>;

fn parse_window_records(bytes: &[u8]) -> Option<(WindowHead, WindowRecords<'_>)> {
    let w = parse_window(bytes)?;
    let body = bytes.get(HEAD..usize::try_from(w.bytes).ok()?)?;
    let mut records = Vec::with_capacity(w.count as usize);
    let mut at = 0;
    for i in 0..w.count as u64 {
        let (lsn, group, payload, kind, len) = parse_record(body.get(at..)?)?;
        if lsn != w.lsn_first + i {
            return None;
        }
        records.push((lsn, group, payload, kind));
        at += len;
    }
    (at == body.len()).then_some((w, records))
}

impl<S: Storage> PartitionWal<S> {
    /// Opens the WAL, scanning every file in order and handing every intact record to `visit`
    /// (in lsn order). A torn tail window is cut durably; interior damage is reported.
    pub async fn open(
        storage: S,
        config: WalConfig,
        mut visit: impl FnMut(WalRecord<'_>),
    ) -> Result<(PartitionWal<S>, WalRecovery), WalError> {
        if config.file_size_max < SECTOR as u64
            || !config.file_size_max.is_multiple_of(SECTOR as u64)
            || config.window_bytes_max as u64 > config.file_size_max
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
        let mut recovery = WalRecovery::default();
        let mut files = Vec::new();
        let mut offset = 0;
        let mut lsn_last = 0;
        let mut cut: Option<(usize, u64)> = None;
        // Windows found by file index: scan all files, remember the first damaged window.
        let mut pending_damage: Option<(u64, u64)> = None; // (file, offset)
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
                if index + 1 == seqs.len() && parse_window(bytes).is_none() {
                    // The last file, never written: the crash hit its preallocation.
                    bytes.fill(0);
                    storage.set_len(&file, config.file_size_max).await?;
                    storage.sync(&file).await?;
                } else {
                    // Files are preallocated to their full size: a shorter one lost its tail.
                    recovery.truncated.push(*seq);
                }
            }
            let mut at = 0usize;
            let mut file_lsn_last = lsn_last;
            while at + HEAD <= bytes.len() {
                if bytes[at..at + HEAD].iter().all(|b| *b == 0)
                    && bytes[at..].iter().all(|b| *b == 0)
                {
                    // End of this file's windows: the preallocated rest is zeros.
                    break;
                }
                match parse_window_records(&bytes[at..]) {
                    Some((w, records)) if w.lsn_first > lsn_last => {
                        // Before the first intact window a gap is a reclaimed prefix.
                        let gap = recovery.windows > 0 && w.lsn_first > lsn_last + 1;
                        if gap || pending_damage.is_some() {
                            let (file, off) = pending_damage.take().unwrap_or((*seq, at as u64));
                            recovery.damage.push(WalDamage {
                                file,
                                offset: off,
                                lsn_first: lsn_last + 1,
                                lsn_last: w.lsn_first - 1,
                            });
                        }
                        for (lsn, group, payload, kind) in records {
                            let (frame, truncate_from) = if kind == KIND_TRUNCATE {
                                let op = u64::from_le_bytes(payload.try_into().expect("8"));
                                (&payload[..0], Some(op))
                            } else {
                                (payload, None)
                            };
                            visit(WalRecord {
                                lsn,
                                group,
                                frame,
                                truncate_from,
                            });
                            recovery.records += 1;
                        }
                        recovery.windows += 1;
                        lsn_last = w.lsn_first + w.count as u64 - 1;
                        file_lsn_last = lsn_last;
                        at = sector_ceil(at as u64 + w.bytes) as usize;
                        cut = None;
                    }
                    _ => {
                        if pending_damage.is_none() {
                            pending_damage = Some((*seq, at as u64));
                            cut = Some((index, at as u64));
                        }
                        at += SECTOR; // probe the next sector boundary for a window
                    }
                }
            }
            if cut.is_none() {
                offset = at as u64;
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
        if let Some((index, at)) = cut {
            let seq = files[index].seq;
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
            }
            // Damage with nothing intact after it: a torn tail, never acknowledged. Zero it
            // (the file keeps its preallocated size) and continue the log from there.
            recovery.torn_tail = Some((seq, at));
            for f in files.drain(index + 1..) {
                storage.remove(&file_name(f.seq)).await?;
            }
            let image = &images
                .iter()
                .find(|(i, _)| *i == index)
                .expect("the cut file's image is kept")
                .1
                .as_slice();
            let zero = AlignedBuf::zeroed(ZERO_CHUNK);
            let mut chunk = at as usize;
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
            offset = at;
        } else if let Some((file, off)) = pending_damage {
            recovery.damage.push(WalDamage {
                file,
                offset: off,
                lsn_first: lsn_last + 1,
                lsn_last: u64::MAX,
            });
        }
        recovery.lsn_last = lsn_last;
        if files.is_empty() {
            let file = storage.open(&file_name(1), OpenMode::Create).await?;
            storage.set_len(&file, config.file_size_max).await?;
            storage.sync(&file).await?;
            files.push(WalFile {
                seq: 1,
                file,
                lsn_last: 0,
            });
            offset = 0;
        }
        let wal = PartitionWal {
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
        };
        Ok((wal, recovery))
    }

    /// Adds a record to the open window (no IO) and returns its lsn; it is durable once
    /// [`PartitionWal::durable_lsn`] reaches it.
    pub fn submit(&mut self, group: u64, frame: &[u8], now_us: u64) -> Result<u64, WalError> {
        self.submit_kind(group, frame, KIND_PREPARE, now_us)
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
            || (HEAD + record_len) as u64 > self.config.file_size_max
        {
            return Err(WalError::TooLarge(frame.len()));
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
        sector_ceil((self.config.window_bytes_max + HEAD) as u64) as usize + SECTOR
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

    /// The highest durable lsn.
    pub fn durable_lsn(&self) -> u64 {
        self.durable_lsn
    }

    /// Writes the open window with one write and one `fdatasync`; returns the durable lsn.
    /// On error nothing of the window is durable and the caller must fail-stop.
    pub async fn commit(&mut self) -> Result<u64, WalError> {
        if self.window.is_empty() {
            return Ok(self.durable_lsn);
        }
        let bytes = self.window.len as u64;
        let mut head = [0u8; HEAD];
        head[0..4].copy_from_slice(&WINDOW_MAGIC.to_le_bytes());
        head[4..8].copy_from_slice(&self.window_count.to_le_bytes());
        head[8..16].copy_from_slice(&self.window_lsn_first.to_le_bytes());
        head[16..24].copy_from_slice(&bytes.to_le_bytes());
        let checksum = head_checksum(&head);
        head[56..64].copy_from_slice(&checksum.to_le_bytes());
        self.window.as_mut_slice()[..HEAD].copy_from_slice(&head);
        let padded = sector_ceil(bytes);
        if self.offset + padded > self.config.file_size_max {
            self.rotate().await?;
        }
        let file = self.files.last().expect("one file at least");
        self.storage
            .write_at(&file.file, self.offset, self.window.sealed())
            .await?;
        self.storage.sync(&file.file).await?;
        self.offset += padded;
        let last = self.window_lsn_first + self.window_count as u64 - 1;
        self.files.last_mut().expect("one").lsn_last = last;
        self.durable_lsn = last;
        let keep = 2 * self.window_buf_hint();
        self.window.clear(keep);
        self.window_count = 0;
        Ok(self.durable_lsn)
    }

    /// Submits and commits one record: one `fdatasync` per append (the baseline).
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
        Ok(())
    }

    /// Removes whole files whose records are all below `lsn` (every group's segments and
    /// offsets durably hold them: the caller's G4 analogue). The active file stays.
    pub async fn reclaim(&mut self, lsn: u64) -> Result<usize, WalError> {
        let mut removed = 0;
        while self.files.len() > 1 && self.files[0].lsn_last < lsn {
            let f = self.files.remove(0);
            self.storage.remove(&file_name(f.seq)).await?;
            removed += 1;
        }
        Ok(removed)
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
    /// Group → op → prepare frame.
    pub groups: std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, Vec<u8>>>,
    /// Records that are not a decodable prepare (ignored, counted).
    pub undecodable: u64,
}

impl GroupReplay {
    /// Applies one record (hand this to [`PartitionWal::open`]'s visitor).
    pub fn apply(&mut self, record: WalRecord<'_>) {
        let ops = self.groups.entry(record.group).or_default();
        if let Some(from) = record.truncate_from {
            ops.split_off(&from);
            return;
        }
        match crate::prepare::verify_header(record.frame) {
            Ok(header) if header.size() as usize == record.frame.len() => {
                ops.insert(header.op(), record.frame.to_vec());
            }
            _ => self.undecodable += 1,
        }
    }
}

#[cfg(test)]
mod tests;
