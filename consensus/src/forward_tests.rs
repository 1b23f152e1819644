//! Session forwarding over the reference driver and as single handlers.

#![allow(unused_must_use)]

use wire::{Command, Operation};

use crate::io::Input;
use crate::test_support::*;
use crate::testing::Cluster;
use crate::types::{GroupId, ReplicaId};

#[test]
fn register_at_a_backup_is_forwarded_and_answered() {
    let mut c = Cluster::new(3, GroupId::METADATA, |_| {});
    c.submit(1, Cluster::request(42, Operation::Register, 0, 0, vec![]));
    let (client, reply) = c.replies.last().unwrap().clone();
    assert_eq!(client.0, 42);
    assert_eq!(reply.command(), Some(Command::Reply));
    let epoch = <wire::header::ReplyHeader as wire::header::Layout>::view(reply.bytes())
        .unwrap()
        .op
        .get();
    assert_eq!(epoch, 1, "the Register committed at op 1");
    assert_eq!(
        &reply.body()[8..16],
        &1u64.to_le_bytes(),
        "session in the body"
    );
    // The session works at the primary; a forwarded logout removes it everywhere.
    c.submit(
        0,
        Cluster::request(42, Operation::CreateStream, 1, 1, vec![]),
    );
    c.submit(2, Cluster::request(42, Operation::Logout, 1, 2, vec![]));
    c.ticks(60);
    for r in 0..3 {
        assert_eq!(c.replica(r).commit_min(), 3);
    }
    c.submit(
        0,
        Cluster::request(42, Operation::CreateStream, 1, 3, vec![]),
    );
    assert_eq!(
        c.replies.last().unwrap().1.command(),
        Some(Command::Eviction),
        "logged out"
    );
}

#[test]
fn a_forwarded_logout_of_an_older_session_leaves_the_newer_one() {
    let mut c = Cluster::new(3, GroupId::METADATA, |_| {});
    // Client 42 registers (epoch 1), then registers again (epoch 2, same client id).
    c.submit(0, Cluster::request(42, Operation::Register, 0, 0, vec![]));
    c.submit(0, Cluster::request(42, Operation::Register, 0, 0, vec![]));
    c.ticks(60);
    assert_eq!(c.replica(0).commit_min(), 2);
    // A Logout of the first session reaches a backup late and is forwarded: answered Ok
    // (that session is gone) without a proposal.
    c.submit(2, Cluster::request(42, Operation::Logout, 1, 7, vec![]));
    c.ticks(60);
    let (client, reply) = c.replies.last().unwrap().clone();
    assert_eq!((client.0, reply.command()), (42, Some(Command::Reply)));
    for r in 0..3 {
        assert_eq!(c.replica(r).commit_min(), 2, "no Logout committed on {r}");
    }
    // The second session still works.
    c.submit(
        0,
        Cluster::request(42, Operation::CreateStream, 2, 1, vec![]),
    );
    assert_eq!(
        c.replies.last().unwrap().1.command(),
        Some(Command::Reply),
        "the newer session was not ended"
    );
    // A forwarded Logout naming a session the primary never registered is refused, and
    // the current session survives it too; one naming the current session ends it.
    c.submit(1, Cluster::request(42, Operation::Logout, 9, 8, vec![]));
    c.ticks(60);
    assert_eq!(c.replica(0).commit_min(), 3);
    c.submit(2, Cluster::request(42, Operation::Logout, 2, 9, vec![]));
    c.ticks(60);
    assert_eq!(c.replica(0).commit_min(), 4);
    c.submit(
        0,
        Cluster::request(42, Operation::CreateStream, 2, 10, vec![]),
    );
    assert_eq!(
        c.replies.last().unwrap().1.command(),
        Some(Command::Eviction),
        "logged out"
    );
}

#[test]
fn forward_times_out_with_a_transient_error() {
    let mut b = fresh(3, 1);
    let (result, effects) = input(
        &mut b,
        Input::Request(Cluster::request(42, Operation::Register, 0, 0, vec![])),
    );
    assert_eq!(result, Ok(()));
    let (to, frame) = sent(&effects[0]);
    assert_eq!((to, frame.command()), (0, Some(Command::ForwardRegister)));
    let mut replies = vec![];
    for _ in 0..600 {
        let (_, effects) = input(&mut b, Input::Tick);
        replies.extend(
            effects
                .into_iter()
                .filter(|e| matches!(e, crate::Effect::Reply { .. })),
        );
    }
    let [crate::Effect::Reply { client, frame }] = replies.as_slice() else {
        panic!("{replies:?}")
    };
    assert_eq!(client.0, 42);
    assert_eq!(&frame.body()[8..12], &57u32.to_le_bytes());
    let _ = ReplicaId(0);
}

#[test]
fn the_primary_answers_a_forward_it_cannot_take_with_an_outcome() {
    use wire::decode::RegisterOutcome;
    use wire::header::{ForwardRegisterHeader, ForwardRegisterResultHeader, FrameHeader, Layout};
    let forward = |to_view: u32| {
        let mut h = ForwardRegisterHeader::zeroed();
        h.frame = FrameHeader::new(Command::ForwardRegister, sender(1, to_view));
        h.client.set(42);
        h.nonce.set(1 << 64 | 5);
        h.user_id.set(3);
        crate::frames::finish(h, &[])
    };
    // A backup is not the primary.
    let mut b = fresh(3, 2);
    let (result, effects) = feed(&mut b, 1, &forward(0));
    assert_eq!(result, Ok(()));
    let (to, frame) = sent(&effects[0]);
    let h = ForwardRegisterResultHeader::view(frame.bytes()).unwrap();
    assert_eq!(to, 1);
    assert_eq!(h.outcome, RegisterOutcome::NotPrimary as u8);
    assert_eq!((h.epoch.get(), h.watermark.get()), (0, 0));
    // The primary proposes it; a second forward for the same client is InProgress.
    let mut p = fresh(3, 0);
    let (_, effects) = feed(&mut p, 1, &forward(0));
    assert!(matches!(effects.last(), Some(crate::Effect::Append { .. })));
    let (_, effects) = feed(&mut p, 1, &forward(0));
    let h = ForwardRegisterResultHeader::view(sent(&effects[0]).1.bytes()).unwrap();
    assert_eq!(h.outcome, RegisterOutcome::InProgress as u8);
}

#[test]
fn unmatched_forward_results_are_dropped() {
    use wire::header::{ForwardRegisterResultHeader, FrameHeader, Layout};
    let mut h = ForwardRegisterResultHeader::zeroed();
    h.frame = FrameHeader::new(Command::ForwardRegisterResult, sender(0, 0));
    h.client.set(42);
    h.nonce.set(77);
    let frame = crate::frames::finish(h, &[]);
    let mut b = fresh(3, 1);
    assert_eq!(
        feed(&mut b, 0, &frame),
        (Err(crate::Ignored::Nonce), vec![])
    );
}
