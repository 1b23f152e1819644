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
    CREATE_STREAM, CREATE_TOPIC, Client, NON_REPLICATED, frame, name, topic_body,
};
use common::{Node, eventually};
use server::client::codec::{Identifier, Name};
use server::client::groups::GroupTarget;
use server::client::request::Request;

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

#[test]
fn a_member_on_a_killed_backup_is_removed_and_the_survivor_takes_every_partition() {
    let _serial = common::serial();
    let dir = common::scratch("groups-dead-backup");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    write_config(&config_path, "groups-dead-backup", &ports, "1s");
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        common::spawn_plain(&config_path, node, &logs, 1);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        let mp = common::metadata_primary(nodes, &[0, 1, 2], &logs);
        let backup = (mp + 1) % 3;
        let mut admin = Client::connect(nodes[mp].tcp, 0xAD);
        admin.login();
        create_group(&mut admin);
        // Member 0 lives on the primary, member 1 on the backup.
        let (_a_login, _a) = member(&nodes[mp], &nodes[mp], 0xA1);
        let (_b_login, _b_join) = member(&nodes[backup], &nodes[mp], 0xB2);
        let split = members(&mut admin);
        assert_eq!(
            split,
            Some(vec![(0, vec![0, 2]), (1, vec![1, 3])]),
            "two members share the partitions"
        );
        // The backup dies with its connections; the survivor gets all partitions.
        eprintln!("metadata primary n{mp}; SIGKILL of backup n{backup}");
        common::kill(&mut nodes[backup]);
        eventually("the dead backup's member is removed", &logs, || {
            let now = members(&mut admin)?;
            (now == vec![(0, (0..PARTITIONS).collect())]).then_some(())
        });
        let ended = common::log_lines(&logs, "ending a session whose node is gone");
        assert_eq!(ended.len(), 1, "only the backup's session: {ended:?}");
        assert!(
            ended[0].contains(&format!("PeerDown({backup})")) && ended[0].contains("178"),
            "client 0xB2 (178), origin n{backup}: {ended:?}"
        );
    });
}

#[test]
fn a_restarted_backup_ends_the_sessions_of_its_earlier_life_before_any_bound() {
    let _serial = common::serial();
    let dir = common::scratch("groups-restart");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    // A bound no test reaches: only the restart rule can end the session.
    write_config(&config_path, "groups-restart", &ports, "1h");
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        common::spawn_plain(&config_path, node, &logs, 1);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        let mp = common::metadata_primary(nodes, &[0, 1, 2], &logs);
        let backup = (mp + 1) % 3;
        let mut admin = Client::connect(nodes[mp].tcp, 0xAD);
        admin.login();
        create_group(&mut admin);
        let (_a_login, _a) = member(&nodes[mp], &nodes[mp], 0xA1);
        let (_b_login, _b_join) = member(&nodes[backup], &nodes[mp], 0xB2);
        assert_eq!(members(&mut admin).map(|m| m.len()), Some(2));
        eprintln!("metadata primary n{mp}; SIGKILL and restart of backup n{backup}");
        common::kill(&mut nodes[backup]);
        common::spawn_plain(&config_path, &mut nodes[backup], &logs, 1);
        eventually(
            "the restarted backup's old member is removed",
            &logs,
            || {
                let now = members(&mut admin)?;
                (now == vec![(0, (0..PARTITIONS).collect())]).then_some(())
            },
        );
        let ended = common::log_lines(&logs, "ending a session whose node is gone");
        assert!(
            !ended.is_empty() && ended.iter().all(|l| l.contains("StaleOwn")),
            "{ended:?}"
        );
    });
}

#[test]
fn a_new_primary_ends_the_sessions_of_the_killed_primary() {
    let _serial = common::serial();
    let dir = common::scratch("groups-dead-primary");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    write_config(&config_path, "groups-dead-primary", &ports, "1s");
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        common::spawn_plain(&config_path, node, &logs, 1);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        let mp = common::metadata_primary(nodes, &[0, 1, 2], &logs);
        let backup = (mp + 1) % 3;
        let mut admin = Client::connect(nodes[mp].tcp, 0xAD);
        admin.login();
        create_group(&mut admin);
        // Member 0 lives on the primary, member 1 on a backup (watching from there).
        let (_a_login, _a) = member(&nodes[mp], &nodes[mp], 0xA1);
        let (mut b_login, _b_join) = member(&nodes[backup], &nodes[mp], 0xB2);
        eventually("the backup knows both members", &logs, || {
            (members(&mut b_login)?.len() == 2).then_some(())
        });
        eprintln!("SIGKILL of metadata primary n{mp}");
        common::kill(&mut nodes[mp]);
        let live: Vec<usize> = (0..3).filter(|&i| i != mp).collect();
        let new = common::metadata_primary(nodes, &live, &logs);
        eprintln!("new metadata primary n{new}");
        eventually("the dead primary's member is removed", &logs, || {
            let now = members(&mut b_login)?;
            (now == vec![(1, (0..PARTITIONS).collect())]).then_some(())
        });
        let ended = common::log_lines(&logs, "ending a session whose node is gone");
        assert!(
            ended.iter().any(|l| l.contains(&format!("PeerDown({mp})"))),
            "{ended:?}"
        );
    });
}
