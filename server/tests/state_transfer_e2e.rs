//! State transfer across processes (issue 10 item 6), both planes: three `strand start` nodes
//! with a metadata journal of 256 slots and a checkpoint every 16 ops, partition checkpoints
//! every 8 ops and an evicted-prepare ring of one entry. A backup of every group is SIGKILLed
//! and kept down while the others commit more metadata ops than its peers' journals hold and
//! several partition checkpoints past what it has; restarted from its directory, it cannot be
//! repaired (the ops it lacks are gone from every peer's journal) and returns by state
//! transfer: `strand_state_transfers_total` (metadata) and `strand_partition_transfers_total`
//! (every partition group) move, its metadata status is normal and its commit points equal the
//! primary's. Then every acknowledged message and every stream is read back from it (polls and
//! GetStreams answer from the node's own state).
//!
//! Every wait is bounded; nothing asserts on elapsed time.

mod common;

use std::path::Path;

use common::client::{CREATE_STREAM, CREATE_TOPIC, Client, name, topic_body};
use common::{
    Node, eventually, metric_sum, partition_primary, partition_sum, reads_back, scrape,
    send_batches, spawn_plain,
};

const PARTITIONS: u32 = 2;
/// Metadata ops committed while the backup is down: more than the 256 journal slots.
const OPS_WHILE_DOWN: usize = 300;
/// Parallel clients that commit them (each lockstep).
const WRITERS: usize = 4;

fn spawn(config: &Path, node: &mut Node, logs: &Path) {
    spawn_plain(config, node, logs, 1);
}

/// Creates streams `from..from + count` (named `s{n}`) on `tcp`, `WRITERS` clients at once.
fn create_streams(tcp: u16, from: usize, count: usize) {
    std::thread::scope(|scope| {
        for w in 0..WRITERS {
            scope.spawn(move || {
                let mut c = Client::connect(tcp, 0x5000 + w as u128);
                c.login();
                for n in (from..from + count).filter(|n| n % WRITERS == w) {
                    let answer = c.replicated(CREATE_STREAM, &name(&format!("s{n}")));
                    assert_eq!(answer.result(), 0, "CreateStream s{n}");
                }
            });
        }
    });
}

#[test]
fn a_node_kept_down_past_checkpoints_returns_by_state_transfer_on_both_planes() {
    let _serial = common::serial();
    let dir = common::scratch("state-transfer");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    let metadata = "journal_slots = 256\ncheckpoint_interval_ops = 16";
    let partition = "[partition]\ncheckpoint_interval_ops = 8\nevicted_ring_capacity = 1";
    std::fs::write(
        &config_path,
        common::config_with("transfer-e2e", 3, &ports, metadata, partition),
    )
    .unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        spawn(&config_path, node, &logs);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        // 1. Stream 0 with a topic of two partitions; some messages everywhere.
        let mp = common::metadata_primary(nodes, &[0, 1, 2], &logs);
        let mut admin = Client::connect(nodes[mp].tcp, 0xAD);
        admin.login();
        assert_eq!(admin.replicated(CREATE_STREAM, &name("orders")).result(), 0);
        let topic = topic_body(0, PARTITIONS, "events");
        assert_eq!(admin.replicated(CREATE_TOPIC, &topic).result(), 0);
        let pp = partition_primary(nodes, &[0, 1, 2], u64::from(PARTITIONS), &logs);
        let mut producer = Client::connect(nodes[pp].tcp, 0xB0B);
        producer.login();
        let mut acked = vec![Vec::new(); PARTITIONS as usize];
        send_batches(&mut producer, 0, &mut acked, 0, 4);
        for (i, node) in nodes.iter().enumerate() {
            reads_back(node.tcp, 0xC0 + i as u128, 0, &acked, &logs, "before");
        }

        // 2. SIGKILL a node that leads neither plane; the others commit past its reach.
        let down = (0..3).find(|&i| i != mp && i != pp).unwrap();
        let before = common::metrics(nodes[down].http).unwrap();
        eprintln!("metadata primary n{mp}, partition primary n{pp}, SIGKILL n{down}: {before:?}");
        common::kill(&mut nodes[down]);
        create_streams(nodes[mp].tcp, 0, OPS_WHILE_DOWN);
        send_batches(&mut producer, 0, &mut acked, 4, 40);
        let live: Vec<usize> = (0..3).filter(|&i| i != down).collect();
        let watched: Vec<&Node> = live.iter().map(|&i| &nodes[i]).collect();
        let settled = common::wait_until("the live pair checkpointed", &watched, &logs, |all| {
            all.iter().all(|m| {
                m["commit_min"] > before["commit_max"] + 256 && m["checkpoints_total"] >= 2
            })
        });
        eprintln!("while n{down} was down: {settled:?}");
        for &i in &live {
            let m = scrape(nodes[i].http).unwrap();
            assert!(
                partition_sum(&m, "strand_partition_checkpoints_total") >= u64::from(PARTITIONS),
                "n{i}: every partition group checkpointed: {m:?}"
            );
        }

        // 3. Restarted from its directory, it returns by state transfer on both planes, and
        // its commit points equal the primaries' (nothing commits meanwhile: no test hook).
        spawn(&config_path, &mut nodes[down], &logs);
        let (back, primary) = eventually("the restarted node caught up", &logs, || {
            let me = scrape(nodes[down].http)?;
            let m = scrape(nodes[mp].http)?;
            let p = scrape(nodes[pp].http)?;
            let caught_up = me["strand_status{plane=\"metadata\"}"] == 0
                && me["strand_commit_min{plane=\"metadata\"}"]
                    == m["strand_commit_min{plane=\"metadata\"}"]
                && partition_sum(&me, "strand_partition_groups") == u64::from(PARTITIONS)
                && partition_sum(&me, "strand_partition_commit")
                    == partition_sum(&p, "strand_partition_commit");
            caught_up.then_some((me, m))
        });
        eprintln!("n{down} back: {back:?}");
        assert!(
            metric_sum(&back, "strand_state_transfers_total") >= 1,
            "the metadata replica returned by state transfer"
        );
        assert!(
            partition_sum(&back, "strand_partition_transfers_total") >= u64::from(PARTITIONS),
            "every partition group returned by state transfer"
        );
        assert_eq!(
            back["strand_commit_max{plane=\"metadata\"}"],
            primary["strand_commit_max{plane=\"metadata\"}"]
        );

        // 4. Everything acknowledged is read from the restarted node (polls and GetStreams are
        // answered from the node's own state, never from a peer).
        reads_back(
            nodes[down].tcp,
            0xE0,
            0,
            &acked,
            &logs,
            "the transferred node",
        );
        let mut reader = Client::connect(nodes[down].tcp, 0xE1);
        reader.login();
        let streams = reader.streams();
        assert_eq!(streams.len(), OPS_WHILE_DOWN + 1, "every stream is there");
        assert_eq!(streams[0], "orders");
        assert!((0..OPS_WHILE_DOWN).all(|n| streams.contains(&format!("s{n}"))));
    });
}
