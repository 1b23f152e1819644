//! Invariant checkers (simulation.md §2). The simulator feeds them what it observes: effects as
//! the replicas emit them, durable state from the storage model, and each replica's public state
//! after every step. Checkers never draw randomness and never change the run; they only record
//! violations, each naming its invariant.

use std::collections::BTreeMap;
use std::fmt;

use wire::header::PrepareHeader;

/// The invariants the checkers enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// §2.1: no two replicas commit different prepares at the same op of a group.
    Agreement,
    /// §2.2: an op whose reply reached a client stays committed with the same identity.
    ReplyStaysCommitted,
    /// §2.3 / journal.md G1: a PrepareOk leaves only for a prepare durable on the sender's disk.
    AckDurable,
    /// §2.4: view, log_view, commit_min and commit_max never go back within a life; the durable
    /// view never goes back across restarts.
    Monotonic,
    /// §2.5: at most one Normal primary per view of a group.
    SinglePrimary,
    /// §2.6: every view-scoped frame has `view <= durable view` of its sender.
    DurableBeforeSend,
    /// §2.7: replies for `(client, request)` are identical (view bytes masked).
    ReplyDeterminism,
    /// §12: a metadata request `(client, request)` commits at most once.
    ExactlyOnce,
    /// §5.10: every committed prepare's parent is the identity of the committed op below it.
    HashChain,
    /// The core's own state is inconsistent (`commit_min > commit_max`, `log_view > view`).
    LocalState,
    /// Decision 51: no DoViewChange nacks an op its sender acknowledged in the view whose log
    /// it claims (its `log_view`), in any life of that replica's data directory.
    NackAcked,
    /// Decision 61: no replica acknowledges a prepare in a view below one it sent a
    /// DoViewChange for, in any life (a wiped replica forgets its votes; its peers do not).
    AckInSupersededView,
    /// §2.11: after healing, outstanding requests complete and replicas converge within a bound.
    Liveness,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Invariant::Agreement => "agreement",
            Invariant::ReplyStaysCommitted => "reply-stays-committed",
            Invariant::AckDurable => "ack-durable",
            Invariant::Monotonic => "monotonic",
            Invariant::SinglePrimary => "single-primary",
            Invariant::DurableBeforeSend => "durable-before-send",
            Invariant::ReplyDeterminism => "reply-determinism",
            Invariant::ExactlyOnce => "exactly-once",
            Invariant::HashChain => "hash-chain",
            Invariant::LocalState => "local-state",
            Invariant::NackAcked => "nack-acked",
            Invariant::AckInSupersededView => "ack-in-superseded-view",
            Invariant::Liveness => "liveness",
        };
        f.write_str(name)
    }
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Tick of detection.
    pub tick: u64,
    /// Which invariant.
    pub invariant: Invariant,
    /// What was seen.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tick {}: {}: {}", self.tick, self.invariant, self.detail)
    }
}

/// A replica's public state as the checker sees it after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observed {
    /// `view`.
    pub view: u32,
    /// `log_view`.
    pub log_view: u32,
    /// `commit_min`.
    pub commit_min: u64,
    /// `commit_max`.
    pub commit_max: u64,
    /// Normal and the non-ceded primary of `view`.
    pub normal_primary: bool,
}

/// A committed prepare as the checker records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommittedOp {
    /// Prepare identity.
    pub identity: u128,
    /// Prepare `parent`.
    pub parent: u128,
    /// First replica seen applying it.
    pub replica: u8,
    /// The request's client.
    pub client: u128,
    /// The request number.
    pub request: u64,
    /// The operation byte.
    pub operation: u8,
}

/// The checkers' state.
#[derive(Debug, Default)]
pub struct Checker {
    /// `(group, op) -> prepare` for every op any replica applied.
    pub committed: BTreeMap<(u64, u64), CommittedOp>,
    /// `(group, op) -> (identity, view)`: ops whose reply reached a client, with the view the
    /// replying primary stamped (the op was committed in that view or an earlier one).
    replied: BTreeMap<(u64, u64), (u128, u32)>,
    replies: BTreeMap<(u64, u128, u64, u64), Vec<u8>>,
    bodies: BTreeMap<(u64, u64), (u64, u8)>,
    executed: BTreeMap<(u128, u64), u64>,
    last: BTreeMap<(u8, u64), Observed>,
    durable_view: BTreeMap<(u8, u64), (u32, u32)>,
    primaries: BTreeMap<(u64, u32), u8>,
    /// `(group, replica, view, op)` of every PrepareOk sent (cleared when the replica's data
    /// directory is wiped).
    acks: std::collections::BTreeSet<(u64, u8, u32, u64)>,
    /// The acknowledged ops already reported nacked (each is reported once).
    nacked_acks: std::collections::BTreeSet<(u64, u8, u32, u64)>,
    /// `(replica, group) -> highest view` of a DoViewChange it sent, across lives and wipes.
    voted: BTreeMap<(u8, u64), u32>,
    /// Every violation found, in detection order.
    pub violations: Vec<Violation>,
}

impl Checker {
    fn violate(&mut self, tick: u64, invariant: Invariant, detail: String) {
        self.violations.push(Violation {
            tick,
            invariant,
            detail,
        });
    }

    /// A replica committed (applied) the prepare `header` at `op` of `group`.
    pub fn on_apply(
        &mut self,
        tick: u64,
        replica: u8,
        group: u64,
        op: u64,
        header: &PrepareHeader,
    ) {
        let identity = header.frame.checksum.get();
        let parent = header.parent.get();
        let record = CommittedOp {
            identity,
            parent,
            replica,
            client: header.client.get(),
            request: header.request.get(),
            operation: header.operation,
        };
        match self.committed.get(&(group, op)) {
            Some(first) if first.identity != identity => {
                let detail = format!(
                    "group {group:#x} op {op}: r{replica} applied {identity:#034x}, r{} applied {:#034x}",
                    first.replica, first.identity
                );
                self.violate(tick, Invariant::Agreement, detail);
            }
            Some(_) => {}
            None => {
                self.committed.insert((group, op), record);
                // Metadata requests are exactly-once per (client, request) (consensus.md §12);
                // Register may commit again (a re-register moves the epoch), partition ops are
                // at-least-once.
                let metadata_op =
                    wire::Operation::from_byte(record.operation).is_some_and(|o| o.is_metadata());
                if wire::GroupId(group).is_metadata() && metadata_op {
                    let first = *self
                        .executed
                        .entry((record.client, record.request))
                        .or_insert(op);
                    if first != op {
                        let detail = format!(
                            "client {:#x} request {} committed at op {first} and again at op {op}",
                            record.client, record.request
                        );
                        self.violate(tick, Invariant::ExactlyOnce, detail);
                    }
                }
            }
        }
        if let Some(&(reply, _)) = self.replied.get(&(group, op))
            && reply != identity
        {
            let detail = format!(
                "group {group:#x} op {op}: a client got a reply for {reply:#034x}, r{replica} applied {identity:#034x}"
            );
            self.violate(tick, Invariant::ReplyStaysCommitted, detail);
        }
        let below = if op > 1 {
            self.committed.get(&(group, op - 1)).map(|c| c.identity)
        } else {
            Some(0)
        };
        if let Some(below) = below
            && below != parent
        {
            let detail = format!(
                "group {group:#x} op {op}: r{replica} applied a prepare whose parent {parent:#034x} is not op {}'s identity {below:#034x}",
                op - 1
            );
            self.violate(tick, Invariant::HashChain, detail);
        }
        if let Some(above) = self.committed.get(&(group, op + 1)).copied()
            && above.parent != identity
        {
            let detail = format!(
                "group {group:#x} op {op}: committed op {} names parent {:#034x}, r{replica} applied {identity:#034x}",
                op + 1,
                above.parent
            );
            self.violate(tick, Invariant::HashChain, detail);
        }
    }

    /// A replica's state machine applied a body with digest `body_digest` at `op`: every
    /// replica must apply the same bytes (offset integrity, §2.9: partition identities do not
    /// cover the stamped body).
    pub fn on_apply_body(&mut self, tick: u64, replica: u8, group: u64, op: u64, body_digest: u64) {
        match self.bodies.get(&(group, op)) {
            Some(&(first, other)) if first != body_digest => {
                let detail = format!(
                    "group {group:#x} op {op}: r{replica} applied body {body_digest:#018x}, r{other} applied {first:#018x}"
                );
                self.violate(tick, Invariant::Agreement, detail);
            }
            Some(_) => {}
            None => {
                self.bodies.insert((group, op), (body_digest, replica));
            }
        }
    }

    /// A client accepted a committed reply for `(client, request)` saying `op` of `group`;
    /// `masked` is the reply frame with its view bytes (52..56) and seal (0..16) zeroed. The
    /// prepare committed at `op` must be exactly that request.
    #[allow(clippy::too_many_arguments)]
    pub fn on_reply(
        &mut self,
        tick: u64,
        group: u64,
        client: u128,
        request: u64,
        op: u64,
        operation: u8,
        view: u32,
        masked: Vec<u8>,
    ) {
        match self.committed.get(&(group, op)).copied() {
            None => {
                let detail = format!(
                    "group {group:#x}: client {client:#x} request {request} got a reply for op {op}, which no replica committed"
                );
                self.violate(tick, Invariant::ReplyStaysCommitted, detail);
            }
            Some(c) if c.client != client || c.request != request || c.operation != operation => {
                let detail = format!(
                    "group {group:#x} op {op}: reply to client {client:#x} request {request} (operation {operation}), but op {op} committed client {:#x} request {} (operation {})",
                    c.client, c.request, c.operation
                );
                self.violate(tick, Invariant::ReplyStaysCommitted, detail);
            }
            Some(c) => {
                self.replied
                    .entry((group, op))
                    .or_insert((c.identity, view));
            }
        }
        // Partition requests reuse request numbers and are at-least-once (client-plane.md
        // §2.3): their replies are compared per committed op.
        let key = (
            group,
            client,
            request,
            if wire::GroupId(group).is_metadata() {
                0
            } else {
                op
            },
        );
        match self.replies.get(&key) {
            Some(previous) if *previous != masked => {
                let detail = format!(
                    "group {group:#x}: two different replies for client {client:#x} request {request}"
                );
                self.violate(tick, Invariant::ReplyDeterminism, detail);
            }
            Some(_) => {}
            None => {
                self.replies.insert(key, masked);
            }
        }
    }

    /// Ops of `group` whose reply reached a client, with the identity committed there and the
    /// view of the reply.
    pub fn replied_ops(&self, group: u64) -> impl Iterator<Item = (u64, u128, u32)> + '_ {
        self.replied
            .range((group, 0)..=(group, u64::MAX))
            .map(|(&(_, op), &(id, view))| (op, id, view))
    }

    /// A replica sent a DoViewChange revealing `log_view` while its superblock durably holds
    /// `durable_log_view` (§8.10 gates the pair, not only the view).
    pub fn on_log_view_send(
        &mut self,
        tick: u64,
        replica: u8,
        group: u64,
        log_view: u32,
        durable_log_view: u32,
    ) {
        if log_view > durable_log_view {
            let detail = format!(
                "group {group:#x}: r{replica} sent DoViewChange with log_view {log_view}, durable log_view is {durable_log_view}"
            );
            self.violate(tick, Invariant::DurableBeforeSend, detail);
        }
    }

    /// A replica became Normal primary of `view` without holding the replied op `op` above its
    /// commit point (it holds `held` there instead): a later primary lost a committed op.
    pub fn on_primary_lacks(
        &mut self,
        tick: u64,
        replica: u8,
        group: u64,
        view: u32,
        op: u64,
        held: Option<u128>,
    ) {
        let expected = self.replied.get(&(group, op)).map_or(0, |r| r.0);
        let detail = format!(
            "group {group:#x}: r{replica} became primary of view {view} holding {held:x?} at replied op {op} (committed {expected:#034x})"
        );
        self.violate(tick, Invariant::ReplyStaysCommitted, detail);
    }

    /// A partition replica's next offset is below the end of a batch it applied (G8).
    pub fn on_offset_rewind(&mut self, tick: u64, replica: u8, group: u64, next: u64, end: u64) {
        let detail = format!(
            "group {group:#x}: r{replica} next offset {next} is below the end {end} of a committed batch"
        );
        self.violate(tick, Invariant::Monotonic, detail);
    }

    /// Converged replicas hold different replicated state.
    pub fn on_state_divergence(&mut self, tick: u64, detail: String) {
        self.violate(tick, Invariant::Agreement, detail);
    }

    /// A replica sent a PrepareOk for `(op, identity)`; `durable` is the identity its disk holds
    /// durably at that op, if any.
    pub fn on_prepare_ok(
        &mut self,
        tick: u64,
        replica: u8,
        group: u64,
        op: u64,
        identity: u128,
        durable: Option<u128>,
    ) {
        if durable != Some(identity) {
            let detail = format!(
                "group {group:#x}: r{replica} acked op {op} {identity:#034x} but its disk holds {durable:?}"
            );
            self.violate(tick, Invariant::AckDurable, detail);
        }
    }

    /// A replica sent a DoViewChange for `view`: it promised never to acknowledge in an older
    /// view. Kept across restarts and wipes (the replica may forget; the promise stands).
    pub fn on_do_view_change_sent(&mut self, replica: u8, group: u64, view: u32) {
        let voted = self.voted.entry((replica, group)).or_insert(view);
        *voted = (*voted).max(view);
    }

    /// A replica sent a PrepareOk stamped `view` for `op`.
    pub fn on_prepare_ok_view(&mut self, tick: u64, replica: u8, group: u64, op: u64, view: u32) {
        if let Some(&voted) = self.voted.get(&(replica, group))
            && view < voted
        {
            let detail = format!(
                "group {group:#x}: r{replica} acked op {op} in view {view} after voting (DoViewChange) for view {voted}"
            );
            self.violate(tick, Invariant::AckInSupersededView, detail);
        }
    }

    /// A replica sent a view-scoped frame stamped `view` while its superblock durably holds
    /// `durable_view`.
    pub fn on_view_scoped_send(
        &mut self,
        tick: u64,
        replica: u8,
        group: u64,
        command: &str,
        view: u32,
        durable_view: u32,
    ) {
        if view > durable_view {
            let detail = format!(
                "group {group:#x}: r{replica} sent {command} of view {view}, durable view is {durable_view}"
            );
            self.violate(tick, Invariant::DurableBeforeSend, detail);
        }
    }

    /// The durable `(view, log_view)` of a replica's group (after a superblock write completed
    /// or at recovery). It must never go back.
    pub fn on_durable_view(
        &mut self,
        tick: u64,
        replica: u8,
        group: u64,
        view: u32,
        log_view: u32,
    ) {
        let previous = self.durable_view.insert((replica, group), (view, log_view));
        if let Some((pv, plv)) = previous
            && (view < pv || log_view < plv)
        {
            let detail = format!(
                "group {group:#x}: r{replica} durable (view, log_view) went from ({pv}, {plv}) to ({view}, {log_view})"
            );
            self.violate(tick, Invariant::Monotonic, detail);
        }
    }

    /// A replica's data directory was wiped: its durable view starts over (the operator's
    /// choice, not a regression).
    pub fn on_wipe(&mut self, replica: u8) {
        self.durable_view.retain(|(r, _), _| *r != replica);
        // A wiped replica lost what it acknowledged (decision 28 keeps it from voting).
        self.acks.retain(|(_, r, _, _)| *r != replica);
    }

    /// A replica sent a PrepareOk for `op` in `view`.
    pub fn on_ack(&mut self, replica: u8, group: u64, view: u32, op: u64) {
        self.acks.insert((group, replica, view, op));
    }

    /// A replica sent a DoViewChange claiming the log of `log_view` up to `head` and nacking
    /// `nacked` ops: none of them, and no op above `head` (the merge counts those as nacks
    /// too), may be an op it acknowledged in `log_view` (decision 51).
    pub fn on_dvc_nacks(
        &mut self,
        tick: u64,
        replica: u8,
        group: u64,
        log_view: u32,
        head: u64,
        nacked: &[u64],
    ) {
        let above_head: Vec<u64> = self
            .acks
            .range(
                (group, replica, log_view, head.saturating_add(1))
                    ..=(group, replica, log_view, u64::MAX),
            )
            .map(|a| a.3)
            .collect();
        for op in nacked.iter().copied().chain(above_head) {
            if self.acks.contains(&(group, replica, log_view, op))
                && self.nacked_acks.insert((group, replica, log_view, op))
            {
                let detail = format!(
                    "group {group:#x}: r{replica} nacked op {op} in a DoViewChange claiming log_view {log_view}, in which it acknowledged that op"
                );
                self.violate(tick, Invariant::NackAcked, detail);
            }
        }
    }

    /// A replica restarted: its in-memory state starts a new life.
    pub fn on_restart(&mut self, replica: u8) {
        self.last.retain(|(r, _), _| *r != replica);
    }

    /// A replica's public state after a step.
    pub fn observe(&mut self, tick: u64, replica: u8, group: u64, now: Observed) {
        if now.commit_min > now.commit_max {
            let detail = format!(
                "group {group:#x}: r{replica} commit_min {} > commit_max {}",
                now.commit_min, now.commit_max
            );
            self.violate(tick, Invariant::LocalState, detail);
        }
        if now.log_view > now.view {
            let detail = format!(
                "group {group:#x}: r{replica} log_view {} > view {}",
                now.log_view, now.view
            );
            self.violate(tick, Invariant::LocalState, detail);
        }
        if let Some(before) = self.last.get(&(replica, group)).copied() {
            let fields = [
                ("view", u64::from(before.view), u64::from(now.view)),
                (
                    "log_view",
                    u64::from(before.log_view),
                    u64::from(now.log_view),
                ),
                ("commit_min", before.commit_min, now.commit_min),
                ("commit_max", before.commit_max, now.commit_max),
            ];
            for (name, was, is) in fields {
                if is < was {
                    let detail =
                        format!("group {group:#x}: r{replica} {name} went from {was} to {is}");
                    self.violate(tick, Invariant::Monotonic, detail);
                }
            }
        }
        self.last.insert((replica, group), now);
        if now.normal_primary {
            match self.primaries.get(&(group, now.view)).copied() {
                Some(other) if other != replica => {
                    let detail = format!(
                        "group {group:#x} view {}: r{replica} and r{other} both acted as Normal primary",
                        now.view
                    );
                    self.violate(tick, Invariant::SinglePrimary, detail);
                }
                Some(_) => {}
                None => {
                    self.primaries.insert((group, now.view), replica);
                }
            }
        }
    }

    /// A liveness failure found by the simulator (stall or divergence after healing).
    pub fn on_liveness(&mut self, tick: u64, detail: String) {
        self.violate(tick, Invariant::Liveness, detail);
    }

    /// Highest op applied anywhere in `group`.
    pub fn committed_head(&self, group: u64) -> u64 {
        self.committed
            .range((group, 0)..=(group, u64::MAX))
            .next_back()
            .map_or(0, |(k, _)| k.1)
    }

    /// Number of distinct committed ops over every group.
    pub fn committed_ops(&self) -> u64 {
        self.committed.len() as u64
    }

    /// Safety violations (everything but liveness).
    pub fn safety_violations(&self) -> impl Iterator<Item = &Violation> {
        self.violations
            .iter()
            .filter(|v| v.invariant != Invariant::Liveness)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_and_chain() {
        use wire::header::Layout;
        let h = |identity: u128, parent: u128| {
            let mut h = PrepareHeader::zeroed();
            h.frame.checksum.set(identity);
            h.parent.set(parent);
            h
        };
        let mut c = Checker::default();
        c.on_apply(1, 0, 7, 1, &h(0xA, 0));
        c.on_apply(1, 1, 7, 1, &h(0xA, 0));
        assert!(c.violations.is_empty());
        c.on_apply(2, 2, 7, 1, &h(0xB, 0));
        assert_eq!(c.violations[0].invariant, Invariant::Agreement);
        c.on_apply(3, 0, 7, 2, &h(0xC, 0xDEAD));
        assert_eq!(c.violations[1].invariant, Invariant::HashChain);
    }

    #[test]
    fn monotonic_within_a_life_only() {
        let mut c = Checker::default();
        let o = |commit| Observed {
            commit_min: commit,
            commit_max: commit,
            ..Observed::default()
        };
        c.observe(1, 0, 7, o(5));
        c.observe(2, 0, 7, o(4));
        assert_eq!(c.violations.len(), 2); // commit_min and commit_max
        c.on_restart(0);
        c.observe(3, 0, 7, o(2));
        assert_eq!(c.violations.len(), 2);
    }

    #[test]
    fn an_ack_below_a_view_voted_for_in_any_life() {
        let mut c = Checker::default();
        c.on_prepare_ok_view(1, 1, 7, 1, 0);
        c.on_do_view_change_sent(1, 7, 1);
        c.on_prepare_ok_view(2, 1, 7, 1, 1);
        c.on_prepare_ok_view(2, 2, 7, 1, 0);
        assert!(c.violations.is_empty());
        c.on_wipe(1);
        c.on_restart(1);
        c.on_prepare_ok_view(3, 1, 7, 1, 0);
        assert_eq!(c.violations[0].invariant, Invariant::AckInSupersededView);
    }

    #[test]
    fn single_primary() {
        let mut c = Checker::default();
        let p = Observed {
            view: 3,
            log_view: 3,
            normal_primary: true,
            ..Observed::default()
        };
        c.observe(1, 0, 7, p);
        c.observe(1, 1, 7, p);
        assert_eq!(c.violations[0].invariant, Invariant::SinglePrimary);
    }
}
