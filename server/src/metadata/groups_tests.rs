//! Consumer-group tests: join/leave/session end and the rebalance they cause, determinism
//! across instances, the snapshot section, and the answers in the SDK's layouts.

use consensus::WholeArtifacts;
use wire::Operation;
use wire::header::{Layout, PrepareHeader};

use super::*;
use crate::client::codec::{Consumer, Options};
use crate::client::groups::GroupTarget;
use crate::client::reply::read_result;
use crate::client::request::{CreateTopic, Request};
use crate::client::status;
use crate::metadata::password::HashParams;
use crate::metadata::{Genesis, MetadataStateMachine, ROOT_USER_ID, RootCredentials};

const A: u128 = 0xA1;
const B: u128 = 0xB2;
const C: u128 = 0xC3;

struct Driver {
    sm: MetadataStateMachine,
    op: u64,
}

impl Driver {
    fn new() -> Driver {
        let genesis = Genesis {
            cluster_id: 0xC1,
            root: RootCredentials::resolve(None, None, ("a", "b"), |_| None).unwrap(),
            params: HashParams::TEST,
        };
        Driver {
            sm: MetadataStateMachine::new(&genesis).unwrap(),
            op: 0,
        }
    }

    /// Preflight, projection and apply of `request` from `client`: `Err` is the preflight's
    /// refusal, `Ok` the result section's outcome (payload or rejection code).
    fn submit(&mut self, client: u128, request: &Request<'_>) -> Result<Result<Vec<u8>, u32>, u32> {
        let (operation, _) = request.operation();
        let mut body = Vec::new();
        request.encode(&mut body);
        self.sm.preflight(operation, &body)?;
        let projection = self.sm.project(operation, &body);
        Ok(self.apply(client, projection.operation, &projection.body))
    }

    /// Applies a committed prepare of `operation` with `body` as is (no preflight, no
    /// projection: what a primary of an older build replicates).
    fn apply(&mut self, client: u128, operation: Operation, body: &[u8]) -> Result<Vec<u8>, u32> {
        self.op += 1;
        let mut h = PrepareHeader::zeroed();
        h.op.set(self.op);
        h.timestamp.set(self.op * 1000);
        h.operation = operation.byte();
        h.user_id.set(ROOT_USER_ID);
        h.client.set(client);
        let mut reply = Vec::new();
        self.sm.apply(&h, body, &mut reply);
        read_result(&reply).unwrap().map(<[u8]>::to_vec)
    }

    fn ok(&mut self, client: u128, request: &Request<'_>) -> Vec<u8> {
        self.submit(client, request).unwrap().unwrap()
    }

    fn view(&self) -> MetadataView {
        MetadataView {
            op: self.op,
            state: self.sm.state().clone(),
        }
    }
}

fn name(text: &str) -> Name {
    Name::new(text).unwrap()
}

fn target() -> GroupTarget {
    GroupTarget {
        stream: Identifier::Named(name("s")),
        topic: Identifier::Named(name("t")),
        group: Identifier::Named(name("g")),
    }
}

/// A stream `s` with a topic `t` of `partitions` partitions and a group `g`.
fn setup(partitions: u32) -> Driver {
    let mut d = Driver::new();
    d.ok(
        A,
        &Request::CreateStream {
            name: name("s"),
            options: Options::default(),
        },
    );
    d.ok(
        A,
        &Request::CreateTopic(CreateTopic {
            stream: Identifier::Numeric(0),
            partitions_count: partitions,
            name: name("t"),
            options: Options::default(),
        }),
    );
    let details = d.ok(
        A,
        &Request::CreateConsumerGroup {
            stream: Identifier::Numeric(0),
            topic: Identifier::Numeric(0),
            name: name("g"),
        },
    );
    assert_eq!(
        decode_details(&details),
        (0, partitions, "g".into(), vec![])
    );
    d
}

/// The SDK's ConsumerGroupDetailsResponse, read field by field as its decoder does.
fn decode_details(bytes: &[u8]) -> (u32, u32, String, Vec<(u32, Vec<u32>)>) {
    let (id, partitions, members, name, mut at) = decode_record(bytes);
    let mut out = Vec::new();
    for _ in 0..members {
        let member = u32_at(bytes, at);
        let n = u32_at(bytes, at + 4);
        at += 8;
        let assigned = (0..n).map(|i| u32_at(bytes, at + 4 * i as usize)).collect();
        at += 4 * n as usize;
        out.push((member, assigned));
    }
    assert_eq!(at, bytes.len(), "trailing bytes after the group details");
    (id, partitions, name, out)
}

/// The SDK's ConsumerGroupResponse: id, partitions_count, members_count, u8-prefixed name.
fn decode_record(bytes: &[u8]) -> (u32, u32, u32, String, usize) {
    let len = bytes[12] as usize;
    let name = String::from_utf8(bytes[13..13 + len].to_vec()).unwrap();
    (
        u32_at(bytes, 0),
        u32_at(bytes, 4),
        u32_at(bytes, 8),
        name,
        13 + len,
    )
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

/// The SDK's SyncConsumerGroupResponse: generation u64, n u32, n × u32.
fn decode_sync(bytes: &[u8]) -> (u64, Vec<u32>) {
    let generation = u64::from_le_bytes(bytes[..8].try_into().unwrap());
    let n = u32_at(bytes, 8) as usize;
    assert_eq!(bytes.len(), 12 + 4 * n);
    (
        generation,
        (0..n).map(|i| u32_at(bytes, 12 + 4 * i)).collect(),
    )
}

fn sync(d: &Driver, client: u128) -> Option<(u64, Vec<u32>)> {
    let answer = sync_answer(&d.view(), &target(), client);
    (!answer.is_empty()).then(|| decode_sync(&answer))
}

fn details(d: &Driver) -> (u32, u32, String, Vec<(u32, Vec<u32>)>) {
    let view = d.view();
    let found = view
        .consumer_group(&target().stream, &target().topic, &target().group)
        .unwrap();
    let mut out = Vec::new();
    found.group.encode_details(found.partitions, &mut out);
    decode_details(&out)
}

#[test]
fn join_leave_and_session_end_rebalance_with_a_moving_generation() {
    let mut d = setup(5);
    assert_eq!(sync(&d, A), None, "not a member yet: empty Sync");

    d.ok(A, &Request::JoinConsumerGroup(target()));
    assert_eq!(sync(&d, A), Some((1, vec![0, 1, 2, 3, 4])));
    d.ok(B, &Request::JoinConsumerGroup(target()));
    assert_eq!(sync(&d, A), Some((2, vec![0, 2, 4])));
    assert_eq!(sync(&d, B), Some((2, vec![1, 3])));
    assert_eq!(
        details(&d),
        (0, 5, "g".into(), vec![(0, vec![0, 2, 4]), (1, vec![1, 3])])
    );
    // Joining again changes nothing (the SDK rejoins after errors).
    d.ok(A, &Request::JoinConsumerGroup(target()));
    assert_eq!(sync(&d, A), Some((2, vec![0, 2, 4])));

    d.ok(C, &Request::JoinConsumerGroup(target()));
    assert_eq!(sync(&d, C), Some((3, vec![2])));
    // Leave: the others take its partitions.
    d.ok(A, &Request::LeaveConsumerGroup(target()));
    assert_eq!(sync(&d, A), None);
    assert_eq!(sync(&d, B), Some((4, vec![0, 2, 4])));
    assert_eq!(sync(&d, C), Some((4, vec![1, 3])));
    // Leaving twice is refused with 5006 at apply, deterministically.
    assert_eq!(
        d.submit(A, &Request::LeaveConsumerGroup(target())),
        Ok(Err(MEMBER_NOT_FOUND))
    );
    // A session ending (Logout, re-login, eviction, a closed connection's Logout) removes
    // the member everywhere; idempotent.
    d.sm.end_session(B);
    assert_eq!(sync(&d, C), Some((5, vec![0, 1, 2, 3, 4])));
    let before = d.sm.snapshot();
    d.sm.end_session(B);
    d.sm.end_session(0xDEAD);
    assert_eq!(
        d.sm.snapshot(),
        before,
        "ending a non-member's session changes nothing"
    );
    // The read handle other shards use sees it.
    let reader = d.sm.reader();
    let published = reader.view();
    assert_eq!(
        sync_answer(&published, &target(), C),
        sync_answer(&d.view(), &target(), C)
    );
    // Member ids are never reused.
    d.ok(A, &Request::JoinConsumerGroup(target()));
    assert_eq!(
        details(&d).3,
        vec![(2, vec![0, 2, 4]), (3, vec![1, 3])],
        "C (member 2) and A's new membership (member 3)"
    );
}

#[test]
fn assignment_covers_every_partition_once_and_shares_differ_by_at_most_one() {
    for partitions in 0..12u32 {
        for members in 0..7u128 {
            let mut group = ConsumerGroup::new(0, 0, name("g"));
            for m in 0..members {
                group.join(100 + m);
            }
            let assignment = group.assignment(partitions);
            assert_eq!(assignment.len(), members as usize);
            let mut all: Vec<u32> = assignment.iter().flat_map(|(_, p)| p.clone()).collect();
            all.sort_unstable();
            if members > 0 {
                assert_eq!(all, (0..partitions).collect::<Vec<_>>());
            }
            let sizes: Vec<usize> = assignment.iter().map(|(_, p)| p.len()).collect();
            if let (Some(max), Some(min)) = (sizes.iter().max(), sizes.iter().min()) {
                assert!(max - min <= 1, "{partitions} over {members}: {sizes:?}");
            }
        }
    }
}

#[test]
fn business_refusals_and_not_found_codes() {
    let mut d = setup(2);
    let create = Request::CreateConsumerGroup {
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        name: name("g"),
    };
    assert_eq!(d.submit(A, &create), Err(GROUP_NAME_ALREADY_EXISTS));
    let missing = GroupTarget {
        group: Identifier::Numeric(7),
        ..target()
    };
    assert_eq!(
        d.submit(A, &Request::JoinConsumerGroup(missing.clone())),
        Err(GROUP_ID_NOT_FOUND)
    );
    let named = GroupTarget {
        group: Identifier::Named(name("nope")),
        ..target()
    };
    assert_eq!(
        d.submit(A, &Request::DeleteConsumerGroup(named)),
        Err(GROUP_NAME_NOT_FOUND)
    );
    let no_topic = GroupTarget {
        topic: Identifier::Numeric(9),
        ..target()
    };
    assert_eq!(
        d.submit(A, &Request::LeaveConsumerGroup(no_topic)),
        Err(status::TOPIC_ID_NOT_FOUND)
    );
    // A second group takes the next id; deleting the first frees its id.
    let h = d.ok(
        A,
        &Request::CreateConsumerGroup {
            stream: Identifier::Numeric(0),
            topic: Identifier::Numeric(0),
            name: name("h"),
        },
    );
    assert_eq!(decode_details(&h).0, 1);
    d.ok(A, &Request::DeleteConsumerGroup(target()));
    assert_eq!(sync(&d, A), None);
    let again = d.ok(A, &create);
    assert_eq!(decode_details(&again).0, 0);
    // Deleting the stream drops its groups.
    d.ok(A, &Request::DeleteStream(Identifier::Numeric(0)));
    assert!(d.sm.state().consumer_groups.is_empty());
}

#[test]
fn two_instances_end_identical_and_the_snapshot_carries_the_groups() {
    let script = |d: &mut Driver| {
        d.ok(A, &Request::JoinConsumerGroup(target()));
        d.ok(B, &Request::JoinConsumerGroup(target()));
        d.ok(C, &Request::JoinConsumerGroup(target()));
        d.sm.end_session(A);
        let _ = d.submit(C, &Request::LeaveConsumerGroup(target()));
    };
    let mut one = setup(3);
    let mut two = setup(3);
    script(&mut one);
    script(&mut two);
    assert_eq!(one.sm.snapshot(), two.sm.snapshot());

    let artifacts = one.sm.artifacts(one.op);
    let mut fresh = Driver::new();
    fresh.sm.install(one.op, &artifacts).unwrap();
    fresh.op = one.op;
    assert_eq!(fresh.sm.state(), one.sm.state());
    assert_eq!(sync(&fresh, B), Some((5, vec![0, 1, 2])));
    // The restored copy goes on like the original.
    fresh.ok(A, &Request::JoinConsumerGroup(target()));
    one.ok(A, &Request::JoinConsumerGroup(target()));
    assert_eq!(fresh.sm.snapshot(), one.sm.snapshot());
    assert_eq!(State::decode(&one.sm.snapshot()).unwrap(), *one.sm.state());
}

/// Re-seals `content` (a snapshot without its trailer) with its XXH3-64 trailer.
fn seal(mut content: Vec<u8>) -> Vec<u8> {
    let trailer = xxhash_rust::xxh3::xxh3_64(&content);
    content.extend_from_slice(&trailer.to_le_bytes());
    content
}

#[test]
fn snapshot_sections_that_break_the_rules_are_refused() {
    let mut d = setup(2);
    d.ok(A, &Request::JoinConsumerGroup(target()));
    let good = d.sm.state().clone();

    // A snapshot written before the section (no groups) still decodes, without groups.
    let mut bare = good.clone();
    bare.consumer_groups.clear();
    bare.group_keys_issued = 0;
    let encoded = bare.encode_v3();
    // (A version-2 one: no origins section either, decision 371.)
    let mut old = encoded[..encoded.len() - 8 - 4 - 4].to_vec();
    old[4] = 2;
    let old = seal(old);
    assert_eq!(State::decode(&old).unwrap(), bare);

    let broken = |edit: &dyn Fn(&mut State)| {
        let mut s = good.clone();
        edit(&mut s);
        State::decode(&s.encode())
    };
    fn group(s: &mut State) -> &mut ConsumerGroup {
        s.consumer_groups
            .get_mut(&(0, 0))
            .unwrap()
            .get_mut(&0)
            .unwrap()
    }
    assert!(broken(&|_| {}).is_ok());
    // Groups of a topic that does not exist.
    assert!(
        broken(&|s| {
            let groups = s.consumer_groups.remove(&(0, 0)).unwrap();
            s.consumer_groups.insert((0, 5), groups);
        })
        .is_err()
    );
    // A member id at or above the group's counter.
    assert!(broken(&|s| group(s).next_member_id = 0).is_err());
    // The same client twice.
    assert!(
        broken(&|s| {
            let g = group(s);
            g.next_member_id = 5;
            g.members.insert(4, A);
        })
        .is_err()
    );
    // Client id 0.
    assert!(
        broken(&|s| {
            group(s).members.insert(0, 0);
        })
        .is_err()
    );
    // Duplicate names.
    assert!(
        broken(&|s| {
            let mut copy = group(s).clone();
            copy.id = 1;
            copy.members.clear();
            s.consumer_groups.get_mut(&(0, 0)).unwrap().insert(1, copy);
        })
        .is_err()
    );
    // An empty group list for a topic.
    assert!(
        broken(&|s| {
            s.consumer_groups.get_mut(&(0, 0)).unwrap().clear();
        })
        .is_err()
    );
    // Offset keys (decision 392): one the counter has not issued yet, a legacy key that is
    // not its group's id, the same key on two groups of a topic, a counter past its range.
    assert!(broken(&|s| group(s).key = GROUP_KEY_BASE + 1).is_err());
    assert!(broken(&|s| group(s).key = 7).is_err());
    assert!(
        broken(&|s| group(s).key = 0).is_ok(),
        "a legacy key: its id"
    );
    assert!(
        broken(&|s| {
            let mut copy = group(s).clone();
            copy.id = 1;
            copy.name = name("other");
            s.consumer_groups.get_mut(&(0, 0)).unwrap().insert(1, copy);
        })
        .is_err()
    );
    assert!(broken(&|s| s.group_keys_issued = GROUP_KEY_BASE + 1).is_err());
}

#[test]
fn poll_fence_and_offset_targets_name_the_group_by_id() {
    let mut d = setup(3);
    d.ok(A, &Request::JoinConsumerGroup(target()));
    d.ok(B, &Request::JoinConsumerGroup(target()));
    let view = d.view();
    let mut offset_target = crate::client::request::OffsetTarget {
        consumer: Consumer {
            group: true,
            id: Identifier::Named(name("g")),
        },
        stream: target().stream,
        topic: target().topic,
        partition: Some(1),
    };
    consumer_of_group(&view, &mut offset_target).unwrap();
    assert_eq!(
        offset_target.consumer.id,
        Identifier::Numeric(GROUP_KEY_BASE),
        "named by its offset key, not its id 0"
    );
    let fence = |client, partition| {
        poll_fence(
            &view,
            &target().stream,
            &target().topic,
            GROUP_KEY_BASE,
            client,
            partition,
        )
    };
    assert_eq!(fence(A, 0), Ok(()));
    assert_eq!(fence(A, 2), Ok(()));
    assert_eq!(fence(A, 1), Err(PARTITION_NOT_OWNED));
    assert_eq!(fence(B, 1), Ok(()));
    assert_eq!(fence(C, 1), Err(MEMBER_NOT_FOUND));
    // A key no group of the topic has (its group was deleted since the route): 5000.
    assert_eq!(
        poll_fence(&view, &target().stream, &target().topic, 0, A, 0),
        Err(GROUP_ID_NOT_FOUND)
    );
    let mut missing = offset_target.clone();
    missing.consumer.id = Identifier::Numeric(4);
    assert_eq!(
        consumer_of_group(&view, &mut missing),
        Err(GROUP_ID_NOT_FOUND)
    );
}

#[test]
fn an_operation_mix_never_panics_and_replays_identically() {
    // Random Join/Leave/end_session sequences from a few clients, applied to two instances:
    // identical snapshots, every member's partitions disjoint and covering the topic.
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut one = setup(7);
    let mut two = setup(7);
    for _ in 0..400 {
        let client = u128::from(next() % 5 + 1);
        let action = next() % 3;
        for d in [&mut one, &mut two] {
            match action {
                0 => {
                    let _ = d.submit(client, &Request::JoinConsumerGroup(target()));
                }
                1 => {
                    let _ = d.submit(client, &Request::LeaveConsumerGroup(target()));
                }
                _ => d.sm.end_session(client),
            }
        }
        assert_eq!(one.sm.snapshot(), two.sm.snapshot());
        let (_, _, _, members) = details(&one);
        let mut all: Vec<u32> = members.iter().flat_map(|(_, p)| p.clone()).collect();
        all.sort_unstable();
        if !members.is_empty() {
            assert_eq!(all, (0..7).collect::<Vec<_>>());
        }
    }
    let _ = Operation::JoinConsumerGroup;
}

// ---- session origins (decisions 370-372) ----------------------------------------------------

/// A committed Register of `client` whose connection is on replica `origin`, as the core runs
/// it: the session it replaces ends, then the new one begins with the body the primary wrote.
fn register(d: &mut Driver, client: u128, origin: u8) {
    d.op += 1;
    let mut h = PrepareHeader::zeroed();
    h.op.set(d.op);
    h.operation = Operation::Register.byte();
    h.user_id.set(ROOT_USER_ID);
    h.client.set(client);
    let body =
        d.sm.project_register(consensus::ReplicaId(origin), b"login body");
    d.sm.end_session(client);
    d.sm.begin_session(&h, &body);
}

#[test]
fn a_dead_nodes_sessions_end_and_its_members_partitions_move_alike_everywhere() {
    use crate::session_reaper::{Reaper, Reason, Session};
    use std::time::{Duration, Instant};
    let (mut one, mut two) = (setup(4), setup(4));
    for d in [&mut one, &mut two] {
        register(d, A, 0);
        register(d, B, 1);
        register(d, C, 1);
        // An older build's Register (untagged body): a session without an origin.
        d.op += 1;
        let mut h = PrepareHeader::zeroed();
        h.op.set(d.op);
        h.client.set(0xD4);
        d.sm.begin_session(&h, &0x2C00u32.to_le_bytes());
        for client in [A, B, C] {
            d.ok(client, &Request::JoinConsumerGroup(target()));
        }
    }
    assert_eq!(one.sm.session_origin(A), Some(0));
    assert_eq!(one.sm.session_origin(B), Some(1));
    assert_eq!(one.sm.session_origin(0xD4), None);
    assert_eq!(sync(&one, A), Some((3, vec![0, 3])));
    // The snapshot carries the origins: a restore gives the same state.
    let restored = State::decode(&one.sm.snapshot()).unwrap();
    assert_eq!(&restored, one.sm.state());
    assert_eq!(restored.session_origins.len(), 3);

    // The primary (node 0) has seen node 1 down past the bound: B and C are due.
    let t0 = Instant::now();
    let bound = Duration::from_secs(2);
    let mut reaper = Reaper::new(0, 3, bound, t0);
    reaper.peer(2, true, t0);
    reaper.registered(A, t0);
    let sessions: Vec<Session> = [A, B, C, 0xD4]
        .into_iter()
        .map(|client| Session {
            client,
            epoch: 1,
            user: ROOT_USER_ID,
            origin: one.sm.session_origin(client),
        })
        .collect();
    let due = reaper.due(t0 + bound, true, true, sessions);
    let ended: Vec<(u128, Reason)> = due.iter().map(|(s, r)| (s.client, *r)).collect();
    assert_eq!(ended, [(B, Reason::PeerDown(1)), (C, Reason::PeerDown(1))]);
    // Their Logouts commit: every replica ends them in op order, alike.
    for d in [&mut one, &mut two] {
        for (session, _) in &due {
            d.sm.end_session(session.client);
        }
    }
    assert_eq!(one.sm.snapshot(), two.sm.snapshot());
    assert_eq!(sync(&one, A), Some((5, vec![0, 1, 2, 3])));
    assert_eq!(sync(&one, B), None);
    assert_eq!(
        one.sm
            .state()
            .session_origins
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        [A],
        "the untagged session has no origin to end it by"
    );
}

#[test]
fn the_origins_section_is_version_3_and_older_snapshots_load_without_it() {
    let mut d = setup(2);
    // (Written as version 3 did: no offset keys in the groups section, decision 392.)
    let empty = d.sm.state().encode_v3();
    register(&mut d, A, 2);
    register(&mut d, B, 0);
    let state = State::decode(&d.sm.snapshot()).unwrap();
    assert_eq!(state.session_origins.get(&A), Some(&2));
    // A version-2 snapshot (no origins section): the same bytes before the section.
    let content = &empty[..empty.len() - 8];
    assert_eq!(content[4], 3);
    assert_eq!(
        &content[content.len() - 4..],
        &[0, 0, 0, 0],
        "no origins yet"
    );
    let mut v2 = content[..content.len() - 4].to_vec();
    v2[4] = 2;
    let trailer = xxhash_rust::xxh3::xxh3_64(&v2);
    v2.extend_from_slice(&trailer.to_le_bytes());
    let old = State::decode(&v2).unwrap();
    assert!(old.session_origins.is_empty());
    assert_eq!(old.streams, state.streams);
    // Untrusted: a zero client, clients out of order and a cut section are refused.
    let forged = |entries: &[(u128, u8)], count: u32| {
        let mut bytes = content[..content.len() - 4].to_vec();
        bytes.extend_from_slice(&count.to_le_bytes());
        for (client, origin) in entries {
            bytes.extend_from_slice(&client.to_le_bytes());
            bytes.push(*origin);
        }
        let trailer = xxhash_rust::xxh3::xxh3_64(&bytes);
        bytes.extend_from_slice(&trailer.to_le_bytes());
        State::decode(&bytes)
    };
    assert!(forged(&[(5, 1), (9, 0)], 2).is_ok());
    assert!(matches!(
        forged(&[(0, 1)], 1),
        Err(SnapshotError::Content(_))
    ));
    assert!(matches!(
        forged(&[(9, 1), (5, 0)], 2),
        Err(SnapshotError::Content(_))
    ));
    assert!(forged(&[(5, 1)], 2).is_err(), "a count past the entries");
    assert!(
        forged(&[(5, 1), (9, 0)], 1).is_err(),
        "bytes past the count"
    );
}

/// CreateConsumerGroup of `group` on stream 0, topic 0.
fn create(group: &str) -> Request<'static> {
    Request::CreateConsumerGroup {
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        name: Name::new(group).unwrap(),
    }
}

/// The (id, offset key) of each group of stream 0, topic 0, in id order.
fn keys(d: &Driver) -> Vec<(u32, u32)> {
    d.sm.state()
        .consumer_groups
        .get(&(0, 0))
        .map(|g| g.values().map(|g| (g.id, g.key)).collect())
        .unwrap_or_default()
}

/// The offset key a consumer-kind-2 target naming `group` is routed under (decision 390).
fn routed_key(d: &Driver, group: Identifier) -> Result<Identifier, u32> {
    let mut offset_target = crate::client::request::OffsetTarget {
        consumer: Consumer {
            group: true,
            id: group,
        },
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        partition: Some(0),
    };
    consumer_of_group(&d.view(), &mut offset_target)?;
    Ok(offset_target.consumer.id)
}

#[test]
fn a_groups_offset_key_is_never_reused_across_delete_and_create() {
    let mut d = setup(2);
    let base = GROUP_KEY_BASE;
    assert_eq!(keys(&d), vec![(0, base)]);
    d.ok(A, &Request::DeleteConsumerGroup(target()));
    // The topic has no group left (its entry is gone): the counter is not in it.
    assert!(d.sm.state().consumer_groups.is_empty());
    let again = d.ok(A, &create("g"));
    assert_eq!(decode_details(&again).0, 0, "the id is reused");
    assert_eq!(keys(&d), vec![(0, base + 1)], "the key is not");
    d.ok(A, &create("h"));
    assert_eq!(keys(&d), vec![(0, base + 1), (1, base + 2)]);
    assert_eq!(
        routed_key(&d, Identifier::Numeric(0)),
        Ok(Identifier::Numeric(base + 1))
    );
    assert_eq!(
        routed_key(&d, Identifier::Named(name("h"))),
        Ok(Identifier::Numeric(base + 2))
    );
    // A refused create (a duplicate name) issues no key.
    assert_eq!(
        d.apply(
            A,
            Operation::CreateConsumerGroup,
            &keyed_create_body(&{
                let mut body = Vec::new();
                create("h").encode(&mut body);
                body
            })
        ),
        Err(GROUP_NAME_ALREADY_EXISTS)
    );
    assert_eq!(d.sm.state().group_keys_issued, 3);

    // The snapshot keeps the keys and the counter; a restored copy goes on alike.
    let bytes = d.sm.snapshot();
    assert_eq!(bytes[4], 4, "snapshot version 4");
    assert_eq!(State::decode(&bytes).unwrap(), *d.sm.state());
    let mut fresh = Driver::new();
    fresh.sm.install(d.op, &d.sm.artifacts(d.op)).unwrap();
    fresh.op = d.op;
    for x in [&mut d, &mut fresh] {
        x.ok(A, &Request::DeleteConsumerGroup(target()));
        x.ok(A, &create("g"));
        assert_eq!(keys(x), vec![(0, base + 3), (1, base + 2)]);
    }
    assert_eq!(fresh.sm.snapshot(), d.sm.snapshot());
    // The counter is not per topic: a group of another topic takes the next key too.
    d.ok(
        A,
        &Request::CreateTopic(CreateTopic {
            stream: Identifier::Numeric(0),
            partitions_count: 1,
            name: name("u"),
            options: Options::default(),
        }),
    );
    d.ok(
        A,
        &Request::CreateConsumerGroup {
            stream: Identifier::Numeric(0),
            topic: Identifier::Numeric(1),
            name: name("g"),
        },
    );
    assert_eq!(d.sm.state().consumer_groups[&(0, 1)][&0].key, base + 4);
    // An exhausted counter refuses the create, at preflight and at apply alike.
    let mut full = d.sm.state().clone();
    full.group_keys_issued = GROUP_KEY_BASE;
    let mut d = Driver::new();
    d.sm.install(
        1,
        &[consensus::Artifact {
            kind: wire::manifest::ArtifactKind::METADATA_SNAPSHOT,
            frontier: 1,
            bytes: full.encode(),
        }],
    )
    .unwrap();
    d.op = 1;
    assert_eq!(d.submit(A, &create("k")), Err(status::ERROR));
}

#[test]
fn version_3_snapshots_and_untagged_creates_keep_legacy_keys_below_the_counter() {
    // A version-3 snapshot (written before offset keys) of two groups, ids 0 and 1.
    let mut old = setup(2);
    old.ok(A, &create("h"));
    let v3 = old.sm.state().encode_v3();
    assert_eq!(v3[4], 3);
    let state = State::decode(&v3).unwrap();
    let mut d = Driver::new();
    d.sm.install(
        old.op,
        &[consensus::Artifact {
            kind: wire::manifest::ArtifactKind::METADATA_SNAPSHOT,
            frontier: old.op,
            bytes: v3,
        }],
    )
    .unwrap();
    d.op = old.op;
    assert_eq!(*d.sm.state(), state);
    // Each group's key is its id, as the older build stored its offsets; the counter has
    // issued none.
    assert_eq!(keys(&d), vec![(0, 0), (1, 1)]);
    assert_eq!(d.sm.state().group_keys_issued, 0);
    // A CreateConsumerGroup prepare of an older build's primary (no tag): the legacy key
    // again, the counter unmoved, so a replica replaying it from an older checkpoint and one
    // that loads a later version-3 snapshot agree.
    d.ok(A, &Request::DeleteConsumerGroup(target()));
    let mut body = Vec::new();
    create("g2").encode(&mut body);
    d.apply(A, Operation::CreateConsumerGroup, &body).unwrap();
    assert_eq!(keys(&d), vec![(0, 0), (1, 1)]);
    assert_eq!(d.sm.state().group_keys_issued, 0);
    // This build's create: the counter's first key, above every legacy key.
    d.ok(
        A,
        &Request::DeleteConsumerGroup(GroupTarget {
            group: Identifier::Numeric(0),
            ..target()
        }),
    );
    d.ok(A, &create("g3"));
    assert_eq!(keys(&d), vec![(0, GROUP_KEY_BASE), (1, 1)]);
    assert_eq!(
        State::decode(&d.sm.snapshot()).unwrap(),
        *d.sm.state(),
        "legacy and issued keys side by side round-trip"
    );
}
