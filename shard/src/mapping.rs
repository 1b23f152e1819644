//! Which lane and which shard a group belongs to (spec README decision 2, architecture.md §2).
//!
//! `lane(group) = murmur3_32(group as 8 little-endian bytes, seed 0) mod L` and
//! `shard = lane(group) mod shards`, except that the metadata group always lives on shard 0 and
//! travels on lane 0, which is shard 0's on every node whatever its shard count, so metadata
//! frames never hop shards either (docs/decisions.md 101).
//! One rule places connections (the dialer's lane at hello byte 224) and groups, so a lane's
//! frames never hop shards. Pure functions: every node computes the same lane for a group, and
//! the shard only from its own shard count.

use wire::GroupId;

/// `cluster.replica_lanes` default: connections per peer pair.
pub const REPLICA_LANES_DEFAULT: u16 = 16;
/// The lane index travels as one byte in the hello, so at most 256 lanes.
pub const REPLICA_LANES_MAX: u16 = 256;
/// The shard that owns the metadata group.
pub const METADATA_SHARD: u16 = 0;

/// MurmurHash3 x86_32 of `data` with `seed`.
pub fn murmur3_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let scramble = |k: u32| k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        h ^= scramble(k);
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut k = 0u32;
        for (i, &byte) in tail.iter().enumerate() {
            k ^= u32::from(byte) << (8 * i);
        }
        h ^= scramble(k);
    }
    // The length is mixed in as a 32-bit value, as the reference function does.
    h ^= data.len() as u32;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The lane of `group` among `lanes` (`1..=256`): the lane byte a dialer writes and the
/// connection that carries the group's frames. The metadata group's lane is 0.
pub fn lane(group: GroupId, lanes: u16) -> u8 {
    assert!(
        (1..=REPLICA_LANES_MAX).contains(&lanes),
        "lanes {lanes} outside 1..=256"
    );
    if group.is_metadata() {
        return 0;
    }
    hashed_lane(group, lanes)
}

/// The spec's hash rule alone: `murmur3_32(group as 8 LE bytes, seed 0) mod lanes`.
pub fn hashed_lane(group: GroupId, lanes: u16) -> u8 {
    (murmur3_32(&group.0.to_le_bytes(), 0) % u32::from(lanes)) as u8
}

/// The shard that serves `lane` on a node with `shards` shards.
pub fn shard_of_lane(lane: u8, shards: u16) -> u16 {
    assert!(shards >= 1, "a node has at least one shard");
    u16::from(lane) % shards
}

/// The shard that owns `group`: shard 0 for the metadata group, `lane(group) mod shards` for
/// every other value (invalid group values are dropped at routing before this matters, but
/// still map somewhere deterministic).
pub fn shard_of(group: GroupId, lanes: u16, shards: u16) -> u16 {
    if group.is_metadata() {
        return METADATA_SHARD;
    }
    shard_of_lane(lane(group, lanes), shards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use wire::group::{PACKED_MAX, PartitionKey};

    /// Reference values from an independent MurmurHash3 x86_32 (the `mmh3` Python package,
    /// `mmh3.hash(data, 0, signed=False)`).
    #[test]
    fn murmur3_matches_an_independent_implementation() {
        assert_eq!(murmur3_32(b"", 0), 0);
        assert_eq!(murmur3_32(b"test", 0), 0xba6b_d213);
        assert_eq!(murmur3_32(b"Hello, world!", 0), 0xc036_3e43);
        assert_eq!(
            murmur3_32(b"The quick brown fox jumps over the lazy dog", 0),
            0x2e4f_f723
        );
        // Group keys as 8 little-endian bytes.
        let groups: [(u64, u32); 6] = [
            (0, 1_669_671_676),
            (1, 1_392_991_556),
            (1 << 63, 1_366_273_829),
            (4_503_599_627_321_919, 3_353_216_006),
            (3_607_350_633_573_772, 1_463_340_809),
            ((7 << 32) | (3 << 20) | 5, 3_300_562_909),
        ];
        for (group, hash) in groups {
            assert_eq!(murmur3_32(&group.to_le_bytes(), 0), hash, "group {group}");
        }
    }

    #[test]
    fn lanes_follow_the_hash() {
        let g = GroupId((7 << 32) | (3 << 20) | 5);
        assert_eq!(lane(g, 16), (3_300_562_909u32 % 16) as u8);
        assert_eq!(lane(g, 1), 0);
        assert_eq!(lane(g, 256), (3_300_562_909u32 % 256) as u8);
        assert_eq!(shard_of(g, 16, 3), u16::from(lane(g, 16)) % 3);
    }

    #[test]
    fn metadata_lives_on_shard_zero_and_lane_zero() {
        // Its hash would put it on lane 5 of 16, which is shard 5 mod N; lane 0 is shard 0's.
        assert_eq!(
            hashed_lane(GroupId::METADATA, 16),
            (1_366_273_829u32 % 16) as u8
        );
        assert_eq!(hashed_lane(GroupId::METADATA, 16), 5);
        for lanes in 1..=256 {
            assert_eq!(lane(GroupId::METADATA, lanes), 0);
            for shards in 1..=64 {
                assert_eq!(shard_of(GroupId::METADATA, lanes, shards), 0);
                assert_eq!(shard_of_lane(lane(GroupId::METADATA, lanes), shards), 0);
            }
        }
    }

    fn partition_group() -> impl Strategy<Value = GroupId> {
        (
            0u32..=wire::group::STREAM_MAX,
            0u32..=wire::group::TOPIC_MAX,
            0u32..=999_999,
        )
            .prop_map(|(stream, topic, partition)| {
                GroupId::partition(PartitionKey {
                    stream,
                    topic,
                    partition,
                })
                .unwrap()
            })
    }

    proptest! {
        /// The shard is the lane's shard, in range, and a function of the key alone.
        #[test]
        fn shard_is_lane_mod_shards(g in partition_group(), lanes in 1u16..=256, shards in 1u16..=64) {
            let s = shard_of(g, lanes, shards);
            prop_assert!(s < shards);
            prop_assert_eq!(s, u16::from(lane(g, lanes)) % shards);
            prop_assert_eq!(lane(g, lanes), hashed_lane(g, lanes));
            prop_assert_eq!(s, shard_of(GroupId(g.0), lanes, shards));
            prop_assert!(u16::from(lane(g, lanes)) < lanes);
        }

        /// With as many lanes as shards or a multiple of them, every shard hosts lanes; with one
        /// shard everything is on shard 0.
        #[test]
        fn one_shard_owns_everything(g in 0u64..=PACKED_MAX, lanes in 1u16..=256) {
            prop_assert_eq!(shard_of(GroupId(g), lanes, 1), 0);
        }

        /// Lanes spread groups: over 4096 random partition groups no lane of 16 is empty or
        /// holds more than twice its share.
        #[test]
        fn lanes_spread_groups(seed in any::<u64>()) {
            let mut counts = [0u32; 16];
            let mut x = seed | 1;
            for _ in 0..4096 {
                // xorshift64 over packed keys
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                counts[usize::from(lane(GroupId(x & PACKED_MAX), 16))] += 1;
            }
            for (i, &c) in counts.iter().enumerate() {
                prop_assert!((128..=512).contains(&c), "lane {i} holds {c} of 4096");
            }
        }
    }
}
