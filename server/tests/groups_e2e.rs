//! Consumer-group members whose node died are removed (decisions 370-374), across real
//! processes: three `strand start` nodes, a 4-partition topic and a consumer group of two
//! members. Each member's session is registered on its own node and its login connection
//! stays open there, as an SDK client's would. A backup refuses metadata writes, so a member
//! whose session is on a backup sends its JoinConsumerGroup on a second connection to the
//! metadata primary under the same session (a session is its client id and number, valid on
//! every node); that connection stays open, so no connection-close Logout (decision 317 (d))
//! can end the membership: only the session's origin can.
//!
//! Every wait is bounded; nothing asserts on elapsed time.

mod common;

use std::path::Path;

use common::client::{
    CREATE_STREAM, CREATE_TOPIC, Client, GET_CONSUMER_OFFSET, NON_REPLICATED, POLL_MESSAGES,
    STORE_CONSUMER_OFFSET, frame, name, topic_body,
};
use common::{Node, eventually};
use server::client::codec::{Consumer, Identifier, Name, PollingStrategy};
use server::client::groups::GroupTarget;
use server::client::reply::{ConsumerOffsetReply, PollHead};
use server::client::request::{OffsetTarget, PollMessages, Request, StoreConsumerOffset};

const PARTITIONS: u32 = 4;

/// The cluster config with `cluster.dead_node_session_timeout` set.
fn write_config(path: &Path, name: &str, ports: &[u16], dead_node: &str) {
    let text = common::config(name, 3, ports, "").replacen(
        "[cluster]\nenabled = true\n",
        &format!("[cluster]\nenabled = true\ndead_node_session_timeout = \"{dead_node}\"\n"),
        1,
    );
    assert!(text.contains("dead_node_session_timeout"));
    std::fs::write(path, text).unwrap();
}

fn target() -> GroupTarget {
    GroupTarget {
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        group: Identifier::Named(Name::new("workers").unwrap()),
    }
}

/// A request's operation byte, legacy code and body.
fn encoded(request: &Request<'_>) -> (u8, u32, Vec<u8>) {
    let (operation, code) = request.operation();
    let mut body = Vec::new();
    request.encode(&mut body);
    (operation.byte(), code, body)
}

/// A replicated group command; its result code.
fn group_op(client: &mut Client, request: &Request<'_>) -> u32 {
    let (operation, _, body) = encoded(request);
    client.replicated(operation, &body).result()
}

/// GetConsumerGroup on `client`'s node: `(member id, partitions)` per member, `None` when the
/// node does not know the group (yet).
fn members(client: &mut Client) -> Option<Vec<(u32, Vec<u32>)>> {
    let (_, code, body) = encoded(&Request::GetConsumerGroup(target()));
    let answer = client.exchange(&frame(
        client.client,
        NON_REPLICATED,
        code,
        client.session,
        1,
        &body,
    ));
    assert_eq!(answer.status(), 0);
    let b = answer.body();
    if b.is_empty() {
        return None;
    }
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let count = u32_at(8);
    let mut at = 13 + usize::from(b[12]);
    let mut out = Vec::new();
    for _ in 0..count {
        let (member, n) = (u32_at(at), u32_at(at + 4));
        at += 8;
        out.push((
            member,
            (0..n).map(|i| u32_at(at + 4 * i as usize)).collect(),
        ));
        at += 4 * n as usize;
    }
    assert_eq!(at, b.len(), "GetConsumerGroup: trailing bytes");
    Some(out)
}

/// Stream 0, topic 0 of [`PARTITIONS`] partitions and the group, created at the primary.
fn create_group(admin: &mut Client) {
    assert_eq!(admin.replicated(CREATE_STREAM, &name("jobs")).result(), 0);
    let topic = topic_body(0, PARTITIONS, "tasks");
    assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);
    let create = Request::CreateConsumerGroup {
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        name: Name::new("workers").unwrap(),
    };
    assert_eq!(group_op(admin, &create), 0);
}

/// A member whose session is registered on `home` (its login connection is returned and must
/// stay open) and whose Join went to the primary `join_at` on a second connection (returned).
fn member(home: &Node, join_at: &Node, client: u128) -> (Client, Client) {
    let mut login = Client::connect(home.tcp, client);
    login.login();
    let mut joiner = Client::connect(join_at.tcp, client);
    joiner.session = login.session;
    joiner.request = 1;
    assert_eq!(
        group_op(&mut joiner, &Request::JoinConsumerGroup(target())),
        0
    );
    (login, joiner)
}

/// The cluster of one test and its group of two members, as every test here begins.
struct Cluster {
    /// The metadata primary.
    mp: usize,
    /// The backup whose node holds member 1's session.
    backup: usize,
    /// A client at the primary.
    admin: Client,
    /// Member 0: its session on the primary (login and join connections, kept open).
    _a: (Client, Client),
    /// Member 1: its session on `backup`, its Join at the primary (both kept open).
    b: (Client, Client),
    /// `cluster.dead_node_session_timeout`'s file, for a restart.
    config: std::path::PathBuf,
    /// Every node's log.
    logs: std::path::PathBuf,
}

/// Starts three nodes with `dead_node` as `cluster.dead_node_session_timeout`, creates the
/// topic and the group with member 0 on the primary and member 1 on a backup, and runs
/// `body`; the nodes are killed after it (their logs printed if it panicked).
fn with_two_members(name: &str, dead_node: &str, body: impl FnOnce(&mut [Node], Cluster)) {
    let _serial = common::serial();
    let dir = common::scratch(name);
    let ports = common::free_ports(9);
    let config = dir.join("strand.toml");
    write_config(&config, name, &ports, dead_node);
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        common::spawn_plain(&config, node, &logs, 1);
    }
    let at_logs = logs.clone();
    common::run_killed(&mut nodes, &at_logs, &dir, |nodes| {
        let mp = common::metadata_primary(nodes, &[0, 1, 2], &logs);
        let backup = (mp + 1) % 3;
        let mut admin = Client::connect(nodes[mp].tcp, 0xAD);
        admin.login();
        create_group(&mut admin);
        let a = member(&nodes[mp], &nodes[mp], 0xA1);
        let b = member(&nodes[backup], &nodes[mp], 0xB2);
        let cluster = Cluster {
            mp,
            backup,
            admin,
            _a: a,
            b,
            config,
            logs,
        };
        body(nodes, cluster)
    });
}

#[test]
fn a_member_on_a_killed_backup_is_removed_and_the_survivor_takes_every_partition() {
    with_two_members("groups-dead-backup", "1s", |nodes, mut c| {
        let (backup, logs) = (c.backup, &c.logs);
        let split = members(&mut c.admin);
        assert_eq!(
            split,
            Some(vec![(0, vec![0, 2]), (1, vec![1, 3])]),
            "two members share the partitions"
        );
        // The backup dies with its connections; the survivor gets all partitions.
        eprintln!("metadata primary n{}; SIGKILL of backup n{backup}", c.mp);
        common::kill(&mut nodes[backup]);
        eventually("the dead backup's member is removed", logs, || {
            let now = members(&mut c.admin)?;
            (now == vec![(0, (0..PARTITIONS).collect())]).then_some(())
        });
        let ended = common::log_lines(logs, "ending a session whose node is gone");
        assert_eq!(ended.len(), 1, "only the backup's session: {ended:?}");
        assert!(
            ended[0].contains(&format!("PeerDown({backup})")) && ended[0].contains("178"),
            "client 0xB2 (178), origin n{backup}: {ended:?}"
        );
    });
}

#[test]
fn a_restarted_backup_ends_the_sessions_of_its_earlier_life_before_any_bound() {
    // A bound no test reaches: only the restart rule can end the session.
    with_two_members("groups-restart", "1h", |nodes, mut c| {
        let (backup, logs) = (c.backup, &c.logs);
        assert_eq!(members(&mut c.admin).map(|m| m.len()), Some(2));
        eprintln!(
            "metadata primary n{}; SIGKILL and restart of backup n{backup}",
            c.mp
        );
        common::kill(&mut nodes[backup]);
        common::spawn_plain(&c.config, &mut nodes[backup], logs, 1);
        eventually("the restarted backup's old member is removed", logs, || {
            let now = members(&mut c.admin)?;
            (now == vec![(0, (0..PARTITIONS).collect())]).then_some(())
        });
        let ended = common::log_lines(logs, "ending a session whose node is gone");
        assert!(
            !ended.is_empty() && ended.iter().all(|l| l.contains("StaleOwn")),
            "{ended:?}"
        );
    });
}

#[test]
fn a_new_primary_ends_the_sessions_of_the_killed_primary() {
    with_two_members("groups-dead-primary", "1s", |nodes, mut c| {
        let (mp, logs) = (c.mp, &c.logs);
        // Member 1 watches from its backup.
        let b_login = &mut c.b.0;
        eventually("the backup knows both members", logs, || {
            (members(b_login)?.len() == 2).then_some(())
        });
        eprintln!("SIGKILL of metadata primary n{mp}");
        common::kill(&mut nodes[mp]);
        let live: Vec<usize> = (0..3).filter(|&i| i != mp).collect();
        let new = common::metadata_primary(nodes, &live, logs);
        eprintln!("new metadata primary n{new}");
        eventually("the dead primary's member is removed", logs, || {
            let now = members(b_login)?;
            (now == vec![(1, (0..PARTITIONS).collect())]).then_some(())
        });
        let ended = common::log_lines(logs, "ending a session whose node is gone");
        assert!(
            ended.iter().any(|l| l.contains(&format!("PeerDown({mp})"))),
            "{ended:?}"
        );
    });
}

/// Partition 0 of stream 0, topic 0 for `consumer`.
fn offset_target(consumer: Consumer) -> OffsetTarget {
    OffsetTarget {
        consumer,
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        partition: Some(0),
    }
}

fn group_consumer(id: Identifier) -> Consumer {
    Consumer { group: true, id }
}

/// StoreConsumerOffset of `consumer` on partition 0: the result code.
fn store(client: &mut Client, consumer: Consumer, offset: u64) -> u32 {
    let mut body = Vec::new();
    Request::StoreConsumerOffset(StoreConsumerOffset {
        target: offset_target(consumer),
        offset,
        quorum: true,
    })
    .encode(&mut body);
    client.replicated(STORE_CONSUMER_OFFSET, &body).result()
}

/// GetConsumerOffset of `consumer` on partition 0: the stored offset, `None` for none.
fn stored(client: &mut Client, consumer: Consumer) -> Option<u64> {
    let mut body = Vec::new();
    Request::GetConsumerOffset(offset_target(consumer)).encode(&mut body);
    let answer = client.read(GET_CONSUMER_OFFSET, &body);
    assert_eq!(answer.status(), 0);
    ConsumerOffsetReply::decode(answer.body())
        .unwrap()
        .map(|r| r.stored_offset)
}

/// A group poll of partition 0 with strategy Next, one message, auto-commit: the offset of
/// the message returned (`None` for none).
fn poll_next(client: &mut Client, group: Identifier) -> Option<u64> {
    let mut body = Vec::new();
    Request::PollMessages(PollMessages {
        consumer: group_consumer(group),
        stream: Identifier::Numeric(0),
        topic: Identifier::Numeric(0),
        partition: Some(0),
        strategy: PollingStrategy::Next(0),
        count: 1,
        auto_commit: true,
    })
    .encode(&mut body);
    let answer = client.read(POLL_MESSAGES, &body);
    assert_eq!(answer.status(), 0, "group poll");
    let (head, batches) = PollHead::decode(answer.body()).unwrap();
    if head.messages_count == 0 {
        return None;
    }
    // One message per batch was sent, so the first batch's base offset is its offset.
    Some(
        wire::batch::verify(batches)
            .expect("an intact batch")
            .base_offset,
    )
}

/// Decision 390: a group created after a deleted one takes its id (the lowest free) but not
/// its offsets. One node; three messages of one batch each on a one-partition topic.
#[test]
fn a_group_that_reuses_a_deleted_groups_id_starts_without_its_offsets() {
    let _serial = common::serial();
    let dir = common::scratch("groups-reused-id");
    let ports = common::free_ports(3);
    let config = dir.join("strand.toml");
    std::fs::write(&config, common::config("groups-reused-id", 1, &ports, "")).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 1, &ports);
    common::spawn_plain(&config, &mut nodes[0], &logs, 1);
    let at_logs = logs.clone();
    common::run_killed(&mut nodes, &at_logs, &dir, |nodes| {
        common::metadata_primary(nodes, &[0], &logs);
        let mut c = Client::connect(nodes[0].tcp, 0xC0);
        c.login();
        assert_eq!(c.replicated(CREATE_STREAM, &name("jobs")).result(), 0);
        assert_eq!(
            c.replicated(CREATE_TOPIC, &topic_body(0, 1, "tasks"))
                .result(),
            0
        );
        for i in 0..3 {
            c.send(0, 0, &[common::payload(i, 0)]);
        }
        let create = |c: &mut Client, group: &str| {
            let request = Request::CreateConsumerGroup {
                stream: Identifier::Numeric(0),
                topic: Identifier::Numeric(0),
                name: Name::new(group).unwrap(),
            };
            let (operation, _, body) = encoded(&request);
            let answer = c.replicated(operation, &body);
            assert_eq!(answer.result(), 0, "create {group}");
            // The details begin after the result section with the group id.
            let details = &answer.body()[answer.body().len() - (12 + 1 + group.len())..];
            u32::from_le_bytes(details[..4].try_into().unwrap())
        };
        assert_eq!(create(&mut c, "old"), 0);
        let by_id = || group_consumer(Identifier::Numeric(0));
        // The old group's offset, stored by name, read by id.
        let old = group_consumer(Identifier::Named(Name::new("old").unwrap()));
        assert_eq!(store(&mut c, old, 1), 0);
        assert_eq!(stored(&mut c, by_id()), Some(1));
        let delete = Request::DeleteConsumerGroup(GroupTarget {
            stream: Identifier::Numeric(0),
            topic: Identifier::Numeric(0),
            group: Identifier::Numeric(0),
        });
        assert_eq!(group_op(&mut c, &delete), 0);

        assert_eq!(create(&mut c, "new"), 0, "the lowest free id again");
        assert_eq!(create(&mut c, "spare"), 1);
        assert_eq!(stored(&mut c, by_id()), None, "the new group has no offset");
        // Individual consumers keep a table of their own: one whose id is any u32 (here
        // the counter's first keys) does not reach the group's offset.
        for id in [1u32 << 31, (1 << 31) + 1] {
            let plain = Consumer {
                group: false,
                id: Identifier::Numeric(id),
            };
            assert_eq!(store(&mut c, plain, 2), 0);
        }
        assert_eq!(stored(&mut c, by_id()), None);
        // A member's poll with Next starts at the partition's first message, and its
        // auto-commit stores what it returned.
        let join = Request::JoinConsumerGroup(GroupTarget {
            stream: Identifier::Numeric(0),
            topic: Identifier::Numeric(0),
            group: Identifier::Named(Name::new("new").unwrap()),
        });
        assert_eq!(group_op(&mut c, &join), 0);
        assert_eq!(poll_next(&mut c, Identifier::Numeric(0)), Some(0));
        assert_eq!(stored(&mut c, by_id()), Some(0));
        assert_eq!(poll_next(&mut c, Identifier::Numeric(0)), Some(1));
        assert_eq!(poll_next(&mut c, Identifier::Numeric(0)), Some(2));
        // After a restart (the metadata replayed from its journal) the group still reads
        // its own offset, not the deleted group's.
        common::kill(&mut nodes[0]);
        common::spawn_plain(&config, &mut nodes[0], &logs, 1);
        common::metadata_primary(nodes, &[0], &logs);
        let mut c = Client::connect(nodes[0].tcp, 0xC1);
        c.login();
        assert_eq!(
            stored(&mut c, by_id()),
            Some(2),
            "the new group's own offset"
        );
    });
}
