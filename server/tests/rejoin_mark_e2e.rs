//! The stamp's rejoin mark is cleared, and only when it may be (decision 290) across real
//! processes: three `strand start` nodes, a topic `before` whose partition group commits
//! messages; a backup of every group is SIGKILLed, its directory wiped, and it restarts with
//! `--rejoin`. It boots the `before` group in lost state (the stamp still records the rejoin
//! when that group boots: a group of the old life), and only after that group's superblock
//! landed and its metadata replica caught up does the stamp lose the rejoin. A topic `after`
//! created then boots fresh on the rejoined node (not lost), and with the third node
//! SIGKILLed its group commits with the rejoined node in the quorum; the rejoined node reads
//! back what it acknowledged.
//!
//! Every wait is bounded; nothing asserts on elapsed time.

mod common;

use std::path::Path;

use common::client::{CREATE_STREAM, CREATE_TOPIC, Client, name, topic_body};
use common::{Node, eventually, log_lines, partition_primary, partition_sum, scrape, send_batches};

fn stamp(node: &Node) -> String {
    std::fs::read_to_string(node.dir.join("strand.cluster")).unwrap_or_default()
}

#[test]
fn a_rejoined_node_clears_its_mark_and_a_later_group_votes_at_once() {
    let _serial = common::serial();
    let dir = common::scratch("rejoin-mark");
    let ports = common::free_ports(9);
    let config_path = dir.join("strand.toml");
    std::fs::write(
        &config_path,
        common::config("rejoin-mark-e2e", 3, &ports, ""),
    )
    .unwrap();
    let logs = dir.join("nodes.log");
    let mut nodes = common::nodes(&dir, 3, &ports);
    for node in nodes.iter_mut() {
        common::spawn_plain(&config_path, node, &logs, 1);
    }
    common::run_killed(&mut nodes, &logs, &dir, |nodes| {
        // 1. Stream 0, topic 0 `before` (one partition) with messages.
        let mp = common::metadata_primary(nodes, &[0, 1, 2], &logs);
        let mut admin = Client::connect(nodes[mp].tcp, 0xAD);
        admin.login();
        assert_eq!(admin.replicated(CREATE_STREAM, &name("orders")).result(), 0);
        let before = topic_body(0, 1, "before");
        assert_eq!(admin.replicated(CREATE_TOPIC, &before).result(), 0);
        // Partition primaries follow the metadata primary (decision 221).
        let pp = eventually("the metadata primary leads the group", &logs, || {
            let pp = partition_primary(nodes, &[0, 1, 2], 1, &logs);
            (pp == mp).then_some(pp)
        });
        let mut producer = Client::connect(nodes[pp].tcp, 0xB0B);
        producer.login();
        let mut acked = vec![Vec::new()];
        send_batches(&mut producer, 0, &mut acked, 0, 4);

        // 2. A backup of both planes loses its directory and rejoins.
        let wiped = (0..3).find(|&i| i != mp && i != pp).unwrap();
        let third = (0..3).find(|&i| i != wiped && i != pp).unwrap();
        eprintln!("metadata primary n{mp}, partition primary n{pp}, wiped n{wiped}");
        common::kill(&mut nodes[wiped]);
        std::fs::remove_dir_all(&nodes[wiped].dir).unwrap();
        common::start(
            &config_path,
            &mut nodes[wiped],
            &logs,
            1,
            None,
            &["--rejoin"],
        );

        // 3. The mark goes, after the old life's group booted lost under it. The node writes
        // the stamp before it logs the clearing, so both are waited for.
        eventually("the rejoined node clears its mark", &logs, || {
            (!stamp(&nodes[wiped]).is_empty()
                && !stamp(&nodes[wiped]).contains("rejoin =")
                && !log_lines(&logs, "the stamp's rejoin is cleared").is_empty())
            .then_some(())
        });
        let cleared = log_lines(&logs, "the stamp's rejoin is cleared");
        assert_eq!(cleared.len(), 1, "{cleared:?}");
        let booted = log_lines(&logs, "partition group recovered");
        let lost: Vec<&String> = booted
            .iter()
            .filter(|l| l.contains("rejoin_lost=true"))
            .collect();
        assert_eq!(
            lost.len(),
            1,
            "the old life's group booted lost on the rejoined node, before the mark went: \
             {booted:?}"
        );
        let w = scrape(nodes[wiped].http).unwrap();
        assert_eq!(partition_sum(&w, "strand_partition_groups"), 1);

        // 4. A topic created now: its group boots fresh on the rejoined node.
        let after = topic_body(0, 1, "after");
        assert_eq!(admin.replicated(CREATE_TOPIC, &after).result(), 0);
        eventually(
            "the rejoined node hosts the new group, not lost",
            &logs,
            || {
                let w = scrape(nodes[wiped].http)?;
                (partition_sum(&w, "strand_partition_groups") == 2).then_some(())
            },
        );
        let fresh: Vec<String> = log_lines(&logs, "partition group recovered")
            .into_iter()
            .skip(booted.len())
            .collect();
        assert!(
            fresh.iter().all(|l| l.contains("rejoin_lost=false")),
            "{fresh:?}"
        );

        // 5. Without the third node, the new group commits only with the rejoined node's ack.
        eprintln!("SIGKILL n{third}");
        common::kill(&mut nodes[third]);
        let pp_after = partition_primary(nodes, &[pp, wiped], 2, &logs);
        let w = scrape(nodes[wiped].http).unwrap();
        let lost_now = partition_sum(&w, "strand_partition_lost_groups");
        assert!(
            lost_now <= 1,
            "only the old group may still be lost: {lost_now}"
        );
        let mut producer = Client::connect(nodes[pp_after].tcp, 0xB0B + 1);
        producer.login();
        let mut acked_after = vec![Vec::new()];
        // Stream 0's topic 1 is `after`: send through the client with topic id 1.
        send_to_topic(&mut producer, 1, &mut acked_after, 4);
        let w = scrape(nodes[wiped].http).unwrap();
        eprintln!(
            "rejoined node: groups {}, lost {}, commit {}",
            partition_sum(&w, "strand_partition_groups"),
            partition_sum(&w, "strand_partition_lost_groups"),
            partition_sum(&w, "strand_partition_commit"),
        );
        reads_back_topic(nodes[wiped].tcp, 1, &acked_after, &logs);
    });
}

/// Sends `batches` batches of one message to partition 0 of stream 0 / `topic`.
fn send_to_topic(c: &mut Client, topic: u32, acked: &mut [Vec<(u64, Vec<u8>)>], batches: usize) {
    for b in 0..batches {
        let payload = common::payload(b, 0);
        let body = common::client::send_body_to(0, topic, 0, std::slice::from_ref(&payload));
        let answer = c.replicated(common::client::SEND_MESSAGES, &body);
        assert_eq!(answer.status(), 0, "SendMessages to topic {topic}");
        let confirmed = server::client::reply::decode_send_reply(answer.body()).unwrap();
        assert_eq!(confirmed[0].base_offset, acked[0].len() as u64);
        acked[0].push((confirmed[0].base_offset, payload));
    }
}

/// Polls partition 0 of stream 0 / `topic` on `tcp` until it holds what was acknowledged.
fn reads_back_topic(tcp: u16, topic: u32, acked: &[Vec<(u64, Vec<u8>)>], logs: &Path) {
    let mut c = Client::connect(tcp, 0xE0);
    c.login();
    let got = eventually("the rejoined node reads the new topic", logs, || {
        c.poll_topic(0, topic, 0)
            .filter(|got| got.len() >= acked[0].len())
    });
    assert_eq!(got, acked[0]);
}
