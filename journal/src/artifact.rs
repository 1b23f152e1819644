//! State-transfer artifacts (state-transfer.md §3, consensus.md §11.3): their encodings, the
//! stores that keep them durable (consumer offsets, metadata snapshot), and producing and
//! installing them with their manifest checksums.
//!
//! Encodings: CLIENT_TABLE is "ICT2" and CONSUMER_OFFSETS is "ICO1" exactly as consensus.md
//! §11.3 records them (XXH3-64 trailer); SEGMENT_LOG is a segment's `.log` bytes verbatim;
//! METADATA_SNAPSHOT is the snapshot payload (Strand's own format, opaque here), whose
//! `XXH3-64`, widened, is the superblock's `checkpoint_checksum`.

use std::collections::BTreeMap;

use wire::integrity::{widen, xxh3};
use wire::manifest::{self, ArtifactKind, ManifestEntry, ManifestError};

use crate::batch;
use crate::pingpong::{CopyRead, PingPong};
use crate::segment::{FlushPolicy, PartitionLog, SegmentError, SegmentRecovery};
use crate::storage::{Storage, StorageError};

/// Why an artifact cannot be produced, decoded or installed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    /// The storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A segment operation failed.
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// The manifest failed to encode or decode.
    #[error("manifest: {0}")]
    Manifest(#[from] ManifestError),
    /// Bytes too short for the encoding.
    #[error("{0} artifact truncated")]
    Truncated(&'static str),
    /// Unknown magic or version.
    #[error("{0} artifact has an unknown magic or version")]
    Magic(&'static str),
    /// The encoding's own trailer does not match.
    #[error("{0} artifact trailer mismatch")]
    Trailer(&'static str),
    /// Length or XXH3 differs from the manifest entry.
    #[error("artifact {index}: length or checksum differs from the manifest")]
    Checksum {
        /// Index in the manifest.
        index: usize,
    },
    /// The offer's shape is not what this plane installs.
    #[error("offer shape refused: {0}")]
    Shape(&'static str),
    /// Entries not in ascending id order, or trailing bytes.
    #[error("{0} artifact is not canonical")]
    NotCanonical(&'static str),
}

/// Appends the XXH3-64 trailer of `out`.
fn with_trailer(mut out: Vec<u8>) -> Vec<u8> {
    let trailer = xxh3(&out);
    out.extend_from_slice(&trailer.to_le_bytes());
    out
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over `bytes` once their XXH3-64 trailer checks; the trailer is split off.
    fn trailed(bytes: &'a [u8], what: &'static str) -> Result<Reader<'a>, ArtifactError> {
        let split = bytes
            .len()
            .checked_sub(8)
            .ok_or(ArtifactError::Truncated(what))?;
        let (content, trailer) = bytes.split_at(split);
        if u64::from_le_bytes(trailer.try_into().expect("8")) != xxh3(content) {
            return Err(ArtifactError::Trailer(what));
        }
        Ok(Reader {
            bytes: content,
            at: 0,
            what,
        })
    }

    /// Refuses trailing bytes: an encoding is read whole.
    fn finish(self) -> Result<(), ArtifactError> {
        if self.at != self.bytes.len() {
            return Err(ArtifactError::NotCanonical(self.what));
        }
        Ok(())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ArtifactError> {
        let end = self
            .at
            .checked_add(n)
            .ok_or(ArtifactError::Truncated(self.what))?;
        let out = self
            .bytes
            .get(self.at..end)
            .ok_or(ArtifactError::Truncated(self.what))?;
        self.at = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, ArtifactError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, ArtifactError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, ArtifactError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn u128(&mut self) -> Result<u128, ArtifactError> {
        Ok(u128::from_le_bytes(self.take(16)?.try_into().expect("16")))
    }
}

/// The consumer and consumer-group offsets of a partition (CONSUMER_OFFSETS, "ICO1").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OffsetTable {
    /// Applied purge generation.
    pub purge_generation: u64,
    /// The partition's next offset.
    pub next_offset: u64,
    /// Consumer id → offset.
    pub consumers: BTreeMap<u32, u64>,
    /// Consumer-group id → offset.
    pub groups: BTreeMap<u32, u64>,
}

impl OffsetTable {
    /// Encodes as "ICO1".
    pub fn encode(&self) -> Vec<u8> {
        let mut out = b"ICO1".to_vec();
        out.push(1);
        out.extend_from_slice(&self.purge_generation.to_le_bytes());
        out.extend_from_slice(&self.next_offset.to_le_bytes());
        out.extend_from_slice(&(self.consumers.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.groups.len() as u32).to_le_bytes());
        for (id, offset) in self.consumers.iter().chain(&self.groups) {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
        }
        with_trailer(out)
    }

    /// Decodes "ICO1"; ids must be strictly ascending.
    pub fn decode(bytes: &[u8]) -> Result<OffsetTable, ArtifactError> {
        const WHAT: &str = "CONSUMER_OFFSETS";
        let mut r = Reader::trailed(bytes, WHAT)?;
        if r.take(4)? != b"ICO1" || r.u8()? != 1 {
            return Err(ArtifactError::Magic(WHAT));
        }
        let mut table = OffsetTable {
            purge_generation: r.u64()?,
            next_offset: r.u64()?,
            ..OffsetTable::default()
        };
        let consumers = r.u32()?;
        let groups = r.u32()?;
        for (count, map) in [
            (consumers, &mut table.consumers),
            (groups, &mut table.groups),
        ] {
            for _ in 0..count {
                let id = r.u32()?;
                if map.last_key_value().is_some_and(|(last, _)| *last >= id) {
                    return Err(ArtifactError::NotCanonical(WHAT));
                }
                map.insert(id, r.u64()?);
            }
        }
        r.finish()?;
        Ok(table)
    }
}

/// One client-table entry (CLIENT_TABLE, "ICT2").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientEntry {
    /// Client id.
    pub client: u128,
    /// Session epoch (the Register's commit op).
    pub epoch: u64,
    /// Acting user.
    pub user_id: u32,
    /// Latest applied request.
    pub watermark: u64,
    /// Its request checksum.
    pub watermark_checksum: u128,
    /// Cached reply frames, oldest first.
    pub replies: Vec<Vec<u8>>,
}

/// Encodes a client table as "ICT2".
pub fn encode_client_table(entries: &[ClientEntry]) -> Vec<u8> {
    let mut out = b"ICT2".to_vec();
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.client.to_le_bytes());
        out.extend_from_slice(&e.epoch.to_le_bytes());
        out.extend_from_slice(&e.user_id.to_le_bytes());
        out.extend_from_slice(&e.watermark.to_le_bytes());
        out.extend_from_slice(&e.watermark_checksum.to_le_bytes());
        out.push(e.replies.len() as u8);
        for reply in &e.replies {
            out.extend_from_slice(&(reply.len() as u32).to_le_bytes());
            out.extend_from_slice(reply);
        }
    }
    with_trailer(out)
}

/// Decodes "ICT2". `reply_len_max` bounds each cached reply (a hostile length cannot exhaust
/// memory: lengths are checked against the bytes present).
pub fn decode_client_table(bytes: &[u8]) -> Result<Vec<ClientEntry>, ArtifactError> {
    const WHAT: &str = "CLIENT_TABLE";
    let mut r = Reader::trailed(bytes, WHAT)?;
    if r.take(4)? != b"ICT2" {
        return Err(ArtifactError::Magic(WHAT));
    }
    let count = r.u32()?;
    let mut entries = Vec::new();
    for _ in 0..count {
        let mut e = ClientEntry {
            client: r.u128()?,
            epoch: r.u64()?,
            user_id: r.u32()?,
            watermark: r.u64()?,
            watermark_checksum: r.u128()?,
            replies: Vec::new(),
        };
        for _ in 0..r.u8()? {
            let len = r.u32()? as usize;
            e.replies.push(r.take(len)?.to_vec());
        }
        entries.push(e);
    }
    r.finish()?;
    Ok(entries)
}

/// Builds a manifest over `(kind, frontier, bytes)` artifacts, in order, with their XXH3.
pub fn build_manifest(artifacts: &[(ArtifactKind, u64, &[u8])]) -> Result<Vec<u8>, ArtifactError> {
    let entries: Vec<ManifestEntry> = artifacts
        .iter()
        .map(|(kind, frontier, bytes)| ManifestEntry {
            kind: *kind,
            frontier: *frontier,
            len: bytes.len() as u64,
            checksum: manifest::artifact_checksum(bytes),
        })
        .collect();
    let mut out = Vec::new();
    manifest::encode(&entries, &mut out)?;
    Ok(out)
}

/// Checks every artifact against its manifest entry (length and XXH3, state-transfer.md §4).
pub fn verify_artifacts(
    entries: &[ManifestEntry],
    artifacts: &[Vec<u8>],
) -> Result<(), ArtifactError> {
    if entries.len() != artifacts.len() {
        return Err(ArtifactError::Shape(
            "artifact count differs from the manifest",
        ));
    }
    for (index, (entry, bytes)) in entries.iter().zip(artifacts).enumerate() {
        if entry.len != bytes.len() as u64 || entry.checksum != manifest::artifact_checksum(bytes) {
            return Err(ArtifactError::Checksum { index });
        }
    }
    Ok(())
}

const OFFSETS_MAGIC: u32 = u32::from_le_bytes(*b"OFS1");
const SNAPSHOT_MAGIC: u32 = u32::from_le_bytes(*b"SSN1");

/// A partition's consumer offsets, replaced atomically (ping-pong), synced when the topic
/// enforces fsync (journal.md §5).
#[derive(Debug)]
pub struct OffsetStore<S: Storage> {
    store: PingPong<S>,
}

impl<S: Storage> OffsetStore<S> {
    /// Opens `{prefix}offsets.{0,1}`: the newest intact table (empty if none) and whether a
    /// copy was damaged (then the value may be the older one, which the spec allows).
    pub async fn open(
        storage: S,
        prefix: &str,
    ) -> Result<(OffsetStore<S>, OffsetTable, bool), ArtifactError> {
        let (store, payload, reads) =
            PingPong::open(storage, &format!("{prefix}offsets"), OFFSETS_MAGIC).await?;
        let table = match payload {
            Some(bytes) => OffsetTable::decode(&bytes)?,
            None => OffsetTable::default(),
        };
        Ok((
            OffsetStore { store },
            table,
            reads.contains(&CopyRead::Damaged),
        ))
    }

    /// Writes the whole table atomically.
    pub async fn write(&mut self, table: &OffsetTable, fsync: bool) -> Result<(), ArtifactError> {
        Ok(self.store.write(&table.encode(), fsync).await?)
    }
}

/// The metadata snapshot file pair: the payload of the latest checkpoint.
#[derive(Debug)]
pub struct SnapshotStore<S: Storage> {
    store: PingPong<S>,
}

/// A metadata snapshot as stored: its op and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The checkpoint op (sequence number).
    pub op: u64,
    /// The payload (the METADATA_SNAPSHOT artifact bytes).
    pub payload: Vec<u8>,
}

impl Snapshot {
    /// The superblock's `checkpoint_checksum` for this payload.
    pub fn checksum(&self) -> u128 {
        widen(xxh3(&self.payload))
    }
}

impl<S: Storage> SnapshotStore<S> {
    /// Opens `snapshot.{0,1}` and returns the newest intact snapshot. Boot pairs it with the
    /// superblock's checkpoint (journal.md §3.5 step 3): the caller refuses if the superblock
    /// names a newer op or another checksum.
    pub async fn open(storage: S) -> Result<(SnapshotStore<S>, Option<Snapshot>), ArtifactError> {
        let (store, payload, _) = PingPong::open(storage, "snapshot", SNAPSHOT_MAGIC).await?;
        let snapshot = match payload {
            Some(bytes) if bytes.len() >= 8 => Some(Snapshot {
                op: u64::from_le_bytes(bytes[..8].try_into().expect("8")),
                payload: bytes[8..].to_vec(),
            }),
            Some(_) => return Err(ArtifactError::Truncated("METADATA_SNAPSHOT")),
            None => None,
        };
        Ok((SnapshotStore { store }, snapshot))
    }

    /// Writes a snapshot durably (F4); the superblock pairing write comes after.
    pub async fn write(&mut self, snapshot: &Snapshot) -> Result<(), ArtifactError> {
        let mut bytes = snapshot.op.to_le_bytes().to_vec();
        bytes.extend_from_slice(&snapshot.payload);
        Ok(self.store.write(&bytes, true).await?)
    }
}

/// A partition offer: the manifest and its artifacts (segments ascending, then offsets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offer {
    /// The encoded manifest (StateTransferTarget body).
    pub manifest: Vec<u8>,
    /// The artifacts, in manifest order.
    pub artifacts: Vec<Vec<u8>>,
}

/// Builds a partition offer: forces a flush and sync of the segments, then one SEGMENT_LOG per
/// segment and one CONSUMER_OFFSETS last (frontier = `commit_op`).
pub async fn partition_offer<S: Storage>(
    log: &mut PartitionLog<S>,
    offsets: &OffsetTable,
    commit_op: u64,
) -> Result<Offer, ArtifactError> {
    log.sync().await?;
    let mut artifacts = Vec::new();
    let mut kinds = Vec::new();
    for base in log.segment_bases() {
        let bytes = log.segment_bytes(base).await?.unwrap_or_default();
        if bytes.is_empty() {
            continue;
        }
        kinds.push((ArtifactKind::SEGMENT_LOG, base));
        artifacts.push(bytes);
    }
    let mut table = offsets.clone();
    table.next_offset = log.next_offset();
    kinds.push((ArtifactKind::CONSUMER_OFFSETS, commit_op));
    artifacts.push(table.encode());
    let listed: Vec<(ArtifactKind, u64, &[u8])> = kinds
        .iter()
        .zip(&artifacts)
        .map(|((k, f), b)| (*k, *f, b.as_slice()))
        .collect();
    Ok(Offer {
        manifest: build_manifest(&listed)?,
        artifacts,
    })
}

/// The staging file of an incoming segment (swept by [`PartitionLog::open`]).
pub fn staging_name(prefix: &str, base: u64) -> String {
    format!("staging-{}", crate::segment::log_name(prefix, base))
}

/// Installs a partition offer into `prefix` (two-phase: everything is validated first — the
/// manifest, every artifact's length and XXH3, every batch, contiguous segments, the offsets
/// table — then staged, then swapped in). Returns the new log, its recovery and the offsets.
/// A crash during the swap leaves staging files that boot sweeps; the group then transfers
/// again (its superblock still names the old frontier).
pub async fn install_partition<S: Storage + Clone>(
    storage: S,
    prefix: &str,
    policy: FlushPolicy,
    manifest_bytes: &[u8],
    artifacts: &[Vec<u8>],
) -> Result<(PartitionLog<S>, SegmentRecovery, OffsetTable), ArtifactError> {
    let entries = manifest::decode(manifest_bytes)?.to_vec();
    verify_artifacts(&entries, artifacts)?;
    let (last, segments) = entries
        .split_last()
        .ok_or(ArtifactError::Shape("empty offer"))?;
    if last.kind != ArtifactKind::CONSUMER_OFFSETS
        || segments.iter().any(|e| e.kind != ArtifactKind::SEGMENT_LOG)
    {
        return Err(ArtifactError::Shape("segments then one CONSUMER_OFFSETS"));
    }
    let table = OffsetTable::decode(&artifacts[entries.len() - 1])?;
    let mut expected = segments.first().map(|e| e.frontier);
    for (entry, bytes) in segments.iter().zip(artifacts) {
        if Some(entry.frontier) != expected {
            return Err(ArtifactError::Shape("segments are not contiguous"));
        }
        let mut at = 0;
        let mut next = entry.frontier;
        while at < bytes.len() {
            let info = batch::verify(&bytes[at..]).map_err(|fault| SegmentError::Corrupt {
                base: entry.frontier,
                position: at as u64,
                fault,
            })?;
            if info.base_offset != next {
                return Err(ArtifactError::Shape("batch offsets are not contiguous"));
            }
            next = info.end_offset();
            at += info.len as usize;
        }
        expected = Some(next);
    }
    if expected.is_some_and(|end| end > table.next_offset) {
        return Err(ArtifactError::Shape("offsets table behind the segments"));
    }
    // Stage, then swap: remove the old segments, write the new ones through a fresh log.
    for (entry, bytes) in segments.iter().zip(artifacts) {
        let name = staging_name(prefix, entry.frontier);
        let file = storage
            .open(&name, crate::storage::OpenMode::Create)
            .await?;
        let mut buf = crate::file::AlignedBuf::zeroed(
            crate::storage::sector_ceil(bytes.len() as u64) as usize,
        );
        buf.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        storage.write_at(&file, 0, buf.as_slice()).await?;
        storage.sync(&file).await?;
    }
    for name in storage.list().await? {
        let ours = name
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.ends_with(".log") || rest.ends_with(".index"));
        if ours {
            storage.remove(&name).await?;
        }
    }
    let first = segments.first().map_or(table.next_offset, |e| e.frontier);
    let (mut log, _) =
        PartitionLog::open_inner(storage.clone(), prefix, policy, first, false).await?;
    for (entry, bytes) in segments.iter().zip(artifacts) {
        let mut at = 0;
        while at < bytes.len() {
            let info = batch::peek(&bytes[at..]).expect("verified above");
            log.commit_batch(bytes[at..at + info.len as usize].to_vec())?;
            at += info.len as usize;
        }
        log.sync().await?;
        storage
            .remove(&staging_name(prefix, entry.frontier))
            .await?;
    }
    drop(log);
    let (log, recovery) = PartitionLog::open(storage, prefix, policy, table.next_offset).await?;
    Ok((log, recovery, table))
}

#[cfg(test)]
mod tests;
