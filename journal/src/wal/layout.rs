//! The on-disk layout of the WAL's files: the open window's buffer, the window header, the
//! record and the tail marker (their encoding, parsing and checks), the seal written over a
//! damaged last window, and the image of one window write. The format itself is described in
//! the `wal` module docs; this file holds the code that reads and writes it, and no IO.

use wire::HEADER_SIZE;
use wire::integrity::xxh3;

use super::{
    BodyHash, BodyRef, HEAD, KIND_BODY_REF_BATCH, KIND_TRUNCATE, MARKER, RECORD_MAGIC, SEAL_DAMAGE,
    SEAL_NONE, SEAL_UNVERIFIED,
};
use crate::file::AlignedBuf;
use crate::storage::{SECTOR, sector_ceil};

const WINDOW_MAGIC: u32 = u32::from_le_bytes(*b"PWIN");
const MARKER_MAGIC: u32 = u32::from_le_bytes(*b"PTAL");
/// The on-disk format version, in every window header and tail marker (2: tail markers and
/// seals; 1 had neither and no version byte).
pub const WAL_FORMAT_VERSION: u8 = 2;
/// Offsets, lengths and lsns that recovery accepts stay below this (no overflow in its arithmetic).
const FIELD_MAX: u64 = 1 << 62;

/// The open window, built in place in a sector-aligned buffer kept across commits: a commit
/// writes it as it stands (one aligned write, no per-commit allocation and no copy), and the
/// storage can hand it to an `O_DIRECT` write directly.
#[derive(Debug)]
pub(super) struct WindowBuf {
    buf: AlignedBuf,
    pub(super) len: usize,
}

impl WindowBuf {
    pub(super) fn new() -> WindowBuf {
        WindowBuf {
            buf: AlignedBuf::zeroed(0),
            len: 0,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes room for `more` bytes, the sector padding after them and the tail marker's sector,
    /// growing at least twofold (and at once to `hint` bytes) so that a window is copied at most
    /// a few times as it grows.
    pub(super) fn reserve(&mut self, more: usize, hint: usize) {
        let need = sector_ceil((self.len + more) as u64) as usize + MARKER;
        if need > self.buf.len() {
            let capacity = need.max(2 * self.buf.len()).max(hint);
            let mut grown = AlignedBuf::zeroed(capacity);
            grown.as_mut_slice()[..self.len].copy_from_slice(&self.buf.as_slice()[..self.len]);
            self.buf = grown;
        }
    }

    /// Appends `bytes` (room reserved), then zeros up to the next multiple of `align`.
    pub(super) fn push(&mut self, bytes: &[u8], align: usize) {
        let end = self.len + bytes.len();
        let padded = end.next_multiple_of(align);
        let target = &mut self.buf.as_mut_slice()[self.len..padded];
        target[..bytes.len()].copy_from_slice(bytes);
        target[bytes.len()..].fill(0);
        self.len = padded;
    }

    /// The window zero-padded to whole sectors, then `marker` in a sector of its own: the image
    /// one commit writes.
    pub(super) fn sealed(&mut self, marker: &[u8]) -> &[u8] {
        let padded = sector_ceil(self.len as u64) as usize;
        let bytes = self.buf.as_mut_slice();
        bytes[self.len..padded + MARKER].fill(0);
        bytes[padded..padded + marker.len()].copy_from_slice(marker);
        &bytes[..padded + MARKER]
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut_slice()[..self.len]
    }

    /// Empties the window; a buffer grown past `keep` bytes (by a huge record) is released.
    pub(super) fn clear(&mut self, keep: usize) {
        self.len = 0;
        if self.buf.len() > keep {
            self.buf = AlignedBuf::zeroed(0);
        }
    }
}

pub(super) fn file_name(seq: u64) -> String {
    format!("wal.{seq:010}")
}

pub(super) fn head_checksum(head: &[u8]) -> u64 {
    xxh3(&head[..56])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"))
}

pub(super) fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"))
}

#[derive(Debug, Clone, Copy)]
pub(super) struct WindowHead {
    pub(super) count: u32,
    pub(super) lsn_first: u64,
    pub(super) bytes: u64,
    /// [`SEAL_NONE`], or the kind of the lost range a seal names.
    pub(super) seal: u8,
    /// A seal: the first lsn lost (the range ends at `lsn_first - 1`).
    pub(super) lost_lsn_first: u64,
    /// The header's own checksum (what a tail marker names).
    pub(super) checksum: u64,
}

impl WindowHead {
    /// The first lsn this window accounts for: its first record, or a seal's lost range.
    pub(super) fn lsn_accounted(&self) -> u64 {
        if self.seal == SEAL_NONE {
            self.lsn_first
        } else {
            self.lost_lsn_first
        }
    }

    /// The last lsn this window accounts for.
    pub(super) fn lsn_last(&self) -> u64 {
        self.lsn_first + self.count as u64 - 1
    }

    fn encode(&self) -> [u8; HEAD] {
        let mut head = [0u8; HEAD];
        head[0..4].copy_from_slice(&WINDOW_MAGIC.to_le_bytes());
        head[4..8].copy_from_slice(&self.count.to_le_bytes());
        head[8..16].copy_from_slice(&self.lsn_first.to_le_bytes());
        head[16..24].copy_from_slice(&self.bytes.to_le_bytes());
        head[24] = WAL_FORMAT_VERSION;
        head[25] = self.seal;
        head[32..40].copy_from_slice(&self.lost_lsn_first.to_le_bytes());
        let checksum = head_checksum(&head);
        head[56..64].copy_from_slice(&checksum.to_le_bytes());
        head
    }
}

fn parse_window(bytes: &[u8]) -> Option<WindowHead> {
    let head = bytes.get(..HEAD)?;
    if u32_at(head, 0) != WINDOW_MAGIC || u64_at(head, 56) != head_checksum(head) {
        return None;
    }
    let w = WindowHead {
        count: u32_at(head, 4),
        lsn_first: u64_at(head, 8),
        bytes: u64_at(head, 16),
        seal: head[25],
        lost_lsn_first: u64_at(head, 32),
        checksum: u64_at(head, 56),
    };
    let shape = match w.seal {
        SEAL_NONE => w.count > 0 && w.lost_lsn_first == 0,
        SEAL_DAMAGE | SEAL_UNVERIFIED => {
            w.count == 0
                && w.bytes == HEAD as u64
                && w.lost_lsn_first > 0
                && w.lost_lsn_first < w.lsn_first
        }
        _ => false,
    };
    let bounded = w.bytes >= HEAD as u64 && w.lsn_first > 0 && w.lsn_first < FIELD_MAX;
    (head[24] == WAL_FORMAT_VERSION && shape && bounded).then_some(w)
}

/// Parses the record at the start of `bytes`: `(lsn, group, payload, kind, record length)`.
fn parse_record(bytes: &[u8]) -> Option<(u64, u64, &[u8], u8, usize)> {
    let head = bytes.get(..HEAD)?;
    if u32_at(head, 0) != RECORD_MAGIC || u64_at(head, 56) != head_checksum(head) {
        return None;
    }
    let len = u32_at(head, 4) as usize;
    let padded = len.next_multiple_of(8);
    let payload = bytes.get(HEAD..HEAD + len)?;
    if xxh3(payload) != u64_at(head, 24) {
        return None;
    }
    // The padding is covered by no checksum: it must read as written (zeros).
    if bytes
        .get(HEAD + len..HEAD + padded)?
        .iter()
        .any(|b| *b != 0)
    {
        return None;
    }
    let kind = head[32];
    if kind > KIND_BODY_REF_BATCH
        || (kind == KIND_TRUNCATE && len != 8)
        || (BodyHash::of_kind(kind).is_some() && len != HEADER_SIZE + BodyRef::LEN)
    {
        return None;
    }
    Some((
        u64_at(head, 8),
        u64_at(head, 16),
        payload,
        kind,
        HEAD + padded,
    ))
}

/// `(lsn, group, payload, kind)` of each record of a window.
type WindowRecords<'a> = Vec<(u64, u64, &'a [u8], u8)>;

/// Verifies a whole window at the start of `bytes` and returns its records, or `None`.
pub(super) fn parse_window_records(bytes: &[u8]) -> Option<(WindowHead, WindowRecords<'_>)> {
    let w = parse_window(bytes)?;
    let body = bytes.get(HEAD..usize::try_from(w.bytes).ok()?)?;
    // The count is checksummed, not bounded: reserve for no more records than the body holds.
    let mut records = Vec::with_capacity((w.count as usize).min(body.len() / HEAD));
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

/// A tail marker: names the window written just before it, in the same write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Marker {
    pub(super) seq: u64,
    pub(super) offset: u64,
    pub(super) lsn_first: u64,
    pub(super) lsn_last: u64,
    pub(super) head_checksum: u64,
    pub(super) bytes: u64,
}

impl Marker {
    pub(super) fn of(seq: u64, offset: u64, w: &WindowHead) -> Marker {
        Marker {
            seq,
            offset,
            lsn_first: w.lsn_accounted(),
            lsn_last: w.lsn_last(),
            head_checksum: w.checksum,
            bytes: w.bytes,
        }
    }

    /// Where the marker sits: right after its window's padding.
    pub(super) fn at(&self) -> u64 {
        self.offset + sector_ceil(self.bytes)
    }

    pub(super) fn encode(&self) -> [u8; HEAD] {
        let mut m = [0u8; HEAD];
        m[0..4].copy_from_slice(&MARKER_MAGIC.to_le_bytes());
        m[4] = WAL_FORMAT_VERSION;
        m[8..16].copy_from_slice(&self.seq.to_le_bytes());
        m[16..24].copy_from_slice(&self.offset.to_le_bytes());
        m[24..32].copy_from_slice(&self.lsn_first.to_le_bytes());
        m[32..40].copy_from_slice(&self.lsn_last.to_le_bytes());
        m[40..48].copy_from_slice(&self.head_checksum.to_le_bytes());
        m[48..56].copy_from_slice(&self.bytes.to_le_bytes());
        let checksum = head_checksum(&m);
        m[56..64].copy_from_slice(&checksum.to_le_bytes());
        m
    }

    pub(super) fn parse(bytes: &[u8]) -> Option<Marker> {
        let m = bytes.get(..HEAD)?;
        if u32_at(m, 0) != MARKER_MAGIC || m[4] != WAL_FORMAT_VERSION {
            return None;
        }
        if u64_at(m, 56) != head_checksum(m) {
            return None;
        }
        let marker = Marker {
            seq: u64_at(m, 8),
            offset: u64_at(m, 16),
            lsn_first: u64_at(m, 24),
            lsn_last: u64_at(m, 32),
            head_checksum: u64_at(m, 40),
            bytes: u64_at(m, 48),
        };
        // Bounds keep the offset arithmetic and the seal's next lsn from overflowing.
        let shape = marker.offset.is_multiple_of(SECTOR as u64)
            && marker.offset < FIELD_MAX
            && marker.bytes >= HEAD as u64
            && marker.bytes < FIELD_MAX
            && marker.lsn_first > 0
            && marker.lsn_first <= marker.lsn_last
            && marker.lsn_last < FIELD_MAX;
        shape.then_some(marker)
    }
}

/// What recovery does about a damaged last window that a valid tail marker names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MarkedTail {
    /// The window's first sector still holds the previous window's marker: its head never
    /// landed, so it was never acknowledged. Cut like any torn tail.
    Torn,
    /// Every sector landed (none reads as zeros) and the window still fails: damaged after it
    /// landed.
    Damage,
    /// A zero sector: lost after acknowledgement, or never landed on a reordering disk.
    Unverified,
}

/// Classifies the damaged window `span` (its padded sectors) that a valid marker names.
/// `previous`: the marker of the intact window just before it, when it ends where `span`
/// starts in the same file.
pub(super) fn classify_marked_tail(span: &[u8], previous: Option<&[u8; HEAD]>) -> MarkedTail {
    if previous.is_some_and(|p| span.get(..HEAD) == Some(&p[..])) {
        return MarkedTail::Torn;
    }
    if span
        .chunks(SECTOR)
        .all(|sector| sector.iter().any(|b| *b != 0))
    {
        MarkedTail::Damage
    } else {
        MarkedTail::Unverified
    }
}

/// Encodes `head` (filling in its checksum) and returns it with its bytes.
pub(super) fn finish_head(mut head: WindowHead) -> (WindowHead, [u8; HEAD]) {
    let encoded = head.encode();
    head.checksum = u64_at(&encoded, 56);
    (head, encoded)
}

/// The image of one window write: the window (its header encoded in place), zero padding to the
/// sector, and its tail marker in the sector after.
pub(super) fn window_write(window: &[u8], head: &WindowHead, seq: u64, offset: u64) -> AlignedBuf {
    let padded = sector_ceil(head.bytes) as usize;
    let mut buf = AlignedBuf::zeroed(padded + MARKER);
    let slice = buf.as_mut_slice();
    slice[..window.len()].copy_from_slice(window);
    slice[padded..padded + HEAD].copy_from_slice(&Marker::of(seq, offset, head).encode());
    buf
}

/// The seal over the damaged window that `m` names: an empty window that records `m`'s lsns
/// lost, of `kind`.
pub(super) fn seal_head(kind: u8, m: &Marker) -> (WindowHead, [u8; HEAD]) {
    finish_head(WindowHead {
        count: 0,
        lsn_first: m.lsn_last + 1,
        bytes: HEAD as u64,
        seal: kind,
        lost_lsn_first: m.lsn_first,
        checksum: 0,
    })
}
