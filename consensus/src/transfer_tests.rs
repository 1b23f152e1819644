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
