//! Lifecycle commands in the metadata state machine: replies, refusals, determinism across
//! instances, snapshot/install, and the request codec's round trips.

use consensus::{Artifact, WholeArtifacts};
use wire::Operation;
use wire::manifest::ArtifactKind;

use super::tests::{Driver, create_stream, create_topic, name, payload, rejected};
use super::*;
use crate::client::codec::{Identifier, OptionValue, Options, kind};
use crate::client::lifecycle::Lifecycle;
use crate::client::request::{Request, RequestError};

fn num(id: u32) -> Identifier {
    Identifier::Numeric(id)
}

fn u64_option(key: &str, value: u64) -> Options {
    let mut o = Options::default();
    o.0.insert(
        key.into(),
        OptionValue {
            kind: kind::U64,
            bytes: value.to_le_bytes().to_vec(),
        },
    );
    o
}

fn lc(l: Lifecycle) -> Request<'static> {
    Request::Lifecycle(l)
}

/// A driver with streams `a` (0) and `b` (1), topic `t` (0, 2 partitions) in `a` and topic
/// `u` (1, 1 partition) in `a`.
fn seeded() -> Driver {
    let mut d = Driver::new();
    for r in [
        create_stream("a"),
        create_stream("b"),
        create_topic(num(0), "t", 2),
        create_topic(num(0), "u", 1),
    ] {
        payload(&d.submit(&r).unwrap());
    }
    d
}

fn groups(d: &Driver, stream: u32, topic: u32) -> Vec<(u32, u64)> {
    d.sm.state().streams[&stream].topics[&topic]
        .partitions
        .iter()
        .map(|p| (p.id, p.consensus_group_id))
        .collect()
}

#[test]
fn update_stream_renames_and_refuses_what_the_reference_refuses() {
    let mut d = seeded();
    let ok = d
        .submit(&lc(Lifecycle::UpdateStream {
            stream: Identifier::Named(name("a")),
            name: name("a2"),
            options: Options::default(),
        }))
        .unwrap();
    assert_eq!(payload(&ok), b"");
    assert_eq!(d.sm.state().streams[&0].name.as_str(), "a2");
    // Renaming to its own name is fine; to another stream's is not.
    let same = Lifecycle::UpdateStream {
        stream: num(0),
        name: name("a2"),
        options: Options::default(),
    };
    payload(&d.submit(&lc(same)).unwrap());
    let clash = Lifecycle::UpdateStream {
        stream: num(0),
        name: name("b"),
        options: Options::default(),
    };
    assert_eq!(
        d.submit(&lc(clash.clone())),
        Err(status::STREAM_NAME_ALREADY_EXISTS)
    );
    // Also at apply (another rename committed between preflight and apply).
    let mut body = Vec::new();
    clash.encode(&mut body);
    assert_eq!(
        rejected(&d.apply(Operation::UpdateStream, &body)),
        status::STREAM_NAME_ALREADY_EXISTS
    );
    let with_option = Lifecycle::UpdateStream {
        stream: num(0),
        name: name("x"),
        options: u64_option("message_expiry", 1),
    };
    assert_eq!(
        d.submit(&lc(with_option)),
        Err(status::UNSUPPORTED_OPTION_KEY)
    );
    let missing = Lifecycle::UpdateStream {
        stream: num(9),
        name: name("x"),
        options: Options::default(),
    };
    assert_eq!(d.submit(&lc(missing)), Err(status::STREAM_ID_NOT_FOUND));
    assert_eq!(d.sm.state().streams[&0].name.as_str(), "a2");
}

#[test]
fn update_topic_patches_the_updatable_options_and_keeps_the_rest() {
    let mut d = seeded();
    let before = d.sm.state().streams[&0].topics[&0].clone();
    let mut patch = u64_option("message_expiry", 5_000_000);
    patch.0.insert(
        "compression_algorithm".into(),
        OptionValue {
            kind: kind::STRING,
            bytes: b"gzip".to_vec(),
        },
    );
    let update = Lifecycle::UpdateTopic {
        stream: num(0),
        topic: Identifier::Named(name("t")),
        name: name("t2"),
        options: patch,
    };
    payload(&d.submit(&lc(update)).unwrap());
    let after = &d.sm.state().streams[&0].topics[&0];
    assert_eq!(after.name.as_str(), "t2");
    assert_eq!(after.settings.message_expiry, 5_000_000);
    assert_eq!(after.settings.compression_algorithm, 2);
    assert_eq!(after.settings.segment_size, before.settings.segment_size);
    assert_eq!(
        after.settings.max_topic_size,
        before.settings.max_topic_size
    );
    assert_eq!(after.partitions, before.partitions);
    // A patched key moves from derived to explicit; no key is set twice.
    assert!(after.explicit.0.contains_key("message_expiry"));
    assert!(!after.derived.0.contains_key("message_expiry"));
    assert_eq!(
        after.explicit.0.len() + after.derived.0.len(),
        before.explicit.0.len() + before.derived.0.len()
    );
    // GetTopic answers the new values.
    let details = view::topic_details(after);
    assert_eq!(details.topic.message_expiry, 5_000_000);
    assert_eq!(details.topic.name.as_str(), "t2");

    // A key outside the updatable set, a bad value, a duplicate name, a missing topic.
    let refusals = [
        (
            u64_option("segment_size", 1 << 20),
            "t2",
            0,
            status::UNSUPPORTED_OPTION_KEY,
        ),
        (
            u64_option("max_topic_size", 4096),
            "t2",
            0,
            status::INVALID_FORMAT,
        ),
        (
            Options::default(),
            "u",
            0,
            status::TOPIC_NAME_ALREADY_EXISTS,
        ),
        (Options::default(), "z", 7, status::TOPIC_ID_NOT_FOUND),
    ];
    for (options, new_name, topic, code) in refusals {
        let update = Lifecycle::UpdateTopic {
            stream: num(0),
            topic: num(topic),
            name: name(new_name),
            options,
        };
        assert_eq!(d.submit(&lc(update)), Err(code), "{new_name}");
    }
    assert_eq!(d.sm.state().streams[&0].topics[&0].name.as_str(), "t2");
}

#[test]
fn delete_topic_removes_it_and_its_id_is_the_next_one_handed_out() {
    let mut d = seeded();
    let delete = Lifecycle::DeleteTopic {
        stream: num(0),
        topic: Identifier::Named(name("t")),
    };
    payload(&d.submit(&lc(delete.clone())).unwrap());
    let stream = &d.sm.state().streams[&0];
    assert_eq!(stream.topics.keys().copied().collect::<Vec<_>>(), vec![1]);
    assert_eq!(d.submit(&lc(delete)), Err(status::TOPIC_NAME_NOT_FOUND));
    let reply = d.submit(&create_topic(num(0), "t", 1)).unwrap();
    let t = crate::client::reply::TopicDetails::decode(payload(&reply)).unwrap();
    assert_eq!(t.topic.id, 0, "the lowest free slot (client-plane.md §5)");
    // The group-id counter never goes back: the new partition's id is fresh.
    let all: Vec<u64> = d.sm.state().streams[&0]
        .topics
        .values()
        .flat_map(|t| t.partitions.iter().map(|p| p.consensus_group_id))
        .collect();
    assert_eq!(all, vec![3, 2]);
}

#[test]
fn partitions_are_added_after_the_last_and_removed_from_the_top() {
    let mut d = seeded();
    assert_eq!(groups(&d, 0, 0), vec![(0, 0), (1, 1)]);
    let create = |count| {
        lc(Lifecycle::CreatePartitions {
            stream: num(0),
            topic: num(0),
            count,
        })
    };
    let delete = |count| {
        lc(Lifecycle::DeletePartitions {
            stream: num(0),
            topic: num(0),
            count,
        })
    };
    payload(&d.submit(&create(3)).unwrap());
    assert_eq!(
        groups(&d, 0, 0),
        vec![(0, 0), (1, 1), (2, 3), (3, 4), (4, 5)]
    );
    assert_eq!(d.sm.state().next_consensus_group_id, 6);
    let created = d.sm.state().streams[&0].topics[&0].partitions[4].created_at;
    assert_eq!(created, d.op * 1000, "the prepare's timestamp");
    payload(&d.submit(&delete(2)).unwrap());
    assert_eq!(groups(&d, 0, 0), vec![(0, 0), (1, 1), (2, 3)]);
    // Recreated partitions take the freed ids and fresh group ids.
    payload(&d.submit(&create(1)).unwrap());
    assert_eq!(groups(&d, 0, 0), vec![(0, 0), (1, 1), (2, 3), (3, 6)]);
    assert_eq!(d.submit(&create(0)), Err(status::INVALID_PARTITIONS_COUNT));
    assert_eq!(d.submit(&create(997)), Err(status::TOO_MANY_PARTITIONS));
    assert_eq!(d.submit(&delete(5)), Err(status::INVALID_PARTITIONS_COUNT));
    assert_eq!(d.submit(&delete(0)), Err(status::INVALID_PARTITIONS_COUNT));
    // All of them may go; sends then find no partition (3007, view.rs).
    payload(&d.submit(&delete(4)).unwrap());
    assert!(groups(&d, 0, 0).is_empty());
    payload(&d.submit(&create(996 + 4)).unwrap());
    assert_eq!(groups(&d, 0, 0).len(), 1000);
}

/// A purge re-incarnates every partition it covers and changes nothing else (decision 346):
/// ids, keys and creation times stay, each takes the next `consensus_group_id`, nothing is
/// retired (the key is live), and every node's disk now holds a proven-dead incarnation.
#[test]
fn purges_reincarnate_every_partition_they_cover_and_nothing_else() {
    let mut d = seeded();
    let with_groups = |state: &state::State, ids: &[(u32, u32, u64)]| {
        let mut s = state.clone();
        for (topic, partition, group) in ids {
            s.streams
                .get_mut(&0)
                .unwrap()
                .topics
                .get_mut(topic)
                .unwrap()
                .partitions[*partition as usize]
                .consensus_group_id = *group;
        }
        s
    };
    let before = d.sm.state().clone();
    assert_eq!(groups(&d, 0, 0), vec![(0, 0), (1, 1)]);
    assert_eq!(groups(&d, 0, 1), vec![(0, 2)]);
    let ok = d
        .submit(&lc(Lifecycle::PurgeTopic {
            stream: num(0),
            topic: Identifier::Named(name("t")),
        }))
        .unwrap();
    assert_eq!(payload(&ok), b"");
    let mut want = with_groups(&before, &[(0, 0, 3), (0, 1, 4)]);
    want.next_consensus_group_id = 5;
    assert_eq!(d.sm.state(), &want);
    assert!(d.sm.state().retired.is_empty());
    let old = before.streams[&0].topics[&0].group(0, 0).unwrap().0;
    assert_eq!(
        crate::partition::lifecycle::verdict(d.sm.state(), old, Some(0)),
        crate::partition::lifecycle::Verdict::Dead
    );
    assert_eq!(
        crate::partition::lifecycle::verdict(d.sm.state(), old, Some(3)),
        crate::partition::lifecycle::Verdict::Live(3)
    );

    payload(&d.submit(&lc(Lifecycle::PurgeStream(num(0)))).unwrap());
    let mut want = with_groups(&before, &[(0, 0, 5), (0, 1, 6), (1, 0, 7)]);
    want.next_consensus_group_id = 8;
    assert_eq!(d.sm.state(), &want);
    // An empty stream purges to nothing; unknown ids are refused as everywhere else.
    let snapshot = d.sm.snapshot();
    payload(&d.submit(&lc(Lifecycle::PurgeStream(num(1)))).unwrap());
    assert_eq!(d.sm.snapshot(), snapshot);
    assert_eq!(
        d.submit(&lc(Lifecycle::PurgeStream(num(9)))),
        Err(status::STREAM_ID_NOT_FOUND)
    );
    assert_eq!(
        d.submit(&lc(Lifecycle::PurgeTopic {
            stream: num(0),
            topic: num(9),
        })),
        Err(status::TOPIC_ID_NOT_FOUND)
    );
    assert_eq!(d.sm.snapshot(), snapshot);
}

/// A purge that would run the incarnation counter past `u64::MAX` is refused before
/// replication and at apply, and changes nothing.
#[test]
fn a_purge_past_the_counter_is_a_no_op() {
    let mut d = seeded();
    let mut state = d.sm.state().clone();
    state.next_consensus_group_id = u64::MAX - 1;
    let op = d.op;
    d.sm.install(
        op,
        &[Artifact {
            kind: ArtifactKind::METADATA_SNAPSHOT,
            frontier: op,
            bytes: state.encode(),
        }],
    )
    .unwrap();
    let before = d.sm.snapshot();
    let l = Lifecycle::PurgeTopic {
        stream: num(0),
        topic: num(0),
    };
    assert_eq!(d.submit(&lc(l.clone())), Err(status::ERROR));
    let mut body = Vec::new();
    l.encode(&mut body);
    assert_eq!(rejected(&d.apply(l.operation(), &body)), status::ERROR);
    assert_eq!(d.sm.snapshot(), before);
    // One partition still fits.
    payload(
        &d.submit(&lc(Lifecycle::PurgeTopic {
            stream: num(0),
            topic: num(1),
        }))
        .unwrap(),
    );
    assert_eq!(d.sm.state().next_consensus_group_id, u64::MAX);
}

/// A purge never gives a partition an incarnation with its old wire tag (decision 375): the
/// counter skips the one id whose tag would repeat, and only then.
#[test]
fn a_purge_skips_an_id_whose_tag_would_repeat() {
    use crate::partition::lifecycle::incarnation_tag;
    let mut d = seeded();
    let mut state = d.sm.state().clone();
    // Topic t's partitions hold 0 and 1; 2047 has 0's tag, 2049 does not have 1's.
    state.next_consensus_group_id = 2047;
    assert_eq!(incarnation_tag(2047), incarnation_tag(0));
    let op = d.op;
    d.sm.install(
        op,
        &[Artifact {
            kind: ArtifactKind::METADATA_SNAPSHOT,
            frontier: op,
            bytes: state.encode(),
        }],
    )
    .unwrap();
    payload(
        &d.submit(&lc(Lifecycle::PurgeTopic {
            stream: num(0),
            topic: num(0),
        }))
        .unwrap(),
    );
    assert_eq!(groups(&d, 0, 0), vec![(0, 2048), (1, 2049)]);
    assert_eq!(d.sm.state().next_consensus_group_id, 2050);
    for (old, new) in [(0, 2048), (1, 2049)] {
        assert_ne!(incarnation_tag(old), incarnation_tag(new));
    }
}

/// Installs `d`'s state with the incarnation counter at `next`.
fn with_counter(d: &mut Driver, next: u64) {
    let mut state = d.sm.state().clone();
    state.next_consensus_group_id = next;
    let op = d.op;
    d.sm.install(
        op,
        &[Artifact {
            kind: ArtifactKind::METADATA_SNAPSHOT,
            frontier: op,
            bytes: state.encode(),
        }],
    )
    .unwrap();
}

/// A create that reuses a retired key never gives it its retired incarnation's wire tag
/// (decision 396): CreateTopic and CreatePartitions skip the one id whose tag would repeat,
/// as purges do (decision 375).
#[test]
fn a_create_reusing_a_retired_key_skips_an_id_whose_tag_would_repeat() {
    use crate::partition::lifecycle::incarnation_tag;
    let mut d = seeded();
    // Topic u (id 1) holds incarnation 2; deleted, its key is retired at 2.
    payload(
        &d.submit(&lc(Lifecycle::DeleteTopic {
            stream: num(0),
            topic: num(1),
        }))
        .unwrap(),
    );
    with_counter(&mut d, 2049);
    assert_eq!(incarnation_tag(2049), incarnation_tag(2));
    let reply = d.submit(&create_topic(num(0), "w", 2)).unwrap();
    let t = crate::client::reply::TopicDetails::decode(payload(&reply)).unwrap();
    assert_eq!(t.topic.id, 1, "the retired topic's slot");
    // Partition 0 reuses the retired key: 2049 is skipped; partition 1's key is new.
    assert_eq!(groups(&d, 0, 1), vec![(0, 2050), (1, 2051)]);
    assert!(d.sm.state().retired.is_empty());
    // Topic t's partition 1 (incarnation 1) deleted, then created again.
    payload(
        &d.submit(&lc(Lifecycle::DeletePartitions {
            stream: num(0),
            topic: num(0),
            count: 1,
        }))
        .unwrap(),
    );
    with_counter(&mut d, 4095);
    assert_eq!(incarnation_tag(4095), incarnation_tag(1));
    payload(
        &d.submit(&lc(Lifecycle::CreatePartitions {
            stream: num(0),
            topic: num(0),
            count: 2,
        }))
        .unwrap(),
    );
    assert_eq!(groups(&d, 0, 0), vec![(0, 0), (1, 4096), (2, 4097)]);
    assert_eq!(d.sm.state().next_consensus_group_id, 4098);
    assert!(d.sm.state().retired.is_empty());
}

fn lifecycle_script() -> Vec<Request<'static>> {
    vec![
        create_stream("a"),
        create_topic(num(0), "t", 2),
        create_topic(num(0), "u", 3),
        lc(Lifecycle::CreatePartitions {
            stream: num(0),
            topic: num(1),
            count: 2,
        }),
        lc(Lifecycle::UpdateTopic {
            stream: num(0),
            topic: num(0),
            name: name("t-renamed"),
            options: u64_option("max_topic_size", 1 << 31),
        }),
        lc(Lifecycle::DeletePartitions {
            stream: num(0),
            topic: num(1),
            count: 3,
        }),
        lc(Lifecycle::DeleteTopic {
            stream: num(0),
            topic: num(0),
        }),
        lc(Lifecycle::UpdateStream {
            stream: num(0),
            name: name("a-renamed"),
            options: Options::default(),
        }),
        create_topic(num(0), "v", 1),
        lc(Lifecycle::PurgeTopic {
            stream: num(0),
            topic: num(1),
        }),
        lc(Lifecycle::PurgeStream(num(0))),
    ]
}

/// Every replica applying the same prepares ends in the same state and replies; the snapshot
/// of that state installs into a fresh machine and encodes byte for byte the same.
#[test]
fn lifecycle_ops_are_deterministic_and_survive_a_snapshot() {
    let mut primary = Driver::new();
    let mut prepares = Vec::new();
    let mut replies = Vec::new();
    for request in lifecycle_script() {
        let (operation, _) = request.operation();
        let mut body = Vec::new();
        request.encode(&mut body);
        primary.sm.preflight(operation, &body).unwrap();
        let p = primary.sm.project(operation, &body);
        replies.push(primary.apply(p.operation, &p.body));
        prepares.push(p);
    }
    let mut backup = Driver::new();
    let backup_replies: Vec<_> = prepares
        .iter()
        .map(|p| backup.apply(p.operation, &p.body))
        .collect();
    assert_eq!(backup_replies, replies);
    assert_eq!(backup.sm.snapshot(), primary.sm.snapshot());
    let state = primary.sm.state();
    let a = &state.streams[&0];
    assert_eq!(a.name.as_str(), "a-renamed");
    let names: Vec<_> = a.topics.values().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["v", "u"]);
    assert_eq!(a.topics[&1].partitions.len(), 2);
    // v took 7; the purges re-incarnated u (8, 9), then v (10) and u (11, 12).
    let incarnations: Vec<Vec<u64>> = a
        .topics
        .values()
        .map(|t| t.partitions.iter().map(|p| p.consensus_group_id).collect())
        .collect();
    assert_eq!(incarnations, vec![vec![10], vec![11, 12]]);
    assert_eq!(state.next_consensus_group_id, 13);
    // Deleted partitions are retired with their incarnation; a key used again is live again.
    let key = |t, p| {
        wire::GroupId::partition(wire::PartitionKey {
            stream: 0,
            topic: t,
            partition: p,
        })
        .unwrap()
        .0
    };
    let retired: Vec<(u64, u64)> = state.retired.iter().map(|(k, v)| (*k, *v)).collect();
    assert_eq!(
        retired,
        vec![
            (key(0, 1), 1),
            (key(1, 2), 4),
            (key(1, 3), 5),
            (key(1, 4), 6)
        ]
    );
    assert_eq!(state.live_incarnation(key(0, 0)), Some(10));
    assert_eq!(state.live_incarnation(key(0, 1)), None);

    let mut restored = super::tests::machine();
    restored
        .install(
            primary.op,
            &[Artifact {
                kind: ArtifactKind::METADATA_SNAPSHOT,
                frontier: primary.op,
                bytes: primary.sm.snapshot(),
            }],
        )
        .unwrap();
    assert_eq!(restored.state(), primary.sm.state());
    assert_eq!(restored.snapshot(), primary.sm.snapshot());
}

#[test]
fn lifecycle_bodies_round_trip_and_truncations_fail_typed() {
    let all = [
        Lifecycle::UpdateStream {
            stream: Identifier::Named(name("s")),
            name: name("n"),
            options: Options::default(),
        },
        Lifecycle::PurgeStream(num(3)),
        Lifecycle::UpdateTopic {
            stream: num(1),
            topic: Identifier::Named(name("tt")),
            name: name("n2"),
            options: u64_option("message_expiry", 9),
        },
        Lifecycle::DeleteTopic {
            stream: num(1),
            topic: num(2),
        },
        Lifecycle::PurgeTopic {
            stream: num(1),
            topic: num(2),
        },
        Lifecycle::CreatePartitions {
            stream: num(1),
            topic: num(2),
            count: 7,
        },
        Lifecycle::DeletePartitions {
            stream: num(1),
            topic: num(2),
            count: 5,
        },
    ];
    for l in all {
        let op = l.operation();
        let request = lc(l.clone());
        assert_eq!(request.operation(), (op, 0));
        let mut body = Vec::new();
        request.encode(&mut body);
        assert_eq!(Request::decode(op, 0, &body).unwrap(), request);
        for cut in 0..body.len() {
            // Options blocks may legally end early only at an entry boundary; every other
            // prefix must fail with a typed body error, never a panic.
            match Request::decode(op, 0, &body[..cut]) {
                Err(RequestError::Body { .. }) => {}
                Ok(decoded) => assert!(
                    matches!(
                        decoded,
                        Request::Lifecycle(
                            Lifecycle::UpdateStream { .. } | Lifecycle::UpdateTopic { .. }
                        )
                    ),
                    "{op:?} prefix {cut} decoded"
                ),
                Err(e) => panic!("{op:?} prefix {cut}: {e}"),
            }
        }
        let mut long = body.clone();
        long.push(0);
        assert!(
            Request::decode(op, 0, &long).is_err(),
            "{op:?} trailing byte"
        );
    }
}

/// A snapshot naming a live group as retired, or an incarnation the counter never handed
/// out, is refused; a version-1 snapshot (no retired section) still decodes.
#[test]
fn retired_groups_in_snapshots_are_checked() {
    let mut d = seeded();
    payload(
        &d.submit(&lc(Lifecycle::DeleteTopic {
            stream: num(0),
            topic: num(1),
        }))
        .unwrap(),
    );
    let good = d.sm.state().clone();
    assert_eq!(good.retired.len(), 1);
    assert_eq!(state::State::decode(&good.encode()).unwrap(), good);
    let live_key = *good.retired.keys().next().unwrap() - (1 << 20); // topic 0, partition 0
    for (group, incarnation) in [(live_key, 0), (*good.retired.keys().next().unwrap(), 99)] {
        let mut bad = good.clone();
        bad.retired.clear();
        bad.retired.insert(group, incarnation);
        assert!(matches!(
            state::State::decode(&bad.encode()),
            Err(state::SnapshotError::Content(_))
        ));
    }
    // Version 1: the same encoding without the retired section.
    let mut v1 = good.clone();
    v1.retired.clear();
    let mut bytes = v1.encode_v3();
    // (And without version 3's origins section, decision 371.)
    bytes.truncate(bytes.len() - 8 - 4 - 4);
    bytes[4] = 1;
    let trailer = xxhash_rust::xxh3::xxh3_64(&bytes);
    bytes.extend_from_slice(&trailer.to_le_bytes());
    assert_eq!(state::State::decode(&bytes).unwrap(), v1);
}

/// DeleteStream retires every partition of every topic it held (decision 343).
#[test]
fn delete_stream_retires_all_its_partitions() {
    let mut d = seeded();
    let before: Vec<u64> = d.sm.state().streams[&0]
        .topics
        .values()
        .flat_map(|t| (0..t.partitions.len() as u32).map(move |p| t.group(0, p).unwrap().0))
        .collect();
    assert_eq!(before.len(), 3);
    payload(&d.submit(&Request::DeleteStream(num(0))).unwrap());
    let retired: Vec<(u64, u64)> = d.sm.state().retired.iter().map(|(k, v)| (*k, *v)).collect();
    let mut want: Vec<(u64, u64)> = before.into_iter().zip([0, 1, 2]).collect();
    want.sort();
    assert_eq!(retired, want);
}

/// Decision 345: a deleted topic takes its consumer groups in the same apply, so a topic
/// created later in the freed slot starts without them.
#[test]
fn delete_topic_drops_its_consumer_groups() {
    let mut d = seeded();
    let create = Request::CreateConsumerGroup {
        stream: num(0),
        topic: num(0),
        name: name("g"),
    };
    payload(&d.submit(&create).unwrap());
    assert!(d.sm.state().consumer_groups.contains_key(&(0, 0)));
    let delete = Lifecycle::DeleteTopic {
        stream: num(0),
        topic: num(0),
    };
    payload(&d.submit(&lc(delete)).unwrap());
    assert!(
        !d.sm.state().consumer_groups.contains_key(&(0, 0)),
        "the deleted topic's groups outlived it"
    );
    payload(&d.submit(&create_topic(num(0), "t", 1)).unwrap());
    assert!(!d.sm.state().consumer_groups.contains_key(&(0, 0)));
}
