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

/// `len` prepares of `body_len` bytes each from op 1, chained, by r0 in view 0.
fn chain_of(len: u64, body_len: usize) -> Vec<crate::Frame> {
    let mut out: Vec<crate::Frame> = Vec::new();
    for op in 1..=len {
        let parent = out.last().map_or(0, checksum);
        out.push(prepare(0, 0, op, parent, 0, &vec![op as u8; body_len]));
    }
    out
}

/// Decision 517: a chunk of 1 MiB prepares ends once its frames reach the window's 8 MiB,
/// whether the frames are cached or read back, and its RepairDone names the last op served
/// (the requester asks again from there, §10.4).
#[test]
fn server_ends_a_chunk_at_the_window_bytes() {
    let c = chain_of(20, 1024 * 1024);
    let fits = (crate::constants::REPAIR_WINDOW_BYTES_MAX / c[0].bytes().len() as u64) as usize;
    assert_eq!(fits, 7);
    let mut b = fresh(3, 1);
    journal(&mut b, &c);
    let (result, effects) = feed(&mut b, 2, &request_prepares(2, 77, 1, 20));
    assert_eq!(result, Ok(()));
    let mut want: Vec<_> = c[..fits].iter().map(|f| send(2, as_repair(f))).collect();
    want.push(send(
        2,
        repair_reply(Command::RepairDone, 1, 77, fits as u64),
    ));
    assert_eq!(effects, want);

    // Evicted: only the chunk's ops are read back.
    for op in 1..=20 {
        b.journal.evict_frame(op);
    }
    let (_, effects) = feed(&mut b, 2, &request_prepares(2, 78, 1, 20));
    let reads: Vec<_> = (1..=fits as u64)
        .map(|op| Effect::Read {
            op,
            checksum: checksum(&c[op as usize - 1]),
        })
        .collect();
    assert_eq!(effects, reads);
    let mut served = Vec::new();
    for op in 1..=fits as u64 {
        let frame = Some(c[op as usize - 1].clone());
        let (result, effects) = input(&mut b, Input::Done(Completion::Read { op, frame }));
        assert_eq!(result, Ok(()));
        served.extend(effects);
    }
    want[fits] = send(2, repair_reply(Command::RepairDone, 1, 78, fits as u64));
    assert_eq!(served, want);
}

/// The cut at send time (decision 517): as many leading frames as fit the window, and at
/// least one, however large, so that repair always progresses.
#[test]
fn a_chunk_carries_what_fits_the_window_and_at_least_one_frame() {
    let count =
        |frames: &[crate::Frame]| super::chunk_within_bytes(frames.iter().map(|f| f.len() as u64));
    assert_eq!(count(&chain_of(20, 1024 * 1024)), 7);
    assert_eq!(count(&chain_of(3, 100)), 3);
    assert_eq!(count(&chain_of(2, 9 * 1024 * 1024)), 1);
    assert_eq!(count(&[]), 0);
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

/// Decision 517 from the requester's side: a chunk that a server ended at the window's bytes
/// is progress, the next window starts after it, and it is sized by the large prepares the
/// requester has just taken in (7 of 1 MiB, where the first asked for all 20).
#[test]
fn requester_asks_again_after_a_chunk_ended_at_the_window_bytes() {
    let c = chain_of(20, 1024 * 1024);
    let mut b = fresh(3, 2);
    let window = |effects: &[Effect]| {
        effects.iter().find_map(|e| match e {
            Effect::Send { to, frame } if frame.command() == Some(Command::RequestPrepares) => {
                let h = <wire::header::RequestPreparesHeader as wire::header::Layout>::view(
                    frame.bytes(),
                )
                .unwrap();
                Some((to.0, h.nonce.get(), h.from_op.get(), h.to_op.get()))
            }
            _ => None,
        })
    };
    let (_, effects) = feed(&mut b, 0, &commit_frame(0, 0, 20, 1));
    let (to, nonce, from_op, to_op) = window(&effects).expect("repair requested");
    assert_eq!((to, from_op, to_op), (0, 1, 20));
    for f in &c[..7] {
        let (result, effects) = feed(&mut b, 0, &as_repair(f));
        assert_eq!(result, Ok(()));
        assert_eq!(effects, vec![append(f)]);
    }
    let (result, effects) = feed(&mut b, 0, &repair_reply(Command::RepairDone, 0, nonce, 7));
    assert_eq!(result, Ok(()));
    assert_eq!(b.commit_min(), 7);
    assert_eq!(window(&effects), Some((0, nonce, 8, 14)), "{effects:?}");
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

/// A partition group's frames for the repair-floor tests (decision 71).
mod partition_floor {
    use wire::header::{FrameHeader, Layout, PrepareHeader, RepairRangeReplyHeader};
    use wire::{Command, Operation};

    use super::as_repair;
    use crate::Frame;
    use crate::io::Effect;
    use crate::partition::{build_batch, stamp};
    use crate::test_support::*;
    use crate::types::{GroupId, ReplicaId};

    fn group() -> GroupId {
        GroupId::partition(wire::PartitionKey {
            stream: 1,
            topic: 1,
            partition: 3,
        })
        .unwrap()
    }

    /// A backup `r` of 3 on the partition group.
    fn backup(r: u8) -> R {
        boot(crate::RawConfig::new(CLUSTER, ReplicaId(r), 3, group()))
    }

    /// `len` SendMessages prepares of one message each, by r0 in view 0.
    fn prepares(len: u64) -> Vec<Frame> {
        prepares_of(len, b"m")
    }

    /// `len` SendMessages prepares of one `message` each, by r0 in view 0.
    fn prepares_of(len: u64, message: &[u8]) -> Vec<Frame> {
        let mut out: Vec<Frame> = Vec::new();
        for op in 1..=len {
            let mut batch = build_batch(&[message]);
            stamp(&mut batch, 3, op - 1, 1_000 + op);
            let mut h = PrepareHeader::zeroed();
            h.frame = FrameHeader::new(Command::Prepare, sender(0, 0));
            h.client.set(5);
            h.parent.set(out.last().map_or(0, checksum));
            h.op.set(op);
            h.timestamp.set(1_000 + op);
            h.request.set(op);
            h.operation = Operation::SendMessages.byte();
            h.group.set(group().0);
            out.push(crate::frames::finish(h, &batch));
        }
        out
    }

    fn commit(view: u32, from: u8, commit: u64) -> Frame {
        crate::frames::commit(sender(from, view), group().0, commit, 1)
    }

    fn reply(command: Command, from: u8, nonce: u128, op: u64) -> Frame {
        let mut h = RepairRangeReplyHeader::zeroed();
        h.frame = FrameHeader::new(command, sender(from, 0));
        h.nonce.set(nonce);
        h.op.set(op);
        h.group.set(group().0);
        crate::frames::finish(h, &[])
    }

    /// The RequestPrepares among `effects`: `(to, nonce, from_op, to_op)`.
    fn request(effects: &[Effect]) -> Option<(u8, u128, u64, u64)> {
        effects.iter().find_map(|e| match e {
            Effect::Send { to, frame } if frame.command() == Some(Command::RequestPrepares) => {
                let b = frame.bytes();
                Some((
                    to.0,
                    u128::from_le_bytes(b[128..144].try_into().unwrap()),
                    u64::from_le_bytes(b[144..152].try_into().unwrap()),
                    u64::from_le_bytes(b[152..160].try_into().unwrap()),
                ))
            }
            _ => None,
        })
    }

    fn request_prepares(from: u8, nonce: u128, from_op: u64, to_op: u64) -> Frame {
        let mut h = wire::header::RequestPreparesHeader::zeroed();
        h.frame = FrameHeader::new(Command::RequestPrepares, sender(from, 0));
        h.nonce.set(nonce);
        h.from_op.set(from_op);
        h.to_op.set(to_op);
        h.group.set(group().0);
        crate::frames::finish(h, &[])
    }

    /// Server side of the repair floor: a partition replica whose checkpoint raised its floor
    /// to 12 no longer indexes ops 1..=11, but its WAL may still hold them. It asks the journal
    /// (identity unknown: 0) and serves what the journal still holds; only what the journal
    /// really evicted is answered RangeEvicted (the requester then transfers). Before decision
    /// 71 the whole range below the checkpoint was answered RangeEvicted at once.
    #[test]
    fn below_the_checkpoint_the_wal_is_asked_and_only_a_real_eviction_is_reported() {
        let p = prepares(12);
        let mut b = checkpointed_at_12(&p);
        // r2 lags at op 2: ops 3..=11 are below the index, 12 is the kept entry (header only).
        let (result, effects) = feed(&mut b, 2, &request_prepares(2, 7, 3, 12));
        assert_eq!(result, Ok(()));
        // (Op 12's body is still cached.)
        let expected: Vec<Effect> = (3..=11)
            .map(|op| Effect::Read { op, checksum: 0 })
            .collect();
        assert_eq!(effects, expected);
        // The WAL still holds them all: served in order, then RepairDone.
        let served = read_back(&mut b, &p, 3..=11);
        let mut want: Vec<Effect> = p[2..].iter().map(|f| send(2, as_repair(f))).collect();
        want.push(send(2, reply(Command::RepairDone, 1, 7, 12)));
        assert_eq!(served, want);

        // A read of the wrong op or group is not served as that op.
        feed(&mut b, 2, &request_prepares(2, 8, 3, 3));
        let (_, effects) = input(
            &mut b,
            crate::io::Input::Done(crate::io::Completion::Read {
                op: 3,
                frame: Some(p[4].clone()),
            }),
        );
        assert_eq!(
            effects,
            vec![
                send(2, reply(Command::RangeEvicted, 1, 8, 4)),
                send(2, reply(Command::RepairDone, 1, 8, 2)),
            ]
        );
        // The WAL no longer holds op 3: RangeEvicted, which the requester turns into a state
        // transfer (`evicted_by_the_primary_becomes_a_state_transfer`).
        feed(&mut b, 2, &request_prepares(2, 9, 3, 4));
        let (_, effects) = input(
            &mut b,
            crate::io::Input::Done(crate::io::Completion::Read { op: 3, frame: None }),
        );
        assert_eq!(
            effects,
            vec![
                send(2, reply(Command::RangeEvicted, 1, 9, 4)),
                send(2, reply(Command::RepairDone, 1, 9, 2)),
            ]
        );
        // The chunk is answered; op 4's late read serves nothing.
        let (_, effects) = input(
            &mut b,
            crate::io::Input::Done(crate::io::Completion::Read {
                op: 4,
                frame: Some(p[3].clone()),
            }),
        );
        assert_eq!(effects, vec![]);
    }

    /// Completes `b`'s journal reads of `ops` with the frames of `p` at those ops: what it
    /// sent in answer.
    fn read_back(b: &mut R, p: &[Frame], ops: std::ops::RangeInclusive<u64>) -> Vec<Effect> {
        let mut served = Vec::new();
        for op in ops {
            let (result, effects) = input(
                b,
                crate::io::Input::Done(crate::io::Completion::Read {
                    op,
                    frame: Some(p[op as usize - 1].clone()),
                }),
            );
            assert_eq!(result, Ok(()));
            served.extend(effects);
        }
        served
    }

    /// r1 of the partition group with `p` (12 prepares) journaled, committed and checkpointed
    /// at op 12: ops 1..=11 are below its index, only its WAL holds them.
    fn checkpointed_at_12(p: &[Frame]) -> R {
        let mut raw = crate::RawConfig::new(CLUSTER, ReplicaId(1), 3, group());
        raw.checkpoint_interval_ops = 8;
        let mut b = boot(raw);
        journal(&mut b, p);
        let (_, effects) = feed(&mut b, 0, &commit(0, 0, 12));
        assert_eq!(b.commit_min(), 12);
        assert!(
            effects.contains(&Effect::Checkpoint { op: 12 }),
            "{effects:?}"
        );
        input(
            &mut b,
            crate::io::Input::Done(crate::io::Completion::Checkpointed { op: 12 }),
        );
        assert_eq!(b.snapshot_op(), 12);
        b
    }

    /// Decision 517, sizes the server cannot know before it reads: ops below its index are
    /// planned at the size of the prepares it saw last (small here), and the chunk is cut to
    /// the window's bytes by the frames the reads bring (1 MiB each: 7 of them).
    #[test]
    fn below_the_checkpoint_a_chunk_is_cut_to_the_sizes_read() {
        let mut b = checkpointed_at_12(&prepares(12));
        let big = prepares_of(12, &vec![b'm'; 1 << 20]);
        let (_, effects) = feed(&mut b, 2, &request_prepares(2, 7, 3, 12));
        let expected: Vec<Effect> = (3..=11)
            .map(|op| Effect::Read { op, checksum: 0 })
            .collect();
        assert_eq!(
            effects, expected,
            "planned at the small size: every op read"
        );
        let served = read_back(&mut b, &big, 3..=11);
        let fits = (crate::constants::REPAIR_WINDOW_BYTES_MAX / big[2].len() as u64) as usize;
        assert_eq!(fits, 7);
        let mut want: Vec<Effect> = big[2..2 + fits]
            .iter()
            .map(|f| send(2, as_repair(f)))
            .collect();
        want.push(send(2, reply(Command::RepairDone, 1, 7, 2 + fits as u64)));
        assert_eq!(served, want);
    }

    /// The primary itself no longer holds ops the backup lacks: state transfer from it.
    #[test]
    fn evicted_by_the_primary_becomes_a_state_transfer() {
        let p = prepares(4);
        let mut b = backup(2);
        journal(&mut b, &p[..1]);
        let (_, effects) = feed(&mut b, 0, &commit(0, 0, 4));
        let (to, nonce, _, _) = request(&effects).expect("repair requested");
        assert_eq!(to, 0);
        let (result, effects) = feed(&mut b, 0, &reply(Command::RangeEvicted, 0, nonce, 4));
        assert_eq!(result, Ok(()));
        assert!(b.is_transferring());
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, Effect::Send { to, frame }
            if to.0 == 0 && frame.command() == Some(Command::RequestStateTransfer)))
        );
    }
}
