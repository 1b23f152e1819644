//! The simulated network: per-peer send queues that drop on overrun (like the message bus,
//! `message_bus.peer_queue_capacity`), then links that delay, lose, duplicate and reorder frames,
//! and partitions (symmetric and one-way) and clogs between any two endpoints.
//!
//! Frames are plain bytes; the network never looks inside them. Determinism: every decision
//! draws from the network stream, and in-flight frames are kept in a `BTreeMap` ordered by
//! `(deliver_at, sequence)`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::prng::Prng;

/// An endpoint of the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    /// A replica by id.
    Replica(u8),
    /// A client by index.
    Client(u32),
}

/// A directed link.
pub type Link = (Node, Node);

/// Link behaviour. Rates are parts per million; durations are ticks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// Mean one-way delay.
    pub delay_mean_ticks: u64,
    /// Longest one-way delay (before clogging).
    pub delay_max_ticks: u64,
    /// Probability that a frame is lost on the wire.
    pub loss_ppm: u32,
    /// Probability that a frame is delivered twice.
    pub duplicate_ppm: u32,
    /// Probability that a frame leaves FIFO order (gets an independent delay).
    pub reorder_ppm: u32,
    /// Per-peer send queue capacity (message_bus.peer_queue_capacity, default 256).
    pub peer_queue_capacity: usize,
    /// Frames a link moves from its send queue onto the wire per tick (bandwidth).
    pub frames_per_tick: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            delay_mean_ticks: 1,
            delay_max_ticks: 20,
            loss_ppm: 0,
            duplicate_ppm: 0,
            reorder_ppm: 0,
            peer_queue_capacity: 256,
            frames_per_tick: 64,
        }
    }
}

/// A frame on its way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Sender.
    pub from: Node,
    /// Receiver.
    pub to: Node,
    /// The frame's bytes.
    pub frame: Vec<u8>,
}

/// Counters of what the network did to frames.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames handed to `send`.
    pub sent: u64,
    /// Frames delivered (duplicates count twice).
    pub delivered: u64,
    /// Dropped because the per-peer send queue was full.
    pub dropped_overrun: u64,
    /// Dropped by random loss.
    pub dropped_loss: u64,
    /// Dropped because the link was partitioned (at send, in the queue, or in flight).
    pub dropped_partition: u64,
    /// Dropped because the receiver was down.
    pub dropped_down: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Frames that left FIFO order.
    pub reordered: u64,
}

impl NetStats {
    /// Every frame the network dropped, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_overrun + self.dropped_loss + self.dropped_partition + self.dropped_down
    }
}

/// The network.
#[derive(Debug)]
pub struct Network {
    /// Current link behaviour; the fault schedule may change it between phases.
    pub config: NetConfig,
    prng: Prng,
    queues: BTreeMap<Link, VecDeque<Vec<u8>>>,
    in_flight: BTreeMap<(u64, u64), Packet>,
    /// Latest scheduled delivery per link, to keep links FIFO unless a frame is reordered.
    last_delivery: BTreeMap<Link, u64>,
    blocked: BTreeSet<Link>,
    clogged: BTreeMap<Link, u64>,
    /// Per-command loss between replicas: command byte -> loss rate (ppm).
    command_loss: BTreeMap<u8, u32>,
    down: BTreeSet<Node>,
    sequence: u64,
    /// Counters.
    pub stats: NetStats,
}

impl Network {
    /// An empty, healthy network.
    pub fn new(config: NetConfig, prng: Prng) -> Network {
        Network {
            config,
            prng,
            queues: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            last_delivery: BTreeMap::new(),
            blocked: BTreeSet::new(),
            clogged: BTreeMap::new(),
            command_loss: BTreeMap::new(),
            down: BTreeSet::new(),
            sequence: 0,
            stats: NetStats::default(),
        }
    }

    /// Enqueues a frame on the sender's queue toward `to`. Returns false when the frame was
    /// dropped at once (queue full, or link down), which the sender's bus would also report.
    pub fn send(&mut self, from: Node, to: Node, frame: Vec<u8>) -> bool {
        self.stats.sent += 1;
        if !self.is_connected(from, to) {
            self.stats.dropped_partition += 1;
            return false;
        }
        let capacity = self.config.peer_queue_capacity;
        let queue = self.queues.entry((from, to)).or_default();
        if queue.len() >= capacity {
            self.stats.dropped_overrun += 1;
            return false;
        }
        queue.push_back(frame);
        true
    }

    /// True when `from` can currently reach `to` (what the bus reports as a live connection).
    pub fn is_connected(&self, from: Node, to: Node) -> bool {
        !self.blocked.contains(&(from, to))
            && !self.down.contains(&to)
            && !self.down.contains(&from)
    }

    /// Moves frames from the send queues onto the wire, applying loss, delay, duplication and
    /// reordering. Call once per tick before `deliver`.
    pub fn transmit(&mut self, now: u64) {
        let links: Vec<Link> = self.queues.keys().copied().collect();
        for link in links {
            let connected = self.is_connected(link.0, link.1);
            let queue = self.queues.get_mut(&link).expect("listed");
            if !connected {
                // A broken connection loses whatever its queue held.
                self.stats.dropped_partition += queue.len() as u64;
                queue.clear();
                continue;
            }
            let take = queue.len().min(self.config.frames_per_tick);
            let frames: Vec<Vec<u8>> = queue.drain(..take).collect();
            for frame in frames {
                self.put_on_wire(now, link, frame);
            }
        }
    }

    fn put_on_wire(&mut self, now: u64, link: Link, frame: Vec<u8>) {
        let between_replicas = matches!(link, (Node::Replica(_), Node::Replica(_)));
        let command_loss = frame
            .get(60)
            .filter(|_| between_replicas)
            .and_then(|c| self.command_loss.get(c))
            .copied()
            .unwrap_or(0);
        if command_loss > 0 && self.prng.chance_ppm(command_loss) {
            self.stats.dropped_loss += 1;
            return;
        }
        if self.prng.chance_ppm(self.config.loss_ppm) {
            self.stats.dropped_loss += 1;
            return;
        }
        let copies = if self.prng.chance_ppm(self.config.duplicate_ppm) {
            2
        } else {
            1
        };
        for copy in 0..copies {
            let clog = self.clogged.get(&link).copied().unwrap_or(0);
            let delay = self
                .prng
                .delay(self.config.delay_mean_ticks, self.config.delay_max_ticks);
            let mut at = now + 1 + delay + clog;
            let reorder = copy > 0 || self.prng.chance_ppm(self.config.reorder_ppm);
            if reorder {
                self.stats.reordered += 1;
            } else {
                let last = self.last_delivery.entry(link).or_insert(0);
                at = at.max(*last);
                *last = at;
            }
            if copy > 0 {
                self.stats.duplicated += 1;
            }
            self.sequence += 1;
            let packet = Packet {
                from: link.0,
                to: link.1,
                frame: frame.clone(),
            };
            self.in_flight.insert((at, self.sequence), packet);
        }
    }

    /// Frames due at or before `now`, in delivery order. Frames on a link that broke while they
    /// were in flight, or to a receiver that is down, are dropped here.
    pub fn deliver(&mut self, now: u64) -> Vec<Packet> {
        let mut due = Vec::new();
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let packet = entry.remove();
            if self.down.contains(&packet.to) {
                self.stats.dropped_down += 1;
            } else if self.blocked.contains(&(packet.from, packet.to)) {
                self.stats.dropped_partition += 1;
            } else {
                self.stats.delivered += 1;
                due.push(packet);
            }
        }
        due
    }

    /// Blocks `from -> to` only (one-way partition).
    pub fn block(&mut self, from: Node, to: Node) {
        self.blocked.insert((from, to));
    }

    /// Blocks both directions between every member of `side` and every node of `others`.
    pub fn partition(&mut self, side: &[Node], others: &[Node]) {
        for &a in side {
            for &b in others {
                if a != b {
                    self.blocked.insert((a, b));
                    self.blocked.insert((b, a));
                }
            }
        }
    }

    /// Adds `extra_ticks` of delay to `from -> to`.
    pub fn clog(&mut self, from: Node, to: Node, extra_ticks: u64) {
        self.clogged.insert((from, to), extra_ticks);
    }

    /// Loses frames of `command` between replicas with probability `ppm` (a per-command filter;
    /// 1_000_000 drops them all). Cleared by `heal`.
    pub fn lose_command(&mut self, command: wire::Command, ppm: u32) {
        self.command_loss.insert(command.byte(), ppm);
    }

    /// Removes every partition, clog and command filter.
    pub fn heal(&mut self) {
        self.blocked.clear();
        self.clogged.clear();
        self.command_loss.clear();
    }

    /// Marks a node down (crashed): its queues and in-flight frames toward it are lost.
    pub fn set_down(&mut self, node: Node, down: bool) {
        if down {
            self.down.insert(node);
            for (link, queue) in self.queues.iter_mut() {
                if link.0 == node || link.1 == node {
                    self.stats.dropped_down += queue.len() as u64;
                    queue.clear();
                }
            }
        } else {
            self.down.remove(&node);
        }
    }

    /// Frames queued or in flight (for quiescence checks).
    pub fn pending(&self) -> usize {
        self.in_flight.len() + self.queues.values().map(VecDeque::len).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prng::Stream;

    fn net(config: NetConfig) -> Network {
        Network::new(config, Prng::new(3, Stream::Network))
    }

    #[test]
    fn fifo_delivery_without_faults() {
        let mut n = net(NetConfig::default());
        let (a, b) = (Node::Replica(0), Node::Replica(1));
        for i in 0..50u8 {
            assert!(n.send(a, b, vec![i]));
        }
        let mut got = Vec::new();
        for now in 0..100 {
            n.transmit(now);
            got.extend(n.deliver(now).into_iter().map(|p| p.frame[0]));
        }
        assert_eq!(got, (0..50).collect::<Vec<u8>>());
    }

    #[test]
    fn overrun_drops_and_counts() {
        let mut n = net(NetConfig {
            peer_queue_capacity: 4,
            ..NetConfig::default()
        });
        let (a, b) = (Node::Replica(0), Node::Replica(1));
        let accepted = (0..10).filter(|_| n.send(a, b, vec![0])).count();
        assert_eq!(accepted, 4);
        assert_eq!(n.stats.dropped_overrun, 6);
    }

    #[test]
    fn one_way_partition() {
        let mut n = net(NetConfig::default());
        let (a, b) = (Node::Replica(0), Node::Replica(1));
        n.block(a, b);
        assert!(!n.send(a, b, vec![1]));
        assert!(n.send(b, a, vec![2]));
        for now in 0..30 {
            n.transmit(now);
            for p in n.deliver(now) {
                assert_eq!(p.to, a);
            }
        }
        n.heal();
        assert!(n.send(a, b, vec![1]));
    }
}
