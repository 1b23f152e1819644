//! What the replica plane needs to know, already validated: the runtime's typed configuration
//! (architecture.md section 10) is converted into a [`NetConfig`] once at boot.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use wire::handshake::Keys;

use super::tls::TlsConfig;
use crate::mapping::{REPLICA_LANES_DEFAULT as LANES_DEFAULT, REPLICA_LANES_MAX as LANES_MAX};

/// Inbound handshakes in flight on one node at most (architecture.md section 10, constants).
pub const MAX_HANDSHAKES_IN_FLIGHT: usize = 256;

/// Default `message_bus.handshake_grace`.
pub const HANDSHAKE_GRACE_DEFAULT: Duration = Duration::from_secs(10);

/// Strand's default `message_bus.reconnect_period` (architecture.md section 3.3).
pub const RECONNECT_PERIOD_DEFAULT: Duration = Duration::from_secs(1);

/// Default `message_bus.peer_queue_capacity`.
pub const PEER_QUEUE_CAPACITY_DEFAULT: usize = 256;

/// Default `message_bus.max_batch`.
pub const MAX_BATCH_DEFAULT: usize = 256;

/// Largest `message_bus.max_batch`: IOV_MAX / 2.
pub const MAX_BATCH_MAX: usize = 512;

/// One roster entry as the replica plane sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Roster replica id.
    pub id: u8,
    /// Roster node name: the TLS server name a dialer sends and verifies (handshake.md
    /// section 5).
    pub name: String,
    /// `ip` and `ports.tcp_replica`.
    pub addr: SocketAddr,
}

/// Why a [`NetConfig`] is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `cluster.replica_lanes` outside 1..=256 (the lane is one hello byte).
    #[error("cluster.replica_lanes is {0}, must be 1..=256")]
    Lanes(u16),
    /// The node's shard count exceeds the lanes: shards beyond them would host no groups.
    #[error("cluster.replica_lanes is {lanes}, below this node's {shards} shards")]
    LanesBelowShards {
        /// Configured lanes.
        lanes: u16,
        /// Shards of this node.
        shards: usize,
    },
    /// The roster does not name this replica, or names an id twice, or is not 0..n.
    #[error("roster must list replica ids 0..n exactly once and include self_id {0}")]
    Roster(u8),
    /// `message_bus.max_batch` outside 1..=512.
    #[error("message_bus.max_batch is {0}, must be 1..=512")]
    MaxBatch(usize),
    /// `message_bus.peer_queue_capacity` is 0.
    #[error("message_bus.peer_queue_capacity must be at least 1")]
    QueueCapacity,
    /// TLS without authentication (handshake.md section 1).
    #[error("cluster.tls.enabled requires cluster.auth.enabled")]
    TlsWithoutAuth,
    /// A zero duration where a timer must fire.
    #[error("{0} must be non-zero")]
    ZeroDuration(&'static str),
    /// `message_bus.max_message_size` below one header.
    #[error("message_bus.max_message_size {0} is below 256")]
    MaxMessageSize(usize),
}

/// The replica plane's configuration for one node.
#[derive(Debug, Clone)]
pub struct NetConfig {
    /// Cluster id (wire.md section 8).
    pub cluster: u128,
    /// This node's replica id.
    pub self_id: u8,
    /// Every roster entry, this node included, indexed by id.
    pub roster: Vec<Peer>,
    /// `cluster.replica_lanes`.
    pub lanes: u16,
    /// `cluster.auth` keys; `None` when auth is disabled.
    pub auth: Option<Keys>,
    /// `cluster.tls`; `None` when TLS is disabled.
    pub tls: Option<Arc<TlsConfig>>,
    /// `message_bus.handshake_grace`: TLS plus the whole handshake.
    pub handshake_grace: Duration,
    /// `message_bus.reconnect_period`: the sweep period and each dial's connect timeout.
    pub reconnect_period: Duration,
    /// `message_bus.max_message_size`.
    pub max_message_size: usize,
    /// `message_bus.peer_queue_capacity`.
    pub peer_queue_capacity: usize,
    /// `message_bus.max_batch`.
    pub max_batch: usize,
    /// `network.tcp_congestion_control`: set on the replica listener before it listens and on
    /// every dial before it connects (decision 501); `None` keeps the kernel's default.
    pub congestion: Option<super::CongestionControl>,
}

impl NetConfig {
    /// A configuration with every default of architecture.md section 10 (auth and TLS off).
    pub fn new(cluster: u128, self_id: u8, roster: Vec<Peer>) -> NetConfig {
        NetConfig {
            cluster,
            self_id,
            roster,
            lanes: LANES_DEFAULT,
            auth: None,
            tls: None,
            handshake_grace: HANDSHAKE_GRACE_DEFAULT,
            reconnect_period: RECONNECT_PERIOD_DEFAULT,
            max_message_size: wire::MAX_MESSAGE_SIZE_DEFAULT,
            peer_queue_capacity: PEER_QUEUE_CAPACITY_DEFAULT,
            max_batch: MAX_BATCH_DEFAULT,
            congestion: None,
        }
    }

    /// Checks every rule the replica plane relies on, for a node with `shards` shards.
    pub fn validate(&self, shards: usize) -> Result<(), ConfigError> {
        if !(1..=LANES_MAX).contains(&self.lanes) {
            return Err(ConfigError::Lanes(self.lanes));
        }
        if shards > usize::from(self.lanes) {
            return Err(ConfigError::LanesBelowShards {
                lanes: self.lanes,
                shards,
            });
        }
        let ids_in_order = self
            .roster
            .iter()
            .enumerate()
            .all(|(i, peer)| usize::from(peer.id) == i);
        if !ids_in_order
            || usize::from(self.self_id) >= self.roster.len()
            || self.roster.len() > 255
        {
            return Err(ConfigError::Roster(self.self_id));
        }
        if !(1..=MAX_BATCH_MAX).contains(&self.max_batch) {
            return Err(ConfigError::MaxBatch(self.max_batch));
        }
        if self.peer_queue_capacity == 0 {
            return Err(ConfigError::QueueCapacity);
        }
        if self.tls.is_some() && self.auth.is_none() {
            return Err(ConfigError::TlsWithoutAuth);
        }
        if self.handshake_grace.is_zero() {
            return Err(ConfigError::ZeroDuration("message_bus.handshake_grace"));
        }
        if self.reconnect_period.is_zero() {
            return Err(ConfigError::ZeroDuration("message_bus.reconnect_period"));
        }
        if self.max_message_size < wire::HEADER_SIZE {
            return Err(ConfigError::MaxMessageSize(self.max_message_size));
        }
        Ok(())
    }

    /// Roster size.
    pub fn replica_count(&self) -> u8 {
        u8::try_from(self.roster.len()).expect("validated: at most 255 replicas")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NetConfig {
        let roster = (0..3)
            .map(|id| Peer {
                id,
                name: format!("node-{id}"),
                addr: SocketAddr::from(([127, 0, 0, 1], 9090 + u16::from(id))),
            })
            .collect();
        NetConfig::new(7, 1, roster)
    }

    /// A way to break a valid configuration, the shard count to validate with, the error.
    type Broken = (fn(&mut NetConfig), usize, ConfigError);

    #[test]
    fn defaults_are_valid_and_every_rule_is_enforced() {
        assert_eq!(config().validate(16), Ok(()));
        let broken: [Broken; 8] = [
            (|c| c.lanes = 0, 1, ConfigError::Lanes(0)),
            (|c| c.lanes = 257, 1, ConfigError::Lanes(257)),
            (
                |c| c.lanes = 4,
                8,
                ConfigError::LanesBelowShards {
                    lanes: 4,
                    shards: 8,
                },
            ),
            (|c| c.self_id = 3, 1, ConfigError::Roster(3)),
            (|c| c.roster.swap(0, 1), 1, ConfigError::Roster(1)),
            (|c| c.max_batch = 513, 1, ConfigError::MaxBatch(513)),
            (
                |c| c.handshake_grace = Duration::ZERO,
                1,
                ConfigError::ZeroDuration("message_bus.handshake_grace"),
            ),
            (
                |c| c.max_message_size = 255,
                1,
                ConfigError::MaxMessageSize(255),
            ),
        ];
        for (breaks, shards, error) in broken {
            let mut config = config();
            breaks(&mut config);
            assert_eq!(config.validate(shards), Err(error));
        }
        let mut tls_only = config();
        tls_only.tls = Some(Arc::new(TlsConfig::self_signed("node-1").unwrap()));
        assert_eq!(tls_only.validate(1), Err(ConfigError::TlsWithoutAuth));
    }
}
