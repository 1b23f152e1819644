//! What travels between the shards of a node over the shard mesh (`shard::mesh`): replica
//! connections handed to the shard that owns their lane, replica frames of a partition group
//! forwarded to the shard that runs it (`crate::routing`, decision 166), and the client core's
//! cross-shard work (requests to the group's shard, replies back to the connection's shard).

use bytes::Bytes;
use consensus::{ClientRequest, Frame};
use shard::net::plane::Handed;
use wire::GroupId;
use wire::header::RequestHeader;

use crate::client_core::PartitionRead;

/// One mesh message.
#[derive(Debug)]
pub enum ShardMsg {
    /// A replica connection handed to the shard that owns its lane (main lane).
    Handed(Handed),
    /// A replica-plane frame of a partition group the receiving shard owns (main lane).
    Replica {
        /// The peer it came from.
        from: u8,
        /// Its group.
        group: u64,
        /// The whole frame (shared, never copied again).
        bytes: Bytes,
    },
    /// A client request for the metadata group, to shard 0 (main lane).
    Metadata {
        /// The shard whose connection waits for the reply.
        origin: u16,
        /// The request, `user_id` stamped by the receiving shard.
        request: Box<ClientRequest>,
    },
    /// A replicated partition request for a group the receiving shard runs (main lane).
    Partition {
        /// The shard whose connection waits for the reply.
        origin: u16,
        /// The group.
        group: GroupId,
        /// The request.
        request: Box<ClientRequest>,
    },
    /// A partition read answered by the shard that runs the group (main lane).
    Read {
        /// The shard whose connection waits for the reply.
        origin: u16,
        /// The client's request header (the reply echoes it).
        request: Box<RequestHeader>,
        /// What to read.
        read: Box<PartitionRead>,
    },
    /// A Reply or Eviction for a client whose connection lives on the receiving shard (reply
    /// lane).
    Reply {
        /// The client.
        client: u128,
        /// The frame.
        frame: Frame,
    },
}
