//! Group -> lane -> shard (spec README, decision 2).
//!
//! A lane is one of the `cluster.replica_lanes` connections between two nodes. Both ends compute
//! the lane of a group with the same hash, and each node places lane `l` on shard `l mod shards`,
//! so a partition group's frames are read, processed and written on the core that runs its
//! consensus. The metadata group always rides lane 0 (decision 110): lane 0 lands on shard 0 for
//! every shard count, and shard 0 owns the metadata group.

use wire::GroupId;

/// Default `cluster.replica_lanes`.
pub const LANES_DEFAULT: u16 = 16;

/// Most lanes a hello can name: the lane index is one byte (hello byte 224).
pub const LANES_MAX: u16 = 256;

/// MurmurHash3 x86_32 of `data` with `seed`: the hash decision 2 names.
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mix = |k: u32| k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let k = u32::from_le_bytes(block.try_into().expect("chunks of 4"));
        h ^= mix(k);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let k = tail
            .iter()
            .rev()
            .fold(0u32, |k, &byte| (k << 8) | u32::from(byte));
        h ^= mix(k);
    }
    // The length enters modulo 2^32, as in the reference algorithm.
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The lane of `group` among `lanes` (1..=[`LANES_MAX`]): `murmur3_32(group as 8 LE bytes, 0)
/// mod lanes` for partition groups, 0 for the metadata group (decision 110).
///
/// # Panics
/// When `lanes` is 0 or above [`LANES_MAX`]: configuration validation refuses both.
pub fn lane_of(group: GroupId, lanes: u16) -> u8 {
    assert!(
        (1..=LANES_MAX).contains(&lanes),
        "replica_lanes {lanes} outside 1..={LANES_MAX}"
    );
    if group == GroupId::METADATA {
        return 0;
    }
    let lane = murmur3_32(&group.0.to_le_bytes(), 0) % u32::from(lanes);
    u8::try_from(lane).expect("lane < lanes <= 256")
}

/// The shard that owns `lane` on a node with `shards` shards.
///
/// # Panics
/// When `shards` is 0.
pub fn shard_of_lane(lane: u8, shards: usize) -> usize {
    assert!(shards > 0, "a node has at least one shard");
    usize::from(lane) % shards
}

/// The shard that owns `group` on a node with `shards` shards and `lanes` lanes.
pub fn shard_of(group: GroupId, lanes: u16, shards: usize) -> usize {
    shard_of_lane(lane_of(group, lanes), shards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn murmur3_matches_published_values() {
        // Values of the reference algorithm (also what Python's mmh3 prints, unsigned).
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_32(b"test", 0), 0xba6b_d213);
        assert_eq!(murmur3_32(b"Hello, world!", 0), 0xc036_3e43);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog", 0),
            0x2e4f_f723
        );
    }

    #[test]
    fn group_keys_hash_as_eight_le_bytes() {
        // Computed with mmh3.hash(struct.pack('<Q', g), 0, signed=False).
        let cases: [(u64, u32); 4] = [
            (0, 0x6385_2afc),
            (1, 0x5307_5d44),
            ((3 << 32) | (2 << 20) | 7, 0x137d_dd5c),
            ((1 << 52) - 1, 0xd08b_2f82),
        ];
        for (group, hash) in cases {
            assert_eq!(
                murmur3_32(&group.to_le_bytes(), 0),
                hash,
                "group {group:#x}"
            );
            assert_eq!(u32::from(lane_of(GroupId(group), 16)), hash % 16);
        }
        // Hashed, the metadata group would ride lane 5 of 16 and land off shard 0.
        assert_eq!(murmur3_32(&(1u64 << 63).to_le_bytes(), 0) % 16, 5);
        assert_eq!(lane_of(GroupId::METADATA, 16), 0);
    }

    proptest! {
        #[test]
        fn lanes_and_shards_stay_in_range(group in any::<u64>(), lanes in 1..=LANES_MAX, shards in 1usize..64) {
            let lane = lane_of(GroupId(group), lanes);
            prop_assert!(u16::from(lane) < lanes);
            let shard = shard_of(GroupId(group), lanes, shards);
            prop_assert!(shard < shards);
            prop_assert_eq!(shard, usize::from(lane) % shards);
            // Pure: the same inputs always give the same placement.
            prop_assert_eq!(lane, lane_of(GroupId(group), lanes));
        }

        #[test]
        fn metadata_always_lands_on_shard_zero(lanes in 1..=LANES_MAX, shards in 1usize..64) {
            prop_assert_eq!(shard_of(GroupId::METADATA, lanes, shards), 0);
        }
    }
}
