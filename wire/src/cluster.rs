//! Cluster id (wire.md §8).

/// The cluster id of a cluster name: the first 16 bytes of `BLAKE3(name)`, read little-endian,
/// so that header bytes 32..48 are those digest bytes in digest order.
pub fn cluster_id(name: &str) -> u128 {
    let digest = blake3::hash(name.as_bytes());
    u128::from_le_bytes(digest.as_bytes()[..16].try_into().expect("16 of 32 bytes"))
}
