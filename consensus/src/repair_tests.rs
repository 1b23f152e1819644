//! Handler tests for journal repair, both sides.

#![allow(unused_must_use)]

use wire::Command;

use crate::Ignored;
use crate::io::{Completion, Effect, Input};
use crate::test_support::*;

fn as_repair(frame: &crate::Frame) -> crate::Frame {
    crate::frames::as_repair(frame)
}

#[test]
fn server_sends_the_range_then_repair_done() {
    let c = chain(0, 0, 3);
    let mut b = fresh(3, 1);
    journal(&mut b, &c);
    let (result, effects) = feed(&mut b, 2, &request_prepares(2, 77, 2, 9));
    assert_eq!(result, Ok(()));
    assert_eq!(
        effects,
        vec![
            send(2, as_repair(&c[1])),
            send(2, as_repair(&c[2])),
            send(2, repair_reply(Command::RepairDone, 1, 77, 3)),
        ]
    );
}

#[test]
fn server_clamps_an_empty_range_and_reports_eviction() {
    let c = chain(0, 0, 2);
    let mut b = fresh(3, 1);
    journal(&mut b, &c);
    // Entirely above what we hold (§17.10: never an inverted range).
    assert_eq!(
        feed(&mut b, 2, &request_prepares(2, 5, 3, 9)),
        (
            Ok(()),
            vec![send(2, repair_reply(Command::RepairDone, 1, 5, 2))]
        )
    );
}

#[test]
fn server_reads_evicted_bodies_back_through_the_journal() {
    let c = chain(0, 0, 1);
    let mut b = fresh(3, 1);
    journal(&mut b, &c);
    b.journal.evict_frame(1);
    let (_, effects) = feed(&mut b, 2, &request_prepares(2, 5, 1, 1));
    assert_eq!(
        effects,
        vec![Effect::Read {
            op: 1,
            checksum: checksum(&c[0])
        }]
    );
    let (result, effects) = input(
        &mut b,
        Input::Done(Completion::Read {
            op: 1,
            frame: Some(c[0].clone()),
        }),
    );
    assert_eq!(result, Ok(()));
    assert_eq!(
        effects,
        vec![
            send(2, as_repair(&c[0])),
            send(2, repair_reply(Command::RepairDone, 1, 5, 1))
        ]
    );
}

#[test]
fn requester_verifies_ingests_and_commits() {
    let c = chain(0, 0, 3);
    let mut b = fresh(3, 2);
    // A heartbeat says op 3 committed: the backup asks the primary for 1..=3.
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 3, 1));
    let (to, request) = sent(&effects[0]);
    assert_eq!(to, 0);
    assert_eq!(request.command(), Some(Command::RequestPrepares));
    let nonce =
        <wire::header::RequestPreparesHeader as wire::header::Layout>::view(request.bytes())
            .unwrap()
            .nonce
            .get();
    for f in &c {
        let (result, effects) = feed(&mut b, 0, &as_repair(f));
        assert_eq!(result, Ok(()));
        assert_eq!(effects, vec![append(f)]);
    }
    assert_eq!(
        feed(
            &mut b,
            0,
            &repair_reply(Command::RepairDone, 0, nonce + 1, 3)
        )
        .0,
        Err(Ignored::Nonce)
    );
    let (result, effects) = feed(&mut b, 0, &repair_reply(Command::RepairDone, 0, nonce, 3));
    assert_eq!(result, Ok(()));
    assert_eq!(effects, vec![]);
    assert_eq!(b.commit_min(), 3);
}

#[test]
fn requester_refuses_a_body_that_is_not_the_views() {
    let c = chain(0, 0, 2);
    let mut b = fresh(3, 2);
    journal(&mut b, &c[..1]);
    let (_, _) = feed(&mut b, 0, &commit_frame(0, 0, 2, 1));
    let forged = prepare(0, 0, 2, 5, 0, b"forged");
    assert_eq!(
        feed(&mut b, 0, &as_repair(&forged)),
        (Ok(()), vec![]),
        "unverifiable: buffered, never journaled"
    );
    assert!(b.header(2).is_none());
    let (result, effects) = feed(&mut b, 0, &as_repair(&c[1]));
    assert_eq!(result, Ok(()));
    assert_eq!(
        effects,
        vec![Effect::Append {
            op: 2,
            frame: c[1].clone()
        }]
    );
}

#[test]
fn repair_frames_without_a_session_are_dropped() {
    let c = chain(0, 0, 1);
    let mut b = fresh(3, 2);
    assert_eq!(
        feed(&mut b, 0, &as_repair(&c[0])),
        (Err(Ignored::Nonce), vec![])
    );
}

#[test]
fn range_evicted_turns_repair_into_state_transfer() {
    let mut b = fresh(3, 2);
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 50, 1));
    let (_, request) = sent(&effects[0]);
    let nonce =
        <wire::header::RequestPreparesHeader as wire::header::Layout>::view(request.bytes())
            .unwrap()
            .nonce
            .get();
    let (result, effects) = feed(
        &mut b,
        0,
        &repair_reply(Command::RangeEvicted, 0, nonce, 30),
    );
    assert_eq!(result, Ok(()));
    let (to, frame) = sent(&effects[0]);
    assert_eq!(
        (to, frame.command()),
        (0, Some(Command::RequestStateTransfer))
    );
    assert!(b.is_transferring());
    // While transferring it neither acks nor serves.
    let c = chain(0, 0, 1);
    assert_eq!(feed(&mut b, 0, &c[0]).0, Err(Ignored::Transferring));
    assert_eq!(
        feed(&mut b, 1, &request_prepares(1, 3, 1, 1)).0,
        Err(Ignored::Transferring)
    );
}

#[test]
fn a_periodic_checkpoint_raises_the_floor_and_repair_below_it_is_evicted() {
    let c = chain(0, 0, 12);
    let mut raw = raw(3, 1);
    raw.checkpoint_interval_ops = 8;
    let mut b = boot(raw);
    journal(&mut b, &c);
    // Committing past the interval checkpoints at commit_min, last in the step.
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 12, 1));
    assert_eq!(b.commit_min(), 12);
    assert_eq!(effects.last(), Some(&Effect::Checkpoint { op: 12 }));
    assert_eq!(
        effects
            .iter()
            .filter(|e| matches!(e, Effect::Checkpoint { .. }))
            .count(),
        1
    );
    // Until the checkpoint is durable the journal below it is still served.
    let (result, effects) = feed(&mut b, 2, &request_prepares(2, 4, 3, 3));
    assert_eq!(result, Ok(()));
    assert_eq!(
        effects,
        vec![
            send(2, as_repair(&c[2])),
            send(2, repair_reply(Command::RepairDone, 1, 4, 3)),
        ]
    );
    // No second checkpoint while one is in flight.
    assert!(
        !tick_until_effects(&mut b, 50)
            .iter()
            .any(|e| matches!(e, Effect::Checkpoint { .. }))
    );
    assert_eq!(
        input(&mut b, Input::Done(Completion::Checkpointed { op: 12 })).0,
        Ok(())
    );
    assert_eq!(b.snapshot_op(), 12);
    // The driver compacted: ops at or below the floor are RangeEvicted (first op held: 13),
    // never read back through the journal.
    let (result, effects) = feed(&mut b, 2, &request_prepares(2, 5, 3, 12));
    assert_eq!(result, Ok(()));
    assert_eq!(
        effects,
        vec![
            send(2, repair_reply(Command::RangeEvicted, 1, 5, 13)),
            send(2, repair_reply(Command::RepairDone, 1, 5, 2)),
        ]
    );
    // A duplicate completion changes nothing; one above anything asked for is stale.
    assert_eq!(
        input(&mut b, Input::Done(Completion::Checkpointed { op: 12 })).0,
        Ok(())
    );
    assert_eq!(
        input(&mut b, Input::Done(Completion::Checkpointed { op: 11 })).0,
        Ok(())
    );
    assert_eq!(b.snapshot_op(), 12);
}
