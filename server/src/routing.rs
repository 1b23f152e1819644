//! Replica-plane routing on a shard (issue 10 item 4; decision 166): every frame that passed the
//! receive checks goes by its group to
//! - the metadata group's inbox (shard 0);
//! - this shard's partition pump, when it hosts the group;
//! - the shard that owns the group (`shard::mapping::shard_of`), over the shard mesh, counted
//!   `forwarded` (a lane's frames normally never hop shards; a peer with another lane count, or
//!   a frame on the wrong lane, still reaches its group);
//! - nowhere, counted, when this node knows no such group (its CreateTopic may not have
//!   committed here yet; VSR retransmits heal it).
//!
//! Connection reports go to the metadata pump for lane 0 and to the partition pump for every
//! lane (each group hears its own lane's peers).

use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use shard::net::{Origin, Sink};
use wire::GroupId;

use crate::metadata_group::MetadataSink;
use crate::metrics::Gauges;
use crate::partition_group::{Event, Host};
use crate::shard_msg::ShardMsg;

/// Sends a mesh message to a shard without blocking; `false` if it could not be queued.
pub type Forward = Box<dyn Fn(u16, ShardMsg) -> bool>;

/// The replica plane's sink of one shard.
pub struct ShardSink {
    /// This shard.
    pub shard: u16,
    /// The metadata group's sink (shard 0 only).
    pub metadata: Option<MetadataSink>,
    /// This shard's partition groups.
    pub partitions: Rc<Host>,
    /// The mesh.
    pub forward: Forward,
    /// Where metadata-plane drops are counted (frames for the metadata group off shard 0).
    pub gauges: Arc<Gauges>,
}

impl ShardSink {
    /// Where a replica frame goes: the metadata sink (borrowed bytes), this shard's partition
    /// pump or the owning shard (the `Bytes` that `bytes` makes).
    fn route(
        &self,
        origin: Origin,
        message: &wire::Message<'_>,
        frame: &[u8],
        bytes: impl FnOnce() -> Bytes,
    ) {
        let group = message.group();
        if group == GroupId::METADATA {
            match &self.metadata {
                Some(sink) => sink.frame(origin, message, frame),
                None => {
                    self.gauges
                        .inbox_dropped_foreign
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
            return;
        }
        // A partition frame goes by its key; the incarnation tag in bits 52..62 is checked by
        // the group itself (decision 375).
        let group = group.key();
        let p = &self.partitions;
        if p.hosts(group.0) {
            p.inbox.push(Event::Frame {
                from: origin.peer,
                group: group.0,
                bytes: bytes(),
            });
            return;
        }
        let owner = p.shard_of(group);
        if owner != self.shard {
            let message = ShardMsg::Replica {
                from: origin.peer,
                group: group.0,
                bytes: bytes(),
            };
            if (self.forward)(owner, message) {
                p.gauges.forwarded.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        p.gauges.dropped_unknown.fetch_add(1, Ordering::Relaxed);
    }
}

impl Sink for ShardSink {
    fn frame(&self, origin: Origin, message: &wire::Message<'_>, frame: &[u8]) {
        self.route(origin, message, frame, || Bytes::copy_from_slice(frame));
    }

    /// A large frame read into its own buffer: the partition pump (or the owning shard) keeps
    /// that buffer, not a copy (decision 365).
    fn frame_owned(&self, origin: Origin, message: &wire::Message<'_>, frame: &Bytes) {
        self.route(origin, message, frame, || frame.clone());
    }

    fn connected(&self, origin: Origin) {
        if let Some(sink) = &self.metadata {
            sink.connected(origin);
        }
        self.partitions.inbox.push(Event::Peer {
            peer: origin.peer,
            lane: origin.lane,
            connected: true,
        });
    }

    fn disconnected(&self, origin: Origin) {
        if let Some(sink) = &self.metadata {
            sink.disconnected(origin);
        }
        self.partitions.inbox.push(Event::Peer {
            peer: origin.peer,
            lane: origin.lane,
            connected: false,
        });
    }
}

/// A frame forwarded by another shard: into this shard's partition pump if it hosts the group,
/// else counted and dropped.
pub fn deliver_forwarded(partitions: &Host, from: u8, group: u64, bytes: Bytes) {
    if partitions.hosts(group) {
        partitions.inbox.push(Event::Frame { from, group, bytes });
    } else {
        partitions
            .gauges
            .dropped_unknown
            .fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition_group::PartitionGauges;
    use std::cell::RefCell;
    use wire::PartitionKey;
    use wire::header::{FrameHeader, Layout, PrepareHeader};
    use wire::{Command, Operation, Sender};

    fn frame(group: GroupId) -> Vec<u8> {
        let mut header = PrepareHeader::zeroed();
        header.frame = FrameHeader::new(
            Command::Prepare,
            Sender {
                cluster: 42,
                replica: 1,
                view: 0,
            },
        );
        header.op.set(1);
        header.timestamp.set(1);
        header.operation = Operation::StoreConsumerOffset.byte();
        header.group.set(group.0);
        wire::encode::finish_header(&mut header, &[]).unwrap();
        header.bytes().to_vec()
    }

    /// A partition frame of a group owned by another shard is forwarded there and counted;
    /// one owned here but not hosted (unknown) is dropped and counted; a metadata frame off
    /// shard 0 is dropped as foreign.
    #[test]
    fn frames_route_by_group() {
        let shards = 4;
        let lanes = 16;
        let gauges = Arc::new(PartitionGauges::default());
        let host = Host::new(1, shards, lanes, gauges.clone());
        let sent: Rc<RefCell<Vec<(u16, u64)>>> = Rc::default();
        let log = sent.clone();
        let metadata_gauges = Arc::new(Gauges::default());
        let sink = ShardSink {
            shard: 1,
            metadata: None,
            partitions: host.clone(),
            forward: Box::new(move |to, m| {
                if let ShardMsg::Replica { group, .. } = m {
                    log.borrow_mut().push((to, group));
                }
                true
            }),
            gauges: metadata_gauges.clone(),
        };
        let groups: Vec<GroupId> = (0..32)
            .map(|p| {
                GroupId::partition(PartitionKey {
                    stream: 1,
                    topic: 1,
                    partition: p,
                })
                .unwrap()
            })
            .collect();
        let origin = Origin { peer: 2, lane: 0 };
        let mut foreign = 0;
        let mut local = 0;
        for g in &groups {
            let bytes = frame(*g);
            let message = wire::decode::decode_replica(&bytes, 1 << 20).unwrap();
            sink.frame(origin, &message, &bytes);
            if shard::mapping::shard_of(*g, lanes, shards) == 1 {
                local += 1;
            } else {
                foreign += 1;
            }
        }
        assert!(local > 0 && foreign > 0);
        let sent = sent.borrow();
        assert_eq!(sent.len(), foreign);
        for (to, g) in sent.iter() {
            assert_eq!(*to, shard::mapping::shard_of(GroupId(*g), lanes, shards));
        }
        assert_eq!(gauges.forwarded.load(Ordering::Relaxed), foreign as u64);
        assert_eq!(gauges.dropped_unknown.load(Ordering::Relaxed), local as u64);
        let bytes = frame(GroupId::METADATA);
        let message = wire::decode::decode_replica(&bytes, 1 << 20).unwrap();
        sink.frame(origin, &message, &bytes);
        assert_eq!(
            metadata_gauges
                .inbox_dropped_foreign
                .load(Ordering::Relaxed),
            1
        );

        // The client core's view of the same shard: a group of another shard is refused with
        // its owner, one of this shard not hosted as unknown.
        use crate::groups::{Partitions, Refused};
        for g in &groups {
            let owner = shard::mapping::shard_of(*g, lanes, shards);
            let request =
                consensus::ClientRequest::new(9, Operation::SendMessages, 0, 1, Vec::new());
            let expected = if owner == 1 {
                Refused::Unknown
            } else {
                Refused::OtherShard(owner)
            };
            assert_eq!(host.submit(*g, request), Err(expected));
            // Reads: a group of this shard not booted yet is transient (57), another
            // shard's is not found here (3007).
            let poll = crate::client::request::PollMessages {
                consumer: crate::client::codec::Consumer {
                    group: false,
                    id: crate::client::codec::Identifier::Numeric(1),
                },
                stream: crate::client::codec::Identifier::Numeric(1),
                topic: crate::client::codec::Identifier::Numeric(1),
                partition: Some(0),
                strategy: crate::client::codec::PollingStrategy::First(0),
                count: 1,
                auto_commit: false,
            };
            let code = if owner == 1 {
                consensus::codes::TRANSIENT_NOT_COMMITTED
            } else {
                crate::client::status::PARTITION_NOT_FOUND
            };
            assert_eq!(host.poll(*g, 0, &poll).err(), Some(code));
            assert_eq!(
                host.consumer_offset(*g, 0, &poll.consumer).err(),
                Some(code)
            );
        }
    }
}
