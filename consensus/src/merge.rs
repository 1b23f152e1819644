//! The DoViewChange merge of §8.6, as a pure function over the received DVCs so it can be
//! property-tested in isolation. \[cluster\]: every replica must decide exactly like this.

use std::collections::BTreeMap;

use wire::header::PrepareHeader;

use crate::constants::UNCOMMITTED_WINDOW_MAX;

/// What one DVC says about one op of its suffix. Slots live only for the duration of a view
/// change, so the header is stored inline rather than boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// A header; `present`: the sender can serve the body.
    Held {
        header: PrepareHeader,
        present: bool,
    },
    /// A header the sender knows from its view's log without ever having journaled the body
    /// (decision 33): it describes the op and nacks it.
    HeldNack { header: PrepareHeader },
    /// A blank slot; `nack`: the sender proves it never prepared the op.
    Blank { nack: bool },
}

/// One received DoViewChange, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dvc {
    pub replica: u8,
    pub log_view: u32,
    pub op: u64,
    pub commit: u64,
    /// Suffix slots by op (ops outside the suffix are absent: the sender abstains).
    pub slots: BTreeMap<u64, Slot>,
}

impl Dvc {
    fn header(&self, op: u64) -> Option<&PrepareHeader> {
        match self.slots.get(&op) {
            Some(Slot::Held { header, .. } | Slot::HeldNack { header }) => Some(header),
            _ => None,
        }
    }
}

/// A decided log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Merged {
    pub op_head: u64,
    pub commit_max: u64,
    /// Headers of `max(commit_max, 1) ..= op_head` that are known, by op.
    pub headers: BTreeMap<u64, PrepareHeader>,
    /// Per op, replicas whose DVC offered the body (repair sources).
    pub sources: BTreeMap<u64, u32>,
}

/// The merge's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ready(Merged),
    /// Undecidable with the DVCs so far; wait for more.
    AwaitingRepair,
    /// A committed op would be nacked, or canonical logs conflict with everyone reporting.
    Deadlocked,
}

fn checksum(header: &PrepareHeader) -> u128 {
    header.frame.checksum.get()
}

/// Runs the merge over `dvcs` (at most one per sender) for a cluster of `n` with nack quorum
/// `nack_quorum`.
pub(crate) fn merge(dvcs: &[Dvc], n: usize, nack_quorum: usize) -> Outcome {
    if dvcs.is_empty() {
        return Outcome::AwaitingRepair;
    }
    let everyone = dvcs.len() >= n;
    // Step 1: the commit point.
    let mut commit_max = 0u64;
    for d in dvcs {
        commit_max = commit_max.max(d.commit);
        if let Some(head) = d.header(d.op) {
            commit_max = commit_max.max(head.commit.get().min(d.op));
        }
        commit_max = commit_max.max(d.op.saturating_sub(UNCOMMITTED_WINDOW_MAX));
    }
    // Step 2: canonical senders.
    let log_view_max = dvcs.iter().map(|d| d.log_view).max().expect("non-empty");
    let canonical: Vec<&Dvc> = dvcs.iter().filter(|d| d.log_view == log_view_max).collect();
    // Step 3.
    let op_head_max = canonical
        .iter()
        .map(|d| d.op)
        .max()
        .expect("non-empty")
        .max(commit_max);
    if op_head_max == 0 {
        return Outcome::Ready(Merged {
            op_head: 0,
            commit_max: 0,
            headers: BTreeMap::new(),
            sources: BTreeMap::new(),
        });
    }
    // Steps 4-5.
    let mut headers = BTreeMap::new();
    let mut sources = BTreeMap::new();
    let mut op_head = op_head_max;
    for op in commit_max.max(1)..=op_head_max {
        let mut canonical_header: Option<PrepareHeader> = None;
        let mut conflict = false;
        for d in &canonical {
            if let Some(h) = d.header(op) {
                match canonical_header {
                    None => canonical_header = Some(*h),
                    Some(c) if checksum(&c) != checksum(h) => conflict = true,
                    Some(_) => {}
                }
            }
        }
        let mut nacks = 0usize;
        let mut copies = 0u32;
        for d in dvcs {
            if d.op < op {
                nacks += 1;
                continue;
            }
            match d.slots.get(&op) {
                Some(Slot::Blank { nack: true } | Slot::HeldNack { .. }) => nacks += 1,
                Some(Slot::Held { header, present }) => {
                    let same = canonical_header.is_some_and(|c| checksum(&c) == checksum(header));
                    if same && *present {
                        copies |= 1 << d.replica;
                    }
                    if d.log_view < log_view_max && !same {
                        nacks += 1;
                    }
                }
                Some(Slot::Blank { nack: false }) | None => {}
            }
        }
        if nacks >= nack_quorum {
            if op <= commit_max {
                return Outcome::Deadlocked;
            }
            op_head = op - 1;
            break;
        }
        let Some(header) = canonical_header.filter(|_| !conflict) else {
            if op == commit_max && !conflict {
                // A committed op nobody describes: its identity is pinned by the chain above.
                continue;
            }
            return if everyone {
                Outcome::Deadlocked
            } else {
                Outcome::AwaitingRepair
            };
        };
        if copies == 0 {
            return if everyone {
                Outcome::Deadlocked
            } else {
                Outcome::AwaitingRepair
            };
        }
        headers.insert(op, header);
        sources.insert(op, copies);
    }
    // Step 6: the kept headers chain.
    let mut below: Option<&PrepareHeader> = None;
    for (op, header) in headers.range(..=op_head) {
        if let Some(b) = below
            && b.op.get() + 1 == *op
            && header.parent.get() != checksum(b)
        {
            return Outcome::Deadlocked;
        }
        below = Some(header);
    }
    headers.retain(|op, _| *op <= op_head);
    sources.retain(|op, _| *op <= op_head);
    Outcome::Ready(Merged {
        op_head,
        commit_max,
        headers,
        sources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum;
    use proptest::prelude::*;
    use wire::header::Layout;

    /// A held slot whose body the sender has.
    fn present(header: PrepareHeader) -> Slot {
        Slot::Held {
            header,
            present: true,
        }
    }

    /// A held slot (header known) whose body the sender lacks.
    fn absent(header: PrepareHeader) -> Slot {
        Slot::Held {
            header,
            present: false,
        }
    }

    /// A chained log whose identities depend on `fork` (so forks differ).
    fn log(len: u64, fork: u64, base: &[PrepareHeader]) -> Vec<PrepareHeader> {
        let mut out: Vec<PrepareHeader> = base.to_vec();
        while (out.len() as u64) < len {
            let op = out.len() as u64 + 1;
            let mut h = PrepareHeader::zeroed();
            h.frame.command = wire::Command::Prepare.byte();
            h.op.set(op);
            h.timestamp.set(op * 10 + fork);
            h.request.set(fork);
            h.parent.set(
                out.last()
                    .map_or(0, |p: &PrepareHeader| p.frame.checksum.get()),
            );
            h.frame.checksum.set(
                u128::from(xxhash_rust::xxh3::xxh3_64(
                    &[op.to_le_bytes(), fork.to_le_bytes()].concat(),
                )) | 1,
            );
            out.push(h);
        }
        out
    }

    #[derive(Debug, Clone)]
    struct Model {
        n: usize,
        len: u64,
        /// Ops of the latest view's starting log (every latest-log_view replica knows them).
        start: u64,
        /// Per replica: (stale?, prefix, holes bitmask, reported commit, fork length, lost
        /// bitmask: of the holes, the ops it acknowledged and lost the body of since).
        replicas: Vec<(bool, u64, u64, u64, u64, u64)>,
        quorum_mask: u32,
    }

    fn model() -> impl Strategy<Value = Model> {
        (1usize..=7, 1u64..=12).prop_flat_map(|(n, len)| {
            let replica = (
                any::<bool>(),
                0..=len,
                any::<u64>(),
                0..=len,
                0..=4u64,
                any::<u64>(),
            );
            (
                Just(n),
                Just(len),
                0..=len,
                proptest::collection::vec(replica, n),
                any::<u32>(),
            )
                .prop_map(|(n, len, start, replicas, quorum_mask)| Model {
                    n,
                    len,
                    start,
                    replicas,
                    quorum_mask,
                })
        })
    }

    /// Builds the DVCs of a history: `truth` is the latest view's log. Latest-log_view
    /// replicas know every header up to `start` (bodies maybe missing) and hold a prefix of the
    /// rest with holes. A hole is either never acknowledged (a header the view described is
    /// reported held-and-nacked, decision 33, `Slot::HeldNack`; one it did not, blank and
    /// nacked) or acknowledged and lost since (a stale run cut below it, a restart): reported
    /// held without a body, never nacked (decision 51; `restart_nacks_acked` reports it as
    /// `HeldNack`, the bug before it). Stale replicas (lower log_view) hold a prefix of the
    /// truth up to at most `start`, then an uncommitted fork of their own. An op is committed
    /// when a replication quorum acknowledged it at any time (history, not who holds the body
    /// now), for a prefix of the log.
    fn build(m: &Model, restart_nacks_acked: bool) -> Option<(Vec<Dvc>, u64, Vec<PrepareHeader>)> {
        let truth = log(m.len, 0, &[]);
        let q_rep = quorum::replication(m.n);
        struct R {
            stale: bool,
            entries: Vec<PrepareHeader>,
            body: Vec<bool>,
            lost: Vec<bool>,
            known: u64,
        }
        let mut rs = Vec::new();
        for (i, &(stale, prefix, holes, _, fork_len, lost_mask)) in m.replicas.iter().enumerate() {
            if stale {
                let p = prefix.min(m.start);
                let entries = log(p + fork_len, i as u64 + 1, &truth[..p as usize]);
                let body = vec![true; entries.len() + 1];
                let lost = vec![false; entries.len() + 1];
                rs.push(R {
                    stale,
                    entries,
                    body,
                    lost,
                    known: 0,
                });
            } else {
                let op = prefix.max(m.start);
                let entries = truth[..op as usize].to_vec();
                let mut body = vec![false; op as usize + 1];
                let mut lost = vec![false; op as usize + 1];
                for o in 1..=op {
                    body[o as usize] = holes & (1 << (o % 64)) == 0 || o == op;
                    lost[o as usize] = !body[o as usize] && lost_mask & (1 << (o % 64)) != 0;
                }
                rs.push(R {
                    stale,
                    entries,
                    body,
                    lost,
                    known: m.start,
                });
            }
        }
        let holds_truth = |r: &R, o: u64| {
            (o as usize) <= r.entries.len()
                && r.body[o as usize]
                && r.entries[o as usize - 1].frame.checksum.get()
                    == truth[o as usize - 1].frame.checksum.get()
        };
        let acked_truth = |r: &R, o: u64| {
            holds_truth(r, o)
                || ((o as usize) <= r.entries.len()
                    && r.lost[o as usize]
                    && r.entries[o as usize - 1].frame.checksum.get()
                        == truth[o as usize - 1].frame.checksum.get())
        };
        let mut committed = 0;
        for o in 1..=m.len {
            if rs.iter().filter(|r| acked_truth(r, o)).count() >= q_rep {
                committed = o;
            } else {
                break;
            }
        }
        let mut dvcs = Vec::new();
        for (i, r) in rs.iter().enumerate() {
            if m.quorum_mask & (1 << i) == 0 {
                continue;
            }
            let op = r.entries.len() as u64;
            let commit_raw = m.replicas[i].3;
            // A reported commit is truly committed, and within what the replica describes.
            let mut commit = commit_raw.min(committed).min(op);
            if r.stale {
                // A stale replica's commit point lies inside its truthful prefix.
                while commit > 0 && !holds_truth(r, commit) {
                    commit -= 1;
                }
            }
            let mut slots = BTreeMap::new();
            if op > 0 {
                for o in (commit.max(1)..=op).rev().take(128) {
                    let header = r.entries[o as usize - 1];
                    let slot = if r.body[o as usize] {
                        present(header)
                    } else if r.lost[o as usize] {
                        if restart_nacks_acked && o > commit {
                            Slot::HeldNack { header }
                        } else {
                            absent(header)
                        }
                    } else if o <= r.known {
                        if o > commit {
                            Slot::HeldNack { header }
                        } else {
                            absent(header)
                        }
                    } else {
                        Slot::Blank { nack: o > commit }
                    };
                    slots.insert(o, slot);
                }
            }
            dvcs.push(Dvc {
                replica: i as u8,
                log_view: if r.stale { 1 } else { 2 },
                op,
                commit,
                slots,
            });
        }
        if dvcs.len() < quorum::view_change(m.n) {
            return None;
        }
        Some((dvcs, committed, truth))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn merge_never_discards_a_committed_op(m in model()) {
            let Some((dvcs, committed, truth)) = build(&m, false) else { return Ok(()); };
            if let Some(why) = discards_committed(&dvcs, m.n, committed, &truth) {
                prop_assert!(false, "{}", why);
            }
        }
    }

    /// Why the merge of `dvcs` loses a committed op, if it does.
    fn discards_committed(
        dvcs: &[Dvc],
        n: usize,
        committed: u64,
        truth: &[PrepareHeader],
    ) -> Option<String> {
        let Outcome::Ready(merged) = merge(dvcs, n, quorum::nack(n)) else {
            return None;
        };
        if merged.op_head < committed {
            return Some(format!(
                "op_head {} < committed {committed}",
                merged.op_head
            ));
        }
        merged
            .headers
            .iter()
            .find(|(op, h)| {
                **op <= committed
                    && h.frame.checksum.get() != truth[**op as usize - 1].frame.checksum.get()
            })
            .map(|(op, _)| format!("op {op} replaced"))
    }

    /// The model bites: with the bug decision 51 fixed (a restarted replica nacks an op it
    /// acknowledged and then lost), the same generator finds a committed op the merge
    /// discards.
    #[test]
    fn the_merge_model_finds_a_restart_nacking_an_acked_op() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let mut runner = TestRunner::deterministic();
        let strategy = model();
        let found = (0..20_000).find_map(|_| {
            let m = strategy.new_tree(&mut runner).ok()?.current();
            let (dvcs, committed, truth) = build(&m, true)?;
            discards_committed(&dvcs, m.n, committed, &truth)
        });
        assert!(found.is_some(), "no counterexample with the bug on");
    }

    fn held(op: u64, fork: u64) -> PrepareHeader {
        log(op, fork, &[])[op as usize - 1]
    }

    #[test]
    fn nack_quorum_truncates_uncommitted_suffix() {
        let l = log(3, 0, &[]);
        let a = Dvc {
            replica: 0,
            log_view: 1,
            op: 3,
            commit: 1,
            slots: BTreeMap::from([(1, present(l[0])), (2, present(l[1])), (3, present(l[2]))]),
        };
        let b = Dvc {
            replica: 1,
            log_view: 1,
            op: 1,
            commit: 1,
            slots: BTreeMap::from([(1, present(l[0]))]),
        };
        // n = 3: Q_nack = 2, only b nacks (by op) → keep everything.
        let Outcome::Ready(m) = merge(&[a.clone(), b.clone()], 3, 2) else {
            panic!()
        };
        assert_eq!(m.op_head, 3);
        // With nack quorum 1 (a loosened quorum) b alone truncates 2 and 3.
        let Outcome::Ready(m) = merge(&[a.clone(), b.clone()], 3, 1) else {
            panic!()
        };
        assert_eq!(m.op_head, 1);
    }

    #[test]
    fn same_log_view_conflict_awaits_then_deadlocks() {
        let x = held(1, 1);
        let y = held(1, 2);
        let dvc = |replica, header| Dvc {
            replica,
            log_view: 1,
            op: 1,
            commit: 0,
            slots: BTreeMap::from([(1, present(header))]),
        };
        assert_eq!(
            merge(&[dvc(0, x), dvc(1, y)], 3, 2),
            Outcome::AwaitingRepair
        );
        assert_eq!(
            merge(&[dvc(0, x), dvc(1, y), dvc(2, x)], 3, 2),
            Outcome::Deadlocked
        );
    }

    #[test]
    fn header_without_body_awaits_a_copy() {
        let x = held(1, 1);
        let a = Dvc {
            replica: 0,
            log_view: 1,
            op: 1,
            commit: 0,
            slots: BTreeMap::from([(1, absent(x))]),
        };
        assert_eq!(
            merge(std::slice::from_ref(&a), 3, 2),
            Outcome::AwaitingRepair
        );
        let mut b = a.clone();
        b.replica = 1;
        b.slots.insert(1, present(x));
        let Outcome::Ready(m) = merge(&[a, b], 3, 2) else {
            panic!()
        };
        assert_eq!(m.sources[&1], 0b10);
    }

    /// Decision 62: an op every replica holds faulty (header from its ring, body damaged) was
    /// durable on each of them, so possibly acked and committed. No copy exists and nobody
    /// nacks: the merge never discards it, it waits for a copy and, once everyone reported,
    /// refuses to decide. (A power cut cannot produce this: a torn write is not ring-known,
    /// see the scenario `a_power_cut_tearing_the_same_last_write_everywhere`.)
    #[test]
    fn an_op_every_replica_holds_faulty_is_never_discarded() {
        let l = log(2, 0, &[]);
        let dvc = |replica| Dvc {
            replica,
            log_view: 1,
            op: 2,
            commit: 1,
            slots: BTreeMap::from([(1, present(l[0])), (2, absent(l[1]))]),
        };
        assert_eq!(merge(&[dvc(0), dvc(1)], 3, 2), Outcome::AwaitingRepair);
        assert_eq!(merge(&[dvc(0), dvc(1), dvc(2)], 3, 2), Outcome::Deadlocked);
    }

    #[test]
    fn held_nack_names_the_header_and_nacks() {
        // Seed 4605's shape (n = 3): the canonical sender describes op 2 without ever having
        // journaled it; a stale sender holds that same prepare. Not a nack from the stale one.
        let l = log(2, 0, &[]);
        let canonical = Dvc {
            replica: 0,
            log_view: 2,
            op: 2,
            commit: 1,
            slots: BTreeMap::from([(1, present(l[0])), (2, Slot::HeldNack { header: l[1] })]),
        };
        let stale = Dvc {
            replica: 1,
            log_view: 1,
            op: 2,
            commit: 1,
            slots: BTreeMap::from([(1, present(l[0])), (2, present(l[1]))]),
        };
        let Outcome::Ready(m) = merge(&[canonical.clone(), stale], 3, 2) else {
            panic!()
        };
        assert_eq!(m.op_head, 2);
        // Seed 53286's shape (n = 4, Q_nack = 3): two senders below op 2 plus the HeldNack.
        let low = |replica| Dvc {
            replica,
            log_view: 2,
            op: 1,
            commit: 1,
            slots: BTreeMap::from([(1, present(l[0]))]),
        };
        let Outcome::Ready(m) = merge(&[canonical.clone(), low(1), low(2)], 4, 3) else {
            panic!()
        };
        assert_eq!(m.op_head, 1);
        // Without the nack (held, no body) it waits for a copy.
        let mut held = canonical;
        held.slots.insert(2, absent(l[1]));
        assert_eq!(
            merge(&[held, low(1), low(2)], 4, 3),
            Outcome::AwaitingRepair
        );
    }

    #[test]
    fn empty_cluster_is_ready_and_empty() {
        let a = Dvc {
            replica: 0,
            log_view: 0,
            op: 0,
            commit: 0,
            slots: BTreeMap::new(),
        };
        let Outcome::Ready(m) = merge(&[a], 1, 1) else {
            panic!()
        };
        assert_eq!((m.op_head, m.commit_max), (0, 0));
    }
}
