//! Frame seal, prepare identity and body digests (wire.md §7).

use crate::{Command, HEADER_SIZE};

/// XXH3-64 with seed 0 and the default secret.
#[inline]
pub fn xxh3(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// A 64-bit hash widened to the 128-bit checksum fields: zero-extended.
#[inline]
pub const fn widen(hash: u64) -> u128 {
    hash as u128
}

fn checksum_field(header: &[u8; HEADER_SIZE]) -> u128 {
    u128::from_le_bytes(header[0..16].try_into().expect("16 bytes"))
}

/// The frame seal of a header: XXH3 over bytes 16..256, widened (§7.1).
#[inline]
pub fn seal_of(header: &[u8; HEADER_SIZE]) -> u128 {
    widen(xxh3(&header[16..]))
}

/// Seals a header in place. Call it last, after every other field (size, `checksum_body`) is
/// final.
#[inline]
pub fn seal(header: &mut [u8; HEADER_SIZE]) {
    let seal = seal_of(header);
    header[0..16].copy_from_slice(&seal.to_le_bytes());
}

/// Whether bytes 0..16 hold the seal of the rest. All 16 bytes are compared: a correct low half
/// with a non-zero high half is a mismatch, and so is a zero checksum.
#[inline]
pub fn verify_seal(header: &[u8; HEADER_SIZE]) -> bool {
    checksum_field(header) == seal_of(header)
}

/// The prepare identity (§7.2): XXH3 of the header with `checksum` and `view` zeroed and the
/// command byte set to Prepare, widened. RepairPrepare frames therefore have the identity of the
/// Prepare they repair, and a retransmit that re-stamps `view` keeps its identity.
#[inline]
pub fn prepare_identity(header: &[u8; HEADER_SIZE]) -> u128 {
    let mut canonical = *header;
    canonical[0..16].fill(0);
    canonical[52..56].fill(0);
    canonical[60] = Command::Prepare.byte();
    widen(xxh3(&canonical))
}

/// Writes the prepare identity into bytes 0..16. Call it after every other field is final.
#[inline]
pub fn set_prepare_identity(header: &mut [u8; HEADER_SIZE]) {
    let identity = prepare_identity(header);
    header[0..16].copy_from_slice(&identity.to_le_bytes());
}

/// Whether bytes 0..16 hold the prepare identity of the header. A zero checksum does not match
/// (Strand has no unsealed legacy prepares).
#[inline]
pub fn verify_prepare_identity(header: &[u8; HEADER_SIZE]) -> bool {
    let checksum = checksum_field(header);
    checksum != 0 && checksum == prepare_identity(header)
}

/// The digest of a body as carried in `checksum_body`: `XXH3(body)` widened. An empty body gives
/// `XXH3("")`, which is non-zero; the DoViewChange/StartView rule that an empty body carries 0
/// is applied by their builders, not here.
#[inline]
pub fn body_digest(body: &[u8]) -> u128 {
    widen(xxh3(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_hash_is_the_spec_constant() {
        assert_eq!(xxh3(b""), 0x2d06800538d394c2);
    }

    #[test]
    fn seal_covers_everything_after_the_checksum() {
        let mut header = [0u8; HEADER_SIZE];
        header[60] = Command::Commit.byte();
        seal(&mut header);
        assert!(verify_seal(&header));
        for offset in [16, 47, 60, 200, 255] {
            let mut flipped = header;
            flipped[offset] ^= 1;
            assert!(!verify_seal(&flipped), "offset {offset}");
        }
        let mut high = header;
        high[8] = 1;
        assert!(!verify_seal(&high));
    }

    #[test]
    fn identity_ignores_view_and_repair_command() {
        let mut header = [0u8; HEADER_SIZE];
        header[60] = Command::Prepare.byte();
        header[176] = 7;
        set_prepare_identity(&mut header);
        let mut restamped = header;
        restamped[52] = 9;
        restamped[60] = Command::RepairPrepare.byte();
        assert!(verify_prepare_identity(&restamped));
        restamped[176] = 8;
        assert!(!verify_prepare_identity(&restamped));
    }
}
