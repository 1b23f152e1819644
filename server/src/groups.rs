//! The seam between the client core (the listener on the `tcp` port) and the consensus groups a
//! shard runs (the metadata group on shard 0, the partition groups of the shard's lanes).
//!
//! - A group's pump delivers every `Effect::Reply` through the shard's [`ReplySink`], which
//!   finds the client's connection (on this shard, or across the shard mesh) or counts the
//!   frame as undeliverable.
//! - The client core hands partition work to the shard's [`Partitions`]: replicated requests
//!   (SendMessages, StoreConsumerOffset) are submitted to the group's replica; reads
//!   (PollMessages, GetConsumerOffset) are answered from the group's committed state on the
//!   shard that runs it.

use consensus::{ClientRequest, Frame};
use wire::GroupId;

use crate::client::codec::Consumer;
use crate::client::reply::ConsumerOffsetReply;
use crate::client::request::PollMessages;
use crate::partition::PollAnswer;

/// Where a group's replies go: the shard's client connections, keyed by client id.
pub trait ReplySink {
    /// Delivers a Reply or Eviction frame to the connection of `client`. A client whose
    /// connection is gone loses the frame (counted by the implementation; the client resends
    /// after it reconnects and the client table answers the duplicate).
    fn reply(&self, client: u128, frame: Frame);
}

/// Why a partition group did not take a request. The client core turns each into the reply the
/// spec gives (never silence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The group runs on another shard of this node (the client core forwards over the mesh).
    OtherShard(u16),
    /// This node hosts no such group (yet: its CreateTopic may not have committed here).
    Unknown,
    /// This replica is not the group's primary in a normal view; `primary` is the replica the
    /// view names (partition primaries follow the metadata primary, README decision 3).
    NotPrimary {
        /// The group's current view.
        view: u32,
        /// The replica that is primary in that view.
        primary: u8,
    },
    /// The group cannot admit more requests now (pipeline or inbox full).
    Busy,
}

/// The partition groups of one shard, as the client core sees them.
pub trait Partitions {
    /// Submits a replicated request (SendMessages, StoreConsumerOffset) to `group`. The reply
    /// arrives later through the shard's [`ReplySink`] under the request header's client id.
    fn submit(&self, group: GroupId, request: ClientRequest) -> Result<(), Refused>;

    /// Answers a PollMessages from the group's committed messages and stored offsets
    /// (decision 127): from memory, or as a read of the segments the caller awaits (decision
    /// 281). `Err(code)` is a client-plane status for the reply.
    fn poll(
        &self,
        group: GroupId,
        partition: u32,
        request: &PollMessages,
    ) -> Result<PollAnswer, u32>;

    /// Answers a GetConsumerOffset: `None` when nothing is stored for `consumer`.
    fn consumer_offset(
        &self,
        group: GroupId,
        partition: u32,
        consumer: &Consumer,
    ) -> Result<Option<ConsumerOffsetReply>, u32>;
}
