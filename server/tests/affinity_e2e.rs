//! Partition primaries follow the metadata primary across real processes (decision 221): three
//! `strand start` processes on loopback; the metadata primary is SIGKILLed and restarted, so
//! the metadata group is led by a node other than replica 0; then a topic of three partitions
//! is created. Fresh partition groups start in view 0, led by replica 0; primary affinity moves
//! every one of them to the metadata primary, where a client then sends to every partition.
//! Without affinity the groups stay with replica 0 and the wait for them fails.
//!
//! Every wait is bounded; nothing asserts on elapsed time.

mod common;

use common::client::{CREATE_STREAM, CREATE_TOPIC, Client, name, topic_body};
use common::{eventually, metadata_primary, partition_sum, spawn_plain};

const PARTITIONS: u32 = 3;

#[test]
fn partition_primaries_follow_the_metadata_primary_across_processes() {
    let _serial = common::serial();
    let dir = common::scratch("affinity");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(&config_path, common::config("affinity-e2e", 3, &ports, "")).unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        spawn_plain(&config_path, node, &logs, 1);
    }
    common::run_cluster(&mut nodes, &logs, |nodes| {
        // 1. Move the metadata primary off replica 0 (partition groups start led by it).
        let mut mp = metadata_primary(nodes, &[0, 1, 2], &logs);
        while mp == 0 {
            eprintln!("SIGKILL metadata primary n{mp}");
            common::kill(&mut nodes[mp]);
            let live: Vec<usize> = (0..3).filter(|&i| i != mp).collect();
            let next = metadata_primary(nodes, &live, &logs);
            spawn_plain(&config_path, &mut nodes[mp], &logs, 1);
            mp = next;
        }
        let mp = metadata_primary(nodes, &[0, 1, 2], &logs);
        assert_ne!(mp, 0);
        eprintln!("metadata primary n{mp}");

        // 2. A topic of three partitions, created on the metadata primary.
        let mut admin = Client::connect(nodes[mp].tcp, 0xAD);
        admin.login();
        assert_eq!(admin.replicated(CREATE_STREAM, &name("orders")).result(), 0);
        let topic = topic_body(0, PARTITIONS, "events");
        assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);

        // 3. Every node runs every group, and the metadata primary leads all of them.
        eventually(
            "the metadata primary leads every partition group",
            &logs,
            || {
                let all: Option<Vec<_>> = nodes.iter().map(|n| common::scrape(n.http)).collect();
                let all = all?;
                let groups = all
                    .iter()
                    .all(|m| partition_sum(m, "strand_partition_groups") == u64::from(PARTITIONS));
                let led = partition_sum(&all[mp], "strand_partition_primaries");
                (groups && led == u64::from(PARTITIONS)).then_some(())
            },
        );

        // 4. A client on the metadata primary sends to every partition.
        let mut producer = Client::connect(nodes[mp].tcp, 0xB0B);
        producer.login();
        for partition in 0..PARTITIONS {
            let payload = format!("to partition {partition}").into_bytes();
            let (confirmed, base) = producer.send(0, partition, &[payload]);
            assert_eq!((confirmed, base), (partition, 0));
        }
        // The metadata primary is still where it was (nothing pulled it away).
        assert_eq!(metadata_primary(nodes, &[0, 1, 2], &logs), mp);
    });
}
