//! Counters of the replica plane, by reason: what a metrics endpoint reads.
//!
//! One [`Counters`] per shard (no cache line is shared between cores on the hot path); a reader
//! on any thread sums them. Every counter is a relaxed atomic: each is an independent tally, and
//! nothing is ordered by them.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! reasons {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $label:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            /// Every reason, in counter order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The metric label.
            pub const fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)+
                }
            }
        }
    };
}

reasons! {
    /// Why an inbound frame was dropped with its connection kept (wire.md section 6, steps 3-7,
    /// then Strand's roster-aware and routing drops).
    Dropped {
        /// Step 3: commands 0-4 and 14-16 have no handler.
        NoHandler => "no_handler",
        /// Step 3: Reply or Eviction, client-bound.
        ClientBound => "client_bound",
        /// Step 4: an undefined operation, outcome or reason byte.
        BitPattern => "bit_pattern",
        /// Step 5: frame seal mismatch.
        Seal => "seal",
        /// Step 6: per-command validation.
        Validate => "validate",
        /// Step 7: prepare identity or body digest.
        PrepareIntegrity => "prepare_integrity",
        /// Step 7: DoViewChange / StartView body digest.
        ControlBody => "control_body",
        /// Step 7: DoViewChange suffix decode.
        SuffixDecode => "suffix_decode",
        /// `replica >= replica_count` (wire.md section 4).
        OutsideRoster => "outside_roster",
        /// A non-prepare naming the receiver's own id.
        OwnId => "own_id",
        /// A Prepare or RepairPrepare with checksum 0 (wire.md section 7.2).
        ZeroIdentity => "zero_identity",
        /// A client Request on the replica port (consensus.md section 16.1).
        ClientRequest => "client_request",
        /// A `group` that names neither the metadata group nor a partition (wire.md section 9).
        InvalidGroup => "invalid_group",
    }
}

reasons! {
    /// Why an established connection closed.
    Closed {
        /// Step 1: `size < 256`.
        SizeTooSmall => "size_too_small",
        /// Step 1: `size > max_message_size`.
        SizeTooLarge => "size_too_large",
        /// Step 2: command byte above 29.
        CommandByte => "command_byte",
        /// The peer closed the stream.
        Eof => "eof",
        /// A read failed (including TLS record errors).
        ReadError => "read_error",
        /// A write failed.
        WriteError => "write_error",
        /// The owning shard already holds a connection for this peer and lane.
        Duplicate => "duplicate",
        /// Closed by this node (shutdown or an explicit close).
        Local => "local",
    }
}

reasons! {
    /// Why a connection never became established.
    Handshake {
        /// TLS and the handshake together exceeded `handshake_grace`.
        Timeout => "timeout",
        /// 256 inbound handshakes were already in flight.
        CapFull => "cap_full",
        /// The TCP connect failed or exceeded the per-dial timeout.
        Connect => "connect",
        /// A read or write failed, or the stream ended.
        Io => "io",
        /// The TLS handshake failed.
        Tls => "tls",
        /// TLS completed without ALPN `iggy-replica`.
        Alpn => "alpn",
        /// A handshake frame broke a framing rule.
        Framing => "framing",
        /// The first frame was not a ReplicaHello, or the next frame had the wrong command.
        UnexpectedCommand => "unexpected_command",
        /// The hello named another cluster.
        ClusterMismatch => "cluster_mismatch",
        /// The hello's replica may not dial us.
        DirectionalRule => "directional_rule",
        /// Auth is on and the hello carried no nonce.
        AuthRequired => "auth_required",
        /// A MAC did not verify.
        MacMismatch => "mac_mismatch",
        /// The acceptor answered with a non-zero status.
        Rejected => "rejected",
        /// The hello's lane is not below `replica_lanes`.
        LaneOutOfRange => "lane_out_of_range",
        /// The connection could not be handed to the shard owning its lane.
        HandoffFailed => "handoff_failed",
    }
}

reasons! {
    /// Why an outbound frame was not queued.
    SendDrop {
        /// The per-peer queue held `peer_queue_capacity` frames.
        QueueFull => "queue_full",
        /// No established connection for that peer and lane.
        NotConnected => "not_connected",
    }
}

/// A fixed array of counters indexed by a reason enum.
#[derive(Debug)]
pub struct ByReason<const N: usize>([AtomicU64; N]);

impl<const N: usize> Default for ByReason<N> {
    fn default() -> Self {
        ByReason(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl<const N: usize> ByReason<N> {
    fn add(&self, index: usize) {
        self.0[index].fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self, index: usize) -> u64 {
        self.0[index].load(Ordering::Relaxed)
    }
}

/// Counters of one shard's replica plane.
#[derive(Debug, Default)]
pub struct Counters {
    dropped: ByReason<{ Dropped::ALL.len() }>,
    closed: ByReason<{ Closed::ALL.len() }>,
    handshake: ByReason<{ Handshake::ALL.len() }>,
    send_drop: ByReason<{ SendDrop::ALL.len() }>,
    /// Frames that passed every receive check and reached the sink.
    pub frames_in: AtomicU64,
    /// Bytes of those frames.
    pub bytes_in: AtomicU64,
    /// Frames written to a socket.
    pub frames_out: AtomicU64,
    /// Bytes of those frames.
    pub bytes_out: AtomicU64,
    /// Vectored writes (one per batch of up to `max_batch` frames).
    pub batches_out: AtomicU64,
    /// Connections established after an accepted handshake.
    pub established_inbound: AtomicU64,
    /// Connections established after a dial.
    pub established_outbound: AtomicU64,
    /// Accepted connections handed to another shard.
    pub handed_off: AtomicU64,
    /// Connections this shard adopted from another shard.
    pub adopted: AtomicU64,
    /// Dials started by the reconnect sweep.
    pub dials: AtomicU64,
    /// Connections registered on this shard now (a gauge: up at establishment or adoption,
    /// down at close), so a harness can tell from outside when the peers are connected.
    pub open: AtomicU64,
}

impl Counters {
    /// Counts a dropped frame.
    pub fn dropped(&self, reason: Dropped) {
        self.dropped.add(reason as usize);
    }

    /// Counts a closed connection.
    pub fn closed(&self, reason: Closed) {
        self.closed.add(reason as usize);
    }

    /// Counts a failed handshake.
    pub fn handshake_failed(&self, reason: Handshake) {
        self.handshake.add(reason as usize);
    }

    /// Counts a frame that was not queued.
    pub fn send_dropped(&self, reason: SendDrop) {
        self.send_drop.add(reason as usize);
    }

    /// Frames dropped for `reason`.
    pub fn dropped_count(&self, reason: Dropped) -> u64 {
        self.dropped.get(reason as usize)
    }

    /// Connections closed for `reason`.
    pub fn closed_count(&self, reason: Closed) -> u64 {
        self.closed.get(reason as usize)
    }

    /// Handshakes failed for `reason`.
    pub fn handshake_count(&self, reason: Handshake) -> u64 {
        self.handshake.get(reason as usize)
    }

    /// Frames not queued for `reason`.
    pub fn send_drop_count(&self, reason: SendDrop) -> u64 {
        self.send_drop.get(reason as usize)
    }

    /// Relaxed read of a plain counter.
    pub fn read(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Every counter as `(metric, reason label, value)`, for a metrics endpoint: metric names
    /// without the `strand_` prefix the endpoint adds, the reason empty for unlabelled ones.
    pub fn snapshot(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut out = Vec::new();
        for reason in Dropped::ALL {
            out.push((
                "replica_frames_dropped_total",
                reason.label(),
                self.dropped_count(*reason),
            ));
        }
        for reason in Closed::ALL {
            out.push((
                "replica_connections_closed_total",
                reason.label(),
                self.closed_count(*reason),
            ));
        }
        for reason in Handshake::ALL {
            let count = self.handshake_count(*reason);
            out.push(("replica_handshakes_failed_total", reason.label(), count));
        }
        for reason in SendDrop::ALL {
            let count = self.send_drop_count(*reason);
            out.push(("replica_send_dropped_total", reason.label(), count));
        }
        let plain: [(&'static str, &AtomicU64); 10] = [
            ("replica_frames_in_total", &self.frames_in),
            ("replica_bytes_in_total", &self.bytes_in),
            ("replica_frames_out_total", &self.frames_out),
            ("replica_bytes_out_total", &self.bytes_out),
            ("replica_write_batches_total", &self.batches_out),
            (
                "replica_connections_inbound_total",
                &self.established_inbound,
            ),
            (
                "replica_connections_outbound_total",
                &self.established_outbound,
            ),
            ("replica_connections_handed_off_total", &self.handed_off),
            ("replica_connections_adopted_total", &self.adopted),
            ("replica_dials_total", &self.dials),
        ];
        for (name, counter) in plain {
            out.push((name, "", Counters::read(counter)));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_index_their_own_counter() {
        let counters = Counters::default();
        for (i, reason) in Dropped::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, i);
            for _ in 0..=i {
                counters.dropped(*reason);
            }
        }
        for (i, reason) in Dropped::ALL.iter().enumerate() {
            assert_eq!(
                counters.dropped_count(*reason),
                i as u64 + 1,
                "{}",
                reason.label()
            );
        }
        let snapshot = counters.snapshot();
        let seal = snapshot
            .iter()
            .find(|(name, reason, _)| *name == "replica_frames_dropped_total" && *reason == "seal");
        assert_eq!(seal.map(|s| s.2), Some(Dropped::Seal as u64 + 1));
        let names: std::collections::HashSet<_> =
            snapshot.iter().map(|(n, r, _)| (*n, *r)).collect();
        assert_eq!(names.len(), snapshot.len(), "every series is distinct");
        let labels: std::collections::HashSet<_> =
            Handshake::ALL.iter().map(|h| h.label()).collect();
        assert_eq!(labels.len(), Handshake::ALL.len());
    }
}
