//! The superblock: the durable VSR state of one group, in four redundant copies.
//!
//! Layout of the file `superblock` (one per group directory or name prefix): four copies of
//! one [`SECTOR`] each. Copy `i` at byte `i * 4096`:
//!
//! ```text
//! 0..4     magic "SBLK" (u32 LE 0x5342_4C4B)
//! 4..6     version u16 = 2
//! 6..8     copy index u16 (a misdirected write reads as damage)
//! 8..16    sequence u64 (newest wins)
//! 16..20   payload length u32 (= 82)
//! 20..24   reserved, zero
//! 24..106  payload, VsrState (below)
//! 4088..4096  XXH3-64 of bytes 0..4088
//! ```
//!
//! Payload, little-endian: cluster u128, replica_id u8, replica_count u8, view u32,
//! log_view u32, commit_max u64, op_head u64, checkpoint_op u64, checkpoint_checksum u128,
//! offset_frontier u64, flags u8 (bit 0: `lost_state`; other bits zero), reserved 7 bytes
//! (zero).
//!
//! A write of generation `q` goes to the copy pair `q % 2` (copies `2p` then `2p+1`, each
//! synced before the next), so the other pair always holds the intact previous generation (G5).
//! On open: the newest valid sequence wins; a pair whose two copies are both present and
//! damaged could have held the newest generation, so the open is refused ([`SuperblockError::
//! Unreadable`]) instead of falling back to an older view. A crash can damage at most the copy
//! being written, whose generation was not yet complete.

use crate::storage::{OpenMode, SECTOR, Storage, StorageError, is_zero, read_exact_at};

const MAGIC: u32 = 0x5342_4C4B;
const VERSION: u16 = 2;
/// Copies of the superblock.
pub const COPIES: usize = 4;
const PAYLOAD_LEN: usize = 82;
const PAYLOAD_AT: usize = 24;
const CHECKSUM_AT: usize = SECTOR - 8;
const _: () = assert!(PAYLOAD_AT + PAYLOAD_LEN <= CHECKSUM_AT);

/// The durable VSR state of a group (journal.md §3.3, consensus.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VsrState {
    /// Cluster id.
    pub cluster: u128,
    /// This replica's id.
    pub replica_id: u8,
    /// Replicas in the cluster.
    pub replica_count: u8,
    /// Current view.
    pub view: u32,
    /// Latest view in which the log was (re)based; `<= view`.
    pub log_view: u32,
    /// Highest op known committed (a recovery lower bound).
    pub commit_max: u64,
    /// Highest op the replica had durably journaled when the state was written (a lower bound
    /// for the recovered head: recovery never reports a shorter log as complete).
    pub op_head: u64,
    /// Op of the latest durable checkpoint (the journal's floor).
    pub checkpoint_op: u64,
    /// Checksum of that checkpoint's snapshot payload.
    pub checkpoint_checksum: u128,
    /// Partition plane: next offset to mint. 0 on the metadata plane.
    pub offset_frontier: u64,
    /// The replica rejoined after its state was wiped and may have acknowledged prepares it no
    /// longer holds; it must not vote until it adopts a view (consensus.md §9). Persisted so a
    /// restart before that keeps the restriction.
    pub lost_state: bool,
}

/// What the configuration says the data directory must belong to (G6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// Cluster id.
    pub cluster: u128,
    /// This replica's id.
    pub replica_id: u8,
    /// Replicas in the cluster.
    pub replica_count: u8,
}

/// Why the superblock cannot be opened or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SuperblockError {
    /// The storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A copy pair is damaged: the newest generation may be lost; boot must not go on.
    #[error("superblock unreadable: copies {copies:?}")]
    Unreadable {
        /// The state of each copy.
        copies: [CopyState; COPIES],
    },
    /// A verified copy of a version this build does not know (a downgrade).
    #[error("superblock version {0} is unknown")]
    UnknownVersion(u16),
    /// The directory belongs to another cluster or replica (G6).
    #[error("superblock identity {found:?} differs from the configuration {expected:?}")]
    IdentityMismatch {
        /// In the superblock.
        found: Identity,
        /// From the configuration.
        expected: Identity,
    },
    /// No superblock was ever written, yet the journal files of its group hold data: a fresh
    /// superblock would format over them (the superblock was lost, or the directory is not
    /// what the configuration thinks). Boot must stop.
    #[error(
        "{dir}: no superblock {prefix:?}, but {files:?} hold data: refusing to format over them"
    )]
    DataWithoutSuperblock {
        /// The data directory.
        dir: String,
        /// The superblock's prefix (`""`: the metadata plane).
        prefix: String,
        /// The files that hold data.
        files: Vec<String>,
    },
    /// A write would regress the state (programmer error caught as a value).
    #[error("state refused: log_view {log_view} > view {view}")]
    LogViewAboveView {
        /// The view.
        view: u32,
        /// The log view.
        log_view: u32,
    },
}

/// The state of one copy as read at open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyState {
    /// All zeros or absent.
    Empty,
    /// Verified, with its sequence.
    Valid(u64),
    /// Present but not verifying (checksum, magic, copy index, payload).
    Damaged,
}

impl VsrState {
    fn encode(&self, out: &mut [u8]) {
        out[0..16].copy_from_slice(&self.cluster.to_le_bytes());
        out[16] = self.replica_id;
        out[17] = self.replica_count;
        out[18..22].copy_from_slice(&self.view.to_le_bytes());
        out[22..26].copy_from_slice(&self.log_view.to_le_bytes());
        out[26..34].copy_from_slice(&self.commit_max.to_le_bytes());
        out[34..42].copy_from_slice(&self.op_head.to_le_bytes());
        out[42..50].copy_from_slice(&self.checkpoint_op.to_le_bytes());
        out[50..66].copy_from_slice(&self.checkpoint_checksum.to_le_bytes());
        out[66..74].copy_from_slice(&self.offset_frontier.to_le_bytes());
        out[74] = u8::from(self.lost_state);
        out[75..82].fill(0);
    }

    fn decode(bytes: &[u8]) -> Option<VsrState> {
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u128_at = |at: usize| u128::from_le_bytes(bytes[at..at + 16].try_into().expect("16"));
        let state = VsrState {
            cluster: u128_at(0),
            replica_id: bytes[16],
            replica_count: bytes[17],
            view: u32_at(18),
            log_view: u32_at(22),
            commit_max: u64_at(26),
            op_head: u64_at(34),
            checkpoint_op: u64_at(42),
            checkpoint_checksum: u128_at(50),
            offset_frontier: u64_at(66),
            lost_state: bytes[74] == 1,
        };
        let reserved_clear = bytes[74] <= 1 && bytes[75..82].iter().all(|b| *b == 0);
        (state.log_view <= state.view && reserved_clear).then_some(state)
    }

    /// The identity fields.
    pub fn identity(&self) -> Identity {
        Identity {
            cluster: self.cluster,
            replica_id: self.replica_id,
            replica_count: self.replica_count,
        }
    }
}

/// One decoded copy: `Ok(None)` empty, `Ok(Some((sequence, state)))` valid, `Err(Some(v))` a
/// verified record of unknown version `v`, `Err(None)` damaged.
pub type DecodedCopy = Result<Option<(u64, VsrState)>, Option<u16>>;

/// Encodes copy `copy` of generation `sequence` (one sector).
pub fn encode_copy(state: &VsrState, sequence: u64, copy: usize) -> Vec<u8> {
    let mut sector = vec![0u8; SECTOR];
    sector[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    sector[4..6].copy_from_slice(&VERSION.to_le_bytes());
    sector[6..8].copy_from_slice(&(copy as u16).to_le_bytes());
    sector[8..16].copy_from_slice(&sequence.to_le_bytes());
    sector[16..20].copy_from_slice(&(PAYLOAD_LEN as u32).to_le_bytes());
    state.encode(&mut sector[PAYLOAD_AT..PAYLOAD_AT + PAYLOAD_LEN]);
    let checksum = wire::integrity::xxh3(&sector[..CHECKSUM_AT]);
    sector[CHECKSUM_AT..].copy_from_slice(&checksum.to_le_bytes());
    sector
}

/// Decodes one copy: `Ok(None)` for an empty sector, `Ok(Some)` for a valid one,
/// `Err(Some(version))` for a verified record of an unknown version, `Err(None)` for damage.
pub fn decode_copy(sector: &[u8], copy: usize) -> DecodedCopy {
    if is_zero(sector) {
        return Ok(None);
    }
    if sector.len() < SECTOR {
        return Err(None);
    }
    let checksum = u64::from_le_bytes(sector[CHECKSUM_AT..SECTOR].try_into().expect("8"));
    if checksum != wire::integrity::xxh3(&sector[..CHECKSUM_AT]) {
        return Err(None);
    }
    if u32::from_le_bytes(sector[0..4].try_into().expect("4")) != MAGIC {
        return Err(None);
    }
    let version = u16::from_le_bytes(sector[4..6].try_into().expect("2"));
    if version != VERSION {
        return Err(Some(version));
    }
    let index = u16::from_le_bytes(sector[6..8].try_into().expect("2"));
    let len = u32::from_le_bytes(sector[16..20].try_into().expect("4"));
    if index as usize != copy || len as usize != PAYLOAD_LEN {
        return Err(None);
    }
    let sequence = u64::from_le_bytes(sector[8..16].try_into().expect("8"));
    let state = VsrState::decode(&sector[PAYLOAD_AT..PAYLOAD_AT + PAYLOAD_LEN]).ok_or(None)?;
    Ok(Some((sequence, state)))
}

/// The decision of [`open`] as a pure function of the four copies: the newest state (`None`
/// when every copy is empty), or why boot must stop.
pub fn choose(copies: &[DecodedCopy; COPIES]) -> Result<Option<(u64, VsrState)>, SuperblockError> {
    let states: [CopyState; COPIES] = std::array::from_fn(|i| match &copies[i] {
        Ok(None) => CopyState::Empty,
        Ok(Some((sequence, _))) => CopyState::Valid(*sequence),
        Err(_) => CopyState::Damaged,
    });
    if let Some(version) = copies
        .iter()
        .find_map(|c| c.as_ref().err().copied().flatten())
    {
        return Err(SuperblockError::UnknownVersion(version));
    }
    let pair_damaged = (0..COPIES / 2)
        .any(|p| states[2 * p] == CopyState::Damaged && states[2 * p + 1] == CopyState::Damaged);
    let newest = copies
        .iter()
        .filter_map(|c| c.as_ref().ok().copied().flatten())
        .max_by_key(|(sequence, _)| *sequence);
    let any_damaged = states.contains(&CopyState::Damaged);
    if pair_damaged || (newest.is_none() && any_damaged) {
        return Err(SuperblockError::Unreadable { copies: states });
    }
    Ok(newest)
}

/// An open superblock: the newest state and the next generation to write.
#[derive(Debug)]
pub struct Superblock<S: Storage> {
    storage: S,
    file: S::File,
    sequence: u64,
    state: Option<VsrState>,
}

/// The files of the group under `prefix` that hold data (a non-zero byte): the metadata
/// journal's two files for the metadata plane (`prefix` empty; the shard WAL beside it is not
/// the metadata group's), every other file of the prefix for a partition group (segments,
/// indexes, offsets).
pub async fn data_files<S: Storage>(
    storage: &S,
    prefix: &str,
) -> Result<Vec<String>, StorageError> {
    let superblock = file_name(prefix);
    let names: Vec<String> = if prefix.is_empty() {
        let all = storage.list().await?;
        [
            crate::metadata::PREPARES_FILE,
            crate::metadata::HEADERS_FILE,
        ]
        .into_iter()
        .filter(|n| all.iter().any(|a| a == n))
        .map(str::to_owned)
        .collect()
    } else {
        storage
            .list()
            .await?
            .into_iter()
            .filter(|n| n.starts_with(prefix) && *n != superblock)
            .collect()
    };
    let mut holding = Vec::new();
    let mut buf = crate::file::AlignedBuf::zeroed(1 << 20);
    for name in names {
        let file = storage.open(&name, OpenMode::Existing).await?;
        let len = storage.len(&file).await?;
        let mut at = 0;
        while at < len {
            let n = match storage.read_at(&file, at, buf.as_mut_slice()).await {
                Ok(n) => n,
                // An unreadable sector was written once: data.
                Err(e) if e.is_media() => {
                    holding.push(name.clone());
                    break;
                }
                Err(e) => return Err(e),
            };
            if n == 0 {
                break;
            }
            if !is_zero(&buf.as_slice()[..n]) {
                holding.push(name.clone());
                break;
            }
            at += n as u64;
        }
    }
    Ok(holding)
}

/// The file name of a superblock with a prefix (`""` for the metadata plane).
pub fn file_name(prefix: &str) -> String {
    format!("{prefix}superblock")
}

impl<S: Storage> Superblock<S> {
    /// Opens (creating if absent) the superblock `"{prefix}superblock"`, checks the identity
    /// against the configuration, and returns it with the newest state (`None` = fresh). A
    /// fresh superblock is refused ([`SuperblockError::DataWithoutSuperblock`]) when the
    /// group's journal files already hold data (see [`data_files`]): boot never formats over
    /// data. So a group's first superblock write must come before its first journal write (the
    /// boot API formats: `crate::boot`).
    pub async fn open(
        storage: S,
        prefix: &str,
        identity: Identity,
    ) -> Result<Superblock<S>, SuperblockError> {
        let file = storage.open(&file_name(prefix), OpenMode::Create).await?;
        let mut bytes = vec![0u8; SECTOR * COPIES];
        let mut copies: [DecodedCopy; COPIES] = std::array::from_fn(|_| Ok(None));
        let whole = read_exact_at(&storage, &file, 0, &mut bytes).await;
        for (i, copy) in copies.iter_mut().enumerate() {
            let sector = &bytes[i * SECTOR..(i + 1) * SECTOR];
            *copy = match &whole {
                Ok(_) => decode_copy(sector, i),
                Err(e) if e.is_media() => {
                    // Read copy by copy to find which sector is lost.
                    let mut one = vec![0u8; SECTOR];
                    match storage.read_at(&file, (i * SECTOR) as u64, &mut one).await {
                        Ok(_) => decode_copy(&one, i),
                        Err(e) if e.is_media() => Err(None),
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e.clone().into()),
            };
        }
        let newest = choose(&copies)?;
        if newest.is_none() {
            let files = data_files(&storage, prefix).await?;
            if !files.is_empty() {
                return Err(SuperblockError::DataWithoutSuperblock {
                    dir: storage.location(),
                    prefix: prefix.to_owned(),
                    files,
                });
            }
        }
        if let Some((_, state)) = newest
            && state.identity() != identity
        {
            return Err(SuperblockError::IdentityMismatch {
                found: state.identity(),
                expected: identity,
            });
        }
        Ok(Superblock {
            storage,
            file,
            sequence: newest.map_or(0, |(s, _)| s),
            state: newest.map(|(_, s)| s),
        })
    }

    /// The newest durable state, `None` if the superblock was never written.
    pub fn state(&self) -> Option<&VsrState> {
        self.state.as_ref()
    }

    /// The sequence of the newest durable generation.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Writes a new generation durably: both copies of the pair not holding the newest
    /// generation, each synced. On return the state survives a crash; on error the previous
    /// generation is intact and the caller must fail-stop.
    pub async fn write(&mut self, state: &VsrState) -> Result<(), SuperblockError> {
        if state.log_view > state.view {
            return Err(SuperblockError::LogViewAboveView {
                view: state.view,
                log_view: state.log_view,
            });
        }
        let sequence = self.sequence + 1;
        let pair = (sequence % 2) as usize;
        for copy in [2 * pair, 2 * pair + 1] {
            let sector = encode_copy(state, sequence, copy);
            self.storage
                .write_at(&self.file, (copy * SECTOR) as u64, &sector)
                .await?;
            self.storage.sync(&self.file).await?;
        }
        self.sequence = sequence;
        self.state = Some(*state);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{CrashMode, MemStorage, Prng};
    use crate::storage::block_on;

    const ID: Identity = Identity {
        cluster: 42,
        replica_id: 1,
        replica_count: 3,
    };

    fn state(view: u32) -> VsrState {
        VsrState {
            cluster: 42,
            replica_id: 1,
            replica_count: 3,
            view,
            log_view: view,
            commit_max: 10 + view as u64,
            op_head: 12 + view as u64,
            checkpoint_op: 4,
            checkpoint_checksum: 0xabc,
            offset_frontier: 0,
            lost_state: view % 2 == 1,
        }
    }

    #[test]
    fn fresh_then_newest_wins() {
        let disk = MemStorage::new();
        block_on(async {
            let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            assert!(sb.state().is_none());
            for view in 1..=5 {
                sb.write(&state(view)).await.unwrap();
            }
            let sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            assert_eq!(sb.state(), Some(&state(5)));
            assert_eq!(sb.sequence(), 5);
        });
    }

    #[test]
    fn identity_mismatch_refuses() {
        let disk = MemStorage::new();
        block_on(async {
            let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            sb.write(&state(1)).await.unwrap();
            let other = Identity {
                replica_id: 2,
                ..ID
            };
            assert!(matches!(
                Superblock::open(disk.clone(), "", other).await,
                Err(SuperblockError::IdentityMismatch { .. })
            ));
        });
    }

    #[test]
    fn crash_during_write_keeps_old_or_new_never_older() {
        for seed in 0..200 {
            let disk = MemStorage::new();
            block_on(async {
                let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
                sb.write(&state(1)).await.unwrap();
                sb.write(&state(2)).await.unwrap();
                // An unsynced write of generation 3 (as if the crash hit between write and sync).
                let seq = 3;
                let pair = 1;
                let f = disk.open("superblock", OpenMode::Existing).await.unwrap();
                disk.write_at(
                    &f,
                    (2 * pair * SECTOR) as u64,
                    &encode_copy(&state(3), seq, 2 * pair),
                )
                .await
                .unwrap();
                disk.crash(CrashMode::Reorder, &mut Prng::new(seed));
                let sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
                let view = sb.state().unwrap().view;
                assert!(view == 2 || view == 3, "seed {seed}: view {view}");
            });
        }
    }

    #[test]
    fn one_damaged_copy_is_survived_a_damaged_pair_refuses() {
        let disk = MemStorage::new();
        block_on(async {
            let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            sb.write(&state(1)).await.unwrap();
            sb.write(&state(2)).await.unwrap();
            disk.flip_bit("superblock", 0, 3).unwrap(); // copy 0 (generation 2)
            let sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            assert_eq!(sb.state().unwrap().view, 2);
            disk.zero_sector("superblock", 1).unwrap();
            disk.flip_bit("superblock", SECTOR as u64 + 30, 1).unwrap(); // copy 1 present, damaged
            assert!(matches!(
                Superblock::open(disk.clone(), "", ID).await,
                Err(SuperblockError::Unreadable { .. })
            ));
        });
    }

    #[test]
    fn every_single_bit_flip_is_detected_or_survived() {
        // Flipping any bit of any copy never yields a state that was not written.
        let mut prng = Prng::new(7);
        for _ in 0..300 {
            let disk = MemStorage::new();
            block_on(async {
                let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
                sb.write(&state(1)).await.unwrap();
                sb.write(&state(2)).await.unwrap();
                let byte = prng.below((SECTOR * COPIES) as u64);
                disk.flip_bit("superblock", byte, prng.below(8) as u8)
                    .unwrap();
                let sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
                assert_eq!(sb.state(), Some(&state(2)));
            });
        }
    }

    #[test]
    fn lost_sector_is_a_damaged_copy() {
        let disk = MemStorage::new();
        block_on(async {
            let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            sb.write(&state(1)).await.unwrap();
            sb.write(&state(2)).await.unwrap();
            disk.lose_sector("superblock", 0).unwrap();
            let sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            assert_eq!(sb.state(), Some(&state(2)));
        });
    }

    #[test]
    fn log_view_above_view_is_refused() {
        let disk = MemStorage::new();
        block_on(async {
            let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            let bad = VsrState {
                log_view: 9,
                ..state(1)
            };
            assert!(sb.write(&bad).await.is_err());
        });
    }
}
