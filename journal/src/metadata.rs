//! The metadata prepare journal: fixed slots, a redundant header ring, recovery classification.
//!
//! Layout (journal config `slot_count` N, `slot_size` S, a multiple of [`SECTOR`]):
//!
//! - `journal.prepares`: slot `s = op % N` at byte `s * S` holds the whole prepare frame
//!   (`[256-byte PrepareHeader][body]`, `size` bytes), then `XXH3-64(frame)` (u64 LE, which also
//!   covers `view`, a field outside the prepare identity), zero-padded to a sector multiple.
//! - `journal.headers`: the header ring, a copy of slot `s`'s 256-byte header at byte `s * 256`.
//!
//! Append (G1): write the prepare into its slot, `fdatasync`, then write the ring sector holding
//! its header, `fdatasync`; the append completes (and PrepareOk may leave) after both. A header
//! in the ring therefore implies its prepare was durable, which is how recovery tells a torn
//! last write (never acknowledged: the ring does not know it) from a corrupt acknowledged entry
//! (the ring knows its op and identity: repair it from peers).
//!
//! Truncate-from zeroes the first sector of each truncated prepare slot (synced), then their
//! ring entries (synced); a crash in between leaves ring entries without prepares, which
//! recovery reports as missing, never resurrects.
//!
//! Recovery ([`classify`], a pure function of what was read) never drops an op at or below the
//! head, where the head is the highest op any valid prepare or ring entry names, and at least
//! the superblock's `op_head`: every op in `(checkpoint_op, head]` that is not intact is
//! reported for repair.

use std::collections::BTreeMap;

use wire::HEADER_SIZE;
use wire::integrity::xxh3;

use crate::file::AlignedBuf;
use crate::prepare::{FrameFault, Header, verify_frame, verify_header};
use crate::storage::{
    OpenMode, SECTOR, Storage, StorageError, is_zero, read_exact_at, sector_ceil,
};

/// The prepare slots file.
pub const PREPARES_FILE: &str = "journal.prepares";
/// The header ring file.
pub const HEADERS_FILE: &str = "journal.headers";

/// Size of the journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalConfig {
    /// Slots in the ring (`journal_slots`, default 1024).
    pub slot_count: u64,
    /// Bytes per slot: the largest prepare frame it holds, a sector multiple.
    pub slot_size: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            slot_count: 1024,
            slot_size: 1024 * 1024,
        }
    }
}

/// Why a journal call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// The storage failed (environmental: fail-stop).
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The frame given to append is not an intact prepare.
    #[error("frame refused: {0}")]
    Frame(#[from] FrameFault),
    /// The configuration is unusable.
    #[error("journal config: slot_count {slot_count}, slot_size {slot_size}")]
    Config {
        /// Slots.
        slot_count: u64,
        /// Bytes per slot.
        slot_size: u64,
    },
    /// The prepare is larger than a slot.
    #[error("prepare of {size} bytes exceeds the slot size {slot_size}")]
    TooLarge {
        /// Frame size.
        size: u64,
        /// Slot size.
        slot_size: u64,
    },
    /// The op is at or below the checkpoint: it is compacted, not journaled.
    #[error("op {op} is at or below the checkpoint {checkpoint_op}")]
    BelowCheckpoint {
        /// The op.
        op: u64,
        /// The floor.
        checkpoint_op: u64,
    },
    /// The slot holds an op above the checkpoint: appending would destroy it (G4).
    #[error("slot of op {op} holds op {occupant} above the checkpoint")]
    SlotOccupied {
        /// The op appended.
        op: u64,
        /// The op in the slot.
        occupant: u64,
    },
    /// The op is not in the journal.
    #[error("op {0} is not journaled")]
    NotFound(u64),
    /// The op's bytes no longer verify.
    #[error("op {op} is corrupt: {fault}")]
    Corrupt {
        /// The op.
        op: u64,
        /// What failed.
        fault: FrameFault,
    },
    /// A checkpoint below the current one.
    #[error("checkpoint {op} below the current {current}")]
    CheckpointRegress {
        /// Asked.
        op: u64,
        /// Current.
        current: u64,
    },
}

impl JournalConfig {
    /// Checks the sizes.
    pub fn validate(&self) -> Result<(), JournalError> {
        let ok = self.slot_count > 0
            && self.slot_count <= 1 << 20
            && self.slot_size >= SECTOR as u64
            && self.slot_size.is_multiple_of(SECTOR as u64)
            && self.slot_size <= 64 * 1024 * 1024 + SECTOR as u64;
        if ok {
            Ok(())
        } else {
            Err(JournalError::Config {
                slot_count: self.slot_count,
                slot_size: self.slot_size,
            })
        }
    }

    fn ring_len(&self) -> u64 {
        sector_ceil(self.slot_count * HEADER_SIZE as u64)
    }
}

/// What the recovery scan read from a prepare slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one per slot, built once at boot
pub enum PrepareRead {
    /// First sector all zeros (never written, truncated, or zeroed).
    Zeroed,
    /// An intact prepare whose op belongs to this slot.
    Valid(Header),
    /// Bytes that do not verify.
    Damaged(FrameFault),
    /// A read error of the media.
    Unreadable,
}

/// What the recovery scan read from a header-ring entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one per slot, built once at boot
pub enum RingRead {
    /// All zeros.
    Empty,
    /// A verifying prepare header whose op belongs to this slot.
    Valid(Header),
    /// Anything else.
    Damaged,
}

/// The classification of one slot at recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Never written, or holds nothing needed.
    Empty,
    /// Holds the intact prepare of `op`, which is in the journal.
    Valid {
        /// The op.
        op: u64,
    },
    /// Holds an intact prepare at or below the checkpoint (superseded, reusable).
    Stale {
        /// The op.
        op: u64,
    },
    /// Damage in the slot after the head: the last append was torn by a crash (never
    /// acknowledged). Harmless; the next append to the slot overwrites it.
    Torn,
    /// `op` is needed and its prepare is damaged or unreadable; `identity` when the header ring
    /// still knows it. Repair from peers.
    Corrupt {
        /// The op that belongs here.
        op: u64,
        /// Its identity, if the ring knows it.
        identity: Option<u128>,
    },
    /// `op` is needed and the slot does not hold it (zeroed or an older op). Repair from peers.
    Missing {
        /// The op that belongs here.
        op: u64,
    },
    /// Damage in a slot that holds nothing needed (at or below the checkpoint).
    Damaged,
}

/// What recovery found, for the consensus core to decide on (consensus.md §9.1).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recovery {
    /// Every slot, by index.
    pub slots: Vec<SlotState>,
    /// The intact prepares above the checkpoint, headers in op order.
    pub headers: Vec<Header>,
    /// The head: highest op known to have been journaled (never below the superblock's).
    pub op_head: u64,
    /// The checkpoint op (floor) the scan used.
    pub checkpoint_op: u64,
    /// Ops in `(checkpoint_op, op_head]` that are not intact, as inclusive ranges.
    pub repair: Vec<(u64, u64)>,
    /// Ops whose parent is not the identity of the intact previous op (both intact).
    pub chain_breaks: Vec<u64>,
    /// Slots whose ring entry does not match their intact prepare (rewritten at open).
    pub ring_stale: Vec<u64>,
}

impl Recovery {
    /// Slots in each state: `(valid, torn, corrupt, missing, damaged)`.
    pub fn counts(&self) -> (usize, usize, usize, usize, usize) {
        let mut c = (0, 0, 0, 0, 0);
        for slot in &self.slots {
            match slot {
                SlotState::Valid { .. } => c.0 += 1,
                SlotState::Torn => c.1 += 1,
                SlotState::Corrupt { .. } => c.2 += 1,
                SlotState::Missing { .. } => c.3 += 1,
                SlotState::Damaged => c.4 += 1,
                SlotState::Empty | SlotState::Stale { .. } => {}
            }
        }
        c
    }

    /// Whether every op up to the head is intact.
    pub fn is_clean(&self) -> bool {
        self.repair.is_empty()
    }

    /// The last op of the unbroken prefix: ops `checkpoint_op + 1 ..= chain_end()` are intact,
    /// consecutive and hash-chained (what the consensus core replays, consensus.md §9.1).
    /// Whatever lies above it is the core's call (repair, or truncate if it was never
    /// acknowledged); the journal decides nothing.
    pub fn chain_end(&self) -> u64 {
        let mut end = self.checkpoint_op;
        for header in &self.headers {
            if header.op() != end + 1 || self.chain_breaks.contains(&header.op()) {
                break;
            }
            end += 1;
        }
        end
    }
}

/// The recovery decision as a pure function of the slots read, the checkpoint op and the
/// superblock's durable head.
pub fn classify(
    reads: &[(RingRead, PrepareRead)],
    checkpoint_op: u64,
    op_head_min: u64,
) -> Recovery {
    let n = reads.len() as u64;
    // (op, header, intact prepare?) as far as each slot knows.
    let known: Vec<Option<(Header, bool)>> = reads
        .iter()
        .map(|(ring, prepare)| match (ring, prepare) {
            (RingRead::Valid(r), PrepareRead::Valid(p)) if r.op() > p.op() => Some((*r, false)),
            (_, PrepareRead::Valid(p)) => Some((*p, true)),
            (RingRead::Valid(r), _) => Some((*r, false)),
            _ => None,
        })
        .collect();
    let op_head = known
        .iter()
        .flatten()
        .map(|(h, _)| h.op())
        .chain([checkpoint_op, op_head_min])
        .max()
        .unwrap_or(0);
    let mut recovery = Recovery {
        op_head,
        checkpoint_op,
        ..Recovery::default()
    };
    let mut intact = BTreeMap::new();
    let mut needed = Vec::new();
    for (s, ((ring, prepare), known)) in reads.iter().zip(&known).enumerate() {
        let s = s as u64;
        // The op that belongs in this slot: the largest op <= head congruent to s, if above the
        // checkpoint.
        let expected = (op_head >= s)
            .then(|| op_head - (op_head - s) % n)
            .filter(|op| *op > checkpoint_op);
        let damaged = matches!(prepare, PrepareRead::Damaged(_) | PrepareRead::Unreadable);
        let state = match (expected, known) {
            (Some(op), Some((h, true))) if h.op() == op => {
                intact.insert(op, *h);
                if *ring != RingRead::Valid(*h) {
                    recovery.ring_stale.push(s);
                }
                SlotState::Valid { op }
            }
            (Some(op), Some((h, false))) if h.op() == op => {
                needed.push(op);
                if damaged {
                    SlotState::Corrupt {
                        op,
                        identity: Some(h.identity()),
                    }
                } else {
                    SlotState::Missing { op }
                }
            }
            (Some(op), _) => {
                needed.push(op);
                if damaged {
                    SlotState::Corrupt { op, identity: None }
                } else {
                    SlotState::Missing { op }
                }
            }
            (None, Some((h, true))) => SlotState::Stale { op: h.op() },
            (None, _) if damaged || *ring == RingRead::Damaged => {
                if (op_head + 1) % n == s {
                    SlotState::Torn
                } else {
                    SlotState::Damaged
                }
            }
            (None, _) => SlotState::Empty,
        };
        recovery.slots.push(state);
    }
    needed.sort_unstable();
    for op in needed {
        match recovery.repair.last_mut() {
            Some((_, last)) if *last + 1 == op => *last = op,
            _ => recovery.repair.push((op, op)),
        }
    }
    let mut previous: Option<&Header> = None;
    for (op, header) in &intact {
        if let Some(p) = previous
            && p.op() + 1 == *op
            && header.parent() != p.identity()
        {
            recovery.chain_breaks.push(*op);
        }
        previous = Some(header);
    }
    recovery.headers = intact.into_values().collect();
    recovery
}

#[derive(Debug, Clone, Copy)]
struct SlotMeta {
    op: u64,
    identity: u128,
    size: u32,
    intact: bool,
}

/// The metadata journal, open.
#[derive(Debug)]
pub struct MetadataJournal<S: Storage> {
    storage: S,
    prepares: S::File,
    headers: S::File,
    config: JournalConfig,
    /// The header ring's image, sector-aligned so its sectors are written in place.
    ring: AlignedBuf,
    slots: Vec<Option<SlotMeta>>,
    op_head: u64,
    checkpoint_op: u64,
}

/// Bytes after each stored frame: its XXH3-64.
const RECORD_TRAILER: u64 = 8;

fn verify_record(bytes: &[u8], size: usize) -> Result<Header, FrameFault> {
    let frame = bytes.get(..size).ok_or(FrameFault::TooShort(bytes.len()))?;
    let trailer = bytes
        .get(size..size + 8)
        .ok_or(FrameFault::TooShort(bytes.len()))?;
    let header = verify_frame(frame, true)?;
    if trailer != xxh3(frame).to_le_bytes() {
        return Err(FrameFault::Record);
    }
    Ok(header)
}

fn ring_read(bytes: &[u8], slot: u64, n: u64) -> RingRead {
    if is_zero(bytes) {
        return RingRead::Empty;
    }
    match verify_header(bytes) {
        Ok(h) if h.op() % n == slot => RingRead::Valid(h),
        _ => RingRead::Damaged,
    }
}

impl<S: Storage> MetadataJournal<S> {
    /// Opens (creating if absent) the journal, scans every slot, classifies it, rewrites stale
    /// ring entries, and returns the journal with what recovery found. `checkpoint_op` and
    /// `op_head_min` come from the superblock (0 when fresh).
    pub async fn open(
        storage: S,
        config: JournalConfig,
        checkpoint_op: u64,
        op_head_min: u64,
    ) -> Result<(MetadataJournal<S>, Recovery), JournalError> {
        config.validate()?;
        let prepares = storage.open(PREPARES_FILE, OpenMode::Create).await?;
        let headers = storage.open(HEADERS_FILE, OpenMode::Create).await?;
        let n = config.slot_count;
        let mut ring = AlignedBuf::zeroed(config.ring_len() as usize);
        let mut ring_lost = vec![false; ring.len() / SECTOR];
        match read_exact_at(&storage, &headers, 0, ring.as_mut_slice()).await {
            Ok(_) => {}
            Err(e) if e.is_media() => {
                for (i, chunk) in ring.as_mut_slice().chunks_mut(SECTOR).enumerate() {
                    match storage.read_at(&headers, (i * SECTOR) as u64, chunk).await {
                        Ok(_) => {}
                        Err(e) if e.is_media() => {
                            chunk.fill(0xff);
                            ring_lost[i] = true;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Err(e) => return Err(e.into()),
        }
        let mut reads = Vec::with_capacity(n as usize);
        let mut buf = AlignedBuf::zeroed(config.slot_size as usize);
        for s in 0..n {
            let at = (s * HEADER_SIZE as u64) as usize;
            let ring_entry = ring_read(&ring.as_slice()[at..at + HEADER_SIZE], s, n);
            let prepare = Self::read_slot(&storage, &prepares, &config, s, &mut buf).await?;
            reads.push((ring_entry, prepare));
        }
        let recovery = classify(&reads, checkpoint_op, op_head_min);
        let mut slots = vec![None; n as usize];
        for (s, state) in recovery.slots.iter().enumerate() {
            slots[s] = match (state, &reads[s]) {
                (SlotState::Valid { .. } | SlotState::Stale { .. }, (_, PrepareRead::Valid(h))) => {
                    Some(SlotMeta {
                        op: h.op(),
                        identity: h.identity(),
                        size: h.size(),
                        intact: true,
                    })
                }
                (SlotState::Corrupt { op, identity }, _) => Some(SlotMeta {
                    op: *op,
                    identity: identity.unwrap_or(0),
                    size: 0,
                    intact: false,
                }),
                (SlotState::Missing { op }, _) => Some(SlotMeta {
                    op: *op,
                    identity: 0,
                    size: 0,
                    intact: false,
                }),
                _ => None,
            };
        }
        let mut journal = MetadataJournal {
            storage,
            prepares,
            headers,
            config,
            ring,
            slots,
            op_head: recovery.op_head,
            checkpoint_op,
        };
        // Repair the ring from intact prepares (it is a redundant copy) and clear unreadable
        // sectors so that they read again; the prepares are the truth.
        let mut dirty = std::collections::BTreeSet::new();
        for s in &recovery.ring_stale {
            if let (_, PrepareRead::Valid(h)) = &reads[*s as usize] {
                let at = (*s * HEADER_SIZE as u64) as usize;
                journal.ring.as_mut_slice()[at..at + HEADER_SIZE].copy_from_slice(&h.0);
                dirty.insert(at / SECTOR);
            }
        }
        for (i, lost) in ring_lost.iter().enumerate() {
            if *lost {
                let sector = &mut journal.ring.as_mut_slice()[i * SECTOR..(i + 1) * SECTOR];
                for (k, entry) in sector.chunks_mut(HEADER_SIZE).enumerate() {
                    let s = (i * SECTOR / HEADER_SIZE + k) as u64;
                    match reads.get(s as usize) {
                        Some((_, PrepareRead::Valid(h))) => entry.copy_from_slice(&h.0),
                        _ => entry.fill(0),
                    }
                }
                dirty.insert(i);
            }
        }
        for i in &dirty {
            let at = i * SECTOR;
            let sector = &journal.ring.as_slice()[at..at + SECTOR];
            journal
                .storage
                .write_at(&journal.headers, at as u64, sector)
                .await?;
        }
        if !dirty.is_empty() {
            journal.storage.sync(&journal.headers).await?;
        }
        Ok((journal, recovery))
    }

    async fn read_slot(
        storage: &S,
        prepares: &S::File,
        config: &JournalConfig,
        slot: u64,
        buf: &mut AlignedBuf,
    ) -> Result<PrepareRead, JournalError> {
        let at = slot * config.slot_size;
        let first = &mut buf.as_mut_slice()[..SECTOR];
        first.fill(0);
        match read_exact_at(storage, prepares, at, first).await {
            Ok(_) => {}
            Err(e) if e.is_media() => return Ok(PrepareRead::Unreadable),
            Err(e) => return Err(e.into()),
        }
        if is_zero(first) {
            return Ok(PrepareRead::Zeroed);
        }
        let header = match verify_header(first) {
            Ok(h) => h,
            Err(fault) => return Ok(PrepareRead::Damaged(fault)),
        };
        let size = header.size() as u64;
        if size + RECORD_TRAILER > config.slot_size || header.op() % config.slot_count != slot {
            return Ok(PrepareRead::Damaged(FrameFault::Size {
                size: header.size(),
                len: config.slot_size as usize,
            }));
        }
        let whole = sector_ceil(size + RECORD_TRAILER) as usize;
        if whole > SECTOR {
            let rest = &mut buf.as_mut_slice()[SECTOR..whole];
            rest.fill(0);
            match read_exact_at(storage, prepares, at + SECTOR as u64, rest).await {
                Ok(_) => {}
                Err(e) if e.is_media() => return Ok(PrepareRead::Unreadable),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(
            match verify_record(&buf.as_slice()[..whole], size as usize) {
                Ok(h) => PrepareRead::Valid(h),
                Err(fault) => PrepareRead::Damaged(fault),
            },
        )
    }

    /// The configuration.
    pub fn config(&self) -> &JournalConfig {
        &self.config
    }

    /// The highest op journaled (or known to be needed).
    pub fn op_head(&self) -> u64 {
        self.op_head
    }

    /// The checkpoint op (floor).
    pub fn checkpoint_op(&self) -> u64 {
        self.checkpoint_op
    }

    /// Whether `op` is journaled intact.
    pub fn has(&self, op: u64) -> bool {
        let s = (op % self.config.slot_count) as usize;
        matches!(self.slots[s], Some(m) if m.op == op && m.intact && op > self.checkpoint_op)
    }

    /// Appends a prepare frame durably: on `Ok` the frame survives a crash (G1) and the core
    /// may emit `PrepareOk`. The frame must be an intact prepare with its body digest. An op
    /// whose slot holds another op above the checkpoint is refused before anything is written.
    pub async fn append(&mut self, frame: &[u8]) -> Result<(), JournalError> {
        let header = verify_frame(frame, true)?;
        let op = header.op();
        if op <= self.checkpoint_op {
            return Err(JournalError::BelowCheckpoint {
                op,
                checkpoint_op: self.checkpoint_op,
            });
        }
        if frame.len() as u64 + RECORD_TRAILER > self.config.slot_size {
            return Err(JournalError::TooLarge {
                size: frame.len() as u64,
                slot_size: self.config.slot_size,
            });
        }
        let s = op % self.config.slot_count;
        if let Some(m) = self.slots[s as usize]
            && m.op != op
            && m.op > self.checkpoint_op
        {
            return Err(JournalError::SlotOccupied { op, occupant: m.op });
        }
        if cfg!(feature = "bug-ack-early") {
            // BUG KNOB: the previous append's fdatasyncs, after it was acknowledged.
            self.storage.sync(&self.prepares).await?;
            self.storage.sync(&self.headers).await?;
        }
        let len = frame.len();
        let mut buf = AlignedBuf::zeroed(sector_ceil((len + 8) as u64) as usize);
        buf.as_mut_slice()[..len].copy_from_slice(frame);
        buf.as_mut_slice()[len..len + 8].copy_from_slice(&xxh3(frame).to_le_bytes());
        let at = s * self.config.slot_size;
        self.storage
            .write_at(&self.prepares, at, buf.as_slice())
            .await?;
        if !cfg!(feature = "bug-ack-early") {
            self.storage.sync(&self.prepares).await?;
        }
        let ring_at = (s * HEADER_SIZE as u64) as usize;
        self.ring.as_mut_slice()[ring_at..ring_at + HEADER_SIZE].copy_from_slice(&header.0);
        if cfg!(feature = "bug-ack-early") {
            // BUG KNOB: the ring sector goes out unsynced (the next append syncs it).
            let at = ring_at / SECTOR * SECTOR;
            let sector = &self.ring.as_slice()[at..at + SECTOR];
            self.storage
                .write_at(&self.headers, at as u64, sector)
                .await?;
        } else {
            self.write_ring_sectors(&[ring_at / SECTOR]).await?;
        }
        self.slots[s as usize] = Some(SlotMeta {
            op,
            identity: header.identity(),
            size: header.size(),
            intact: true,
        });
        self.op_head = self.op_head.max(op);
        Ok(())
    }

    async fn write_ring_sectors(&self, sectors: &[usize]) -> Result<(), JournalError> {
        for i in sectors {
            let at = i * SECTOR;
            let sector = &self.ring.as_slice()[at..at + SECTOR];
            self.storage
                .write_at(&self.headers, at as u64, sector)
                .await?;
        }
        self.storage.sync(&self.headers).await?;
        Ok(())
    }

    /// The header ring's copy of `op`'s 256-byte header, when the ring holds one that verifies
    /// and names `op`. For a `Corrupt` slot whose ring entry survived, this is the header of an
    /// entry that was durably written (the ring is written after the prepare's sync) and must
    /// be repaired from peers, never dropped.
    pub fn ring_header(&self, op: u64) -> Option<[u8; HEADER_SIZE]> {
        let s = op % self.config.slot_count;
        let at = (s * HEADER_SIZE as u64) as usize;
        let bytes = self.ring.as_slice().get(at..at + HEADER_SIZE)?;
        match ring_read(bytes, s, self.config.slot_count) {
            RingRead::Valid(h) if h.op() == op => bytes.try_into().ok(),
            _ => None,
        }
    }

    /// Where the stored record of `op` lives: `(file, byte offset, length)` when the journal
    /// holds it (for fault injection in tests and the simulator).
    pub fn record_location(&self, op: u64) -> Option<(&'static str, u64, u64)> {
        let s = op % self.config.slot_count;
        match self.slots[s as usize] {
            Some(m) if m.op == op && m.intact && op >= self.checkpoint_op => Some((
                PREPARES_FILE,
                s * self.config.slot_size,
                m.size as u64 + RECORD_TRAILER,
            )),
            _ => None,
        }
    }

    /// Reads and verifies the frame of `op`. The entry at the checkpoint op itself is readable
    /// while its slot still holds it (G4 keeps it for its header).
    pub async fn read(&self, op: u64) -> Result<Vec<u8>, JournalError> {
        let s = op % self.config.slot_count;
        let meta = match self.slots[s as usize] {
            Some(m) if m.op == op && m.intact && op >= self.checkpoint_op => m,
            _ => return Err(JournalError::NotFound(op)),
        };
        let mut buf = AlignedBuf::zeroed(sector_ceil(meta.size as u64 + RECORD_TRAILER) as usize);
        read_exact_at(
            &self.storage,
            &self.prepares,
            s * self.config.slot_size,
            buf.as_mut_slice(),
        )
        .await?;
        let size = meta.size as usize;
        match verify_record(buf.as_slice(), size) {
            Ok(h) if h.op() == op && h.identity() == meta.identity => {
                Ok(buf.as_slice()[..size].to_vec())
            }
            Ok(_) => Err(JournalError::Corrupt {
                op,
                fault: FrameFault::Identity,
            }),
            Err(fault) => Err(JournalError::Corrupt { op, fault }),
        }
    }

    /// Reads and verifies the frames of ops `from..=to`, in op order (the recovered prefix the
    /// driver hands the core at boot).
    pub async fn read_range(&self, from: u64, to: u64) -> Result<Vec<Vec<u8>>, JournalError> {
        let mut frames = Vec::new();
        for op in from..=to {
            frames.push(self.read(op).await?);
        }
        Ok(frames)
    }

    /// Removes every op `>= op` durably (view-change reconciliation). Returns how many slots
    /// were cleared.
    pub async fn truncate_from(&mut self, op: u64) -> Result<usize, JournalError> {
        let op = op.max(self.checkpoint_op + 1);
        let victims: Vec<u64> = (0..self.config.slot_count)
            .filter(|s| matches!(self.slots[*s as usize], Some(m) if m.op >= op))
            .collect();
        if victims.is_empty() {
            self.op_head = self.op_head.min(op - 1);
            return Ok(0);
        }
        let zero = AlignedBuf::zeroed(SECTOR);
        for s in &victims {
            self.storage
                .write_at(&self.prepares, s * self.config.slot_size, zero.as_slice())
                .await?;
        }
        self.storage.sync(&self.prepares).await?;
        let mut sectors = Vec::new();
        for s in &victims {
            let at = (s * HEADER_SIZE as u64) as usize;
            self.ring.as_mut_slice()[at..at + HEADER_SIZE].fill(0);
            sectors.push(at / SECTOR);
            self.slots[*s as usize] = None;
        }
        sectors.dedup(); // victims ascend, so their sectors do
        self.write_ring_sectors(&sectors).await?;
        self.op_head = self
            .slots
            .iter()
            .flatten()
            .map(|m| m.op)
            .chain([self.checkpoint_op])
            .max()
            .unwrap_or(0)
            .min(op - 1);
        Ok(victims.len())
    }

    /// Raises the floor after a durable checkpoint (the superblock names it): ops at or below
    /// it may be overwritten (G4). The caller keeps the checkpoint op's entry by raising the
    /// floor only to `checkpoint_op - 1` if it needs it as a DVC slot.
    pub fn set_checkpoint(&mut self, op: u64) -> Result<(), JournalError> {
        if op < self.checkpoint_op {
            return Err(JournalError::CheckpointRegress {
                op,
                current: self.checkpoint_op,
            });
        }
        self.checkpoint_op = op;
        self.op_head = self.op_head.max(op);
        Ok(())
    }

    /// Remaining ring capacity above the checkpoint: `slots - (head - checkpoint)`.
    pub fn capacity_remaining(&self) -> u64 {
        self.config
            .slot_count
            .saturating_sub(self.op_head - self.checkpoint_op)
    }
}

#[cfg(test)]
mod tests;
