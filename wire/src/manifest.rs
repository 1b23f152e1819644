//! The state-transfer manifest codec (state-transfer.md §2) and the chunk arithmetic both ends
//! of a transfer must agree on (§4).
//!
//! The manifest is the body of a StateTransferTarget offer: `ISM1`, `count: u32`,
//! `entry_len: u8`, `count` entries, and an XXH3 trailer over everything before it. Decoding is
//! zero-copy: [`decode`] validates once and returns a [`Manifest`] view over the input.

use core::fmt;

use crate::HEADER_SIZE;
use crate::integrity::xxh3;

/// Magic at offset 0: `ISM1`.
pub const MAGIC: [u8; 4] = *b"ISM1";

/// Bytes per entry this version writes; a decoder reads these and skips any longer tail.
pub const ENTRY_LEN: u8 = 25;

/// Largest `count` an offer may carry (inclusive); a larger one is a sender bug.
pub const COUNT_MAX: u32 = 65_536;

/// Length of the XXH3 trailer.
pub const TRAILER_LEN: usize = 8;

/// Magic, `count` and `entry_len`: the bytes before the first entry.
const PREFIX_LEN: usize = 9;

/// Upper bound of a chunk, whatever the frame limit (256 KiB).
pub const CHUNK_LEN_CAP: u32 = 262_144;

/// What an artifact holds (state-transfer.md §3). A newtype rather than an enum so that unknown
/// values survive decoding: the receiving plane, not the codec, decides whether it can use them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArtifactKind(pub u8);

impl ArtifactKind {
    /// The metadata snapshot payload; `frontier` is its sequence number.
    pub const METADATA_SNAPSHOT: ArtifactKind = ArtifactKind(0);
    /// The encoded client table; `frontier` is the offer's `commit_op`.
    pub const CLIENT_TABLE: ArtifactKind = ArtifactKind(1);
    /// One retained segment's `.log`; `frontier` is its base offset.
    pub const SEGMENT_LOG: ArtifactKind = ArtifactKind(2);
    /// The consumer offsets table; `frontier` is the offer's `commit_op`.
    pub const CONSUMER_OFFSETS: ArtifactKind = ArtifactKind(3);

    /// Whether this build names the kind; values are pinned, new kinds are appended.
    pub const fn is_known(self) -> bool {
        self.0 <= Self::CONSUMER_OFFSETS.0
    }

    /// The spec's name of a known kind, for logs and tools.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "METADATA_SNAPSHOT",
            1 => "CLIENT_TABLE",
            2 => "SEGMENT_LOG",
            3 => "CONSUMER_OFFSETS",
            _ => return None,
        })
    }
}

impl fmt::Display for ArtifactKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "kind {}", self.0),
        }
    }
}

/// One artifact of an offer: what it is, its watermark, and how the requester verifies it
/// (exactly `len` bytes whose XXH3 is `checksum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ManifestEntry {
    /// What the artifact holds.
    pub kind: ArtifactKind,
    /// Kind-specific watermark (§3).
    pub frontier: u64,
    /// Artifact length in bytes.
    pub len: u64,
    /// `XXH3(artifact bytes)`, see [`artifact_checksum`].
    pub checksum: u64,
}

impl ManifestEntry {
    /// Reads the first 25 bytes of an entry; the caller has checked the length.
    fn read(bytes: &[u8; ENTRY_LEN as usize]) -> ManifestEntry {
        let u64_at = |at: usize| {
            let mut field = [0u8; 8];
            field.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(field)
        };
        ManifestEntry {
            kind: ArtifactKind(bytes[0]),
            frontier: u64_at(1),
            len: u64_at(9),
            checksum: u64_at(17),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.push(self.kind.0);
        out.extend_from_slice(&self.frontier.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.checksum.to_le_bytes());
    }
}

/// Why a manifest was refused. Decoding reports the first failure in the order of §2
/// "Decoding"; a requester ignores the StateTransferTarget that carried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    /// The input ends before a field, an entry or the trailer, or has bytes after the entries.
    #[error("manifest truncated or with trailing bytes")]
    Truncated,
    /// The trailer does not match the content; checked before any field is read.
    #[error("manifest trailer {expected:#018x} does not match content hash {actual:#018x}")]
    ChecksumMismatch {
        /// The trailer carried by the input.
        expected: u64,
        /// XXH3 of the content.
        actual: u64,
    },
    /// The content does not start with `ISM1`.
    #[error("manifest magic is not ISM1")]
    BadMagic,
    /// `count` above [`COUNT_MAX`]: refused on decode before any entry is read, and refused on
    /// encode because the receiver would refuse it.
    #[error("manifest has {count} entries, more than 65536")]
    TooManyEntries {
        /// The offending count.
        count: u64,
    },
    /// `entry_len` below the 25 bytes every entry needs.
    #[error("manifest entry_len {entry_len} is below 25")]
    EntryTooShort {
        /// The offending `entry_len`.
        entry_len: u8,
    },
}

/// The length of an encoded manifest of `count` entries: `17 + 25 × count`, so a frame builder
/// can size the body before encoding.
pub const fn encoded_len(count: usize) -> usize {
    PREFIX_LEN + count * ENTRY_LEN as usize + TRAILER_LEN
}

/// Appends the manifest of `entries` to `out` (entry_len 25, trailer last over the manifest's
/// own bytes). Refuses more than [`COUNT_MAX`] entries without writing anything.
pub fn encode(entries: &[ManifestEntry], out: &mut Vec<u8>) -> Result<(), ManifestError> {
    let count = u32::try_from(entries.len())
        .ok()
        .filter(|&count| count <= COUNT_MAX)
        .ok_or(ManifestError::TooManyEntries {
            count: entries.len() as u64,
        })?;
    let start = out.len();
    out.reserve(encoded_len(entries.len()));
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&count.to_le_bytes());
    out.push(ENTRY_LEN);
    for entry in entries {
        entry.write(out);
    }
    let trailer = xxh3(&out[start..]);
    out.extend_from_slice(&trailer.to_le_bytes());
    Ok(())
}

/// A validated manifest borrowed from the frame body: entries are read on access, so decoding
/// allocates nothing whatever `count` a peer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest<'a> {
    entries: &'a [u8],
    entry_len: u8,
}

impl<'a> Manifest<'a> {
    /// Number of entries; a chunk's `artifact` field indexes them.
    pub fn len(&self) -> usize {
        self.entries.len() / usize::from(self.entry_len)
    }

    /// Whether the offer has no artifacts.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `entry_len` as carried; only 25 is what this version re-encodes byte for byte.
    pub fn entry_len(&self) -> u8 {
        self.entry_len
    }

    /// The entry at manifest index `index` (a chunk's `artifact`), `None` past the end.
    pub fn get(&self, index: usize) -> Option<ManifestEntry> {
        let stride = usize::from(self.entry_len);
        let start = index.checked_mul(stride)?;
        let entry = self.entries.get(start..)?.first_chunk()?;
        Some(ManifestEntry::read(entry))
    }

    /// The entries in artifact order.
    pub fn iter(&self) -> Entries<'a> {
        Entries(self.entries.chunks_exact(usize::from(self.entry_len)))
    }

    /// The entries, owned.
    pub fn to_vec(&self) -> Vec<ManifestEntry> {
        self.iter().collect()
    }
}

impl<'a> IntoIterator for Manifest<'a> {
    type Item = ManifestEntry;
    type IntoIter = Entries<'a>;

    fn into_iter(self) -> Entries<'a> {
        self.iter()
    }
}

/// Iterator over a [`Manifest`]'s entries, reading each on demand (no allocation).
#[derive(Debug, Clone)]
pub struct Entries<'a>(core::slice::ChunksExact<'a, u8>);

impl Iterator for Entries<'_> {
    type Item = ManifestEntry;

    fn next(&mut self) -> Option<ManifestEntry> {
        // Every chunk holds `entry_len >= 25` bytes (checked by `decode`), so none is skipped.
        self.0
            .find_map(|entry| entry.first_chunk().map(ManifestEntry::read))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

impl DoubleEndedIterator for Entries<'_> {
    fn next_back(&mut self) -> Option<ManifestEntry> {
        self.0
            .by_ref()
            .rev()
            .find_map(|entry| entry.first_chunk().map(ManifestEntry::read))
    }
}

impl ExactSizeIterator for Entries<'_> {}

/// Decodes and validates a manifest in the check order of §2 "Decoding" (first failure wins):
/// trailer length, trailer, magic, count, entry_len, entries, no leftover. Unknown kinds decode.
pub fn decode(bytes: &[u8]) -> Result<Manifest<'_>, ManifestError> {
    let split = bytes
        .len()
        .checked_sub(TRAILER_LEN)
        .ok_or(ManifestError::Truncated)?;
    let (content, trailer) = bytes.split_at(split);
    let expected = u64::from_le_bytes(trailer.try_into().map_err(|_| ManifestError::Truncated)?);
    let actual = xxh3(content);
    if expected != actual {
        return Err(ManifestError::ChecksumMismatch { expected, actual });
    }
    let (magic, rest) = content
        .split_first_chunk::<4>()
        .ok_or(ManifestError::Truncated)?;
    if *magic != MAGIC {
        return Err(ManifestError::BadMagic);
    }
    let (count, rest) = rest
        .split_first_chunk::<4>()
        .ok_or(ManifestError::Truncated)?;
    let count = u32::from_le_bytes(*count);
    if count > COUNT_MAX {
        return Err(ManifestError::TooManyEntries {
            count: u64::from(count),
        });
    }
    let (&entry_len, entries) = rest.split_first().ok_or(ManifestError::Truncated)?;
    if entry_len < ENTRY_LEN {
        return Err(ManifestError::EntryTooShort { entry_len });
    }
    // 65 536 × 255 fits in 32 bits, but a hostile count must never wrap on any target.
    let entries_len = usize::try_from(count)
        .ok()
        .and_then(|count| count.checked_mul(usize::from(entry_len)))
        .ok_or(ManifestError::Truncated)?;
    if entries.len() != entries_len {
        // Fewer bytes: missing entries (step 6). More: leftover content (step 7).
        return Err(ManifestError::Truncated);
    }
    Ok(Manifest { entries, entry_len })
}

/// The checksum a manifest entry carries for an artifact: plain XXH3-64, not widened. The
/// requester compares it with the entry once the artifact is complete (§4 "Completion").
pub fn artifact_checksum(bytes: &[u8]) -> u64 {
    xxh3(bytes)
}

/// The largest chunk either side requests or serves: `clamp(max_message_size − 256, 1,
/// 262 144)`, so a full chunk plus its header always fits one frame.
pub fn chunk_len_max(max_message_size: usize) -> u32 {
    let body_max = max_message_size.saturating_sub(HEADER_SIZE);
    u32::try_from(body_max).map_or(CHUNK_LEN_CAP, |body_max| body_max.clamp(1, CHUNK_LEN_CAP))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MAX_MESSAGE_SIZE_DEFAULT;

    fn entry(kind: u8, n: u64) -> ManifestEntry {
        ManifestEntry {
            kind: ArtifactKind(kind),
            frontier: n,
            len: n * 3,
            checksum: n ^ u64::MAX,
        }
    }

    fn encoded(entries: &[ManifestEntry]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(entries, &mut out).expect("encodes");
        out
    }

    /// Builds raw manifest bytes with a correct trailer, for inputs an encoder would refuse.
    fn sealed(content: &[u8]) -> Vec<u8> {
        let mut bytes = content.to_vec();
        bytes.extend_from_slice(&xxh3(content).to_le_bytes());
        bytes
    }

    fn prefix(count: u32, entry_len: u8) -> Vec<u8> {
        let mut content = MAGIC.to_vec();
        content.extend_from_slice(&count.to_le_bytes());
        content.push(entry_len);
        content
    }

    #[test]
    fn round_trip_keeps_order_and_unknown_kinds() {
        let entries = [entry(0, 1), entry(1, 2), entry(200, 3)];
        let bytes = encoded(&entries);
        assert_eq!(bytes.len(), encoded_len(entries.len()));
        let manifest = decode(&bytes).expect("decodes");
        assert_eq!(manifest.to_vec(), entries);
        assert_eq!(manifest.get(2), Some(entries[2]));
        assert_eq!(manifest.get(3), None);
        assert_eq!(manifest.get(usize::MAX), None);
        assert!(!ArtifactKind(200).is_known());
    }

    #[test]
    fn empty_manifest_is_17_bytes() {
        let bytes = encoded(&[]);
        assert_eq!(bytes.len(), 17);
        assert!(decode(&bytes).expect("decodes").is_empty());
    }

    #[test]
    fn encode_appends_and_seals_only_its_own_bytes() {
        let mut out = b"prefix".to_vec();
        encode(&[entry(2, 9)], &mut out).expect("encodes");
        assert_eq!(decode(&out[6..]).expect("decodes").to_vec(), [entry(2, 9)]);
    }

    #[test]
    fn encoder_refuses_more_than_count_max() {
        let entries = vec![entry(2, 0); COUNT_MAX as usize + 1];
        let mut out = Vec::new();
        assert_eq!(
            encode(&entries, &mut out),
            Err(ManifestError::TooManyEntries {
                count: u64::from(COUNT_MAX) + 1
            })
        );
        assert!(out.is_empty());
        encode(&entries[1..], &mut out).expect("65 536 entries pass");
    }

    #[test]
    fn checksum_is_checked_before_anything_else() {
        let mut bytes = prefix(u32::MAX, 0);
        bytes.extend_from_slice(&[0; 8]);
        assert!(matches!(
            decode(&bytes),
            Err(ManifestError::ChecksumMismatch { .. })
        ));
        assert_eq!(decode(&[0; 7]), Err(ManifestError::Truncated));
    }

    #[test]
    fn steps_fail_in_spec_order() {
        use ManifestError::*;
        let cases: [(Vec<u8>, ManifestError); 9] = [
            (sealed(b""), Truncated),
            (sealed(b"ISM"), Truncated),
            (sealed(b"ISM2\0\0\0\0\x19"), BadMagic),
            (sealed(b"ISM1\0\0"), Truncated),
            (
                sealed(&prefix(COUNT_MAX + 1, 0)),
                TooManyEntries {
                    count: u64::from(COUNT_MAX) + 1,
                },
            ),
            (sealed(&prefix(0, 0)[..8]), Truncated),
            (sealed(&prefix(0, 24)), EntryTooShort { entry_len: 24 }),
            (sealed(&prefix(COUNT_MAX, 255)), Truncated),
            (sealed(&[prefix(0, 25), vec![0]].concat()), Truncated),
        ];
        for (bytes, error) in cases {
            assert_eq!(decode(&bytes), Err(error), "{bytes:02x?}");
        }
    }

    #[test]
    fn longer_entries_skip_their_tail() {
        let mut content = prefix(2, 30);
        for n in [5, 6] {
            let mut one = Vec::new();
            entry(3, n).write(&mut one);
            content.extend_from_slice(&one);
            content.extend_from_slice(&[0xab; 5]);
        }
        let bytes = sealed(&content);
        let manifest = decode(&bytes).expect("decodes");
        assert_eq!(manifest.entry_len(), 30);
        assert_eq!(manifest.to_vec(), [entry(3, 5), entry(3, 6)]);
        assert_eq!(manifest.iter().len(), 2);
        assert_eq!(manifest.get(1), Some(entry(3, 6)));
    }

    #[test]
    fn chunk_len_max_clamps() {
        assert_eq!(chunk_len_max(MAX_MESSAGE_SIZE_DEFAULT), CHUNK_LEN_CAP);
        assert_eq!(chunk_len_max(HEADER_SIZE + 1000), 1000);
        assert_eq!(chunk_len_max(HEADER_SIZE), 1);
        assert_eq!(chunk_len_max(0), 1);
        assert_eq!(chunk_len_max(usize::MAX), CHUNK_LEN_CAP);
    }

    #[test]
    fn artifact_checksum_is_plain_xxh3() {
        assert_eq!(artifact_checksum(b""), 0x2d06800538d394c2);
    }
}
