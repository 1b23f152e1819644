use super::*;
use crate::client::codec::{Identifier, PollingStrategy};
use crate::client::reply::{PollHead, decode_send_reply};
use crate::metadata_group::Checkpointable;

fn group() -> GroupId {
    crate::test_frames::partition_group()
}

fn header(op: Operation) -> PrepareHeader {
    let mut h = PrepareHeader::zeroed();
    h.operation = op.byte();
    h
}

fn consumer() -> Consumer {
    Consumer {
        group: false,
        id: Identifier::Numeric(7),
    }
}

fn poll(m: &PartitionStateMachine, strategy: PollingStrategy, count: u32) -> (u32, u64) {
    let p = m
        .poll(
            3,
            &PollMessages {
                consumer: consumer(),
                stream: Identifier::Numeric(1),
                topic: Identifier::Numeric(2),
                partition: Some(3),
                strategy,
                count,
                auto_commit: false,
            },
        )
        .unwrap();
    let PollAnswer::Ready(p) = p else {
        panic!("no disk here")
    };
    let (head, _) = PollHead::decode(&p.body()).unwrap();
    (p.messages_count, head.current_offset)
}

fn store(offset: u64) -> Vec<u8> {
    use crate::client::request::{OffsetTarget, Request, StoreConsumerOffset};
    let mut body = Vec::new();
    Request::StoreConsumerOffset(StoreConsumerOffset {
        target: OffsetTarget {
            consumer: consumer(),
            stream: Identifier::Numeric(1),
            topic: Identifier::Numeric(2),
            partition: Some(3),
        },
        offset,
        quorum: true,
    })
    .encode(&mut body);
    body
}

/// Applied batches become readable and go to storage in order; a replayed batch already
/// held is answered but not stored twice; a stored offset is readable and goes to storage;
/// the artifacts install into an equal machine.
#[test]
fn apply_poll_store_and_transfer_round_trip() {
    let mut m = PartitionStateMachine::new(group());
    let mut reply = Vec::new();
    let b1 = batch::build(3, 0, 100, &[b"a", b"b"]);
    let b2 = batch::build(3, 2, 200, &[b"c"]);
    m.apply(&header(Operation::SendMessages), &b1, &mut reply);
    let sent = decode_send_reply(read_result(&reply).unwrap().unwrap()).unwrap();
    assert_eq!(sent[0].base_offset, 0);
    reply.clear();
    m.apply(&header(Operation::SendMessages), &b2, &mut reply);
    reply.clear();
    m.apply(&header(Operation::SendMessages), &b1, &mut reply);
    assert_eq!(read_result(&reply).unwrap().map(|_| ()), Ok(()));
    assert_eq!(m.next_offset(), 3);
    // GetStats' bytes (decision 380): each committed batch once, the replay not again.
    let held = (b1.len() + b2.len()) as u64;
    assert_eq!(m.stored_bytes(), held);
    assert_eq!(m.segments_count(), 0, "no disk: no segment files");
    assert_eq!(poll(&m, PollingStrategy::Offset(1), 10), (2, 2));
    assert_eq!(poll(&m, PollingStrategy::First(0), 1), (1, 2));
    reply.clear();
    m.apply(
        &header(Operation::StoreConsumerOffset),
        &store(1),
        &mut reply,
    );
    assert_eq!(read_result(&reply).unwrap().map(|_| ()), Ok(()));
    assert_eq!(poll(&m, PollingStrategy::Next(0), 10), (1, 2));
    assert_eq!(m.consumer_offset(3, &consumer()).unwrap().stored_offset, 1);
    reply.clear();
    m.apply(
        &header(Operation::StoreConsumerOffset),
        &store(9),
        &mut reply,
    );
    assert_eq!(
        read_result(&reply).unwrap(),
        Err(status::INVALID_OFFSET),
        "beyond the committed data"
    );
    let work = m.take_storage();
    assert_eq!(work.len(), 3, "{work:?}");
    assert!(matches!(&work[0], StorageWork::Batch(b) if b[..] == b1[..]));
    assert!(matches!(&work[1], StorageWork::Batch(b) if b[..] == b2[..]));
    assert!(matches!(&work[2], StorageWork::Offsets(t) if t.consumers.len() == 1));

    let artifacts = m.checkpoint_artifacts(5);
    let mut other = PartitionStateMachine::new(group());
    other.restore(5, &artifacts).unwrap();
    assert_eq!(other.batches, m.batches);
    assert_eq!(other.offsets, m.offsets);
    assert_eq!(other.next_offset(), 3);
    assert_eq!(other.stored_bytes(), held, "a transfer's install");
    assert!(
        matches!(&other.take_storage()[..], [StorageWork::Install { batches, .. }] if batches.len() == 2)
    );
    // A damaged artifact is refused and changes nothing.
    let mut bad = artifacts.clone();
    bad[0].bytes[300] ^= 1;
    let mut third = PartitionStateMachine::new(group());
    assert!(third.restore(5, &bad).is_err());
    assert_eq!(third.next_offset(), 0);
    // Restored from the segments' bytes.
    let stored = [b1.clone(), b2.clone()].concat();
    let restored = PartitionStateMachine::restore(group(), &stored, m.offsets.clone()).unwrap();
    assert_eq!(restored.batches, m.batches);
    assert_eq!(restored.stored_bytes(), held, "restored from the segments");
    assert!(
        PartitionStateMachine::restore(group(), &[b2, b1].concat(), OffsetTable::default())
            .is_err()
    );
}

/// Streams `m`'s offer for replica 1 into `into` in `chunk`-byte pieces, flipping byte
/// `flip` of the SEGMENT_LOG on the way if given; returns the install's result.
fn transfer(
    m: &mut PartitionStateMachine,
    into: &mut PartitionStateMachine,
    chunk: usize,
    flip: Option<usize>,
) -> Result<(), InstallError> {
    let entries = m.offer(ReplicaId(1), 9).unwrap();
    into.stage_begin(&entries).unwrap();
    for (index, entry) in entries.iter().enumerate() {
        let mut offset = 0;
        while offset < entry.len {
            let len = chunk.min((entry.len - offset) as usize);
            let mut buf = Vec::new();
            m.read_chunk(ReplicaId(1), index, offset, len, &mut buf)
                .unwrap();
            assert_eq!(buf.len(), len);
            if let Some(at) = flip.filter(|_| index == 0)
                && (offset as usize..offset as usize + len).contains(&at)
            {
                buf[at - offset as usize] ^= 1;
            }
            into.stage_chunk(index, offset, &buf).unwrap();
            offset += len as u64;
        }
    }
    m.release_offer(ReplicaId(1));
    into.install_staged(9)
}

/// A transfer staged through a file installs the same batches and offsets, reading chunks
/// that straddle batches; the file is gone afterwards. A damaged SEGMENT_LOG is refused
/// and changes nothing (the file goes too); a staging file a crash left is removed when
/// the machine is given its directory.
#[test]
fn a_transfer_stages_in_a_file_and_a_damaged_one_changes_nothing() {
    let dir = std::env::temp_dir().join(format!("strand-staging-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let staged = dir.join(format!("t{:016x}-0.staging", group().0));
    let mut m = PartitionStateMachine::new(group());
    let mut reply = Vec::new();
    let mut at = 0;
    for i in 0..20u8 {
        let payload = vec![i; 100 + usize::from(i) * 7];
        let b = batch::build(3, at, 100, &[&payload, b"x"]);
        m.apply(&header(Operation::SendMessages), &b, &mut reply);
        at += 2;
    }
    m.apply(
        &header(Operation::StoreConsumerOffset),
        &store(5),
        &mut reply,
    );
    let _ = m.take_storage();
    assert_eq!(m.offers_held(), 0);

    std::fs::write(&staged, b"left by a crash").unwrap();
    let mut other = PartitionStateMachine::new(group()).with_staging_dir(Some(dir.clone()));
    assert!(!staged.exists(), "a crash's staging file is removed");
    transfer(&mut m, &mut other, 333, None).unwrap();
    assert_eq!(other.batches, m.batches);
    assert_eq!(other.offsets, m.offsets);
    assert_eq!(other.next_offset(), 40);
    assert!(!staged.exists());
    assert!(
        matches!(&other.take_storage()[..], [StorageWork::Install { batches, .. }] if batches.len() == 20)
    );

    let mut third = PartitionStateMachine::new(group()).with_staging_dir(Some(dir.clone()));
    assert!(transfer(&mut m, &mut third, 1000, Some(500)).is_err());
    assert_eq!(third.next_offset(), 0);
    assert!(third.batches.is_empty());
    assert!(third.take_storage().is_empty());
    assert!(!staged.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Decision 493: a committed batch is counted at once and hashed later, one batch per
/// `hash_owed`; an offer hashes what is still owed first, so its SEGMENT_LOG checksum is
/// the hash of every batch; and the bytes waiting stay under their bound when nothing
/// pays them.
#[test]
fn the_log_hash_is_paid_later_and_an_offer_names_every_batch() {
    let mut m = PartitionStateMachine::new(group());
    let mut reply = Vec::new();
    let mut log = Vec::new();
    for i in 0..6u8 {
        let payload = vec![i; 1000 + usize::from(i)];
        let b = batch::build(3, u64::from(i), 100, &[&payload]);
        m.apply(&header(Operation::SendMessages), &b, &mut reply);
        log.extend_from_slice(&b);
    }
    let owed = |m: &PartitionStateMachine| m.log.borrow().owed.len();
    assert_eq!(owed(&m), 6, "nothing hashed on the commit path");
    assert_eq!(m.stored_bytes(), log.len() as u64, "counted at once");
    assert!(m.hash_owed());
    assert!(m.hash_owed());
    assert_eq!(owed(&m), 4, "one batch per call");
    let entries = m.offer(ReplicaId(1), 9).unwrap();
    assert_eq!(owed(&m), 0, "the offer paid the rest");
    assert!(!m.hash_owed());
    let segment_log = &entries[0];
    assert_eq!(segment_log.kind, ArtifactKind::SEGMENT_LOG);
    assert_eq!(segment_log.len, log.len() as u64);
    assert_eq!(segment_log.checksum, xxhash_rust::xxh3::xxh3_64(&log));
    m.release_offer(ReplicaId(1));

    // Never paid: the oldest are hashed as the bound is crossed.
    let mut big = PartitionStateMachine::new(group());
    let payload = vec![7u8; 4 << 20];
    let mut log = Vec::new();
    for base in 0..12 {
        let b = batch::build(3, base, 100, &[&payload]);
        big.apply(&header(Operation::SendMessages), &b, &mut reply);
        log.extend_from_slice(&b);
        let owed_bytes = big.log.borrow().owed_bytes;
        assert!(owed_bytes <= UNHASHED_BYTES_MAX, "{owed_bytes} bytes owed");
    }
    assert!(owed(&big) < 12, "the bound hashed some");
    let entries = big.offer(ReplicaId(1), 9).unwrap();
    assert_eq!(entries[0].checksum, xxhash_rust::xxh3::xxh3_64(&log));
}

fn reply_frame(operation: Operation, body: &[u8]) -> Frame {
    let mut h = ReplyHeader::zeroed();
    h.frame = wire::header::FrameHeader::new(
        Command::Reply,
        wire::Sender {
            cluster: 1,
            replica: 0,
            view: 0,
        },
    );
    h.client.set(9);
    h.op.set(4);
    h.operation = operation.byte();
    wire::encode::finish_header(&mut h, body).unwrap();
    Frame::new([&h.bytes()[..], body].concat())
}

/// A SendMessages reply reaches the client raw: the confirmations alone on success (they
/// decode as the SDK reads them), the code in the header status on a committed rejection;
/// a StoreConsumerOffset success keeps its result section, its refusal and a
/// DeleteConsumerOffset refusal go to the header status.
#[test]
fn send_replies_leave_raw_and_others_unchanged() {
    let mut m = PartitionStateMachine::new(group());
    let mut body = Vec::new();
    m.apply(
        &header(Operation::SendMessages),
        &batch::build(3, 0, 100, &[b"a", b"b"]),
        &mut body,
    );
    let out = client_reply(reply_frame(Operation::SendMessages, &body));
    let h = ReplyHeader::view(out.header_bytes().unwrap()).unwrap();
    assert_eq!((h.status.get(), h.op.get(), h.client.get()), (0, 4, 9));
    let sent = decode_send_reply(out.body()).unwrap();
    assert_eq!(
        (sent.len(), sent[0].partition, sent[0].base_offset),
        (1, 3, 0)
    );
    assert!(wire::decode::decode_reply(out.bytes(), 1 << 20).is_ok());

    let rejected = reply_frame(
        Operation::SendMessages,
        &result_rejected(status::INVALID_COMMAND),
    );
    let out = client_reply(rejected);
    let h = ReplyHeader::view(out.header_bytes().unwrap()).unwrap();
    assert_eq!(h.status.get(), status::INVALID_COMMAND);
    assert!(out.body().is_empty());

    let store = reply_frame(Operation::StoreConsumerOffset, &RESULT_OK);
    assert_eq!(client_reply(store.clone()).bytes(), store.bytes());
    // Offset refusals go to the header (client-plane.md §4.1, decision 383).
    for (operation, code) in [
        (Operation::StoreConsumerOffset, status::INVALID_OFFSET),
        (
            Operation::DeleteConsumerOffset,
            status::CONSUMER_OFFSET_NOT_FOUND,
        ),
    ] {
        let out = client_reply(reply_frame(operation, &result_rejected(code)));
        let h = ReplyHeader::view(out.header_bytes().unwrap()).unwrap();
        assert_eq!((h.status.get(), h.operation), (code, operation.byte()));
        assert!(out.body().is_empty());
        assert!(wire::decode::decode_reply(out.bytes(), 1 << 20).is_ok());
    }
    let other = reply_frame(
        Operation::CreateStream,
        &result_rejected(status::INVALID_COMMAND),
    );
    assert_eq!(client_reply(other.clone()).bytes(), other.bytes());
}
