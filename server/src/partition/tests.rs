//! Poll replies and consumer offsets.

use journal::artifact::OffsetTable;
use journal::batch;
use proptest::prelude::*;

use super::*;
use crate::client::codec::{Consumer, Identifier, Name, PollingStrategy};
use crate::client::reply::{PollHead, read_result};

/// Three stamped batches: offsets 0..3 at t=100, 3..5 at t=200, 5..9 at t=300.
fn stored() -> Vec<u8> {
    let payloads: Vec<Vec<u8>> = (0..9u8).map(|i| vec![b'm', i]).collect();
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    [
        batch::build(4, 0, 100, &refs[0..3]),
        batch::build(4, 3, 200, &refs[3..5]),
        batch::build(4, 5, 300, &refs[5..9]),
    ]
    .concat()
}

/// The `(offset, payload)` of every message in a poll reply, checking each batch verifies.
fn messages(body: &[u8]) -> (PollHead, Vec<(u64, Vec<u8>)>) {
    let (head, mut rest) = PollHead::decode(body).unwrap();
    let mut out = Vec::new();
    while !rest.is_empty() {
        let info = batch::verify(rest).expect("every returned batch verifies");
        let b = &rest[..info.len as usize];
        let mut at = 256;
        while at < b.len() {
            let delta = u32::from_le_bytes(b[at + 24..at + 28].try_into().unwrap());
            let payload = u32::from_le_bytes(b[at + 36..at + 40].try_into().unwrap()) as usize;
            out.push((
                info.base_offset + u64::from(delta),
                b[at + 48..at + 48 + payload].to_vec(),
            ));
            at += 48 + payload;
        }
        rest = &rest[info.len as usize..];
    }
    assert_eq!(head.messages_count as usize, out.len());
    (head, out)
}

fn offsets(body: &[u8]) -> Vec<u64> {
    messages(body).1.into_iter().map(|(o, _)| o).collect()
}

fn poll(strategy: PollingStrategy, count: u32, stored_offset: Option<u64>) -> Poll {
    let start = resolve_start(strategy, count, Some(8), stored_offset);
    build_poll_reply(4, Some(8), start, count, &stored()).unwrap()
}

#[test]
fn strategies_resolve_as_the_spec_says() {
    assert_eq!(
        offsets(&poll(PollingStrategy::Offset(0), 100, None).body()),
        (0..9).collect::<Vec<_>>()
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::Offset(4), 3, None).body()),
        vec![4, 5, 6]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::First(77), 2, None).body()),
        vec![0, 1]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::Last(0), 3, None).body()),
        vec![6, 7, 8]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::Next(0), 2, None).body()),
        vec![0, 1]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::Next(0), 2, Some(4)).body()),
        vec![5, 6]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::Timestamp(150), 10, None).body()),
        (3..9).collect::<Vec<_>>()
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::Timestamp(301), 10, None).body()),
        Vec::<u64>::new()
    );
    let p = poll(PollingStrategy::Offset(4), 3, None);
    assert_eq!((p.messages_count, p.last_offset), (3, Some(6)));
    let (head, _) = messages(&p.body());
    assert_eq!((head.partition_id, head.current_offset), (4, 8));
}

#[test]
fn an_empty_poll_is_the_sixteen_byte_head() {
    for (strategy, stored_offset) in [
        (PollingStrategy::Offset(9), None),
        (PollingStrategy::Next(0), Some(8)),
    ] {
        let p = poll(strategy, 5, stored_offset);
        assert_eq!(p.body().len(), 16);
        assert_eq!((p.messages_count, p.last_offset), (0, None));
    }
    let empty = build_poll_reply(
        0,
        None,
        resolve_start(PollingStrategy::First(0), 1, None, None),
        1,
        &[],
    )
    .unwrap();
    assert_eq!(empty.body(), vec![0; 16]);
    let zero = build_poll_reply(4, Some(8), Some(Start::Offset(0)), 0, &stored()).unwrap();
    assert_eq!(zero.body().len(), 16);
}

#[test]
fn a_partly_returned_batch_gets_a_consistent_header() {
    let stored = stored();
    // Offsets 1..2 out of the first batch (0..3): a middle run.
    let p = build_poll_reply(4, Some(8), Some(Start::Offset(1)), 1, &stored).unwrap();
    let part = &p.body()[16..];
    let info = batch::verify(part).unwrap();
    assert_eq!(
        (info.base_offset, info.message_count, info.base_timestamp),
        (0, 1, 100)
    );
    assert_eq!(info.len as usize, part.len());
    assert_eq!(messages(&p.body()).1, vec![(1, vec![b'm', 1])]);
    // Whole batches are passed through unchanged.
    let p = build_poll_reply(4, Some(8), Some(Start::Offset(3)), 2, &stored).unwrap();
    let second = &stored[batch::verify(&stored).unwrap().len as usize..];
    assert_eq!(
        &p.body()[16..],
        &second[..batch::verify(second).unwrap().len as usize]
    );
}

#[test]
fn corrupt_stored_bytes_are_a_typed_error() {
    let mut stored = stored();
    stored[300] ^= 1;
    assert!(matches!(
        build_poll_reply(4, Some(8), Some(Start::Offset(0)), 9, &stored),
        Err(PollError::Batch { at: 0, .. })
    ));
}

#[test]
fn consumer_offsets_store_and_answer() {
    let mut table = OffsetTable::default();
    let alice = Consumer {
        group: false,
        id: Identifier::Named(Name::new("alice").unwrap()),
    };
    let group = Consumer {
        group: true,
        id: Identifier::Numeric(1),
    };
    // Nothing committed: every store is beyond the partition.
    assert_eq!(
        store_offset(&mut table, &alice, 0),
        Err(status::INVALID_OFFSET)
    );
    table.next_offset = 9;
    assert_eq!(consumer_offset_reply(&table, &alice, 4), None);
    assert_eq!(
        store_offset(&mut table, &alice, 9),
        Err(status::INVALID_OFFSET)
    );
    store_offset(&mut table, &alice, 8).unwrap();
    store_offset(&mut table, &group, 2).unwrap();
    assert_eq!(
        consumer_offset_reply(&table, &alice, 4),
        Some(ConsumerOffsetReply {
            partition_id: 4,
            current_offset: 8,
            stored_offset: 8
        })
    );
    // A plain consumer named by a string is keyed by XXH32 of the name; groups apart.
    assert_eq!(
        table.consumers.keys().copied().collect::<Vec<_>>(),
        vec![xxhash_rust::xxh32::xxh32(b"alice", 0)]
    );
    assert_eq!(table.groups.get(&1), Some(&2));
    // Next after a stored offset continues from it.
    assert_eq!(
        resolve_start(
            PollingStrategy::Next(0),
            1,
            Some(8),
            stored_offset(&table, &group)
        ),
        Some(Start::Offset(3))
    );

    // The apply of a committed StoreConsumerOffset body: result sections, deterministic.
    let body = |offset: u64| {
        let mut out = Vec::new();
        Request::StoreConsumerOffset(crate::client::request::StoreConsumerOffset {
            target: crate::client::request::OffsetTarget {
                consumer: alice.clone(),
                stream: Identifier::Numeric(0),
                topic: Identifier::Numeric(0),
                partition: Some(4),
            },
            offset,
            quorum: true,
        })
        .encode(&mut out);
        out
    };
    assert_eq!(
        read_result(&apply_store_consumer_offset(&mut table, &body(3))).unwrap(),
        Ok(&[][..])
    );
    assert_eq!(stored_offset(&table, &alice), Some(3));
    assert_eq!(
        read_result(&apply_store_consumer_offset(&mut table, &body(50))).unwrap(),
        Err(status::INVALID_OFFSET)
    );
    assert_eq!(
        read_result(&apply_store_consumer_offset(&mut table, &[1, 2])).unwrap(),
        Err(status::INVALID_COMMAND)
    );
    assert_eq!(stored_offset(&table, &alice), Some(3));
}

#[test]
fn consumer_offsets_delete_through_the_apply() {
    let mut table = OffsetTable {
        next_offset: 9,
        ..OffsetTable::default()
    };
    let group = Consumer {
        group: true,
        id: Identifier::Numeric(0),
    };
    let plain = Consumer {
        group: false,
        id: Identifier::Numeric(0),
    };
    store_offset(&mut table, &group, 4).unwrap();
    store_offset(&mut table, &plain, 5).unwrap();
    let body = |consumer: &Consumer| {
        let mut out = Vec::new();
        Request::DeleteConsumerOffset(crate::client::groups::DeleteConsumerOffset {
            target: crate::client::request::OffsetTarget {
                consumer: consumer.clone(),
                stream: Identifier::Numeric(0),
                topic: Identifier::Numeric(0),
                partition: Some(2),
            },
            quorum: true,
        })
        .encode(&mut out);
        out
    };
    assert_eq!(
        read_result(&apply_delete_consumer_offset(&mut table, &body(&group))).unwrap(),
        Ok(&[][..])
    );
    // Only the group's offset went; the plain consumer with the same id keeps its own.
    assert_eq!(stored_offset(&table, &group), None);
    assert_eq!(stored_offset(&table, &plain), Some(5));
    assert_eq!(
        read_result(&apply_delete_consumer_offset(&mut table, &body(&group))).unwrap(),
        Err(status::CONSUMER_OFFSET_NOT_FOUND)
    );
    assert_eq!(
        read_result(&apply_delete_consumer_offset(&mut table, &[9])).unwrap(),
        Err(status::INVALID_COMMAND)
    );
}

proptest! {
    /// Any strategy and count over any split of stored batches: the reply holds exactly the
    /// expected contiguous run of offsets, every batch verifies, and the count is honoured.
    #[test]
    fn polls_return_the_expected_run(
        sizes in proptest::collection::vec(1usize..5, 1..6),
        kind in 0u8..5,
        value in 0u64..30,
        count in 0u32..12,
        stored_offset in proptest::option::of(0u64..30),
    ) {
        let total: usize = sizes.iter().sum();
        let mut bytes = Vec::new();
        let mut base = 0u64;
        for (i, n) in sizes.iter().enumerate() {
            let payloads: Vec<Vec<u8>> = (0..*n).map(|k| vec![(base as usize + k) as u8]).collect();
            let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
            bytes.extend(batch::build(0, base, 10 * (i as u64 + 1), &refs));
            base += *n as u64;
        }
        let current = Some(total as u64 - 1);
        let strategy = match kind {
            0 => PollingStrategy::Offset(value),
            1 => PollingStrategy::First(value),
            2 => PollingStrategy::Last(value),
            3 => PollingStrategy::Next(value),
            _ => PollingStrategy::Timestamp(value),
        };
        let start = resolve_start(strategy, count, current, stored_offset);
        let poll = build_poll_reply(0, current, start, count, &bytes).unwrap();
        let got = offsets(&poll.body());
        // The expected first offset, from the strategy alone.
        let first = match start {
            None => None,
            Some(Start::Offset(o)) => Some(o),
            Some(Start::Timestamp(t)) => {
                let mut b = 0u64;
                let mut found = None;
                for (i, n) in sizes.iter().enumerate() {
                    if 10 * (i as u64 + 1) >= t { found = Some(b); break; }
                    b += *n as u64;
                }
                found
            }
        };
        let expected: Vec<u64> = match first {
            None => Vec::new(),
            Some(f) => (f..total as u64).take(count as usize).collect(),
        };
        prop_assert_eq!(&got, &expected);
        prop_assert_eq!(poll.last_offset, expected.last().copied());
        // What auto-commit reads back from the reply bytes is the same offset.
        prop_assert_eq!(super::last_polled_offset(&poll.body()), expected.last().copied());
    }
}
