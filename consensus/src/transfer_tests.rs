//! Handler tests for state transfer, both sides.

#![allow(unused_must_use)]

use wire::Command;
use wire::header::{
    FrameHeader, Layout, RequestStateChunkHeader, RequestStateTransferHeader, StateChunkHeader,
    StateTransferTargetHeader,
};
use wire::manifest;

use crate::Ignored;
use crate::io::Effect;
use crate::test_support::*;
use crate::testing::Cluster;
use crate::transfer::TransferStage;
use crate::types::{GroupId, ReplicaId};

fn request_transfer(from: u8, nonce: u128) -> crate::Frame {
    let mut h = RequestStateTransferHeader::zeroed();
    h.frame = FrameHeader::new(Command::RequestStateTransfer, sender(from, 0));
    h.nonce.set(nonce);
    h.group.set(GroupId::METADATA.0);
    crate::frames::finish(h, &[])
}

fn request_chunk(from: u8, nonce: u128, artifact: u32, offset: u64, len: u32) -> crate::Frame {
    let mut h = RequestStateChunkHeader::zeroed();
    h.frame = FrameHeader::new(Command::RequestStateChunk, sender(from, 0));
    h.nonce.set(nonce);
    h.artifact.set(artifact);
    h.offset.set(offset);
    h.len.set(len);
    h.group.set(GroupId::METADATA.0);
    crate::frames::finish(h, &[])
}

/// A primary that committed `k` ops through the reference driver.
fn primary_with(k: u64) -> Cluster {
    let mut c = Cluster::new(3, GroupId::METADATA, |_| {});
    for client in 1..=k as u128 {
        c.submit(
            0,
            Cluster::request(client, wire::Operation::Register, 0, 0, vec![]),
        );
    }
    c
}

#[test]
fn server_offers_a_manifest_and_serves_chunks_clamped() {
    let mut c = primary_with(2);
    let p = c.replicas[0].as_mut().unwrap();
    let (result, effects) = feed(p, 2, &request_transfer(2, 99));
    assert_eq!(result, Ok(()));
    let (to, descriptor) = sent(&effects[0]);
    assert_eq!(to, 2);
    let h = StateTransferTargetHeader::view(descriptor.bytes()).unwrap();
    assert_eq!((h.available, h.commit_op.get()), (1, 2));
    let entries = manifest::decode(descriptor.body()).unwrap().to_vec();
    assert_eq!(entries.len(), 2, "snapshot and client table");
    // The same nonce again gets the same offer.
    let (_, again) = feed(p, 2, &request_transfer(2, 99));
    assert_eq!(sent(&again[0]).1, descriptor);
    // A chunk of the client table, len clamped to what is left.
    let (_, effects) = feed(p, 2, &request_chunk(2, 99, 1, 4, 1 << 20));
    let (_, chunk) = sent(&effects[0]);
    let ch = StateChunkHeader::view(chunk.bytes()).unwrap();
    assert_eq!((ch.artifact.get(), ch.offset.get()), (1, 4));
    assert_eq!(chunk.body().len() as u64, entries[1].len - 4);
    // Unknown nonce: a transient refusal so the requester restarts.
    let (result, effects) = feed(p, 2, &request_chunk(2, 98, 0, 0, 16));
    assert_eq!(result, Err(Ignored::Nonce));
    let refusal = StateTransferTargetHeader::view(sent(&effects[0]).1.bytes()).unwrap();
    assert_eq!((refusal.available, refusal.unavailable_transient), (0, 1));
}

#[test]
fn backups_refuse_to_serve_transfers() {
    let mut b = fresh(3, 1);
    let (result, effects) = feed(&mut b, 2, &request_transfer(2, 5));
    assert_eq!(result, Err(Ignored::NotPrimary));
    let h = StateTransferTargetHeader::view(sent(&effects[0]).1.bytes()).unwrap();
    assert_eq!((h.available, h.unavailable_transient), (0, 1));
}

#[test]
fn receiver_pulls_in_lockstep_verifies_and_installs() {
    let mut c = primary_with(3);
    let mut b = fresh(3, 2);
    let mut out = crate::Outbox::new();
    b.start_state_transfer(ReplicaId(0), &mut out);
    assert_eq!(b.transfer.stage, TransferStage::AwaitingTarget);
    let effects: Vec<Effect> = out.drain().collect();
    let (_, request) = sent(&effects[0]);
    // Serve it from the real primary.
    let p = c.replicas[0].as_mut().unwrap();
    let (_, effects) = feed(p, 2, request);
    let descriptor = sent(&effects[0]).1.clone();
    let (result, effects) = feed(&mut b, 0, &descriptor);
    assert_eq!(result, Ok(()));
    assert_eq!(b.transfer.stage, TransferStage::Fetching);
    // Exactly one chunk request in flight; answer until installed.
    let mut pending = effects;
    let mut rounds = 0;
    while b.transfer.stage == TransferStage::Fetching {
        rounds += 1;
        assert_eq!(pending.len(), 1, "lockstep");
        let p = c.replicas[0].as_mut().unwrap();
        let (_, served) = feed(p, 2, sent(&pending[0]).1);
        let chunk = sent(&served[0]).1.clone();
        // A replayed chunk at a stale offset is out of scope.
        let (_, effects) = feed(&mut b, 0, &chunk);
        pending = effects
            .into_iter()
            .filter(|e| matches!(e, Effect::Send { .. }))
            .collect();
        if b.transfer.stage == TransferStage::Fetching {
            assert_eq!(feed(&mut b, 0, &chunk).0, Err(Ignored::Scope));
        }
    }
    assert!(rounds >= 2);
    assert_eq!(b.transfer.stage, TransferStage::Idle);
    assert_eq!(b.commit_min(), 3);
    assert_eq!(b.state_machine(), c.replica(0).state_machine());
    assert_eq!(
        b.client_table_encoded(),
        c.replica(0).client_table_encoded()
    );
}

/// A backup that is transferring still hears its primary's heartbeats: a transfer that outlasts
/// the heartbeat timeout must not start view changes against a healthy group (it neither
/// commits nor repairs until the install).
#[test]
fn a_transferring_backup_keeps_its_primary() {
    let mut b = fresh(3, 2);
    let timeout = raw(3, 2).heartbeat_timeout_ticks;
    let mut out = crate::Outbox::new();
    b.start_state_transfer(ReplicaId(0), &mut out);
    assert_eq!(b.transfer.stage, TransferStage::AwaitingTarget);
    let mut counter = 1;
    let mut transferring_until = 0;
    for tick in 0..4 * timeout {
        let (_, effects) = input(&mut b, crate::Input::Tick);
        for effect in &effects {
            if let Effect::Send { frame, .. } = effect {
                assert_ne!(
                    frame.command(),
                    Some(Command::StartViewChange),
                    "tick {tick}: a view change against a live primary"
                );
            }
        }
        assert_eq!(
            (b.status(), b.view()),
            (crate::Status::Normal, 0),
            "tick {tick}"
        );
        if b.transfer.is_active() {
            transferring_until = tick;
        }
        if tick % (timeout / 2).max(1) == 0 {
            counter += 1;
            let active = b.transfer.is_active();
            let (result, _) = feed(&mut b, 0, &commit_frame(0, 0, 0, counter));
            if active {
                assert_eq!(result, Err(Ignored::Transferring), "tick {tick}");
            }
        }
    }
    assert!(
        transferring_until > timeout,
        "the transfer outlasted the heartbeat timeout ({transferring_until} ticks)"
    );
}

/// Ticks a Recovering replica through its probes into the election fallback (§9.3) and
/// completes the superblock write of the new view.
fn fall_back_to_election(r: &mut crate::test_support::R) {
    for _ in 0..10_000 {
        input(r, crate::Input::Tick);
        if r.status() == crate::Status::ViewChange {
            persisted(r);
            return;
        }
    }
    panic!("no election fallback");
}

/// The stall of seeds 9200000136 and 880288 (`--replicas 3 --groups 4`), rule 1 (decision 60):
/// a replica restarts with an uncommitted op above its checkpoint, so its recovery barrier sits
/// above its commit point, and becomes the only possible primary. It must still serve state
/// transfers (they carry only applied, hence committed, state) while the barrier holds back
/// new requests; its backups, mid-transfer, cannot ack the op that would lift the barrier.
/// Rule 1's setup: r1, primary of view 1 after a whole-cluster restart with its barrier above
/// its commit point; returns it and the StartView it broadcast.
fn primary_behind_its_barrier() -> (crate::test_support::R, crate::Frame) {
    let mut c = chain(0, 0, 2);
    c.push(prepare(0, 0, 3, checksum(&c[1]), 2, &[3]));
    // Whole-cluster restart: r1 and r2 hold ops 1..=3, op 3 not provably committed.
    let mut p = restarted(3, 1, 0, &c, 9);
    let mut b = restarted(3, 2, 0, &c, 10);
    assert_eq!(p.recovery_barrier, 3);
    fall_back_to_election(&mut p);
    fall_back_to_election(&mut b);
    assert_eq!((p.view(), b.view()), (1, 1));
    // SVC and DVC exchange for view 1; r1 is its primary-elect.
    let (_, effects) = feed(&mut b, 1, &svc(1, 1));
    let dvc = effects
        .iter()
        .find_map(|e| match e {
            Effect::Send { to, frame }
                if to.0 == 1 && frame.command() == Some(Command::DoViewChange) =>
            {
                Some(frame.clone())
            }
            _ => None,
        })
        .expect("r2 sends its DVC");
    feed(&mut p, 2, &svc(1, 2));
    feed(&mut p, 2, &dvc);
    let effects = persisted(&mut p);
    assert!(p.is_primary(), "{:?}", p.status());
    let start_view = effects
        .iter()
        .find_map(|e| match e {
            Effect::Send { to, frame }
                if to.0 == 0 && frame.command() == Some(Command::StartView) =>
            {
                Some(frame.clone())
            }
            _ => None,
        })
        .expect("StartView to r0");
    (p, start_view)
}

#[test]
fn a_primary_behind_its_recovery_barrier_serves_transfers() {
    let (mut p, _) = primary_behind_its_barrier();
    assert_eq!((p.op(), p.commit_min(), p.commit_max()), (3, 2, 2));
    assert!(p.recovery_barrier > p.commit_max(), "barrier still up");
    assert!(!p.is_caught_up_primary());
    // A backup mid-transfer asks: it gets an offer of the committed state at op 2.
    let (result, effects) = feed(&mut p, 0, &request_transfer(0, 77));
    assert_eq!(result, Ok(()));
    let [effect] = effects.as_slice() else {
        panic!("{effects:?}")
    };
    let (to, frame) = sent(effect);
    let h = StateTransferTargetHeader::view(frame.bytes()).unwrap();
    assert_eq!((to, h.available, h.commit_op.get()), (0, 1, 2));
    // New client requests still wait for the barrier.
    let request = Cluster::request(5, wire::Operation::Register, 0, 0, vec![]);
    let (result, effects) = input(&mut p, crate::Input::Request(request));
    assert_eq!(result, Err(Ignored::Refused), "{effects:?}");
    // A primary that is not caught up for another reason (commit_min < commit_max) refuses.
    p.commit_max = 3;
    let (result, effects) = feed(&mut p, 0, &request_transfer(0, 78));
    assert_eq!(result, Err(Ignored::NotPrimary));
    let h = StateTransferTargetHeader::view(sent(&effects[0]).1.bytes()).unwrap();
    assert_eq!((h.available, h.unavailable_transient), (0, 1));
}

/// Rule 2 of the same stall class (decision 60): a transferring backup neither journals nor
/// acks a prepare (it would chain onto state it does not hold yet); once it installed the
/// primary's committed state, the primary's retransmission is journaled and acked, and the ack
/// lifts the primary's barrier. End to end at handler level, with rule 1 serving the transfer.
#[test]
fn a_transferring_backup_acks_after_the_install_and_lifts_the_barrier() {
    let (mut p, sv) = primary_behind_its_barrier();
    let mut b = fresh(3, 0);
    assert_eq!(feed(&mut b, 1, &sv).0, Ok(()));
    persisted(&mut b);
    assert_eq!((b.view(), b.op(), b.commit_max()), (1, 3, 2));
    // The primary retransmits op 3 to the backups that have not acked it.
    let mut prepare = None;
    for _ in 0..10_000 {
        let (_, effects) = input(&mut p, crate::Input::Tick);
        prepare = effects.iter().find_map(|e| match e {
            Effect::Send { to, frame }
                if to.0 == 0 && frame.command() == Some(Command::Prepare) =>
            {
                Some(frame.clone())
            }
            _ => None,
        });
        if prepare.is_some() {
            break;
        }
    }
    let prepare = prepare.expect("the primary retransmits op 3");
    // Mid-transfer (its repair range was evicted), the backup cannot take it.
    let mut out = crate::Outbox::new();
    b.start_state_transfer(ReplicaId(1), &mut out);
    let mut pending: Vec<Effect> = out.drain().collect();
    assert_eq!(
        feed(&mut b, 1, &prepare),
        (Err(Ignored::Transferring), vec![])
    );
    // Served by the primary behind its barrier, the transfer installs op 2.
    for _ in 0..64 {
        if !b.transfer.is_active() {
            break;
        }
        let request = pending
            .iter()
            .find_map(|e| match e {
                Effect::Send { to, frame } if to.0 == 1 => Some(frame.clone()),
                _ => None,
            })
            .expect("a request to the primary");
        let (_, served) = feed(&mut p, 0, &request);
        let (_, effects) = feed(&mut b, 1, sent(&served[0]).1);
        pending = effects;
    }
    assert!(!b.transfer.is_active());
    assert_eq!((b.commit_min(), b.op()), (2, 3));
    // The retransmission now lands: journaled, acked once durable.
    let (_, effects) = feed(&mut b, 1, &prepare);
    assert!(effects.contains(&append(&prepare)), "{effects:?}");
    let (_, effects) = input(&mut b, appended(&prepare));
    let ack = effects
        .iter()
        .find_map(|e| match e {
            Effect::Send { to, frame }
                if to.0 == 1 && frame.command() == Some(Command::PrepareOk) =>
            {
                Some(frame.clone())
            }
            _ => None,
        })
        .expect("PrepareOk for op 3");
    feed(&mut p, 0, &ack);
    assert_eq!((p.commit_min(), p.commit_max()), (3, 3));
    assert!(p.is_caught_up_primary(), "the barrier is lifted");
}

/// A chunk whose bytes differ from what the manifest's checksum covers (StateChunk bodies carry
/// no integrity of their own) is caught when its artifact completes: nothing is installed, the
/// session is discarded and a new one (fresh nonce) asks again.
#[test]
fn a_corrupted_chunk_is_never_installed() {
    let mut c = primary_with(3);
    let mut b = fresh(3, 2);
    let before = b.state_machine().clone();
    let mut out = crate::Outbox::new();
    b.start_state_transfer(ReplicaId(0), &mut out);
    let effects: Vec<Effect> = out.drain().collect();
    let first_nonce = b.transfer.session.as_ref().unwrap().nonce;
    let p = c.replicas[0].as_mut().unwrap();
    let (_, served) = feed(p, 2, sent(&effects[0]).1);
    let (_, effects) = feed(&mut b, 0, sent(&served[0]).1);
    // The snapshot artifact (16 bytes: op, digest) comes in one chunk; flip a digest byte.
    let (_, served) = feed(p, 2, sent(&effects[0]).1);
    let chunk = sent(&served[0]).1;
    let h = StateChunkHeader::view(chunk.bytes()).unwrap();
    assert_eq!(
        (h.artifact.get(), h.offset.get(), chunk.body().len()),
        (0, 0, 16)
    );
    let mut bytes = chunk.bytes().to_vec();
    bytes[wire::HEADER_SIZE + 12] ^= 0x40;
    let (result, effects) = feed(&mut b, 0, &crate::Frame::new(bytes));
    assert_eq!(result, Ok(()));
    assert_eq!(b.transfer.stage, TransferStage::AwaitingTarget);
    let session = b.transfer.session.as_ref().unwrap();
    assert_ne!(session.nonce, first_nonce, "a fresh session");
    assert_eq!(session.failures, 1);
    let (to, frame) = sent(&effects[0]);
    assert_eq!(
        (to, frame.command()),
        (0, Some(Command::RequestStateTransfer))
    );
    assert_eq!(b.commit_min(), 0);
    assert_eq!(b.state_machine(), &before);
    assert_eq!(b.transfers_installed(), 0);
}

/// Primary affinity (decision 171): a backup's `take_over` starts a view change toward the
/// smallest later view it is the primary of; everything else refuses.
#[test]
fn take_over_aims_at_the_next_view_this_replica_leads() {
    let now = crate::Now {
        tick: 1,
        realtime_us: 1_000_000,
    };
    let mut b = fresh(3, 2);
    let mut out = crate::Outbox::new();
    assert_eq!(b.take_over(now, &mut out), Ok(2));
    assert_eq!((b.status(), b.view()), (crate::Status::ViewChange, 2));
    assert_eq!(b.takeovers(), 1);
    // Mid view change: not Normal, refused.
    assert_eq!(b.take_over(now, &mut out), Err(Ignored::Status));
    // The primary of its view refuses.
    let mut p = fresh(3, 0);
    assert_eq!(p.take_over(now, &mut out), Err(Ignored::NotBackup));
    assert_eq!((p.status(), p.view()), (crate::Status::Normal, 0));
    // From view 4 (primary 1), replica 0 aims at view 6 and replica 2 at view 5.
    for (r, target) in [(0, 6), (2, 5)] {
        let mut b = fresh(3, r);
        b.view = 4;
        b.log_view = 4;
        assert_eq!(b.take_over(now, &mut out), Ok(target), "replica {r}");
    }
}

/// End to end over the reference driver: replica 2 takes over a partition group; the
/// committed log survives the view change and the new primary commits new requests.
#[test]
fn take_over_moves_the_primary_and_keeps_the_log() {
    let key = wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 1,
    };
    let group = GroupId::partition(key).unwrap();
    let mut c = Cluster::new(3, group, |_| {});
    let body = || {
        let batch = crate::partition::build_batch(&[b"a", b"bb"]);
        crate::partition::build_send_messages_request(&batch, 1)
    };
    for request in 1..=3u64 {
        c.submit(
            0,
            Cluster::request(11, wire::Operation::SendMessages, 1, request, body()),
        );
    }
    c.ticks(60);
    let committed = c.replica(0).commit_min();
    assert_eq!(committed, 3);
    assert_eq!(c.take_over(2), Ok(2));
    c.ticks(60);
    assert!(c.replica(2).is_primary(), "{:?}", c.replica(2).status());
    for r in 0..3 {
        assert_eq!(c.replica(r).view(), 2, "replica {r}");
        assert!(c.replica(r).commit_max() >= committed, "replica {r}");
    }
    c.submit(
        2,
        Cluster::request(11, wire::Operation::SendMessages, 1, 4, body()),
    );
    c.ticks(60);
    for r in 0..3 {
        assert_eq!(c.replica(r).commit_min(), committed + 1, "replica {r}");
        assert_eq!(c.replica(r).next_offset(), 8, "replica {r}");
    }
    assert_eq!(c.replica(2).state_machine(), c.replica(0).state_machine());
}

/// Primary affinity backs off (decision 171): a replica that is a backup again after its
/// takeover (the view change went elsewhere) refuses the next `take_over` for twice the
/// heartbeat timeout, then tries again.
#[test]
fn take_over_backs_off_after_a_takeover_that_did_not_hold() {
    let at = |tick: u64| crate::Now {
        tick,
        realtime_us: 1_000_000 + tick * 10_000,
    };
    let timeout = raw(3, 1).heartbeat_timeout_ticks;
    let mut b = fresh(3, 1);
    let mut out = crate::Outbox::new();
    assert_eq!(b.take_over(at(10), &mut out), Ok(1));
    persisted(&mut b);
    // Replica 2 wins view 2 instead; the taker follows it as a backup.
    let (result, _) = feed(&mut b, 2, &start_view(2, 2, 0, 0, &[]));
    assert_eq!(result, Ok(()));
    persisted(&mut b);
    assert_eq!((b.status(), b.view()), (crate::Status::Normal, 2));
    assert_eq!(b.take_over(at(20), &mut out), Err(Ignored::Abdicated));
    assert_eq!(
        b.take_over(at(20 + 2 * timeout - 1), &mut out),
        Err(Ignored::Abdicated)
    );
    assert_eq!((b.status(), b.view()), (crate::Status::Normal, 2));
    assert_eq!(b.take_over(at(20 + 2 * timeout), &mut out), Ok(4));
    assert_eq!(b.takeovers(), 2);
}

/// A partition backup of 3 (replica 1) that asked primary 0 for a state transfer after
/// repair met RangeEvicted; returns it and the transfer's nonce.
fn partition_receiver() -> (crate::test_support::R, GroupId, u128) {
    use wire::header::RepairRangeReplyHeader;
    let group = GroupId::partition(wire::PartitionKey {
        stream: 1,
        topic: 1,
        partition: 0,
    })
    .unwrap();
    let mut b = boot(crate::RawConfig::new(CLUSTER, ReplicaId(1), 3, group));
    let (_, effects) = feed(
        &mut b,
        0,
        &crate::frames::commit(sender(0, 0), group.0, 50, 1),
    );
    let repair = effects
        .iter()
        .find_map(|e| match e {
            Effect::Send { frame, .. } if frame.command() == Some(Command::RequestPrepares) => {
                Some(
                    wire::header::RequestPreparesHeader::view(frame.bytes())
                        .unwrap()
                        .nonce
                        .get(),
                )
            }
            _ => None,
        })
        .expect("a repair request");
    let mut h = RepairRangeReplyHeader::zeroed();
    h.frame = FrameHeader::new(Command::RangeEvicted, sender(0, 0));
    h.nonce.set(repair);
    h.op.set(40);
    h.group.set(group.0);
    let (_, effects) = feed(&mut b, 0, &crate::frames::finish(h, &[]));
    let nonce = effects
        .iter()
        .find_map(|e| match e {
            Effect::Send { frame, .. }
                if frame.command() == Some(Command::RequestStateTransfer) =>
            {
                Some(
                    RequestStateTransferHeader::view(frame.bytes())
                        .unwrap()
                        .nonce
                        .get(),
                )
            }
            _ => None,
        })
        .expect("a transfer request");
    (b, group, nonce)
}

/// An offer of `entries` for `group` at op 30.
fn partition_offer(
    group: GroupId,
    nonce: u128,
    entries: &[manifest::ManifestEntry],
) -> crate::Frame {
    let mut body = Vec::new();
    manifest::encode(entries, &mut body).unwrap();
    let mut h = StateTransferTargetHeader::zeroed();
    h.frame = FrameHeader::new(Command::StateTransferTarget, sender(0, 0));
    h.nonce.set(nonce);
    h.commit_op.set(30);
    h.commit_max.set(50);
    h.group.set(group.0);
    h.available = 1;
    crate::frames::finish(h, &body)
}

fn segment(len: u64) -> manifest::ManifestEntry {
    manifest::ManifestEntry {
        kind: manifest::ArtifactKind::SEGMENT_LOG,
        frontier: 0,
        len,
        checksum: 0,
    }
}

fn offsets(len: u64) -> manifest::ManifestEntry {
    manifest::ManifestEntry {
        kind: manifest::ArtifactKind::CONSUMER_OFFSETS,
        frontier: 30,
        len,
        checksum: 0,
    }
}

/// Decision 507: a partition offer is held to the partition arm's caps (state-transfer.md
/// §3), not the metadata arm's 1 GiB per artifact and 4 GiB in all: Strand offers a
/// partition's whole log as one SEGMENT_LOG (decision 163), so one of 5 GiB is accepted; one
/// over `transfer_artifact_bytes_max` and offsets over 32 MiB are refused.
#[test]
fn a_partition_offer_is_held_to_the_partition_caps() {
    let (mut b, group, nonce) = partition_receiver();
    let offer = partition_offer(group, nonce, &[segment(5 << 30), offsets(37)]);
    let (result, effects) = feed(&mut b, 0, &offer);
    assert_eq!(result, Ok(()), "{effects:?}");
    assert!(
        effects.iter().any(|e| matches!(
            e,
            Effect::Send { frame, .. } if frame.command() == Some(Command::RequestStateChunk)
        )),
        "the first chunk is asked for: {effects:?}"
    );
    let (mut b, group, nonce) = partition_receiver();
    let over = crate::constants::TRANSFER_ARTIFACT_BYTES_MAX_DEFAULT + 1;
    let offer = partition_offer(group, nonce, &[segment(over), offsets(37)]);
    assert_eq!(feed(&mut b, 0, &offer).0, Err(Ignored::Malformed));
    let (mut b, group, nonce) = partition_receiver();
    let offer = partition_offer(group, nonce, &[segment(1 << 20), offsets((32 << 20) + 1)]);
    assert_eq!(feed(&mut b, 0, &offer).0, Err(Ignored::Malformed));
}
