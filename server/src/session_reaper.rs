//! Ending the sessions whose node is gone (decisions 372-373; issue 11's "members on a failed
//! node").
//!
//! A session lives as long as the client table holds it, and its consumer-group memberships
//! with it (decision 317). When a node dies, nobody proposes the Logout of the sessions whose
//! connections died with it, so their groups keep dead members and the partitions assigned to
//! them starve. The replicated state records each session's origin (decision 370); this module,
//! run by the metadata pump on shard 0 of every node, picks the sessions to end:
//!
//! - **a peer down past the bound**: while this replica is the normal metadata primary, the
//!   sessions whose origin is a peer this node has seen disconnected (its shard-0 replica
//!   connection) for at least `cluster.dead_node_session_timeout`. Down times are tracked on
//!   every node from its boot, primary or not, so a new primary after a view change ends the
//!   sessions it inherits once its own observation passes the bound;
//! - **this node's own stale sessions**: while this replica is normal, the sessions whose
//!   origin is this node but whose Register this process never submitted. A restarted node
//!   holds no connections, so every session its earlier life registered is dead, however fast
//!   it came back (faster than the bound, the primary would never see it down).
//!
//! Each is ended by a Logout submitted to the local core like a client's (forwarded to the
//! primary from a backup, §13), so the commit runs `end_session` and the groups rebalance on
//! every replica. Nothing here is replicated: it reads the committed sessions and origins and
//! local observations, and decides only what to propose.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// A proposal is not repeated for the same client within this (its commit is on the way, or
/// it was refused and will be tried again).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);
/// Logouts proposed per scan at most (the rest follow at the next scans).
pub const PER_SCAN_MAX: usize = 32;
/// A Register this process submitted that is not in the committed sessions this long after is
/// forgotten (it failed; a retry submits it again).
pub const REGISTER_MEMORY: Duration = Duration::from_secs(60);

/// One committed session as the scan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The client id.
    pub client: u128,
    /// Its epoch (the Register's commit op, the session number a Logout names).
    pub epoch: u64,
    /// The session's user.
    pub user: u32,
    /// The origin replica, when its Register recorded one.
    pub origin: Option<u8>,
}

/// Why a session is ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Its origin peer has been down past the bound.
    PeerDown(u8),
    /// Its origin is this node, registered by an earlier life of it.
    StaleOwn,
}

/// The reaper's local observations.
#[derive(Debug)]
pub struct Reaper {
    self_id: u8,
    bound: Duration,
    /// Per replica id: since when this node sees it disconnected (`None`: connected, or self).
    down_since: Vec<Option<Instant>>,
    /// Clients this process submitted a Register for, with when.
    registered: BTreeMap<u128, Instant>,
    /// Clients whose Logout this reaper proposed, with when.
    proposed: BTreeMap<u128, Instant>,
}

impl Reaper {
    /// A reaper for replica `self_id` of `replica_count`, booted at `now`: every peer counts
    /// as down from now until it is reported connected.
    pub fn new(self_id: u8, replica_count: u8, bound: Duration, now: Instant) -> Reaper {
        Reaper {
            self_id,
            bound,
            down_since: (0..replica_count)
                .map(|r| (r != self_id).then_some(now))
                .collect(),
            registered: BTreeMap::new(),
            proposed: BTreeMap::new(),
        }
    }

    /// The shard-0 replica connection to `peer` went up or down.
    pub fn peer(&mut self, peer: u8, connected: bool, now: Instant) {
        if peer == self.self_id {
            return;
        }
        if let Some(slot) = self.down_since.get_mut(usize::from(peer)) {
            *slot = match (connected, *slot) {
                (true, _) => None,
                (false, Some(since)) => Some(since),
                (false, None) => Some(now),
            };
        }
    }

    /// This process submitted a Register for `client` (before it can commit).
    pub fn registered(&mut self, client: u128, now: Instant) {
        self.registered.insert(client, now);
    }

    /// The sessions to end now. `primary`: this replica is the normal metadata primary;
    /// `normal`: its metadata status is normal. Marks the returned ones proposed.
    pub fn due(
        &mut self,
        now: Instant,
        primary: bool,
        normal: bool,
        sessions: impl IntoIterator<Item = Session>,
    ) -> Vec<(Session, Reason)> {
        let mut due = Vec::new();
        let mut live = BTreeSet::new();
        for session in sessions {
            live.insert(session.client);
            if !normal || due.len() >= PER_SCAN_MAX {
                continue;
            }
            let Some(origin) = session.origin else {
                continue;
            };
            let reason = if origin == self.self_id {
                (!self.registered.contains_key(&session.client)).then_some(Reason::StaleOwn)
            } else {
                let down = self
                    .down_since
                    .get(usize::from(origin))
                    .copied()
                    .flatten()
                    .is_some_and(|since| now.saturating_duration_since(since) >= self.bound);
                (primary && down).then_some(Reason::PeerDown(origin))
            };
            let Some(reason) = reason else { continue };
            if self
                .proposed
                .get(&session.client)
                .is_some_and(|at| now.saturating_duration_since(*at) < RETRY_AFTER)
            {
                continue;
            }
            self.proposed.insert(session.client, now);
            due.push((session, reason));
        }
        // Forget what no longer needs remembering: ended sessions' proposals, and Registers
        // that never committed (a committed one stays while its session lives).
        self.proposed.retain(|client, _| live.contains(client));
        self.registered.retain(|client, at| {
            live.contains(client) || now.saturating_duration_since(*at) < REGISTER_MEMORY
        });
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_secs(5);

    fn session(client: u128, origin: Option<u8>) -> Session {
        Session {
            client,
            epoch: client as u64,
            user: 0,
            origin,
        }
    }

    fn clients(due: &[(Session, Reason)]) -> Vec<(u128, Reason)> {
        due.iter().map(|(s, r)| (s.client, *r)).collect()
    }

    #[test]
    fn a_peer_down_past_the_bound_loses_its_sessions_on_the_primary_only() {
        let t0 = Instant::now();
        let mut r = Reaper::new(0, 3, BOUND, t0);
        r.peer(1, true, t0);
        r.peer(2, true, t0);
        r.registered(10, t0);
        let all = [
            session(10, Some(0)),
            session(11, Some(1)),
            session(12, Some(2)),
            session(13, None),
        ];
        // Node 1 goes down; nothing before the bound.
        r.peer(1, false, t0 + Duration::from_secs(1));
        assert!(
            r.due(t0 + Duration::from_secs(5), true, true, all)
                .is_empty()
        );
        // A backup never ends a peer's sessions; a primary not normal neither.
        let after = t0 + Duration::from_secs(6);
        assert!(r.due(after, false, true, all).is_empty());
        assert!(r.due(after, true, false, all).is_empty());
        assert_eq!(
            clients(&r.due(after, true, true, all)),
            [(11, Reason::PeerDown(1))]
        );
        // Proposed: not again within RETRY_AFTER, again after it while the session lives.
        assert!(r.due(after, true, true, all).is_empty());
        assert_eq!(r.due(after + RETRY_AFTER, true, true, all).len(), 1);
    }

    #[test]
    fn a_brief_disconnection_resets_and_a_repeated_down_report_keeps_the_first_time() {
        let t0 = Instant::now();
        let mut r = Reaper::new(0, 3, BOUND, t0);
        r.peer(2, true, t0);
        r.peer(1, false, t0); // down since boot, reported again: still since t0
        let all = [session(11, Some(1)), session(12, Some(2))];
        // Node 2 flaps shorter than the bound each time: never due.
        for s in 0..4 {
            let at = t0 + Duration::from_secs(4 * s);
            r.peer(2, false, at);
            r.peer(2, true, at + Duration::from_secs(4));
        }
        let due = r.due(t0 + Duration::from_secs(16), true, true, all);
        assert_eq!(clients(&due), [(11, Reason::PeerDown(1))]);
    }

    #[test]
    fn own_sessions_of_an_earlier_life_end_and_this_lifes_stay() {
        let t0 = Instant::now();
        let mut r = Reaper::new(1, 3, BOUND, t0);
        r.registered(21, t0);
        let all = [
            session(20, Some(1)),
            session(21, Some(1)),
            session(22, Some(0)),
        ];
        // As a backup (not primary), at once: no bound for its own.
        assert_eq!(
            clients(&r.due(t0, false, true, all)),
            [(20, Reason::StaleOwn)]
        );
        // Not while not normal (its view of the sessions may be behind).
        let mut fresh = Reaper::new(1, 3, BOUND, t0);
        assert!(fresh.due(t0, false, false, all).is_empty());
    }

    #[test]
    fn a_register_is_remembered_while_its_session_lives_or_until_it_fails() {
        let t0 = Instant::now();
        let mut r = Reaper::new(0, 3, BOUND, t0);
        r.registered(5, t0);
        r.registered(6, t0);
        let later = t0 + REGISTER_MEMORY + Duration::from_secs(1);
        // 5 committed and lives; 6 never committed: forgotten after REGISTER_MEMORY.
        assert!(r.due(later, true, true, [session(5, Some(0))]).is_empty());
        // Had 6 committed after all, it would now count as stale (it is not this life's).
        let due = r.due(
            later,
            true,
            true,
            [session(5, Some(0)), session(6, Some(0))],
        );
        assert_eq!(clients(&due), [(6, Reason::StaleOwn)]);
    }

    #[test]
    fn a_scan_proposes_at_most_its_share() {
        let t0 = Instant::now();
        let mut r = Reaper::new(0, 2, BOUND, t0);
        let all: Vec<Session> = (1..=100).map(|c| session(c, Some(1))).collect();
        let at = t0 + BOUND;
        assert_eq!(r.due(at, true, true, all.clone()).len(), PER_SCAN_MAX);
        assert_eq!(r.due(at, true, true, all.clone()).len(), PER_SCAN_MAX);
        // Origins outside the cluster are ignored, never a panic.
        assert!(r.due(at, true, true, [session(1000, Some(9))]).is_empty());
    }
}
