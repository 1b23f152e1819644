//! `manifests.json`: the state-transfer manifest codec (state-transfer.md §2) and artifact
//! checksums.

use serde_json::Value;
use wire::manifest::{self, ArtifactKind, ManifestEntry, ManifestError};

use crate::common::{self, arr, hex, name, string, uint};

pub fn check(v: &Value) {
    common::expect_sections(v, &["valid", "invalid", "artifacts"]);
    let artifacts: Vec<ManifestEntry> = arr(v, "artifacts").iter().map(check_artifact).collect();
    for case in arr(v, "valid") {
        check_valid(case, &artifacts);
    }
    for case in arr(v, "invalid") {
        check_invalid(case);
    }
}

fn u8_of(v: &Value, key: &str) -> u8 {
    u8::try_from(uint(v, key)).unwrap_or_else(|_| panic!("{key:?} does not fit a u8"))
}

fn u64_of(v: &Value, key: &str) -> u64 {
    u64::try_from(uint(v, key)).unwrap_or_else(|_| panic!("{key:?} does not fit a u64"))
}

fn entry_of(v: &Value) -> ManifestEntry {
    ManifestEntry {
        kind: ArtifactKind(u8_of(v, "kind")),
        frontier: u64_of(v, "frontier"),
        len: u64_of(v, "len"),
        checksum: u64_of(v, "checksum"),
    }
}

/// An artifact's `len` and `checksum` are those of its bytes; returned as the entry fields a
/// manifest describing it must carry (frontier unused).
fn check_artifact(v: &Value) -> ManifestEntry {
    let bytes = hex(v, "bytes_hex");
    let kind = ArtifactKind(u8_of(v, "kind"));
    assert_eq!(u64_of(v, "len"), bytes.len() as u64, "artifact {kind}: len");
    assert_eq!(
        u64_of(v, "checksum"),
        manifest::artifact_checksum(&bytes),
        "artifact {kind}: checksum"
    );
    ManifestEntry {
        kind,
        frontier: 0,
        len: u64_of(v, "len"),
        checksum: u64_of(v, "checksum"),
    }
}

fn check_valid(case: &Value, artifacts: &[ManifestEntry]) {
    let name = name(case);
    let bytes = hex(case, "encoded_hex");
    let expected: Vec<ManifestEntry> = arr(case, "entries").iter().map(entry_of).collect();
    let decoded = manifest::decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(decoded.to_vec(), expected, "{name}: entries");
    assert_eq!(decoded.len() as u128, uint(case, "count"), "{name}: count");
    let entry_len = u8_of(case, "entry_len");
    assert_eq!(decoded.entry_len(), entry_len, "{name}: entry_len");
    if entry_len == manifest::ENTRY_LEN {
        let mut encoded = Vec::new();
        manifest::encode(&expected, &mut encoded).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(encoded, bytes, "{name}: encoding");
    }
    // README: the entries of known kinds describe the artifacts of the same set.
    for entry in expected.iter().filter(|e| e.kind.is_known()) {
        assert!(
            artifacts
                .iter()
                .any(|a| (a.kind, a.len, a.checksum) == (entry.kind, entry.len, entry.checksum)),
            "{name}: no artifact of {} with len {} and checksum {}",
            entry.kind,
            entry.len,
            entry.checksum
        );
    }
}

/// The vector's error name, matched against the variant alone (fields are ours).
fn error_matches(error: &ManifestError, expected: &str) -> bool {
    let known = [
        "Truncated",
        "ChecksumMismatch",
        "BadMagic",
        "TooManyEntries",
        "EntryTooShort",
    ];
    assert!(
        known.contains(&expected),
        "unknown manifest error {expected:?}"
    );
    let actual = match error {
        ManifestError::Truncated => "Truncated",
        ManifestError::ChecksumMismatch { .. } => "ChecksumMismatch",
        ManifestError::BadMagic => "BadMagic",
        ManifestError::TooManyEntries { .. } => "TooManyEntries",
        ManifestError::EntryTooShort { .. } => "EntryTooShort",
    };
    actual == expected
}

fn check_invalid(case: &Value) {
    let name = name(case);
    let bytes = hex(case, "encoded_hex");
    let expected = string(case, "error");
    match manifest::decode(&bytes) {
        Ok(m) => panic!("{name}: decoded {:?}, expected {expected}", m.to_vec()),
        Err(error) => assert!(
            error_matches(&error, expected),
            "{name}: got {error:?}, expected {expected}"
        ),
    }
}
