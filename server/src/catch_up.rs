//! When a restarted node's metadata replica has caught up in this process life (decision 397).
//!
//! A node boots its metadata replica from its checkpoint and the WAL prefix it can prove
//! committed, which may be behind what it applied before the crash: a purge or delete it
//! applied (and that decision 395's reply gate counted) may be learned again only from the
//! primary. Partition pumps must not boot groups from such a view, or the dead incarnation
//! on the disk runs again. The metadata pump feeds this tracker and publishes the answer into
//! the shared [`crate::metadata::view::MetadataHandle`] once, the first time it holds:
//!
//! - the replica is in normal status, and
//! - it is the acting primary, or it heard the current view's primary in this life (a
//!   Prepare, Commit or StartView that the primary stamped with that view, received from the
//!   primary's own connection), and
//! - `commit_min >= commit_max`: it applied everything it knows committed, which includes
//!   the commit point that primary announced (and the one its own superblock recorded).
//!
//! A single-replica cluster is its own primary once normal. A replica that restarts with a
//! prior life in a larger cluster starts in recovering status (consensus core) and becomes
//! normal only through a view change or a StartView, so the first condition alone already
//! needs peers of this life; the second pins the announcement the third is measured against.

use consensus::Status;
use wire::Command;
use wire::header::{GenericHeader, Layout};

/// The catch-up tracker of one metadata replica.
#[derive(Debug, Default)]
pub struct CatchUp {
    /// The latest view whose primary this replica heard from, in this process life.
    heard_view: Option<u32>,
    /// Latched: caught up once stays caught up for the process life.
    done: bool,
}

/// The replica's state the verdict reads (a snapshot of `consensus::Replica`'s accessors).
#[derive(Debug, Clone, Copy)]
pub struct ReplicaState {
    /// `Replica::status`.
    pub status: Status,
    /// `Replica::is_primary`.
    pub is_primary: bool,
    /// `Replica::view`.
    pub view: u32,
    /// `Replica::commit_min`.
    pub commit_min: u64,
    /// `Replica::commit_max`.
    pub commit_max: u64,
}

impl CatchUp {
    /// A frame from the connection of replica `from` was stepped; `view` and `primary` are
    /// the replica's view and that view's primary index after the step. Counted only from the
    /// primary of that view, stamped with that view, and only the commands by which a primary
    /// announces its commit point (a backup's frames say nothing about what is committed).
    pub fn heard(&mut self, from: u8, frame: &[u8], view: u32, primary: u8) {
        let Some(h) = GenericHeader::view(frame).map(|g| &g.frame) else {
            return;
        };
        let announces = [Command::Prepare, Command::Commit, Command::StartView]
            .iter()
            .any(|c| c.byte() == h.command);
        if announces && from == primary && h.replica == from && h.view.get() == view {
            self.heard_view = Some(self.heard_view.map_or(view, |v| v.max(view)));
        }
    }

    /// Whether the replica has caught up (decision 397). Returns `true` exactly once, the
    /// first time it holds; the caller publishes it then.
    pub fn check(&mut self, r: ReplicaState) -> bool {
        if self.done {
            return false;
        }
        let heard = r.is_primary || self.heard_view == Some(r.view);
        if r.status == Status::Normal && heard && r.commit_min >= r.commit_max {
            self.done = true;
            return true;
        }
        false
    }

    /// Whether [`Self::check`] has held.
    pub fn is_done(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::HEADER_SIZE;

    fn frame(command: Command, replica: u8, view: u32) -> Vec<u8> {
        let mut bytes = vec![0u8; HEADER_SIZE];
        bytes[52..56].copy_from_slice(&view.to_le_bytes());
        bytes[60] = command.byte();
        bytes[61] = replica;
        bytes
    }

    fn state(status: Status, is_primary: bool, view: u32, min: u64, max: u64) -> ReplicaState {
        ReplicaState {
            status,
            is_primary,
            view,
            commit_min: min,
            commit_max: max,
        }
    }

    #[test]
    fn a_lone_primary_is_caught_up_once_normal_and_applied() {
        let mut c = CatchUp::default();
        assert!(!c.check(state(Status::Recovering, false, 0, 3, 3)));
        assert!(!c.check(state(Status::Normal, true, 0, 2, 3)));
        assert!(c.check(state(Status::Normal, true, 0, 3, 3)));
        // Latched: said once, and a later view change does not take it back.
        assert!(!c.check(state(Status::ViewChange, false, 1, 3, 4)));
        assert!(c.is_done());
    }

    #[test]
    fn a_backup_waits_for_its_primarys_announcement_and_for_applying_it() {
        let mut c = CatchUp::default();
        // Normal, applied all it knows, but nothing heard from the primary in this life.
        assert!(!c.check(state(Status::Normal, false, 3, 5, 5)));
        // Frames that do not count: a backup's, another view's, a forwarded prepare (the
        // connection is not its author's), a command that announces nothing.
        c.heard(2, &frame(Command::Commit, 2, 3), 3, 0);
        c.heard(0, &frame(Command::Commit, 0, 2), 3, 0);
        c.heard(1, &frame(Command::Prepare, 0, 3), 3, 0);
        c.heard(0, &frame(Command::PrepareOk, 0, 3), 3, 0);
        c.heard(0, &[0u8; 10], 3, 0);
        assert!(!c.check(state(Status::Normal, false, 3, 5, 5)));
        // The primary's heartbeat announced commit 9: not caught up until 9 is applied.
        c.heard(0, &frame(Command::Commit, 0, 3), 3, 0);
        assert!(!c.check(state(Status::Normal, false, 3, 5, 9)));
        assert!(!c.check(state(Status::Recovering, false, 3, 9, 9)));
        assert!(c.check(state(Status::Normal, false, 3, 9, 9)));
    }

    #[test]
    fn a_view_heard_before_a_view_change_does_not_count_in_the_next() {
        let mut c = CatchUp::default();
        c.heard(0, &frame(Command::StartView, 0, 3), 3, 0);
        assert!(!c.check(state(Status::Normal, false, 4, 9, 9)));
        c.heard(1, &frame(Command::Prepare, 1, 4), 4, 1);
        assert!(c.check(state(Status::Normal, false, 4, 9, 9)));
    }
}
