//! The metadata primary's hold on the replies of purges and deletes (decision 395).
//!
//! A purge or a delete ends a partition incarnation; a node stops that incarnation when its
//! own metadata applies the op (decision 376). Until enough nodes have, the old incarnation
//! can still commit a send on the lagging ones. So the reply that tells the client the op
//! is done waits until so many replicas have applied it that the rest cannot form a
//! replication quorum: `n - Q_rep + 1` of them, this one included (it replies only after
//! its own apply). The backups show how far they applied in their PrepareOks (the core's
//! `acks_carry_applied`), which the primary asks for with `Replica::solicit_applied`.

use consensus::Frame;
use wire::header::{Layout, PrepareOkHeader, ReplyHeader};
use wire::{Command, Operation};

/// Whether a reply to `operation` waits: the operations that end partition incarnations.
pub fn ends_incarnations(operation: u8) -> bool {
    [
        Operation::PurgeStream,
        Operation::PurgeTopic,
        Operation::DeleteStream,
        Operation::DeleteTopic,
        Operation::DeletePartitions,
    ]
    .iter()
    .any(|o| o.byte() == operation)
}

/// A reply waiting for its op to be applied widely enough.
struct Held {
    op: u64,
    client: u128,
    frame: Frame,
}

/// The hold. One per metadata pump.
pub struct ReplyGate {
    me: u8,
    /// Per replica, the highest applied op one of its PrepareOks reported (0: none).
    applied: Vec<u64>,
    /// How many replicas (this one included) must have applied an op before its reply goes.
    needed: usize,
    held: Vec<Held>,
}

impl ReplyGate {
    /// The gate of replica `me` of `replica_count`.
    pub fn new(me: u8, replica_count: u8) -> ReplyGate {
        let n = usize::from(replica_count);
        ReplyGate {
            me,
            applied: vec![0; n],
            needed: n - consensus::quorum::replication(n) + 1,
            held: Vec::new(),
        }
    }

    /// A replica frame from `from` (the transport's peer): a PrepareOk tells how far its
    /// sender applied. Anything else, or a PrepareOk naming another sender, tells nothing.
    pub fn observe(&mut self, from: u8, frame: &[u8]) {
        let Some(h) = PrepareOkHeader::view(frame) else {
            return;
        };
        if h.frame.command != Command::PrepareOk.byte() || h.frame.replica != from {
            return;
        }
        if let Some(applied) = self.applied.get_mut(usize::from(from)) {
            *applied = (*applied).max(h.commit.get());
        }
    }

    /// `peer`'s connection dropped: what it reported before counts no more (a restarted
    /// node may boot behind what it had applied).
    pub fn forget(&mut self, peer: u8) {
        if let Some(applied) = self.applied.get_mut(usize::from(peer)) {
            *applied = 0;
        }
    }

    /// A reply the core emitted: handed back when it may go now, else held. Only a
    /// successful reply (header status 0) of an op that ends incarnations waits; a reply
    /// comes from this replica's own apply (or its client table, filled at apply), so this
    /// replica counts as having applied its op.
    pub fn admit(&mut self, client: u128, frame: Frame) -> Option<Frame> {
        let Some(h) = ReplyHeader::view(frame.bytes()) else {
            return Some(frame);
        };
        if h.frame.command != Command::Reply.byte()
            || h.status.get() != 0
            || !ends_incarnations(h.operation)
        {
            return Some(frame);
        }
        let op = h.op.get();
        if self.confirmed(op) {
            return Some(frame);
        }
        // One per client: a resend answered again from the table replaces the earlier copy.
        self.held.retain(|held| held.client != client);
        self.held.push(Held { op, client, frame });
        None
    }

    /// Whether enough replicas applied `op`.
    fn confirmed(&self, op: u64) -> bool {
        let others = self
            .applied
            .iter()
            .enumerate()
            .filter(|&(r, &applied)| r != usize::from(self.me) && applied >= op)
            .count();
        1 + others >= self.needed
    }

    /// The held replies whose ops are now applied widely enough, in the order they were held.
    pub fn release(&mut self) -> Vec<(u128, Frame)> {
        if self.held.is_empty() {
            return Vec::new();
        }
        let (go, stay): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|held| self.confirmed(held.op));
        self.held = stay;
        go.into_iter().map(|h| (h.client, h.frame)).collect()
    }

    /// Whether a reply waits (the pump then solicits the backups' applied points).
    pub fn is_holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// This replica is no longer the primary: it hears no more PrepareOks, so what it holds
    /// would wait for good. The clients are answered 57 (TransientNotCommitted) with the
    /// reply's header: the SDK resends, and the new primary answers from its client table,
    /// through its own gate.
    pub fn abandon(&mut self) -> Vec<(u128, Frame)> {
        std::mem::take(&mut self.held)
            .into_iter()
            .filter_map(|held| {
                let h = ReplyHeader::view(held.frame.bytes())?;
                let mut request = wire::header::RequestHeader::zeroed();
                request.request_checksum = h.request_checksum;
                request.client = h.client;
                request.timestamp = h.timestamp;
                request.request = h.request;
                request.operation = h.operation;
                Some((
                    held.client,
                    crate::client_core::frames::reply(
                        &request,
                        consensus::codes::TRANSIENT_NOT_COMMITTED,
                        &[],
                    ),
                ))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(operation: Operation, op: u64, status: u32) -> Frame {
        let mut h = ReplyHeader::zeroed();
        h.frame.command = Command::Reply.byte();
        h.operation = operation.byte();
        h.op.set(op);
        h.status.set(status);
        Frame::new(h.bytes().to_vec())
    }

    fn ack(from: u8, commit: u64) -> Vec<u8> {
        let mut h = PrepareOkHeader::zeroed();
        h.frame.command = Command::PrepareOk.byte();
        h.frame.replica = from;
        h.commit.set(commit);
        h.bytes().to_vec()
    }

    /// Five replicas: Q_rep is 3, so the reply waits for 3 appliers (this one and two more);
    /// other replies, refusals and acks naming another sender do not wait or count.
    #[test]
    fn a_reply_waits_for_n_minus_the_replication_quorum_plus_one_appliers() {
        let mut gate = ReplyGate::new(0, 5);
        assert!(gate.admit(1, reply(Operation::CreateTopic, 9, 0)).is_some());
        assert!(gate.admit(1, reply(Operation::PurgeTopic, 9, 4)).is_some());
        assert!(gate.admit(2, reply(Operation::PurgeTopic, 10, 0)).is_none());
        assert!(
            gate.admit(3, reply(Operation::DeletePartitions, 12, 0))
                .is_none()
        );
        gate.observe(1, &ack(1, 11));
        gate.observe(2, &ack(3, 12)); // names replica 3: not counted
        assert!(gate.release().is_empty());
        gate.observe(4, &ack(4, 10));
        let go: Vec<u128> = gate.release().into_iter().map(|(c, _)| c).collect();
        assert_eq!(go, vec![2]);
        gate.forget(1);
        gate.observe(2, &ack(2, 12));
        assert!(gate.release().is_empty(), "a forgotten report counted");
        gate.observe(3, &ack(3, 12));
        assert_eq!(gate.release().len(), 1);
        assert!(!gate.is_holding());
        // Held when the node steps down: answered 57, once.
        assert!(
            gate.admit(5, reply(Operation::DeleteTopic, 20, 0))
                .is_none()
        );
        let answered = gate.abandon();
        assert_eq!(answered.len(), 1);
        let h = ReplyHeader::view(answered[0].1.bytes()).unwrap();
        assert_eq!(h.status.get(), consensus::codes::TRANSIENT_NOT_COMMITTED);
        assert_eq!(h.operation, Operation::DeleteTopic.byte());
        assert!(gate.abandon().is_empty());
    }
}
