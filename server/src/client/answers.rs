//! The node-level answers (client-plane.md §6.4, §6.5) built from the config, the metadata
//! group's state as this node sees it, and the committed metadata.

use super::reply::{ClusterMetadata, ClusterNode, Stats};
use crate::config::Config;
use crate::metadata::view::MetadataView;

/// GetClusterMetadata's `role` of the metadata primary.
pub const ROLE_LEADER: u8 = 0;
/// GetClusterMetadata's `role` of every other node.
pub const ROLE_FOLLOWER: u8 = 1;
/// GetClusterMetadata's `status` of a node this one reaches.
pub const STATUS_HEALTHY: u8 = 0;
/// GetClusterMetadata's `status` of a node it does not.
pub const STATUS_UNREACHABLE: u8 = 3;

/// The roster as clients see it: each node's client-facing address (`advertised_address`,
/// else `ip`) and ports; the leader is the metadata group's primary when this node knows one
/// (`primary`), which the SDK follows (§2.1 step 4); a node is healthy when it is this node
/// or `reachable` says so. With no known primary every node is a follower, and the SDK keeps
/// polling for a leader (or stays where it is on a one-node roster).
pub fn cluster_metadata(
    config: &Config,
    primary: Option<u8>,
    reachable: impl Fn(u8) -> bool,
) -> ClusterMetadata {
    ClusterMetadata {
        name: config.cluster.name.clone(),
        nodes: config
            .cluster
            .nodes
            .iter()
            .map(|n| ClusterNode {
                name: n.name.clone(),
                ip: n
                    .advertised_address
                    .clone()
                    .unwrap_or_else(|| n.ip.to_string()),
                tcp: n.ports.tcp,
                quic: n.ports.quic.unwrap_or(0),
                http: n.ports.http,
                websocket: n.ports.websocket.unwrap_or(0),
                role: if primary == Some(n.replica_id) {
                    ROLE_LEADER
                } else {
                    ROLE_FOLLOWER
                },
                status: if n.replica_id == config.replica_id || reachable(n.replica_id) {
                    STATUS_HEALTHY
                } else {
                    STATUS_UNREACHABLE
                },
            })
            .collect(),
    }
}

/// The metadata part of GetStats: stream, topic and partition counts and the server's
/// version; the caller adds process, message and client figures.
pub fn stats(view: &MetadataView) -> Stats {
    let (streams, topics, partitions) = view.counts();
    Stats {
        streams_count: streams,
        topics_count: topics,
        partitions_count: partitions,
        server_version: env!("CARGO_PKG_VERSION").to_owned(),
        ..Stats::default()
    }
}
