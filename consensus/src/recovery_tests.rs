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
    assert_eq!(
        out.drain().collect::<Vec<_>>(),
        vec![Effect::Truncate { from_op: 3 }]
    );
}

#[test]
fn recovering_replica_probes_then_elects_when_nobody_answers() {
    let mut b = restarted(3, 1, 0, &chain(0, 0, 1), 9);
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
        assert_eq!(effects, broadcast(3, 1, &request_start_view(1, 0, 5)));
    }
    assert_eq!(b.status(), Status::Recovering);
    // Adopting a view is not enough: the flag goes once the view's log is durable here.
    let c = chain(0, 0, 1);
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
    })));
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
    let probes = |r: &mut R| {
        let effects = tick_until_effects(r, 100);
        effects.iter().all(|e| {
            matches!(e, Effect::Send { frame, .. }
                if frame.bytes()[60] == wire::Command::RequestStartView.byte())
        })
    };
    // The disk group takes the election fallback after its probes go unanswered.
    let mut d = restart(false);
    assert!(!d.is_lost_state());
    for _ in 0..4 {
        assert!(probes(&mut d));
    }
    let effects = tick_until_effects(&mut d, 100);
    assert!(effects.contains(&Effect::PersistVsrState(VsrState {
        view: 1,
        log_view: 0,
        commit_max: 0,
        lost_state: false,
    })));
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
    assert!(effects.contains(&Effect::PersistVsrState(VsrState {
        view: 1,
        log_view: 0,
        commit_max: 0,
        lost_state: true,
    })));
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
