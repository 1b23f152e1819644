//! Handler tests for recovery: restart join, probes, incarnation guard, election fallback.

#![allow(unused_must_use)]

use wire::Command;
use wire::header::{Layout, StartViewHeader};

use crate::Ignored;
use crate::io::{Effect, Input};
use crate::test_support::*;
use crate::types::{Status, VsrState};

#[test]
fn recovery_replays_up_to_the_commit_watermark() {
    let mut c = chain(0, 0, 2);
    // Op 3 says op 2 committed: ops 1-2 are applied at boot, op 3 is not.
    c.push(prepare(0, 0, 3, checksum(&c[1]), 2, &[3]));
    let b = restarted(3, 1, 0, &c, 9);
    assert_eq!((b.op(), b.commit_min(), b.commit_max()), (3, 2, 2));
    assert_eq!(b.status(), Status::Recovering);
}

#[test]
fn recovery_drops_frames_from_the_first_chain_break() {
    let mut c = chain(0, 0, 2);
    let kept = headers_of(&c);
    c.push(prepare(0, 0, 3, 999, 0, &[3]));
    let mut out = crate::Outbox::new();
    let b = crate::Replica::new(
        raw(3, 1).validate().unwrap(),
        crate::Recovered {
            superblock: Some(VsrState::default()),
            frames: c,
            incarnation: 1,
            ..Default::default()
        },
        crate::DigestStateMachine::default(),
        &mut out,
    );
    assert_eq!(b.op(), 2);
    // The ceiling (op 3 may have been acked) is written before the cut (decision 51).
    assert_eq!(
        out.drain().collect::<Vec<_>>(),
        vec![
            Effect::PersistVsrState(VsrState {
                view_headers: kept,
                held_ceiling: 3,
                ..Default::default()
            }),
            Effect::Truncate { from_op: 3 }
        ]
    );
}

#[test]
fn recovering_replica_probes_then_elects_when_nobody_answers() {
    let c = chain(0, 0, 1);
    let mut b = restarted(3, 1, 0, &c, 9);
    let probe = request_start_view(1, 0, 9);
    for _ in 0..4 {
        assert_eq!(tick_until_effects(&mut b, 100), broadcast(3, 1, &probe));
    }
    assert_eq!(
        tick_until_effects(&mut b, 100),
        vec![Effect::PersistVsrState(VsrState {
            view: 1,
            log_view: 0,
            commit_max: 0,
            lost_state: false,
            view_headers: headers_of(&c),
            ..Default::default()
        })]
    );
    assert_eq!(b.status(), Status::ViewChange);
}

#[test]
fn the_primary_answers_a_probe_with_a_unicast_start_view() {
    let mut p = fresh(3, 0);
    let (result, effects) = feed(&mut p, 2, &request_start_view(2, 0, 42));
    assert_eq!(result, Ok(()));
    let [effect] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    let (to, frame) = sent(effect);
    assert_eq!(to, 2);
    assert_eq!(frame.command(), Some(Command::StartView));
    let h = StartViewHeader::view(frame.bytes()).unwrap();
    assert_eq!(h.incarnation.get(), 42);
    // A backup does not answer.
    let mut b = fresh(3, 1);
    assert_eq!(
        feed(&mut b, 2, &request_start_view(2, 0, 42)),
        (Err(Ignored::NotPrimary), vec![])
    );
}

#[test]
fn a_probe_from_the_current_primary_in_its_own_view_starts_an_election() {
    let mut b = fresh(3, 1);
    let (result, _) = feed(&mut b, 0, &request_start_view(0, 0, 5));
    assert_eq!(result, Ok(()));
    assert_eq!((b.status(), b.view()), (Status::ViewChange, 1));
    let mut b = fresh(3, 2);
    assert_eq!(
        feed(&mut b, 0, &request_start_view(0, 3, 5)).0,
        Err(Ignored::ViewOld),
        "a probe stamped with another view from the primary is not evidence"
    );
}

#[test]
fn incarnation_guard_rejects_answers_to_a_previous_life() {
    let c = chain(0, 0, 2);
    let mut b = restarted(3, 1, 0, &c, 9);
    // An answer to an older incarnation's probe, with a head below ours.
    let mut sv = start_view(0, 0, 1, 0, &c[..1]).bytes().to_vec();
    sv[240..256].copy_from_slice(&8u128.to_le_bytes());
    wire::finish((&mut sv[..256]).try_into().unwrap(), &c[0].bytes()[..256]).unwrap();
    let sv = crate::Frame::new(sv);
    assert_eq!(feed(&mut b, 0, &sv).0, Err(Ignored::StartViewRejected));
    // Our own incarnation's answer is adopted.
    let mut ok = start_view(0, 0, 2, 0, &c).bytes().to_vec();
    ok[240..256].copy_from_slice(&9u128.to_le_bytes());
    let body = ok[256..].to_vec();
    wire::finish((&mut ok[..256]).try_into().unwrap(), &body).unwrap();
    let (result, _) = feed(&mut b, 0, &crate::Frame::new(ok));
    assert_eq!(result, Ok(()));
    assert_eq!(b.status(), Status::Normal);
}

#[test]
fn recovering_replicas_are_quorum_invisible() {
    let mut b = restarted(3, 1, 0, &chain(0, 0, 1), 9);
    assert_eq!(feed(&mut b, 2, &svc(1, 2)), (Err(Ignored::Status), vec![]));
    let c = chain(0, 0, 2);
    assert_eq!(feed(&mut b, 0, &c[1]).0, Err(Ignored::Status));
    assert_eq!(
        feed(&mut b, 2, &request_start_view(2, 0, 1)).0,
        Err(Ignored::Status)
    );
    let _ = input(&mut b, Input::Tick);
}

#[test]
fn recovery_keeps_acked_prepares_above_a_hole() {
    let c = chain(0, 0, 4);
    // Op 2 is missing (the replica was still repairing it when it crashed).
    let frames = vec![c[0].clone(), c[2].clone(), c[3].clone()];
    let mut out = crate::Outbox::new();
    let b = crate::Replica::new(
        raw(3, 1).validate().unwrap(),
        crate::Recovered {
            superblock: Some(VsrState::default()),
            frames,
            incarnation: 1,
            ..Default::default()
        },
        crate::DigestStateMachine::default(),
        &mut out,
    );
    assert_eq!(out.drain().count(), 0, "nothing truncated");
    assert_eq!(b.op(), 4);
    assert!(b.header(3).is_some() && b.header(4).is_some());
    assert!(b.header(2).is_none());
}

#[test]
fn a_group_that_wrote_its_superblock_restarts_recovering() {
    let b = restarted(3, 0, 0, &[], 4);
    assert_eq!(
        b.status(),
        Status::Recovering,
        "even the view-0 primary cedes"
    );
    assert!(b.is_ceded());
}

#[test]
fn a_solo_replica_truncates_at_the_first_hole() {
    let c = chain(0, 0, 3);
    let mut out = crate::Outbox::new();
    let b = crate::Replica::new(
        raw(1, 0).validate().unwrap(),
        crate::Recovered {
            superblock: Some(VsrState::default()),
            frames: vec![c[0].clone(), c[2].clone()],
            incarnation: 1,
            ..Default::default()
        },
        crate::DigestStateMachine::default(),
        &mut out,
    );
    assert_eq!((b.op(), b.commit_min()), (1, 1));
    assert!(out.drain().any(|e| e == Effect::Truncate { from_op: 2 }));
}

#[test]
fn an_empty_start_view_over_a_committed_log_starts_a_transfer() {
    // Decision 32: a primary whose journal lacks its committed head answers with no suffix;
    // the wiped replica cannot verify it, stays Recovering and catches up by transfer.
    let mut b = wiped(3, 1, 5);
    let (result, effects) = feed(&mut b, 0, &start_view(0, 0, 16, 16, &[]));
    assert_eq!(result, Err(Ignored::StartViewRejected));
    assert_eq!(b.status(), Status::Recovering);
    assert!(b.lost_state);
    assert!(b.transfer.is_active());
    assert!(effects.iter().any(|e| matches!(
        e,
        Effect::Send { to, frame } if to.0 == 0
            && frame.bytes()[60] == wire::Command::RequestStateTransfer.byte()
    )));
    // An uncommitted head without a suffix is still refused, with no transfer.
    let mut c = wiped(3, 1, 5);
    let (result, _) = feed(&mut c, 0, &start_view(0, 0, 16, 15, &[]));
    assert_eq!(result, Err(Ignored::StartViewRejected));
    assert!(!c.transfer.is_active());
}

#[test]
fn a_wiped_replica_probes_forever_and_never_elects() {
    let mut b = wiped(3, 1, 5);
    assert_eq!(b.status(), Status::Recovering);
    for _ in 0..20 {
        let effects = tick_until_effects(&mut b, 100);
        // The probe, and the view probes of decision 61 (random nonces) to the silent peers.
        let (probes, views): (Vec<Effect>, Vec<Effect>) = effects.into_iter().partition(|e| {
            matches!(e, Effect::Send { frame, .. } if frame.command() == Some(Command::RequestStartView))
        });
        assert_eq!(probes, broadcast(3, 1, &request_start_view(1, 0, 5)));
        assert_eq!(views.len(), 2);
    }
    assert_eq!(b.status(), Status::Recovering);
    // Adopting a view is not enough: the flag goes once the view's log is durable here. A
    // heartbeat from r2 makes two peers reporting view 0 (decision 61).
    let c = chain(0, 0, 1);
    let _ = feed(&mut b, 2, &commit_frame(0, 2, 0, 1));
    let (result, _) = feed(&mut b, 0, &start_view(0, 0, 1, 0, &c));
    assert_eq!(result, Ok(()));
    assert!(b.lost_state);
    let _ = feed(&mut b, 0, &c[0]);
    let (_, effects) = input(&mut b, appended(&c[0]));
    assert!(!b.lost_state);
    assert!(effects.contains(&Effect::PersistVsrState(VsrState {
        view: 0,
        log_view: 0,
        commit_max: 0,
        lost_state: false,
        view_headers: headers_of(&c),
        ..Default::default()
    })));
}

/// Decision 61 (seed 9200000408 `--replicas 3 --groups 4`): r1 voted for view 1 with r2, was
/// wiped, and rejoins in lost state. The isolated r0, still primary of view 0, answers its probe.
/// Adopting that StartView and acking op 1 in view 0 would let r0 commit in a superseded view.
/// The lost replica adopts a StartView only of a view at least the highest one reported by
/// `view_learning(n)` distinct peers.
#[test]
fn a_lost_replica_adopts_only_a_view_a_quorum_of_peers_reports() {
    let c = chain(0, 0, 1);
    let sv0 = start_view(0, 0, 1, 0, &c);
    let mut b = wiped(3, 1, 5);
    assert_eq!(crate::quorum::view_learning(3), 2);
    // One peer is not a quorum, however often it answers.
    for _ in 0..3 {
        assert_eq!(feed(&mut b, 0, &sv0), (Err(Ignored::ViewUnlearned), vec![]));
    }
    assert_eq!(b.learned_view(), None);
    // r2 moved on to view 2 (it suspects r1, the primary of view 1): its StartViewChange is
    // ignored by the quorum-invisible replica but still reports the view.
    assert_eq!(feed(&mut b, 2, &svc(2, 2)).0, Err(Ignored::Status));
    assert_eq!(b.learned_view(), Some(2));
    // View 0 is superseded: never adopted, and its prepares are never acked.
    assert_eq!(feed(&mut b, 0, &sv0), (Err(Ignored::ViewUnlearned), vec![]));
    let (_, effects) = feed(&mut b, 0, &c[0]);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Send { frame, .. }
            if frame.command() == Some(Command::PrepareOk))),
        "{effects:?}"
    );
    assert_eq!((b.status(), b.view()), (Status::Recovering, 0));
    // View 2's StartView from its primary is adopted.
    let sv2 = start_view(2, 2, 1, 0, &c);
    assert_eq!(feed(&mut b, 2, &sv2).0, Ok(()));
    assert_eq!((b.status(), b.view(), b.log_view()), (Status::Normal, 2, 2));
}

/// A replica that did not lose state is not held back (the rule costs lost replicas only).
#[test]
fn a_replica_with_its_state_adopts_a_start_view_without_learning() {
    let c = chain(0, 0, 1);
    let mut b = restarted(3, 1, 0, &c, 9);
    assert_eq!(b.learned_view(), None);
    assert_eq!(feed(&mut b, 0, &start_view(0, 0, 1, 0, &c)).0, Ok(()));
    assert_eq!(b.status(), Status::Normal);
}

/// Decision 61 in an idle group: only the primary answers RequestStartView and the backups send
/// a Recovering replica nothing, so a lost replica asks each silent peer for a repair range
/// beyond any log; the RepairDone answer is stamped with the peer's view and counts.
#[test]
fn a_lost_replica_probes_silent_peers_for_their_view() {
    let mut b = wiped(5, 1, 5);
    let effects = tick_until_effects(&mut b, 1000);
    let probes: Vec<(u8, u64)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Send { to, frame } if frame.command() == Some(Command::RequestPrepares) => {
                let h = wire::header::RequestPreparesHeader::view(frame.bytes()).unwrap();
                Some((to.0, h.from_op.get()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        probes,
        vec![(0, u64::MAX), (2, u64::MAX), (3, u64::MAX), (4, u64::MAX)]
    );
    // A Normal backup in view 3 answers with an empty RepairDone stamped with its view.
    let mut peer = fresh(5, 2);
    let (_, effects) = feed(&mut peer, 1, &{
        let (_, f) = sent(
            effects
                .iter()
                .find(|e| {
                    matches!(e, Effect::Send { to, frame }
            if to.0 == 2 && frame.command() == Some(Command::RequestPrepares))
                })
                .unwrap(),
        );
        f.clone()
    });
    let [answer] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    let (to, done) = sent(answer);
    assert_eq!((to, done.command()), (1, Some(Command::RepairDone)));
    assert_eq!(feed(&mut b, 2, done).0, Err(Ignored::Nonce));
    assert_eq!(b.view_reports.get(&2), Some(&0));
    // Three peers make a quorum for n = 5; reported peers are not probed again.
    feed(&mut b, 3, &repair_reply(Command::RepairDone, 3, 1, 0));
    assert_eq!(b.learned_view(), None);
    feed(&mut b, 4, &commit_frame(0, 4, 0, 1));
    assert_eq!(b.learned_view(), Some(0));
    let effects = tick_until_effects(&mut b, 1000);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Send { frame, .. }
            if frame.command() == Some(Command::RequestPrepares))),
        "{effects:?}"
    );
}

/// Replica 1 (0 when solo) restarted with ops 1..=2 intact and op 3 held but faulty
/// (decision 62).
fn restarted_with_faulty_head(n: u8, c: &[crate::Frame]) -> (R, Vec<Effect>) {
    let mut out = crate::Outbox::new();
    let b = crate::Replica::new(
        raw(n, n.min(2) - 1).validate().unwrap(),
        crate::Recovered {
            superblock: Some(VsrState::default()),
            frames: c[..2].to_vec(),
            faulty: vec![*c[2].prepare_header().unwrap()],
            incarnation: 9,
            ..Default::default()
        },
        crate::DigestStateMachine::default(),
        &mut out,
    );
    (b, out.drain().collect())
}

/// Decision 62: a newest entry the header ring vouches for but whose prepare is damaged was
/// durable here, maybe acked: boot keeps it as the head, held but faulty. Its DoViewChange slot
/// carries the header, neither present (no copy to serve) nor nacked; adopting a view that
/// describes it repairs its body.
#[test]
fn a_faulty_newest_entry_is_held_neither_present_nor_nacked() {
    use crate::merge::Slot;
    let c = chain(0, 0, 3);
    let h3 = *c[2].prepare_header().unwrap();
    let (mut b, effects) = restarted_with_faulty_head(3, &c);
    assert_eq!(effects, vec![], "nothing truncated");
    assert_eq!((b.op(), b.header(3)), (3, None));
    let (frame, dvc) = b.build_do_view_change();
    assert_eq!(
        dvc.slots.get(&3),
        Some(&Slot::Held {
            header: h3,
            present: false
        })
    );
    let h = wire::header::DoViewChangeHeader::view(frame.bytes()).unwrap();
    assert_eq!((h.nack_bitset.get(), h.present_bitset.get() & 1), (0, 0));
    // The view's StartView describes op 3: the body is fetched from the primary.
    feed(&mut b, 2, &commit_frame(0, 2, 0, 1));
    let (result, effects) = feed(&mut b, 0, &start_view(0, 0, 3, 0, &c));
    assert_eq!(result, Ok(()));
    let repair = effects.iter().find_map(|e| match e {
        Effect::Send { to, frame } if frame.command() == Some(Command::RequestPrepares) => {
            let h = wire::header::RequestPreparesHeader::view(frame.bytes()).unwrap();
            Some((to.0, h.from_op.get(), h.to_op.get()))
        }
        _ => None,
    });
    assert_eq!(repair, Some((0, 3, 3)), "{effects:?}");
    let (_, effects) = feed(&mut b, 0, &crate::frames::as_repair(&c[2]));
    assert!(effects.contains(&append(&c[2])), "{effects:?}");
}

/// A view whose log ends below the faulty op discards it: the disk, which still names it, is
/// truncated there.
#[test]
fn a_view_below_a_faulty_head_truncates_it_on_disk() {
    let c = chain(0, 0, 3);
    let (mut b, _) = restarted_with_faulty_head(3, &c);
    let (result, effects) = feed(&mut b, 2, &start_view(2, 2, 2, 0, &c[..2]));
    assert_eq!(result, Ok(()));
    // Decision 51: the superblock write carrying the ceiling (op 3 may have been acked) comes
    // before the cut.
    let cut = effects
        .iter()
        .position(|e| *e == Effect::Truncate { from_op: 3 })
        .expect("op 3 cut");
    assert!(
        matches!(&effects[..cut], [.., Effect::PersistVsrState(s)] if s.held_ceiling == 3),
        "{effects:?}"
    );
    assert_eq!(b.op(), 2);
}

/// A solo replica has no peer to repair from: a faulty newest entry is cut, as before.
#[test]
fn a_solo_replica_cuts_a_faulty_newest_entry() {
    let c = chain(0, 0, 3);
    let (b, effects) = restarted_with_faulty_head(1, &c);
    // Like every boot cut, behind a durable ceiling (decision 51).
    assert_eq!(
        effects,
        vec![
            Effect::PersistVsrState(VsrState {
                commit_max: 2,
                held_ceiling: 3,
                ..Default::default()
            }),
            Effect::Truncate { from_op: 3 }
        ]
    );
    assert_eq!(b.op(), 2);
}

/// A faulty header that does not chain onto the intact entries is only never nacked, and cut:
/// the raised ceiling is written before the cut (decisions 51 and 62).
#[test]
fn a_faulty_entry_off_the_chain_is_cut_behind_a_durable_ceiling() {
    let c = chain(0, 0, 2);
    let off = prepare(0, 0, 3, 999, 0, &[3]);
    let mut out = crate::Outbox::new();
    let b = crate::Replica::new(
        raw(3, 1).validate().unwrap(),
        crate::Recovered {
            superblock: Some(VsrState::default()),
            frames: c.clone(),
            faulty: vec![*off.prepare_header().unwrap()],
            incarnation: 9,
            ..Default::default()
        },
        crate::DigestStateMachine::default(),
        &mut out,
    );
    assert_eq!(b.op(), 2);
    assert_eq!(
        out.drain().collect::<Vec<_>>(),
        vec![
            Effect::PersistVsrState(VsrState {
                view_headers: headers_of(&c),
                held_ceiling: 3,
                ..Default::default()
            }),
            Effect::Truncate { from_op: 3 }
        ]
    );
}

/// Decisions 51 and 62 together at boot: the durable ceiling of an earlier life is restored
/// before the faulty entries raise it (never lowered below them), and a held-but-faulty
/// entry's ring header wins over a superblock view header of the same op, as a present entry
/// does (the ring's header was written later: the journal holds it, the superblock only
/// described the log at its write).
#[test]
fn a_faulty_entry_keeps_its_ring_header_over_the_superblocks() {
    use crate::merge::Slot;
    let c = chain(0, 0, 3);
    let h3 = *c[2].prepare_header().unwrap();
    let other = *prepare(0, 0, 3, checksum(&c[1]), 0, &[9])
        .prepare_header()
        .unwrap();
    assert_ne!(other, h3);
    let mut out = crate::Outbox::new();
    let b = crate::Replica::new(
        raw(3, 1).validate().unwrap(),
        crate::Recovered {
            superblock: Some(VsrState {
                held_ceiling: 1,
                view_headers: vec![other],
                ..Default::default()
            }),
            frames: c[..2].to_vec(),
            faulty: vec![h3],
            incarnation: 9,
            ..Default::default()
        },
        crate::DigestStateMachine::default(),
        &mut out,
    );
    assert_eq!(out.drain().count(), 0, "nothing truncated");
    assert_eq!((b.op(), b.held_ceiling, b.faulty_top), (3, 3, 3));
    let (_, dvc) = b.build_do_view_change();
    assert_eq!(
        dvc.slots.get(&3),
        Some(&Slot::Held {
            header: h3,
            present: false
        })
    );
}

/// Decision 73 (spec README decision 4): a partition group with ack level "memory" acks a
/// prepare as soon as it holds it, before the append is durable; after a restart it rejoins in
/// lost state (it may have acknowledged prepares its disk lost): it never takes the election
/// fallback nor votes, and the flag goes only once it durably holds the adopted view's log.
/// The same restart of a "disk" group votes as before.
#[test]
fn a_memory_ack_group_acks_from_memory_and_rejoins_in_lost_state() {
    use crate::io::Outbox;
    use crate::partition::{build_batch, stamp};
    use crate::replica::Replica;
    use crate::types::ReplicaId;
    use wire::header::{FrameHeader, PrepareHeader};
    let group = crate::GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 3,
    })
    .unwrap();
    let config = |memory_ack: bool| {
        let mut raw = crate::RawConfig::new(CLUSTER, ReplicaId(2), 3, group);
        raw.memory_ack = memory_ack;
        raw
    };
    let mut batch = build_batch(&[b"m"]);
    stamp(&mut batch, 3, 0, 1_001);
    let mut h = PrepareHeader::zeroed();
    h.frame = FrameHeader::new(wire::Command::Prepare, sender(0, 0));
    h.client.set(5);
    h.op.set(1);
    h.timestamp.set(1_001);
    h.operation = wire::Operation::SendMessages.byte();
    h.group.set(group.0);
    let p1 = crate::frames::finish(h, &batch);

    // Acked from memory: the PrepareOk leaves with the append request, not after it.
    let mut b = boot(config(true));
    assert_eq!(
        feed(&mut b, 1, &p1),
        (Ok(()), vec![append(&p1), send(0, prepare_ok(0, 2, &p1, 0))])
    );
    assert_eq!(input(&mut b, appended(&p1)), (Ok(()), vec![]));
    // A "disk" group acks only after the append (the control).
    let mut d = boot(config(false));
    assert_eq!(feed(&mut d, 1, &p1), (Ok(()), vec![append(&p1)]));

    let restart = |memory_ack: bool| {
        let mut out = Outbox::new();
        Replica::new(
            config(memory_ack).validate().unwrap(),
            crate::Recovered {
                superblock: Some(VsrState::default()),
                frames: vec![p1.clone()],
                incarnation: 9,
                ..crate::Recovered::default()
            },
            crate::DigestStateMachine::default(),
            &mut out,
        )
    };
    // Recovery probes: RequestStartView, and from a lost-state replica also the view probe of
    // silent peers (decision 61: RequestPrepares from op u64::MAX).
    let probes = |r: &mut R| {
        let effects = tick_until_effects(r, 100);
        effects.iter().all(|e| {
            matches!(e, Effect::Send { frame, .. }
                if frame.bytes()[60] == wire::Command::RequestStartView.byte()
                    || frame.bytes()[60] == wire::Command::RequestPrepares.byte())
        })
    };
    // The disk group takes the election fallback after its probes go unanswered.
    let mut d = restart(false);
    assert!(!d.is_lost_state());
    for _ in 0..4 {
        assert!(probes(&mut d));
    }
    let effects = tick_until_effects(&mut d, 100);
    assert!(effects.iter().any(|e| matches!(
        e,
        Effect::PersistVsrState(VsrState {
            view: 1,
            log_view: 0,
            commit_max: 0,
            lost_state: false,
            ..
        })
    )));
    assert_eq!(d.status(), Status::ViewChange);
    let svc = |view: u32, from: u8| {
        let mut h = wire::header::StartViewChangeHeader::zeroed();
        h.frame = FrameHeader::new(wire::Command::StartViewChange, sender(from, view));
        h.group.set(group.0);
        crate::frames::finish(h, &[])
    };
    let is_dvc = |e: &Effect| matches!(e, Effect::Send { frame, .. } if frame.bytes()[60] == Command::DoViewChange.byte());
    persisted(&mut d);
    let (_, effects) = feed(&mut d, 0, &svc(1, 0));
    assert!(
        effects.iter().any(is_dvc),
        "the disk group votes: {effects:?}"
    );

    // The memory group rejoins in lost state. Its probes unanswered, it moves the others past
    // the view its superblock holds (a StartViewChange) but never votes (no DoViewChange).
    let mut b = restart(true);
    assert!(b.is_lost_state());
    assert_eq!(b.status(), Status::Recovering);
    for _ in 0..4 {
        assert!(probes(&mut b));
    }
    let effects = tick_until_effects(&mut b, 100);
    assert!(effects.iter().any(|e| matches!(
        e,
        Effect::PersistVsrState(VsrState {
            view: 1,
            log_view: 0,
            commit_max: 0,
            lost_state: true,
            ..
        })
    )));
    assert_eq!(b.status(), Status::ViewChange);
    persisted(&mut b);
    let (_, effects) = feed(&mut b, 0, &svc(1, 0));
    assert!(!effects.iter().any(is_dvc), "lost state votes: {effects:?}");
    let (_, effects) = feed(&mut b, 1, &svc(1, 1));
    assert!(!effects.iter().any(is_dvc), "lost state votes: {effects:?}");
    assert!(b.is_lost_state());
    // The new primary's StartView describes op 1, which the journal durably holds: adopted, and
    // the flag goes (the superblock never recorded it: every restart of the group sets it again).
    let mut body = Vec::new();
    wire::suffix::encode([*p1.prepare_header().unwrap()].iter(), &mut body);
    let mut sv = StartViewHeader::zeroed();
    sv.frame = FrameHeader::new(wire::Command::StartView, sender(1, 1));
    sv.op.set(1);
    sv.commit.set(0);
    sv.group.set(group.0);
    let sv = crate::frames::finish(sv, &body);
    assert_eq!(feed(&mut b, 1, &sv).0, Ok(()));
    assert_eq!((b.status(), b.view()), (Status::Normal, 1));
    assert!(!b.is_lost_state());
}

/// Decision 497: a lost-state replica of a disk group whose superblock holds a view the others
/// never reached (view 3, while two peers report view 2) elects once its probes go unanswered:
/// the primary of view 2 answers with that view's StartView, which it refuses as old, so
/// without an election it would probe forever (found by a simulator seed). It moves the others
/// past its view and still never votes. Without a quorum's report of a lower view it keeps
/// probing (the wiped replica of `a_wiped_replica_probes_forever_and_never_elects`).
#[test]
fn a_lost_replica_ahead_of_the_reported_view_moves_the_others_past_it() {
    let boot = |reports: &[u8]| {
        let mut out = crate::Outbox::new();
        let mut b = crate::Replica::new(
            raw(3, 0).validate().unwrap(),
            crate::Recovered {
                superblock: Some(VsrState {
                    view: 3,
                    log_view: 1,
                    lost_state: true,
                    ..Default::default()
                }),
                lost_state: true,
                incarnation: 5,
                ..Default::default()
            },
            crate::DigestStateMachine::default(),
            &mut out,
        );
        persisted(&mut b);
        for &peer in reports {
            let _ = feed(&mut b, peer, &commit_frame(2, peer, 0, 1));
        }
        b
    };
    let elects = |b: &mut R| {
        (0..12).any(|_| {
            let effects = tick_until_effects(b, 100);
            effects.iter().any(|e| {
                matches!(
                    e,
                    Effect::PersistVsrState(VsrState {
                        view: 4,
                        lost_state: true,
                        ..
                    })
                )
            })
        })
    };
    let mut b = boot(&[1, 2]);
    assert_eq!((b.status(), b.view()), (Status::Recovering, 3));
    assert_eq!(b.learned_view(), Some(2));
    assert!(
        elects(&mut b),
        "a lost replica ahead of its peers' view elects"
    );
    assert_eq!((b.status(), b.view()), (Status::ViewChange, 4));
    persisted(&mut b);
    let is_dvc = |e: &Effect| matches!(e, Effect::Send { frame, .. } if frame.bytes()[60] == Command::DoViewChange.byte());
    let (_, effects) = feed(&mut b, 1, &svc(4, 1));
    assert!(!effects.iter().any(is_dvc), "lost state votes: {effects:?}");
    assert!(b.is_lost_state());
    // One peer's report is no quorum: it keeps probing.
    let mut c = boot(&[2]);
    assert_eq!(c.learned_view(), None);
    assert!(!elects(&mut c), "elected without a quorum's report");
    assert_eq!(c.status(), Status::Recovering);
}
