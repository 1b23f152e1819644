//! The WAL's durable-end record: what the WAL held when it last said so, kept outside the WAL
//! files so that a WAL that lost files, a tail, or its last window whole is told from a fresh
//! or reclaimed one (docs/decisions.md item 90).
//!
//! File `wal-end` (one per shard WAL directory), four copies of one [`SECTOR`] in two pairs:
//! generation `q` goes to pair `q % 2` (copies `2p` and `2p + 1`, one two-sector write, one
//! `fdatasync`), so the other pair always holds the previous generation intact. Copy `i` at
//! byte `i * 4096`:
//!
//! ```text
//! 0..4     magic "PEND"
//! 4..6     version u16 = 1
//! 6..8     copy index u16 (a misdirected write reads as damage)
//! 8..16    sequence u64 (newest wins)
//! 16..24   oldest file seq in use
//! 24..32   newest file seq, preallocated and synced before the record named it (oldest - 1:
//!          no file yet, the generation a fresh directory writes before its first file)
//! 32..40   floor: the first lsn the WAL still holds (lower ones were reclaimed)
//! 40..48   durable: every lsn up to it was durable when the record was written
//! 48..4088 zero
//! 4088..4096  XXH3-64 of bytes 0..4088
//! ```
//!
//! A crash tears only the pair being written (sectors are atomic), whose generation had not
//! completed, so the newest valid copy is chosen. Both copies of a pair damaged (media faults
//! after the fact), a file cut short, or no record beside WAL files: the newest generation may
//! be lost, and the WAL refuses to open ([`super::WalError::EndRecord`]) instead of trusting an
//! older one. A fresh directory writes a first generation naming no file before it creates any
//! WAL file, so WAL files beside no record (absent, or cut to length 0) are never a crash
//! during formatting ([`EndFault::Missing`]).

use wire::integrity::xxh3;

use crate::file::AlignedBuf;
use crate::storage::{OpenMode, SECTOR, Storage, StorageError, is_zero, read_exact_at};

/// The record's file name (not a `wal.{seq}` name: the WAL scan skips it).
pub const END_FILE: &str = "wal-end";
const MAGIC: u32 = u32::from_le_bytes(*b"PEND");
const VERSION: u16 = 1;
const COPIES: usize = 4;
const CHECKSUM_AT: usize = SECTOR - 8;
/// Fields stay below this (no overflow in recovery's arithmetic).
const FIELD_MAX: u64 = 1 << 62;

/// What the record says about the WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalEnd {
    /// The oldest file in use; older ones were reclaimed.
    pub oldest: u64,
    /// The newest file, preallocated durably before this record named it; `oldest - 1` when
    /// the record names no file (a fresh directory, before its first file exists).
    pub newest: u64,
    /// The first lsn the WAL still holds.
    pub floor: u64,
    /// Every lsn `<= durable` was durable when the record was written.
    pub durable: u64,
}

/// Why the record cannot be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndFault {
    /// Both copies of a pair are damaged: the newest generation may be lost.
    PairDamaged,
    /// The file is shorter than its four copies (it lost a tail).
    CutShort,
    /// A verified copy of a version this build does not know.
    UnknownVersion(u16),
    /// No record, but WAL files exist (the record was lost or cut to nothing, or the WAL is
    /// not ours): a fresh directory writes its first record before its first file.
    Missing,
}

impl std::fmt::Display for EndFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndFault::PairDamaged => write!(f, "both copies of a pair are damaged"),
            EndFault::CutShort => write!(f, "the file is cut short"),
            EndFault::UnknownVersion(v) => write!(f, "version {v} is unknown"),
            EndFault::Missing => write!(f, "absent or empty while WAL files exist"),
        }
    }
}

enum Copy {
    Empty,
    Valid(u64, WalEnd),
    Damaged,
    Unknown(u16),
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn encode(end: &WalEnd, sequence: u64, copy: usize, out: &mut [u8]) {
    out.fill(0);
    out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..6].copy_from_slice(&VERSION.to_le_bytes());
    out[6..8].copy_from_slice(&(copy as u16).to_le_bytes());
    out[8..16].copy_from_slice(&sequence.to_le_bytes());
    out[16..24].copy_from_slice(&end.oldest.to_le_bytes());
    out[24..32].copy_from_slice(&end.newest.to_le_bytes());
    out[32..40].copy_from_slice(&end.floor.to_le_bytes());
    out[40..48].copy_from_slice(&end.durable.to_le_bytes());
    let checksum = xxh3(&out[..CHECKSUM_AT]);
    out[CHECKSUM_AT..SECTOR].copy_from_slice(&checksum.to_le_bytes());
}

fn decode(sector: &[u8], copy: usize) -> Copy {
    if is_zero(sector) {
        return Copy::Empty;
    }
    if u64_at(sector, CHECKSUM_AT) != xxh3(&sector[..CHECKSUM_AT])
        || u32::from_le_bytes(sector[0..4].try_into().expect("4")) != MAGIC
    {
        return Copy::Damaged;
    }
    let version = u16::from_le_bytes(sector[4..6].try_into().expect("2"));
    if version != VERSION {
        return Copy::Unknown(version);
    }
    let index = u16::from_le_bytes(sector[6..8].try_into().expect("2"));
    let end = WalEnd {
        oldest: u64_at(sector, 16),
        newest: u64_at(sector, 24),
        floor: u64_at(sector, 32),
        durable: u64_at(sector, 40),
    };
    let shape = index as usize == copy
        && is_zero(&sector[48..CHECKSUM_AT])
        && 1 <= end.oldest
        && end.oldest <= end.newest + 1
        && end.newest < FIELD_MAX
        && 1 <= end.floor
        && end.floor <= end.durable + 1
        && end.durable < FIELD_MAX;
    if shape {
        Copy::Valid(u64_at(sector, 8), end)
    } else {
        Copy::Damaged
    }
}

/// The record file, open, with the newest generation read from it.
#[derive(Debug)]
pub struct EndRecord<F> {
    file: F,
    sequence: u64,
    end: Option<WalEnd>,
}

impl<F> EndRecord<F> {
    /// The newest generation (`None`: never written).
    pub fn end(&self) -> Option<WalEnd> {
        self.end
    }
}

/// Opens (creating if absent) the record and chooses its newest valid generation.
pub async fn open<S: Storage<File = F>, F>(
    storage: &S,
) -> Result<Result<EndRecord<F>, EndFault>, StorageError> {
    let file = storage.open(END_FILE, OpenMode::Create).await?;
    let len = storage.len(&file).await?;
    if len > 0 && len < (COPIES * SECTOR) as u64 {
        return Ok(Err(EndFault::CutShort));
    }
    let mut bytes = AlignedBuf::zeroed(COPIES * SECTOR);
    let mut copies = Vec::with_capacity(COPIES);
    match read_exact_at(storage, &file, 0, bytes.as_mut_slice()).await {
        Ok(_) => {
            for (i, sector) in bytes.as_slice().chunks(SECTOR).enumerate() {
                copies.push(decode(sector, i));
            }
        }
        Err(e) if e.is_media() => {
            for i in 0..COPIES {
                let mut one = AlignedBuf::zeroed(SECTOR);
                copies.push(
                    match storage
                        .read_at(&file, (i * SECTOR) as u64, one.as_mut_slice())
                        .await
                    {
                        Ok(_) => decode(one.as_slice(), i),
                        Err(e) if e.is_media() => Copy::Damaged,
                        Err(e) => return Err(e),
                    },
                );
            }
        }
        Err(e) => return Err(e),
    }
    if let Some(v) = copies.iter().find_map(|c| match c {
        Copy::Unknown(v) => Some(*v),
        _ => None,
    }) {
        return Ok(Err(EndFault::UnknownVersion(v)));
    }
    let damaged = |i: usize| matches!(copies[i], Copy::Damaged);
    if (0..COPIES / 2).any(|p| damaged(2 * p) && damaged(2 * p + 1)) {
        return Ok(Err(EndFault::PairDamaged));
    }
    let newest = copies
        .iter()
        .filter_map(|c| match c {
            Copy::Valid(sequence, end) => Some((*sequence, *end)),
            _ => None,
        })
        .max_by_key(|(sequence, _)| *sequence);
    if newest.is_none() && (0..COPIES).any(damaged) {
        return Ok(Err(EndFault::PairDamaged));
    }
    Ok(Ok(EndRecord {
        file,
        sequence: newest.map_or(0, |(s, _)| s),
        end: newest.map(|(_, e)| e),
    }))
}

impl<F> EndRecord<F> {
    /// Writes a new generation durably (one two-sector write into the pair not holding the
    /// newest generation, one `fdatasync`).
    pub async fn write<S: Storage<File = F>>(
        &mut self,
        storage: &S,
        end: WalEnd,
    ) -> Result<(), StorageError> {
        let sequence = self.sequence + 1;
        let pair = (sequence % 2) as usize;
        let mut buf = AlignedBuf::zeroed(2 * SECTOR);
        for (k, sector) in buf.as_mut_slice().chunks_mut(SECTOR).enumerate() {
            encode(&end, sequence, 2 * pair + k, sector);
        }
        if storage.len(&self.file).await? < (COPIES * SECTOR) as u64 {
            storage
                .set_len(&self.file, (COPIES * SECTOR) as u64)
                .await?;
        }
        storage
            .write_at(&self.file, (2 * pair * SECTOR) as u64, buf.as_slice())
            .await?;
        storage.sync(&self.file).await?;
        self.sequence = sequence;
        self.end = Some(end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{CrashMode, MemStorage, Prng};
    use crate::storage::block_on;

    fn end(durable: u64) -> WalEnd {
        WalEnd {
            oldest: 1,
            newest: 2,
            floor: 1,
            durable,
        }
    }

    #[test]
    fn newest_generation_wins_and_a_torn_write_keeps_the_previous() {
        for seed in 0..50 {
            let disk = MemStorage::new();
            block_on(async {
                let mut r = open(&disk).await.unwrap().unwrap();
                assert_eq!(r.end(), None);
                r.write(&disk, end(5)).await.unwrap();
                r.write(&disk, end(9)).await.unwrap();
                assert_eq!(open(&disk).await.unwrap().unwrap().end(), Some(end(9)));
                // An unsynced third generation: a crash keeps the second or lands the third.
                disk.fail_next(crate::mem::FailOp::Sync);
                assert!(r.write(&disk, end(12)).await.is_err());
                disk.crash(CrashMode::Reorder, &mut Prng::new(seed));
                let got = open(&disk).await.unwrap().unwrap().end().unwrap();
                assert!(got == end(9) || got == end(12), "seed {seed}: {got:?}");
            });
        }
    }

    #[test]
    fn a_damaged_pair_or_a_cut_file_refuses() {
        let disk = MemStorage::new();
        block_on(async {
            let mut r = open(&disk).await.unwrap().unwrap();
            r.write(&disk, end(5)).await.unwrap(); // generation 1: pair 1 (copies 2, 3)
            r.write(&disk, end(6)).await.unwrap(); // generation 2: pair 0
            disk.flip_bit(END_FILE, 100, 3).unwrap();
            assert_eq!(open(&disk).await.unwrap().unwrap().end(), Some(end(6)));
            disk.flip_bit(END_FILE, SECTOR as u64 + 100, 3).unwrap();
            assert_eq!(
                open(&disk).await.unwrap().err(),
                Some(EndFault::PairDamaged)
            );
            disk.truncate_file(END_FILE, SECTOR as u64).unwrap();
            assert_eq!(open(&disk).await.unwrap().err(), Some(EndFault::CutShort));
        });
    }
}
