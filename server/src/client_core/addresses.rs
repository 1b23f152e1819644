//! The peer addresses of this node's client connections, by client id (decision 384):
//! GetClient and GetClients report a session's address when its connection is on this node.
//!
//! Each connection maps at most one client id (the last one its requests carried), and its
//! entry goes when the connection closes or carries another id, so the map holds at most one
//! entry per open connection whatever the clients send.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Client id → (the connection that last carried it, its peer address), for this node.
#[derive(Debug, Default)]
pub struct ClientAddresses {
    map: Mutex<HashMap<u128, (u64, SocketAddr)>>,
    next: AtomicU64,
}

impl ClientAddresses {
    /// A node-wide token for a new connection.
    pub fn connection(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// `connection` (from `peer`) carries `client` now.
    pub fn note(&self, client: u128, connection: u64, peer: SocketAddr) {
        if let Ok(mut map) = self.map.lock() {
            map.insert(client, (connection, peer));
        }
    }

    /// `connection` no longer carries `client` (closed, or another id): the entry goes unless
    /// a newer connection took it over.
    pub fn forget(&self, client: u128, connection: u64) {
        if let Ok(mut map) = self.map.lock()
            && map.get(&client).is_some_and(|(c, _)| *c == connection)
        {
            map.remove(&client);
        }
    }

    /// The address `client` is connected from, if its connection is on this node.
    pub fn get(&self, client: u128) -> Option<SocketAddr> {
        self.map.lock().ok()?.get(&client).map(|(_, a)| *a)
    }

    /// Entries held (at most the open connections).
    pub fn len(&self) -> usize {
        self.map.lock().map_or(0, |m| m.len())
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's entry follows its newest connection; the old connection's close leaves it;
    /// a connection that switches ids or closes leaves nothing behind.
    #[test]
    fn entries_follow_the_newest_connection_and_go_with_it() {
        let a = ClientAddresses::default();
        let (one, two) = (a.connection(), a.connection());
        let p1: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let p2: SocketAddr = "10.0.0.2:6000".parse().unwrap();
        a.note(7, one, p1);
        assert_eq!(a.get(7), Some(p1));
        a.note(7, two, p2);
        a.forget(7, one);
        assert_eq!(a.get(7), Some(p2), "the old connection's close");
        a.forget(7, two);
        assert_eq!((a.get(7), a.len()), (None, 0));
    }
}
