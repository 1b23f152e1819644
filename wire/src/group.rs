//! Group keys: the consensus-plane routing key (wire.md §9).

use thiserror::Error;

/// A consensus group key as carried in the `group` field of consensus headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u64);

/// Limits of the packed partition key.
pub const STREAM_MAX: u32 = (1 << 20) - 1;
/// The largest topic id a group key can name.
pub const TOPIC_MAX: u32 = (1 << 12) - 1;
/// The largest partition id a group key can name (the mask admits more; the packer does not).
pub const PARTITION_MAX: u32 = 999_999;
/// The largest packed partition key: `2^52 - 1`.
pub const PACKED_MAX: u64 = (1 << 52) - 1;
/// Where a partition group's incarnation tag sits: bits 52..62, which the reference never sets
/// (wire.md §9). Strand puts the tag of the incarnation there, so two incarnations of one key
/// never take each other's frames (decision 375).
pub const TAG_SHIFT: u32 = 52;
/// The largest incarnation tag (11 bits).
pub const TAG_MAX: u16 = (1 << 11) - 1;
const TAG_MASK: u64 = (TAG_MAX as u64) << TAG_SHIFT;

/// Why a stream/topic/partition triple cannot be packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum GroupError {
    /// `stream >= 2^20`.
    #[error("stream id {0} is not below 2^20")]
    Stream(u32),
    /// `topic >= 4096`.
    #[error("topic id {0} is not below 4096")]
    Topic(u32),
    /// `partition >= 1 000 000`.
    #[error("partition id {0} is not below 1000000")]
    Partition(u32),
}

/// The three ids a partition group key packs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartitionKey {
    /// Stream slab id.
    pub stream: u32,
    /// Topic slab id.
    pub topic: u32,
    /// Partition slab id.
    pub partition: u32,
}

/// What a group value names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupKind {
    /// The single metadata group, `1 << 63`.
    Metadata,
    /// A partition group: a packed key `<= 2^52 - 1`, with or without an incarnation tag in
    /// bits 52..62 (decision 375).
    Partition(PartitionKey),
    /// Any other value: never produced by a correct sender, dropped at routing.
    Invalid,
}

impl GroupId {
    /// The metadata plane's group.
    pub const METADATA: GroupId = GroupId(1 << 63);

    /// Packs a partition key, refusing ids beyond the maxima (not merely the masks).
    pub const fn partition(key: PartitionKey) -> Result<GroupId, GroupError> {
        if key.stream > STREAM_MAX {
            return Err(GroupError::Stream(key.stream));
        }
        if key.topic > TOPIC_MAX {
            return Err(GroupError::Topic(key.topic));
        }
        if key.partition > PARTITION_MAX {
            return Err(GroupError::Partition(key.partition));
        }
        Ok(GroupId(
            ((key.stream as u64) << 32) | ((key.topic as u64) << 20) | key.partition as u64,
        ))
    }

    /// The raw stream, topic and partition fields of any value (masks only, no range check).
    pub const fn fields(self) -> PartitionKey {
        PartitionKey {
            stream: ((self.0 >> 32) & 0xF_FFFF) as u32,
            topic: ((self.0 >> 20) & 0xFFF) as u32,
            partition: (self.0 & 0xF_FFFF) as u32,
        }
    }

    /// Whether the value is within the packed partition range (`<= 2^52 - 1`).
    pub const fn is_packable(self) -> bool {
        self.0 <= PACKED_MAX
    }

    /// The partition key without its incarnation tag (the metadata group and any value with
    /// bit 63 set are returned unchanged). Routing goes by the key; the tag only fences.
    pub const fn key(self) -> GroupId {
        if self.0 >> 63 == 1 {
            return self;
        }
        GroupId(self.0 & !TAG_MASK)
    }

    /// The incarnation tag in bits 52..62 (0: untagged, as the reference sends).
    pub const fn tag(self) -> u16 {
        if self.0 >> 63 == 1 {
            return 0;
        }
        ((self.0 & TAG_MASK) >> TAG_SHIFT) as u16
    }

    /// The key with `tag` in bits 52..62 (a tag above [`TAG_MAX`] is masked to 11 bits). The
    /// metadata group takes no tag and is returned unchanged.
    pub const fn with_tag(self, tag: u16) -> GroupId {
        if self.0 >> 63 == 1 {
            return self;
        }
        GroupId(self.key().0 | (((tag & TAG_MAX) as u64) << TAG_SHIFT))
    }

    /// Classifies the value. A value whose key (bits 0..51) has a partition field of 1 000 000
    /// or more cannot come from the packer and is invalid too; so is any value with bit 63 set
    /// but the metadata group's. Bits 52..62 are an incarnation tag (decision 375).
    pub const fn kind(self) -> GroupKind {
        if self.0 == Self::METADATA.0 {
            return GroupKind::Metadata;
        }
        let key = self.key();
        let fields = key.fields();
        if key.is_packable() && fields.partition <= PARTITION_MAX {
            GroupKind::Partition(fields)
        } else {
            GroupKind::Invalid
        }
    }

    /// Whether this is the metadata group.
    pub const fn is_metadata(self) -> bool {
        self.0 == Self::METADATA.0
    }
}

impl core::fmt::Display for GroupId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self.kind() {
            GroupKind::Metadata => f.write_str("metadata"),
            GroupKind::Partition(k) => write!(f, "{}/{}/{}", k.stream, k.topic, k.partition),
            GroupKind::Invalid => write!(f, "invalid({:#x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_not_a_partition() {
        assert_eq!(GroupId::METADATA.kind(), GroupKind::Metadata);
        assert_eq!(GroupId((1 << 63) | 1).kind(), GroupKind::Invalid);
        let mask_only = GroupId(1_000_000);
        assert_eq!(mask_only.kind(), GroupKind::Invalid);
        assert_eq!(mask_only.with_tag(3).kind(), GroupKind::Invalid);
    }

    /// A tag rides bits 52..62 only: the key, the kind and the metadata group are unchanged.
    #[test]
    fn a_tag_keeps_the_key_and_the_kind() {
        let key = GroupId::partition(PartitionKey {
            stream: STREAM_MAX,
            topic: TOPIC_MAX,
            partition: PARTITION_MAX,
        })
        .unwrap();
        for tag in [1, 2, 1024, TAG_MAX] {
            let tagged = key.with_tag(tag);
            assert_ne!(tagged, key);
            assert_eq!(tagged.tag(), tag);
            assert_eq!(tagged.key(), key);
            assert_eq!(tagged.fields(), key.fields());
            assert_eq!(tagged.kind(), key.kind());
            assert_eq!(tagged.with_tag(0), key);
        }
        assert_eq!(key.with_tag(TAG_MAX + 1).tag(), 0);
        assert_eq!(GroupId::METADATA.with_tag(5), GroupId::METADATA);
        assert_eq!(GroupId::METADATA.key(), GroupId::METADATA);
        assert_eq!(GroupId::METADATA.tag(), 0);
        assert_eq!(
            GroupId(1 << 52).kind(),
            GroupKind::Partition(GroupId(0).fields())
        );
    }
}
