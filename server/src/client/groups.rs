//! The consumer-group requests' shared field (client-plane.md §10): a group named by stream,
//! topic and group identifiers, and the DeleteConsumerOffset body (§9).

use super::codec::{BodyError, Identifier, Reader};
use super::request::OffsetTarget;

/// Stream, topic and group identifiers (Delete/Join/Leave/Get/SyncConsumerGroup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTarget {
    /// The stream.
    pub stream: Identifier,
    /// The topic.
    pub topic: Identifier,
    /// The group.
    pub group: Identifier,
}

impl GroupTarget {
    /// Decodes the three identifiers.
    pub fn read(r: &mut Reader<'_>) -> Result<GroupTarget, BodyError> {
        Ok(GroupTarget {
            stream: Identifier::read(r, "stream id")?,
            topic: Identifier::read(r, "topic id")?,
            group: Identifier::read(r, "group id")?,
        })
    }

    /// Encodes them.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.stream.write(out);
        self.topic.write(out);
        self.group.write(out);
    }
}

/// A DeleteConsumerOffset body (code 122, operation 162): the offset's target and the ack
/// byte StoreConsumerOffset also carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteConsumerOffset {
    /// Where.
    pub target: OffsetTarget,
    /// Replicate before answering (1) or not (0).
    pub quorum: bool,
}
