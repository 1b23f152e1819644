//! The superblock: the durable VSR state of one group, in four redundant copies.
//!
//! Layout of the file `superblock` (one per group directory or name prefix), format version 3:
//! four copies of [`COPY_SECTORS`] sectors each (36 KiB). Copy `i` starts at byte
//! `i * COPY_BYTES`; its first sector is the *record*, the next eight sectors its *view-header
//! area*:
//!
//! ```text
//! record (sector 0 of the copy)
//! 0..4     magic "SBLK" (u32 LE 0x5342_4C4B)
//! 4..6     version u16 = 3
//! 6..8     copy index u16 (a misdirected write reads as damage)
//! 8..16    sequence u64 (newest wins)
//! 16..20   payload length u32 (= 252)
//! 20..24   reserved, zero
//! 24..276  payload, VsrState (below)
//! 4088..4096  XXH3-64 of bytes 0..4088
//! view-header area (sectors 1..=8 of the copy)
//! 128 slots of 256 bytes: the first `view_headers_count` hold prepare headers, the rest zero
//! ```
//!
//! Payload, little-endian: cluster u128, replica_id u8, replica_count u8, view u32,
//! log_view u32, commit_max u64, op_head u64, checkpoint_op u64, checkpoint_checksum u128,
//! offset_frontier u64, flags u8 (bit 0: `lost_state`; other bits zero), reserved 7 bytes
//! (zero); then (new in version 3) checkpoint_prepare_checksum u128, checkpoint_timestamp u64,
//! truncation_ceiling u64, view_headers_count u16 (at most [`VIEW_HEADERS_MAX`]),
//! view_headers_checksum u64 (XXH3-64 of the whole 32 KiB area), and 128 reserved bytes that
//! must be zero. The reserved bytes are room for later fields without a new version: a field
//! placed there must read zero as "absent" (decision 50).
//!
//! A copy is written with one write and one sync; the record's checksum covers its own bytes
//! and, through `view_headers_checksum`, every byte of the area, so a copy torn anywhere reads
//! as damaged. A write of generation `q` goes to the copy pair `q % 2` (copies `2p` then `2p+1`,
//! each synced before the next), so the other pair always holds the intact previous generation
//! (G5), view headers included. On open: the newest valid sequence wins; a pair whose two copies
//! are both present and damaged could have held the newest generation, so the open is refused
//! ([`SuperblockError::Unreadable`]) instead of falling back to an older view. A crash can
//! damage at most the copy being written, whose generation was not yet complete. A verified
//! record of another version (version 2, the one-sector format) is refused with
//! [`SuperblockError::UnknownVersion`]: nothing was deployed with it, so no upgrade path.

use crate::storage::{OpenMode, SECTOR, Storage, StorageError, is_zero, read_exact_at};

const MAGIC: u32 = 0x5342_4C4B;
const VERSION: u16 = 3;
/// Copies of the superblock.
pub const COPIES: usize = 4;
/// Size of one view header (a prepare header).
pub const VIEW_HEADER_SIZE: usize = 256;
/// View headers a superblock holds at most (a DoViewChange/StartView suffix).
pub const VIEW_HEADERS_MAX: usize = 128;
const AREA_BYTES: usize = VIEW_HEADER_SIZE * VIEW_HEADERS_MAX;
/// Sectors per copy: the record and the view-header area.
pub const COPY_SECTORS: usize = 1 + AREA_BYTES / SECTOR;
/// Bytes per copy.
pub const COPY_BYTES: usize = COPY_SECTORS * SECTOR;
const PAYLOAD_LEN: usize = 252;
const PAYLOAD_AT: usize = 24;
const CHECKSUM_AT: usize = SECTOR - 8;
const _: () = assert!(PAYLOAD_AT + PAYLOAD_LEN <= CHECKSUM_AT);
const _: () = assert!(AREA_BYTES.is_multiple_of(SECTOR));

/// One view header as stored (the 256 bytes of a prepare header).
pub type ViewHeader = [u8; VIEW_HEADER_SIZE];

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
    /// Checksum of that checkpoint's snapshot payload (the bytes of the snapshot).
    pub checkpoint_checksum: u128,
    /// Partition plane: next offset to mint. 0 on the metadata plane.
    pub offset_frontier: u64,
    /// The replica rejoined after its state was wiped and may have acknowledged prepares it no
    /// longer holds; it must not vote until it adopts a view (consensus.md §9). Persisted so a
    /// restart before that keeps the restriction.
    pub lost_state: bool,
    /// Identity (header `checksum`) of the prepare at `checkpoint_op`, the `parent` of the op
    /// above it; 0 when the replica did not know it (version 3).
    pub checkpoint_prepare_checksum: u128,
    /// Timestamp of the prepare at `checkpoint_op` (version 3).
    pub checkpoint_timestamp: u64,
    /// The highest op the journal may have held before a truncation (the consensus core's
    /// `held_ceiling`, made durable before the truncation, decision 51; version 3).
    pub truncation_ceiling: u64,
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
    /// A verified copy of a version this build does not know (a downgrade, or a data
    /// directory written by an older format, which is not upgraded).
    #[error("superblock format version {0} is not supported (this build reads version 3 only)")]
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
    /// More view headers than a superblock holds (programmer error caught as a value).
    #[error("{0} view headers exceed the superblock's {VIEW_HEADERS_MAX}")]
    TooManyViewHeaders(usize),
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
        out[82..98].copy_from_slice(&self.checkpoint_prepare_checksum.to_le_bytes());
        out[98..106].copy_from_slice(&self.checkpoint_timestamp.to_le_bytes());
        out[106..114].copy_from_slice(&self.truncation_ceiling.to_le_bytes());
        // 114..124: the view-header count and area checksum, written by `encode_copy`.
        out[124..PAYLOAD_LEN].fill(0);
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
            checkpoint_prepare_checksum: u128_at(82),
            checkpoint_timestamp: u64_at(98),
            truncation_ceiling: u64_at(106),
        };
        let reserved_clear = bytes[74] <= 1
            && bytes[75..82].iter().all(|b| *b == 0)
            && bytes[124..PAYLOAD_LEN].iter().all(|b| *b == 0);
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

/// One decoded copy: `Ok(None)` empty, `Ok(Some((sequence, state, view headers)))` valid,
/// `Err(Some(v))` a verified record of unknown version `v`, `Err(None)` damaged.
pub type DecodedCopy = Result<Option<(u64, VsrState, Vec<ViewHeader>)>, Option<u16>>;

/// Encodes copy `copy` of generation `sequence` ([`COPY_BYTES`]: the record and the area).
/// `headers` must hold at most [`VIEW_HEADERS_MAX`] entries.
pub fn encode_copy(
    state: &VsrState,
    headers: &[ViewHeader],
    sequence: u64,
    copy: usize,
) -> Vec<u8> {
    assert!(headers.len() <= VIEW_HEADERS_MAX, "checked by the caller");
    let mut bytes = vec![0u8; COPY_BYTES];
    for (i, h) in headers.iter().enumerate() {
        let at = SECTOR + i * VIEW_HEADER_SIZE;
        bytes[at..at + VIEW_HEADER_SIZE].copy_from_slice(h);
    }
    let area_checksum = wire::integrity::xxh3(&bytes[SECTOR..]);
    let sector = &mut bytes[..SECTOR];
    sector[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    sector[4..6].copy_from_slice(&VERSION.to_le_bytes());
    sector[6..8].copy_from_slice(&(copy as u16).to_le_bytes());
    sector[8..16].copy_from_slice(&sequence.to_le_bytes());
    sector[16..20].copy_from_slice(&(PAYLOAD_LEN as u32).to_le_bytes());
    let payload = &mut sector[PAYLOAD_AT..PAYLOAD_AT + PAYLOAD_LEN];
    state.encode(payload);
    payload[114..116].copy_from_slice(&(headers.len() as u16).to_le_bytes());
    payload[116..124].copy_from_slice(&area_checksum.to_le_bytes());
    let checksum = wire::integrity::xxh3(&sector[..CHECKSUM_AT]);
    sector[CHECKSUM_AT..].copy_from_slice(&checksum.to_le_bytes());
    bytes
}

/// Decodes one copy (its [`COPY_BYTES`]; a shorter slice is read as zero-padded): `Ok(None)`
/// for an empty copy, `Ok(Some)` for a valid one, `Err(Some(version))` for a verified record
/// of an unknown version, `Err(None)` for damage.
pub fn decode_copy(bytes: &[u8], copy: usize) -> DecodedCopy {
    if is_zero(bytes) {
        return Ok(None);
    }
    if bytes.len() < SECTOR {
        return Err(None);
    }
    let sector = &bytes[..SECTOR];
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
    if index as usize != copy || len as usize != PAYLOAD_LEN || bytes.len() < COPY_BYTES {
        return Err(None);
    }
    let payload = &sector[PAYLOAD_AT..PAYLOAD_AT + PAYLOAD_LEN];
    let count = u16::from_le_bytes(payload[114..116].try_into().expect("2")) as usize;
    let area_checksum = u64::from_le_bytes(payload[116..124].try_into().expect("8"));
    let area = &bytes[SECTOR..COPY_BYTES];
    if count > VIEW_HEADERS_MAX || area_checksum != wire::integrity::xxh3(area) {
        return Err(None);
    }
    // Unused slots are zero: anything else is not what `encode_copy` wrote.
    if !is_zero(&area[count * VIEW_HEADER_SIZE..]) {
        return Err(None);
    }
    let sequence = u64::from_le_bytes(sector[8..16].try_into().expect("8"));
    let state = VsrState::decode(payload).ok_or(None)?;
    let headers = area[..count * VIEW_HEADER_SIZE]
        .chunks_exact(VIEW_HEADER_SIZE)
        .map(|c| c.try_into().expect("256 bytes"))
        .collect();
    Ok(Some((sequence, state, headers)))
}

/// The newest state chosen by [`choose`]: sequence, state and view headers.
pub type Chosen = (u64, VsrState, Vec<ViewHeader>);

/// The decision of [`Superblock::open`] as a pure function of the four copies: the newest state (`None`
/// when every copy is empty), or why boot must stop.
pub fn choose(copies: &[DecodedCopy; COPIES]) -> Result<Option<Chosen>, SuperblockError> {
    let states: [CopyState; COPIES] = std::array::from_fn(|i| match &copies[i] {
        Ok(None) => CopyState::Empty,
        Ok(Some((sequence, _, _))) => CopyState::Valid(*sequence),
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
        .filter_map(|c| c.as_ref().ok().cloned().flatten())
        .max_by_key(|(sequence, _, _)| *sequence);
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
    view_headers: Vec<ViewHeader>,
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
        let mut bytes = vec![0u8; COPY_BYTES * COPIES];
        let mut copies: [DecodedCopy; COPIES] = std::array::from_fn(|_| Ok(None));
        let whole = read_exact_at(&storage, &file, 0, &mut bytes).await;
        for (i, copy) in copies.iter_mut().enumerate() {
            let range = i * COPY_BYTES..(i + 1) * COPY_BYTES;
            *copy = match &whole {
                Ok(_) => decode_copy(&bytes[range], i),
                Err(e) if e.is_media() => {
                    // Read copy by copy to find which one lost a sector.
                    let mut one = vec![0u8; COPY_BYTES];
                    match read_exact_at(&storage, &file, range.start as u64, &mut one).await {
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
        if let Some((_, state, _)) = &newest
            && state.identity() != identity
        {
            return Err(SuperblockError::IdentityMismatch {
                found: state.identity(),
                expected: identity,
            });
        }
        let (sequence, state, view_headers) = match newest {
            Some((sequence, state, headers)) => (sequence, Some(state), headers),
            None => (0, None, Vec::new()),
        };
        Ok(Superblock {
            storage,
            file,
            sequence,
            state,
            view_headers,
        })
    }

    /// The newest durable state, `None` if the superblock was never written.
    pub fn state(&self) -> Option<&VsrState> {
        self.state.as_ref()
    }

    /// The view headers of the newest durable generation (empty if none).
    pub fn view_headers(&self) -> &[ViewHeader] {
        &self.view_headers
    }

    /// The sequence of the newest durable generation.
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Writes a new generation durably with the view headers the newest generation holds (see
    /// [`Superblock::write_with_view_headers`]).
    pub async fn write(&mut self, state: &VsrState) -> Result<(), SuperblockError> {
        let headers = std::mem::take(&mut self.view_headers);
        let result = self.write_with_view_headers(state, &headers).await;
        if result.is_err() {
            self.view_headers = headers;
        }
        result
    }

    /// Writes a new generation durably, state and view headers together: both copies of the
    /// pair not holding the newest generation, each written whole and synced. On return the
    /// state survives a crash; on error the previous generation is intact and the caller must
    /// fail-stop.
    pub async fn write_with_view_headers(
        &mut self,
        state: &VsrState,
        headers: &[ViewHeader],
    ) -> Result<(), SuperblockError> {
        if state.log_view > state.view {
            return Err(SuperblockError::LogViewAboveView {
                view: state.view,
                log_view: state.log_view,
            });
        }
        if headers.len() > VIEW_HEADERS_MAX {
            return Err(SuperblockError::TooManyViewHeaders(headers.len()));
        }
        let sequence = self.sequence + 1;
        let pair = (sequence % 2) as usize;
        for copy in [2 * pair, 2 * pair + 1] {
            let bytes = encode_copy(state, headers, sequence, copy);
            self.storage
                .write_at(&self.file, (copy * COPY_BYTES) as u64, &bytes)
                .await?;
            self.storage.sync(&self.file).await?;
        }
        self.sequence = sequence;
        self.state = Some(*state);
        self.view_headers = headers.to_vec();
        Ok(())
    }
}

/// The consensus core's durable state as this superblock holds it (decisions 50-52): `view`,
/// `log_view`, `commit_max`, `lost_state`, the view headers written with `log_view`, the
/// truncation ceiling and the checkpoint's prepare identity. `None` without a state. One
/// mapping for the server's boot and the simulator's disks (`tests/src/storage.rs`).
#[cfg(feature = "consensus")]
pub fn core_state<S: Storage>(superblock: &Superblock<S>) -> Option<consensus::VsrState> {
    use wire::header::{Layout, PrepareHeader};
    let s = superblock.state()?;
    let view_headers = superblock
        .view_headers()
        .iter()
        .filter_map(|bytes| PrepareHeader::view(&bytes[..]).copied())
        .collect();
    Some(consensus::VsrState {
        view: s.view,
        log_view: s.log_view,
        commit_max: s.commit_max,
        lost_state: s.lost_state,
        view_headers,
        held_ceiling: s.truncation_ceiling,
        snapshot_op: s.checkpoint_op,
        snapshot_checksum: s.checkpoint_prepare_checksum,
        snapshot_timestamp: s.checkpoint_timestamp,
    })
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
            checkpoint_prepare_checksum: 0x5eed_0000 + u128::from(view),
            checkpoint_timestamp: 1_000 + u64::from(view),
            truncation_ceiling: 20 + u64::from(view),
        }
    }

    /// `count` distinct view headers of generation `view`.
    fn headers(view: u32, count: usize) -> Vec<ViewHeader> {
        (0..count)
            .map(|i| {
                let mut h = [0u8; VIEW_HEADER_SIZE];
                h[0] = view as u8;
                h[1] = i as u8;
                h[255] = 0xa5;
                h
            })
            .collect()
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
                    (2 * pair * COPY_BYTES) as u64,
                    &encode_copy(&state(3), &headers(3, 128), seq, 2 * pair),
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
            // Copy 1 present, damaged in its view-header area.
            let copy1 = (COPY_BYTES / SECTOR) as u64;
            disk.zero_sector("superblock", copy1).unwrap();
            disk.flip_bit("superblock", (COPY_BYTES + SECTOR + 30) as u64, 1)
                .unwrap();
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
                sb.write_with_view_headers(&state(1), &headers(1, 3))
                    .await
                    .unwrap();
                sb.write_with_view_headers(&state(2), &headers(2, 128))
                    .await
                    .unwrap();
                let byte = prng.below((COPY_BYTES * COPIES) as u64);
                disk.flip_bit("superblock", byte, prng.below(8) as u8)
                    .unwrap();
                let sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
                assert_eq!(sb.state(), Some(&state(2)));
                assert_eq!(sb.view_headers(), &headers(2, 128)[..]);
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

    #[test]
    fn view_headers_round_trip_and_plain_writes_keep_them() {
        let disk = MemStorage::new();
        block_on(async {
            let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            assert!(sb.view_headers().is_empty());
            sb.write_with_view_headers(&state(1), &headers(1, 5))
                .await
                .unwrap();
            sb.write(&state(2)).await.unwrap();
            let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            assert_eq!(sb.state(), Some(&state(2)));
            assert_eq!(sb.view_headers(), &headers(1, 5)[..]);
            sb.write_with_view_headers(&state(3), &[]).await.unwrap();
            let sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
            assert!(sb.view_headers().is_empty());
            assert_eq!(sb.state(), Some(&state(3)));
            let mut sb = sb;
            assert_eq!(
                sb.write_with_view_headers(&state(4), &headers(4, 129))
                    .await,
                Err(SuperblockError::TooManyViewHeaders(129))
            );
        });
    }

    #[test]
    fn a_copy_torn_in_its_view_header_area_falls_back_to_the_previous_generation() {
        // Every sector of the newest copy pair, lost one at a time in both copies (a write
        // torn after the record landed): the previous generation, with its own headers.
        for sector in 1..COPY_SECTORS {
            let disk = MemStorage::new();
            block_on(async {
                let mut sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
                sb.write_with_view_headers(&state(1), &headers(1, 128))
                    .await
                    .unwrap();
                sb.write_with_view_headers(&state(2), &headers(2, 128))
                    .await
                    .unwrap();
                // Generation 2 is in pair 0; one copy torn: generation 2 survives.
                disk.zero_sector("superblock", sector as u64).unwrap();
                let sb = Superblock::open(disk.clone(), "", ID).await.unwrap();
                assert_eq!(sb.state(), Some(&state(2)), "sector {sector}");
                assert_eq!(sb.view_headers(), &headers(2, 128)[..]);
                // Both copies of the pair damaged: the newest generation may be lost.
                let copy1 = (COPY_SECTORS + sector) as u64;
                disk.zero_sector("superblock", copy1).unwrap();
                assert!(matches!(
                    Superblock::open(disk.clone(), "", ID).await,
                    Err(SuperblockError::Unreadable { .. })
                ));
            });
        }
    }

    #[test]
    fn a_version_2_superblock_is_refused_with_its_version() {
        // The one-sector version 2 record at copy 0, as the previous format wrote it.
        let disk = MemStorage::new();
        block_on(async {
            let mut sector = encode_copy(&state(1), &[], 1, 0);
            sector.truncate(SECTOR);
            sector[4..6].copy_from_slice(&2u16.to_le_bytes());
            sector[16..20].copy_from_slice(&82u32.to_le_bytes());
            sector[24 + 82..CHECKSUM_AT].fill(0);
            let checksum = wire::integrity::xxh3(&sector[..CHECKSUM_AT]);
            sector[CHECKSUM_AT..].copy_from_slice(&checksum.to_le_bytes());
            let f = disk.open("superblock", OpenMode::Create).await.unwrap();
            disk.write_at(&f, 0, &sector).await.unwrap();
            disk.sync(&f).await.unwrap();
            let error = Superblock::open(disk.clone(), "", ID).await.unwrap_err();
            assert_eq!(error, SuperblockError::UnknownVersion(2));
            assert!(error.to_string().contains("version 2 is not supported"));
        });
    }

    #[test]
    fn reserved_bytes_must_be_zero() {
        let mut bytes = encode_copy(&state(1), &headers(1, 2), 1, 0);
        assert!(decode_copy(&bytes, 0).is_ok());
        bytes[PAYLOAD_AT + 200] = 1;
        let checksum = wire::integrity::xxh3(&bytes[..CHECKSUM_AT]);
        bytes[CHECKSUM_AT..SECTOR].copy_from_slice(&checksum.to_le_bytes());
        assert_eq!(decode_copy(&bytes, 0), Err(None));
    }
}
