//! Clients against three real `strand start` processes on loopback, raw frames on the client
//! port (client-plane.md): a client logs in on the metadata primary and creates a stream and
//! a topic; another node's GetStreams shows them once it has committed them; a write on a
//! backup gets the documented answer (TransientNotAccepted in the result section, and
//! GetClusterMetadata naming the primary as leader); after SIGKILL of all three and a
//! restart from their directories (past a checkpoint), the metadata is still there.
//!
//! No test hook: every op is committed through a client. Waits are bounded (generous for a
//! loaded CI machine); nothing asserts on elapsed time.

mod common;

use std::path::Path;

use common::client::{
    CREATE_STREAM, CREATE_TOPIC, Client, GET_CLUSTER_METADATA, STORE_CONSUMER_OFFSET,
    cluster_roles, frame, name, topic_body,
};
use common::{Node, eventually, kill_all, metadata_primary, raw_metric};

fn spawn(config: &Path, node: &mut Node, log: &Path) {
    common::spawn_plain(config, node, log, 2);
}

/// The primary's index once every node is normal in one view with exactly one primary.
fn wait_for_primary(nodes: &[Node], logs: &Path) -> usize {
    metadata_primary(nodes, &[0, 1, 2], logs)
}

#[test]
fn clients_create_on_the_primary_read_everywhere_and_backups_answer() {
    let _serial = common::serial();
    let dir = common::scratch("clients");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    let metadata = "journal_slots = 256\ncheckpoint_interval_ops = 8";
    std::fs::write(
        &config_path,
        common::config_with("clients-e2e", 3, &ports, metadata, ""),
    )
    .unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        let primary = wait_for_primary(nodes, &logs);
        let backup = (primary + 1) % 3;
        eprintln!("primary n{primary}, backup n{backup}");

        // 1. On the primary: log in, create a stream and a topic.
        let mut p = Client::connect(nodes[primary].tcp, 0xA11CE);
        p.login();
        let answer = p.replicated(CREATE_STREAM, &name("orders"));
        assert_eq!(answer.result(), 0, "CreateStream on the primary");
        let topic = topic_body(0, 1, "events");
        assert_eq!(p.replicated(CREATE_TOPIC, &topic).result(), 0);
        assert_eq!(p.streams(), ["orders"]);

        // 2. A client on a backup: its Register travels to the primary (§13); GetStreams and
        // GetTopic there show the stream and the topic once that node committed them.
        let mut b = Client::connect(nodes[backup].tcp, 0xB0B);
        b.login();
        eventually("the backup's GetStreams shows the stream", &logs, || {
            (b.streams() == ["orders"]).then_some(())
        });
        let name = eventually("the backup's GetTopic shows the topic", &logs, || b.topic());
        assert_eq!(name, "events");

        // 3. A metadata write on the backup: TransientNotAccepted in the result section (the
        // SDK retries, then asks for the leader), and GetClusterMetadata names the primary
        // as leader (the SDK's redirect).
        let answer = b.replicated_once(CREATE_STREAM, &self::name("elsewhere"));
        assert_eq!(answer.result(), 58, "a write on a backup");
        let answer = b.read(GET_CLUSTER_METADATA, &[]);
        assert_eq!(answer.status(), 0);
        let roles = cluster_roles(answer.body());
        assert_eq!(roles.len(), 3);
        assert_eq!(
            roles.iter().filter(|(_, role)| *role == 0).count(),
            1,
            "{roles:?}"
        );
        assert_eq!(roles[primary], (nodes[primary].tcp, 0), "{roles:?}");
        assert!(!b.streams().contains(&"elsewhere".to_owned()));
        let requests = raw_metric(nodes[backup].http, "strand_client_requests_total");
        assert!(
            requests >= 5,
            "the backup counted its client requests: {requests}"
        );

        // 4. A partition request for a partition the topic does not have: ResourceNotFound
        // (20) in the result section, not silence.
        let mut body = vec![1, 1, 4, 1, 0, 0, 0, 1, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 1];
        body.extend_from_slice(&5u32.to_le_bytes());
        body.extend_from_slice(&0u64.to_le_bytes());
        body.push(1);
        let f = frame(p.client, STORE_CONSUMER_OFFSET, 0, p.session, 1, &body);
        assert_eq!(p.exchange(&f).result(), 20);

        // 5. Past a checkpoint (8 ops), SIGKILL all three and restart: the metadata is
        // restored from snapshot and journal.
        for i in 0..8 {
            let answer = p.replicated(CREATE_STREAM, &self::name(&format!("s{i}")));
            assert_eq!(answer.result(), 0);
        }
        eventually("a checkpoint on every node", &logs, || {
            let all: Option<Vec<_>> = nodes.iter().map(|n| common::metrics(n.http)).collect();
            all.filter(|all| all.iter().all(|m| m["checkpoints_total"] >= 1))
        });
        let before = p.streams();
        assert_eq!(before.len(), 9);
        kill_all(nodes);
        for node in nodes.iter_mut() {
            spawn(&config_path, node, &logs);
        }
        let primary = wait_for_primary(nodes, &logs);
        // Every node booted from a snapshot (installed into the metadata state machine) and
        // not from the journal alone.
        let log = std::fs::read_to_string(&logs).unwrap();
        let from_snapshot = log
            .lines()
            .filter(|l| l.contains("metadata group recovered from"))
            .filter(|l| {
                l.split("snapshot_op=")
                    .nth(1)
                    .and_then(|t| t.split_whitespace().next())
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|op| op > 0)
            })
            .count();
        assert_eq!(from_snapshot, 3, "each restart installs its snapshot");
        let mut again = Client::connect(nodes[primary].tcp, 0xA11CE + 1);
        again.login();
        assert_eq!(again.streams(), before);
        assert_eq!(again.topic().as_deref(), Some("events"));

        // 6. SIGKILL the primary: a client that asks a survivor for the cluster metadata is
        // sent to the new primary (the SDK's redirect), and writes succeed there.
        common::kill(&mut nodes[primary]);
        let survivors: Vec<&Node> = nodes.iter().filter(|n| n.id as usize != primary).collect();
        let live: Vec<usize> = survivors.iter().map(|n| usize::from(n.id)).collect();
        let new_primary = metadata_primary(nodes, &live, &logs);
        assert_ne!(new_primary, primary);
        let asked = survivors
            .iter()
            .find(|n| n.id as usize != new_primary)
            .unwrap();
        let mut c = Client::connect(asked.tcp, 0xC0FFEE);
        c.login();
        let roles = eventually("a survivor names the new leader", &logs, || {
            let answer = c.read(GET_CLUSTER_METADATA, &[]);
            let roles = cluster_roles(answer.body());
            (roles[new_primary].1 == 0).then_some(roles)
        });
        let leader_port = roles.iter().find(|(_, role)| *role == 0).unwrap().0;
        let leader = nodes.iter().find(|n| n.tcp == leader_port).unwrap();
        let mut c = Client::connect(leader.tcp, 0xC0FFEE + 1);
        c.login();
        let answer = c.replicated(CREATE_STREAM, &self::name("after-failover"));
        assert_eq!(answer.result(), 0, "CreateStream on the new primary");
        assert!(c.streams().contains(&"after-failover".to_owned()));
    });
}
