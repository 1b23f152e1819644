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
    /// A partition group, `<= 2^52 - 1`.
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

    /// Classifies the value. A value in the packed range whose partition field is 1 000 000 or
    /// more cannot come from the packer and is invalid too.
    pub const fn kind(self) -> GroupKind {
        if self.0 == Self::METADATA.0 {
            return GroupKind::Metadata;
        }
        let fields = self.fields();
        if self.is_packable() && fields.partition <= PARTITION_MAX {
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
        assert_eq!(GroupId(1 << 52).kind(), GroupKind::Invalid);
        let mask_only = GroupId(1_000_000);
        assert_eq!(mask_only.kind(), GroupKind::Invalid);
    }
}
