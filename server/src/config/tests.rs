use super::*;

const NODES: &str = r#"
[cluster]
enabled = true

[[cluster.nodes]]
name = "a"
ip = "127.0.0.1"
replica_id = 0
ports = { tcp = 8090, quic = 8080, http = 3000, websocket = 8092, tcp_replica = 9090 }

[[cluster.nodes]]
name = "b"
ip = "127.0.0.1"
replica_id = 1
ports = { tcp = 8091, quic = 8081, http = 3001, websocket = 8093, tcp_replica = 9091 }
"#;

fn overrides() -> Overrides {
    Overrides {
        available_cpus: vec![0, 1, 2, 3],
        ..Overrides::default()
    }
}

fn load_ok(text: &str) -> Config {
    load(text, &overrides()).unwrap_or_else(|e| panic!("{e}"))
}

/// The error for `text` (the two-node roster plus `extra`), as printed.
fn refuse_with(extra: &str, overrides: &Overrides) -> String {
    let text = format!("{NODES}\n{extra}");
    load(&text, overrides).map(|_| ()).unwrap_err().to_string()
}

fn refuse(extra: &str) -> String {
    refuse_with(extra, &overrides())
}

#[test]
fn every_default() {
    let config = load_ok(NODES);
    assert_eq!(config.replica_id, 0);
    let c = &config.cluster;
    assert_eq!(c.replica_lanes, 16);
    assert_eq!(c.name, "iggy-cluster");
    assert_eq!(c.heartbeat_timeout, Duration::from_secs(5));
    assert_eq!(c.commit_broadcast_interval, Duration::from_millis(500));
    assert_eq!(c.prepare_retransmit_interval, Duration::from_millis(250));
    assert_eq!(
        c.view_change_retransmit_interval,
        Duration::from_millis(500)
    );
    assert_eq!(c.view_change_status_timeout, Duration::from_secs(5));
    assert_eq!(
        c.request_start_view_retransmit_interval,
        Duration::from_secs(1)
    );
    assert_eq!(c.view_probe_attempts_max, 5);
    assert_eq!(c.repair_retry_interval, Duration::from_secs(1));
    assert_eq!(c.repair_chunk_max, 128);
    assert_eq!(
        c.superblock_wedged_fatal_timeout,
        Some(Duration::from_secs(120))
    );
    assert_eq!(c.dead_node_session_timeout, Some(Duration::from_secs(10)));
    assert_eq!((c.shared_secret.clone(), c.tls.clone()), (None, None));
    assert!(c.skip_shard_zero_for_replicas && !c.skip_shard_zero_for_clients);
    assert_eq!(c.nodes.len(), 2);
    assert_eq!(config.node().ports.tcp_replica, 9090);
    let b = &config.message_bus;
    assert_eq!(
        (b.max_batch, b.max_message_size, b.peer_queue_capacity),
        (256, 64 << 20, 256)
    );
    assert_eq!(b.reconnect_period, Duration::from_secs(1));
    assert_eq!(
        (b.close_peer_timeout, b.close_grace),
        (Duration::from_secs(2), Duration::from_secs(2))
    );
    assert_eq!(b.handshake_grace, Duration::from_secs(10));
    let m = &config.metadata;
    assert_eq!(
        (m.prepare_queue_depth, m.journal_slots, m.clients_table_max),
        (32, 1024, 8192)
    );
    assert_eq!(m.checkpoint_interval_ops, 256);
    let p = &config.partition;
    assert_eq!(
        (p.ack, p.prepare_queue_depth, p.evicted_ring_capacity),
        (Ack::Disk, 32, 4096)
    );
    assert_eq!(p.evicted_ring_bytes_max, 16 << 20);
    assert_eq!(p.transfer_served_cache_bytes_max, 2176 << 20);
    assert_eq!(p.transfer_artifact_bytes_max, 1 << 40);
    assert_eq!(p.checkpoint_interval_ops, 1024);
    assert_eq!(p.read_cache_bytes, 256 << 20);
    assert_eq!(p.read_cache_shard_bytes, 1 << 30);
    assert_eq!(p.wal_size, 64 << 20);
    assert_eq!(p.appending_bytes_max, 64 << 20);
    assert_eq!(p.appending_shard_bytes_max, 256 << 20);
    assert!(p.topic_ack.is_empty());
    let s = &config.system;
    assert_eq!(s.path, PathBuf::from("local_data"));
    assert_eq!(
        s.sharding,
        Sharding::Pinned(CoreList::parse("0-3").unwrap())
    );
    assert_eq!((s.inbox_capacity, s.reply_inbox_capacity), (1024, 1024));
    assert_eq!(s.shutdown_drain_timeout, Duration::from_secs(10));
    assert_eq!(s.shutdown_poll_interval, Duration::from_millis(50));
    assert_eq!(s.shutdown_join_timeout, Duration::from_secs(30));
    assert_eq!(s.reconcile_periodic_interval, Duration::from_secs(1));
    assert_eq!((s.io_memory, s.ring_depth), (2 << 20, 128));
}

/// `network.tcp_congestion_control` (decision 501): empty keeps the kernel's default, a name
/// of the kernel's shape is taken (whether the kernel has it is `strand start`'s check), and a
/// name the kernel could never take is refused here, naming the key.
#[test]
fn the_congestion_control_is_a_name_or_nothing() {
    assert_eq!(load_ok(NODES).network.tcp_congestion_control, None);
    let set = load_ok(&format!(
        "{NODES}\n[network]\ntcp_congestion_control = \"cubic\"\n"
    ));
    assert_eq!(
        set.network
            .tcp_congestion_control
            .map(|c| c.name().to_string()),
        Some("cubic".to_string())
    );
    for (name, why) in [
        ("cu bic", "' '"),
        ("a_name_of_16_byt", "16 bytes"),
        ("bbr\\u0000", "'\\0'"),
    ] {
        let error = refuse(&format!("[network]\ntcp_congestion_control = \"{name}\"\n"));
        assert!(
            error.starts_with("config key `network.tcp_congestion_control`") && error.contains(why),
            "{name}: {error}"
        );
    }
}

/// The README's config block writes out every default: it parses, and apart from its roster
/// gives exactly what a file with only a roster gives.
#[test]
fn the_readme_config_block_is_the_defaults() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme
        .find("```toml\n# strand.toml")
        .expect("README config block")
        + 8;
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    let mut from_readme = load_ok(block);
    let mut from_defaults = load_ok(NODES);
    assert_eq!(from_readme.cluster.nodes.len(), 3);
    from_readme.cluster.nodes.clear();
    from_defaults.cluster.nodes.clear();
    assert_eq!(format!("{from_readme:?}"), format!("{from_defaults:?}"));
}

/// Every key the config accepts, as dotted paths, read from the pretty `Debug` of the default
/// raw config (one line per field; a field whose value opens a struct is a table). Arrays of
/// tables (`cluster.nodes`, `partition.topic`) are listed by their own name.
fn accepted_keys() -> std::collections::BTreeSet<String> {
    let text = format!("{:#?}", RawConfig::default());
    let mut tables: Vec<String> = Vec::new();
    let mut keys = std::collections::BTreeSet::new();
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let Some((name, value)) = line.trim_start().split_once(": ") else {
            continue;
        };
        if !name.chars().all(|c| c.is_ascii_lowercase() || c == '_') || indent % 4 != 0 {
            continue;
        }
        let depth = indent / 4;
        if depth == 0 || depth > tables.len() + 1 {
            continue;
        }
        tables.truncate(depth - 1);
        if value.ends_with('{') && !value.starts_with('[') {
            tables.push(name.to_owned());
        } else {
            let mut path = tables.clone();
            path.push(name.to_owned());
            keys.insert(path.join("."));
        }
    }
    keys
}

/// The dotted paths of every value in a TOML table; arrays of tables by their own name.
fn toml_keys(table: &toml::Table, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(inner) => toml_keys(inner, &path, out),
            _ => {
                out.insert(path);
            }
        }
    }
}

/// The README's config block names every key the config accepts (so the defaults it writes
/// out cannot drift from the code by omission: `the_readme_config_block_is_the_defaults` checks
/// the values, this checks that none is missing), and `[[partition.topic]]` is documented.
#[test]
fn the_readme_config_block_names_every_key() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme
        .find("```toml\n# strand.toml")
        .expect("README config block")
        + 8;
    let block = &readme[start..start + readme[start..].find("```").unwrap()];
    let mut documented = std::collections::BTreeSet::new();
    toml_keys(&toml::from_str(block).unwrap(), "", &mut documented);
    let accepted = accepted_keys();
    assert!(
        accepted.len() > 50,
        "the Debug walk found too few keys: {accepted:?}"
    );
    assert!(
        accepted.contains("system.sharding.io_memory"),
        "{accepted:?}"
    );
    assert!(accepted.contains("cluster.tls.ca_file"), "{accepted:?}");
    let missing: Vec<&String> = accepted
        .iter()
        .filter(|k| !documented.contains(*k))
        .filter(|k| *k != "partition.topic" || !block.contains("[[partition.topic]]"))
        .collect();
    assert!(
        missing.is_empty(),
        "keys missing from the README block: {missing:?}"
    );
}

#[test]
fn unknown_keys_are_named() {
    assert_eq!(
        refuse("[cluster.auth]\nsecret = \"x\""),
        "config key `cluster.auth.secret`: unknown key"
    );
    assert_eq!(refuse("[bogus]\nx = 1"), "config key `bogus`: unknown key");
    assert_eq!(
        refuse("[system.sharding]\ncores = \"0-3\""),
        "config key `system.sharding.cores`: unknown key"
    );
    let text = NODES.replace("name = \"b\"", "name = \"b\"\nport = 1");
    let error = load(&text, &overrides()).unwrap_err().to_string();
    assert_eq!(error, "config key `cluster.nodes[1].port`: unknown key");
}

#[test]
fn wrong_types_are_named() {
    let error = refuse("[message_bus]\nmax_batch = \"many\"");
    assert!(
        error.starts_with("config key `message_bus.max_batch`: invalid type: string"),
        "{error}"
    );
    let error = refuse("[cluster.tls]\nenabled = 1");
    assert!(
        error.starts_with("config key `cluster.tls.enabled`: invalid type: integer"),
        "{error}"
    );
    let error = load("[cluster\n", &overrides()).unwrap_err().to_string();
    assert!(error.starts_with("config: TOML syntax:"), "{error}");
}

#[test]
fn lanes_cover_the_shards() {
    let over = |shards| Overrides {
        shards: Some(shards),
        ..overrides()
    };
    let lanes = |n: u32, o: &Overrides| {
        load(&with_cluster(&format!("replica_lanes = {n}")), o).map(|c| c.cluster.replica_lanes)
    };
    assert_eq!(
        lanes(2, &over(4)).unwrap_err().to_string(),
        "config key `cluster.replica_lanes`: 2 is below the node's 4 shards: shards beyond the \
         lane count would host no groups (spec README decision 2)"
    );
    // From the default allocation too: one shard per available CPU (4 here).
    let error = lanes(3, &overrides()).unwrap_err().to_string();
    assert!(
        error.starts_with("config key `cluster.replica_lanes`: 3 is below the node's 4 shards"),
        "{error}"
    );
    assert_eq!(
        lanes(300, &over(1)).unwrap_err().to_string(),
        "config key `cluster.replica_lanes`: 300 is outside 1..=256"
    );
    assert_eq!(lanes(4, &over(4)).unwrap(), 4);
    assert_eq!(lanes(1, &over(1)).unwrap(), 1);
}

fn with_cluster(keys: &str) -> String {
    NODES.replace("enabled = true", &format!("enabled = true\n{keys}"))
}

fn refuse_cluster(keys: &str) -> String {
    load(&with_cluster(keys), &overrides())
        .unwrap_err()
        .to_string()
}

#[test]
fn roster_rules() {
    let dup = NODES.replace("replica_id = 1", "replica_id = 0");
    assert_eq!(
        load(&dup, &overrides()).unwrap_err().to_string(),
        "config key `cluster.nodes[1].replica_id`: 0 is also cluster.nodes[0].replica_id"
    );
    let high = NODES.replace("replica_id = 1", "replica_id = 2");
    assert_eq!(
        load(&high, &overrides()).unwrap_err().to_string(),
        "config key `cluster.nodes[1].replica_id`: 2 is not below the roster size 2"
    );
    let names = NODES.replace("name = \"b\"", "name = \"a\"");
    assert_eq!(
        load(&names, &overrides()).unwrap_err().to_string(),
        "config key `cluster.nodes[1].name`: `a` is used twice"
    );
    let port = NODES.replace("tcp_replica = 9091", "tcp_replica = 9090");
    assert_eq!(
        load(&port, &overrides()).unwrap_err().to_string(),
        "config key `cluster.nodes[1].ports.tcp_replica`: 127.0.0.1:9090 is also \
         cluster.nodes[0].ports.tcp_replica"
    );
    let within = NODES.replace("http = 3001", "http = 8091");
    assert_eq!(
        load(&within, &overrides()).unwrap_err().to_string(),
        "config key `cluster.nodes[1].ports.http`: 127.0.0.1:8091 is also cluster.nodes[1].ports.tcp"
    );
    // The same port on two addresses is fine; on 0.0.0.0 it collides with every address.
    let other_ip = NODES
        .replace(
            "ip = \"127.0.0.1\"\nreplica_id = 1",
            "ip = \"127.0.0.2\"\nreplica_id = 1",
        )
        .replace("8091", "8090");
    assert!(load(&other_ip, &overrides()).is_ok());
    let any = other_ip.replace("127.0.0.2", "0.0.0.0");
    assert_eq!(
        load(&any, &overrides()).unwrap_err().to_string(),
        "config key `cluster.nodes[1].ports.tcp`: 0.0.0.0:8090 is also cluster.nodes[0].ports.tcp"
    );
    let ip = NODES.replace(
        "ip = \"127.0.0.1\"\nreplica_id = 1",
        "ip = \"localhost\"\nreplica_id = 1",
    );
    assert_eq!(
        load(&ip, &overrides()).unwrap_err().to_string(),
        "config key `cluster.nodes[1].ip`: `localhost` is not an IP address"
    );
    let missing = NODES.replace("tcp_replica = 9091 ", "");
    let missing = missing.replace(", tcp_replica = 9091", "");
    assert_eq!(
        load(&missing, &overrides()).unwrap_err().to_string(),
        "config key `cluster.nodes[1].ports.tcp_replica`: is required"
    );
    let no_id = Overrides {
        replica_id: 2,
        ..overrides()
    };
    assert_eq!(
        load(NODES, &no_id).unwrap_err().to_string(),
        "flag `--replica-id`: 2 is not in the roster (replica ids 0..2 in [[cluster.nodes]])"
    );
    let disabled = NODES.replace("enabled = true", "enabled = false");
    assert_eq!(
        load(&disabled, &overrides()).unwrap_err().to_string(),
        "config key `cluster.enabled`: must be true: a Strand node is a replica of a cluster"
    );
}

#[test]
fn auth_and_tls_rules() {
    let short = "[cluster.auth]\nenabled = true\nshared_secret = \"too short\"";
    assert_eq!(
        refuse(short),
        "config key `cluster.auth.shared_secret`: is 9 bytes; at least 32 are required"
    );
    let none = "[cluster.auth]\nenabled = true";
    assert_eq!(
        refuse(none),
        "config key `cluster.auth.shared_secret`: is required (at least 32 bytes) when \
         cluster.auth.enabled; prefer IGGY_CLUSTER_AUTH_SHARED_SECRET"
    );
    let long = "0123456789abcdef0123456789abcdef";
    let env = Overrides {
        shared_secret_env: Some(long.into()),
        ..overrides()
    };
    let config = load(&format!("{NODES}\n{short}"), &env).unwrap();
    assert_eq!(
        config.cluster.shared_secret.as_deref(),
        Some(long.as_bytes()),
        "the environment wins"
    );
    let short_env = Overrides {
        shared_secret_env: Some("short".into()),
        ..overrides()
    };
    assert_eq!(
        refuse_with(none, &short_env),
        "environment variable `IGGY_CLUSTER_AUTH_SHARED_SECRET`: is 5 bytes; at least 32 are required"
    );
    let previous = format!("{none}\nshared_secret = \"{long}\"\nprevious_shared_secret = \"old\"");
    assert_eq!(
        refuse(&previous),
        "config key `cluster.auth.previous_shared_secret`: is 3 bytes; at least 32 are required"
    );
    assert_eq!(
        refuse("[cluster.tls]\nenabled = true\nself_signed = true"),
        "config key `cluster.tls.enabled`: requires cluster.auth.enabled"
    );
    let tls = format!(
        "[cluster.auth]\nenabled = true\nshared_secret = \"{long}\"\n[cluster.tls]\nenabled = true"
    );
    assert_eq!(
        refuse(&tls),
        "config key `cluster.tls.cert_file`: is required when TLS is on without self_signed"
    );
    let config = load(&format!("{NODES}\n{tls}\nself_signed = true"), &overrides()).unwrap();
    assert!(config.cluster.tls.unwrap().self_signed);
}

#[test]
fn timer_and_size_rules() {
    assert_eq!(
        refuse_cluster("heartbeat_timeout = \"1s\""),
        "config key `cluster.heartbeat_timeout`: must be at least 2s and at least 4 x \
         cluster.commit_broadcast_interval"
    );
    assert_eq!(
        refuse_cluster("commit_broadcast_interval = \"2s\""),
        "config key `cluster.heartbeat_timeout`: must be at least 2s and at least 4 x \
         cluster.commit_broadcast_interval"
    );
    assert_eq!(
        refuse_cluster("commit_broadcast_interval = \"0s\""),
        "config key `cluster.commit_broadcast_interval`: must not be zero"
    );
    assert_eq!(
        refuse_cluster("view_change_status_timeout = \"1s\""),
        "config key `cluster.view_change_status_timeout`: must be at least 4 x \
         cluster.view_change_retransmit_interval"
    );
    let error = refuse_cluster("prepare_retransmit_interval = \"soon\"");
    assert!(
        error.starts_with(
            "config key `cluster.prepare_retransmit_interval`: `soon` is not a duration"
        ),
        "{error}"
    );
    assert_eq!(
        refuse_cluster("view_probe_attempts_max = 0"),
        "config key `cluster.view_probe_attempts_max`: 0 is outside 1..=100"
    );
    assert_eq!(
        refuse("[message_bus]\npeer_queue_capacity = 128"),
        "config key `cluster.repair_chunk_max`: 128 must be below message_bus.peer_queue_capacity (128)"
    );
    assert_eq!(
        refuse_cluster("superblock_wedged_fatal_timeout = \"10s\""),
        "config key `cluster.superblock_wedged_fatal_timeout`: must be \"0\" (disabled) or at least 30s"
    );
    let off = load(
        &with_cluster("superblock_wedged_fatal_timeout = \"0\""),
        &overrides(),
    )
    .unwrap();
    assert_eq!(off.cluster.superblock_wedged_fatal_timeout, None);
    assert_eq!(
        refuse_cluster("dead_node_session_timeout = \"100ms\""),
        "config key `cluster.dead_node_session_timeout`: must be \"0\" (disabled) or between 500ms and 1h"
    );
    assert_eq!(
        refuse_cluster("dead_node_session_timeout = \"2h\""),
        "config key `cluster.dead_node_session_timeout`: must be \"0\" (disabled) or between 500ms and 1h"
    );
    let off = load(
        &with_cluster("dead_node_session_timeout = \"0\""),
        &overrides(),
    )
    .unwrap();
    assert_eq!(off.cluster.dead_node_session_timeout, None);
    let short = load(
        &with_cluster("dead_node_session_timeout = \"750ms\""),
        &overrides(),
    )
    .unwrap();
    assert_eq!(
        short.cluster.dead_node_session_timeout,
        Some(std::time::Duration::from_millis(750))
    );
    assert_eq!(
        refuse("[message_bus]\nmax_batch = 513"),
        "config key `message_bus.max_batch`: 513 is outside 1..=512"
    );
    assert_eq!(
        refuse("[message_bus]\nmax_message_size = \"lots\""),
        "config key `message_bus.max_message_size`: `lots` is not a size like \"64 MiB\" or \"4096\""
    );
    assert_eq!(
        refuse("[metadata]\njournal_slots = 200"),
        "config key `metadata.journal_slots`: 200 must be at least 4 x max(64, \
         metadata.prepare_queue_depth) = 256"
    );
    let error = refuse("[metadata]\ncheckpoint_interval_ops = 512");
    assert!(
        error.starts_with("config key `metadata.checkpoint_interval_ops`: 512 must be at least 8"),
        "{error}"
    );
    assert_eq!(
        refuse("[metadata]\nprepare_queue_depth = 128"),
        "config key `metadata.prepare_queue_depth`: 128 is outside 1..=127"
    );
    assert_eq!(
        refuse("[partition]\nack = \"fast\""),
        "config key `partition.ack`: `fast` is neither \"disk\" nor \"memory\""
    );
    let topics = "[[partition.topic]]\nstream = \"s\"\ntopic = \"t\"\nack = \"memory\"";
    let config = load(&format!("{NODES}\n{topics}"), &overrides()).unwrap();
    assert_eq!(
        config.partition.topic_ack[&("s".into(), "t".into())],
        Ack::Memory
    );
    assert_eq!(
        refuse(&format!("{topics}\n{topics}")),
        "config key `partition.topic[1]`: stream `s` topic `t` is listed twice"
    );
    let error = refuse("[partition]\ntransfer_artifact_bytes_max = \"2 TiB\"");
    assert!(
        error.starts_with(
            "config key `partition.transfer_artifact_bytes_max`: 2199023255552 must not exceed"
        ),
        "{error}"
    );
    let error = refuse("[partition]\ntransfer_artifact_bytes_max = \"1 GiB\"");
    assert!(
        error.starts_with(
            "config key `partition.transfer_artifact_bytes_max`: 1073741824 must be at least"
        ),
        "{error}"
    );
    assert_eq!(
        refuse("[system.sharding]\nshutdown_poll_interval = \"20s\""),
        "config key `system.sharding.shutdown_poll_interval`: must not exceed \
         system.sharding.shutdown_drain_timeout"
    );
    assert_eq!(
        refuse("[system.sharding]\nshutdown_join_timeout = \"5s\""),
        "config key `system.sharding.shutdown_join_timeout`: must be at least \
         system.sharding.shutdown_drain_timeout"
    );
    assert_eq!(
        refuse("[system.sharding]\nio_memory = \"4 KiB\""),
        "config key `system.sharding.io_memory`: 4096 is outside 65536..=1073741824"
    );
}

#[test]
fn sizes() {
    assert_eq!(parse_size("64 MiB"), Some(64 << 20));
    assert_eq!(parse_size("64MiB"), Some(64 << 20));
    assert_eq!(parse_size("2 kb"), Some(2000));
    assert_eq!(parse_size("4096"), Some(4096));
    assert_eq!(parse_size("1 GB"), Some(1_000_000_000));
    assert_eq!(parse_size("1 TiB"), Some(1 << 40));
    assert_eq!(parse_size("1.5 MiB"), None);
    assert_eq!(parse_size("MiB"), None);
    assert_eq!(parse_size("99999999999 TiB"), None);
}

#[test]
fn sharding_from_the_file_and_the_flags() {
    let pinned = |list: &str| Sharding::Pinned(CoreList::parse(list).unwrap());
    let sharding = |extra: &str, o: &Overrides| {
        load(&format!("{NODES}\n[system.sharding]\n{extra}"), o).map(|c| c.system.sharding)
    };
    let o = overrides();
    assert_eq!(sharding("", &o).unwrap(), pinned("0-3"));
    assert_eq!(sharding("cpu_allocation = 2", &o).unwrap(), pinned("0-1"));
    assert_eq!(
        sharding("cpu_allocation = 2\npin_cores = false", &o).unwrap(),
        Sharding::Unpinned(2)
    );
    assert_eq!(
        sharding("pin_cores = false", &o).unwrap(),
        Sharding::Unpinned(4)
    );
    assert_eq!(
        sharding("cpu_allocation = \"0-1,3\"", &o).unwrap(),
        pinned("0,1,3")
    );
    assert_eq!(
        sharding("cpu_allocation = \"0,5\"", &o)
            .unwrap_err()
            .to_string(),
        "config key `system.sharding.cpu_allocation`: core 5 is not available to this process"
    );
    assert_eq!(
        sharding("cpu_allocation = \"0-\"", &o)
            .unwrap_err()
            .to_string(),
        "config key `system.sharding.cpu_allocation`: `0-`: `0-` is not a core id or a range like 0-3"
    );
    assert_eq!(
        sharding("cpu_allocation = 8", &o).unwrap_err().to_string(),
        "config key `system.sharding.cpu_allocation`: 8 pinned shards but only 4 CPUs are available"
    );
    assert_eq!(
        sharding("cpu_allocation = \"1\"\npin_cores = false", &o)
            .unwrap_err()
            .to_string(),
        "config key `system.sharding.pin_cores`: a core list in cpu_allocation needs pin_cores = true"
    );
    // Flags win over the file.
    let cores = Overrides {
        cores: Some(CoreList::parse("2,0").unwrap()),
        ..overrides()
    };
    assert_eq!(
        sharding("cpu_allocation = 1", &cores).unwrap(),
        pinned("2,0")
    );
    let shards = Overrides {
        shards: Some(3),
        ..overrides()
    };
    assert_eq!(
        sharding("cpu_allocation = 1", &shards).unwrap(),
        Sharding::Unpinned(3)
    );
    let both = Overrides {
        shards: Some(3),
        cores: Some(CoreList::parse("0").unwrap()),
        ..overrides()
    };
    assert_eq!(
        sharding("", &both).unwrap_err().to_string(),
        "flag `--cores`: conflicts with --shards; give one"
    );
    let absent = Overrides {
        cores: Some(CoreList::parse("7").unwrap()),
        ..overrides()
    };
    assert_eq!(
        sharding("", &absent).unwrap_err().to_string(),
        "flag `--cores`: core 7 is not available to this process"
    );
    let zero = Overrides {
        shards: Some(0),
        ..overrides()
    };
    assert_eq!(
        sharding("", &zero).unwrap_err().to_string(),
        "flag `--shards`: 0 is outside 1..=1024"
    );
    let dir = Overrides {
        data_dir: Some("/tmp/x".into()),
        ..overrides()
    };
    assert_eq!(
        load(NODES, &dir).unwrap().system.path,
        PathBuf::from("/tmp/x")
    );
}

#[test]
fn dev_clusters_validate_with_ports_a_hundred_apart() {
    let cubic = shard::net::CongestionControl::new("cubic").unwrap();
    for replicas in 1..=DEV_REPLICAS_MAX {
        // `strand dev --tcp-congestion` reaches every node's config (odd sizes here).
        let congestion = (replicas % 2 == 1).then_some(&cubic);
        let text = dev_config(replicas, congestion);
        for i in 0..replicas {
            let o = Overrides {
                replica_id: u64::from(i),
                shards: Some(1),
                ..overrides()
            };
            let config = load(&text, &o).unwrap_or_else(|e| panic!("{replicas} nodes: {e}"));
            assert_eq!(config.network.tcp_congestion_control.as_ref(), congestion);
            let node = config.node();
            let step = 100 * u16::from(i);
            assert_eq!(node.ip, IpAddr::from([127, 0, 0, 1]));
            assert_eq!(node.ports.tcp, 8090 + step);
            assert_eq!(node.ports.http, 3000 + step);
            assert_eq!(node.ports.tcp_replica, 9090 + step);
            assert_eq!(node.ports.quic, Some(8080 + step));
            assert_eq!(node.ports.websocket, Some(8092 + step));
            assert_eq!(config.cluster.nodes.len(), usize::from(replicas));
            assert_eq!(config.cluster.name, "strand-dev");
        }
    }
}

#[test]
fn root_credentials_from_the_file_and_the_environment() {
    let config = load_ok(NODES);
    assert_eq!(config.metadata.root.username, "iggy");
    let text =
        format!("{NODES}\n[metadata]\nroot_username = \"admin\"\nroot_password = \"pa55word\"");
    let config = load_ok(&text);
    assert_eq!(config.metadata.root.username, "admin");
    // The password never shows in a Debug output of the raw or the validated config.
    let raw = RawConfig::parse(&text).unwrap();
    assert!(!format!("{raw:?}").contains("pa55word"));
    assert!(!format!("{config:?}").contains("pa55word"));

    let env = Overrides {
        root_username_env: Some("envroot".into()),
        root_password_env: Some(Secret("envpass".into())),
        ..overrides()
    };
    let config = load(&text, &env).unwrap();
    assert_eq!(
        config.metadata.root.username, "envroot",
        "the environment wins"
    );

    assert_eq!(
        refuse("[metadata]\nroot_username = \"ab\""),
        "config key `metadata.root_username`: the root username must be 3 to 50 bytes, found 2"
    );
    assert_eq!(
        refuse("[metadata]\nroot_password = \"\""),
        "config key `metadata.root_password`: the root password must be 3 to 100 bytes, found 0"
    );
    let short_env = Overrides {
        root_password_env: Some(Secret("xy".into())),
        ..overrides()
    };
    assert_eq!(
        refuse_with("", &short_env),
        "environment variable `IGGY_ROOT_PASSWORD`: the root password must be 3 to 100 bytes, found 2"
    );
}

#[test]
fn cluster_metadata_names_the_primary_and_the_unreachable() {
    use crate::client::answers::{ROLE_FOLLOWER, ROLE_LEADER, STATUS_HEALTHY, STATUS_UNREACHABLE};
    use crate::client::reply::ClusterMetadata;
    let config = load_ok(NODES);
    let metadata = crate::client::answers::cluster_metadata(&config, Some(1), |_| false);
    assert_eq!(metadata.name, "iggy-cluster");
    let roles: Vec<_> = metadata.nodes.iter().map(|n| (n.role, n.status)).collect();
    assert_eq!(
        roles,
        vec![
            (ROLE_FOLLOWER, STATUS_HEALTHY),
            (ROLE_LEADER, STATUS_UNREACHABLE)
        ]
    );
    assert_eq!(
        (metadata.nodes[1].ip.as_str(), metadata.nodes[1].tcp),
        ("127.0.0.1", 8091)
    );
    let mut bytes = Vec::new();
    metadata.encode(&mut bytes);
    assert_eq!(ClusterMetadata::decode(&bytes).unwrap(), metadata);
    let none = crate::client::answers::cluster_metadata(&config, None, |_| true);
    assert!(
        none.nodes
            .iter()
            .all(|n| n.role == ROLE_FOLLOWER && n.status == STATUS_HEALTHY)
    );
}

/// The rules no other test reached, each refused with the message naming its key (issue 10,
/// "Done when": config errors have tests that match the message naming the key).
#[test]
fn the_remaining_rules_name_their_keys() {
    assert_eq!(
        refuse_cluster("name = \"\""),
        "config key `cluster.name`: must not be empty"
    );
    let long = "k".repeat(32);
    let tls = format!(
        "[cluster.auth]\nenabled = true\nshared_secret = \"{long}\"\n[cluster.tls]\nenabled = true"
    );
    assert_eq!(
        refuse(&format!("{tls}\ncert_file = \"c.pem\"")),
        "config key `cluster.tls.key_file`: is required when TLS is on without self_signed"
    );
    assert_eq!(
        refuse(&format!(
            "{tls}\ncert_file = \"c.pem\"\nkey_file = \"k.pem\""
        )),
        "config key `cluster.tls.ca_file`: is required when TLS is on without self_signed"
    );
    for key in ["close_grace", "handshake_grace"] {
        assert_eq!(
            refuse(&format!("[message_bus]\n{key} = \"0s\"")),
            format!("config key `message_bus.{key}`: must not be zero")
        );
    }
    assert_eq!(
        refuse("[partition]\ncheckpoint_interval_ops = 7"),
        "config key `partition.checkpoint_interval_ops`: 7 must be 0 (off) or at least 8"
    );
    assert!(
        refuse("[partition]\nread_cache_bytes = \"1 KiB\"")
            .starts_with("config key `partition.read_cache_bytes`"),
        "below 64 KiB"
    );
    assert!(
        refuse("[partition]\nread_cache_bytes = \"many\"")
            .starts_with("config key `partition.read_cache_bytes`")
    );
    assert!(
        refuse("[partition]\nread_cache_shard_bytes = \"512 KiB\"")
            .starts_with("config key `partition.read_cache_shard_bytes`")
    );
    // Decision 382: sector-aligned, a window and more, read whole at boot.
    assert_eq!(
        refuse("[partition]\nwal_size = \"16781313\""),
        "config key `partition.wal_size`: 16781313 must be a multiple of the 4096 B sector"
    );
    assert_eq!(
        refuse("[partition]\nwal_size = \"4 MiB\""),
        "config key `partition.wal_size`: 4194304 is outside 8388608..=1073741824"
    );
    assert_eq!(
        refuse("[partition]\nwal_size = \"2 GiB\""),
        "config key `partition.wal_size`: 2147483648 is outside 8388608..=1073741824"
    );
    assert!(
        refuse("[partition]\nwal_size = \"big\"").starts_with("config key `partition.wal_size`")
    );
    let config = load_ok(&format!("{NODES}\n[partition]\nwal_size = \"16 MiB\"\n"));
    assert_eq!(config.partition.wal_size, 16 << 20);
    assert_eq!(
        refuse("[system]\npath = \"\""),
        "config key `system.path`: must not be empty"
    );
}

/// Decision 510: the bounds on incomplete appends are keys; 0 turns one off, the shard's may
/// not be below one group's, and the group's reaches the partition groups' core.
#[test]
fn the_appending_bounds_are_validated_and_reach_the_core() {
    let raw = crate::wiring::partition_config(&load_ok(NODES)).unwrap();
    assert_eq!(raw.appending_bytes_max, 64 << 20);
    let text = format!(
        "{NODES}\n[partition]\nappending_bytes_max = \"16 MiB\"\nappending_shard_bytes_max = \"32 MiB\""
    );
    let config = load_ok(&text);
    assert_eq!(
        (
            config.partition.appending_bytes_max,
            config.partition.appending_shard_bytes_max
        ),
        (16 << 20, 32 << 20)
    );
    let raw = crate::wiring::partition_config(&config).unwrap();
    assert_eq!(raw.appending_bytes_max, 16 << 20);
    let off = format!(
        "{NODES}\n[partition]\nappending_bytes_max = \"0\"\nappending_shard_bytes_max = \"0\""
    );
    let config = load_ok(&off);
    assert_eq!(config.partition.appending_bytes_max, 0);
    assert_eq!(
        crate::wiring::partition_config(&config)
            .unwrap()
            .appending_bytes_max,
        0
    );
    assert_eq!(
        refuse("[partition]\nappending_bytes_max = \"512 KiB\""),
        "config key `partition.appending_bytes_max`: 524288 is outside 1048576..=68719476736"
    );
    for shard in ["\"32 MiB\"", "\"1 GiB\""] {
        let error = refuse(&format!(
            "[partition]\nappending_bytes_max = \"{}\"\nappending_shard_bytes_max = {shard}",
            if shard.contains("MiB") { "64 MiB" } else { "0" }
        ));
        assert!(
            error.starts_with("config key `partition.appending_shard_bytes_max`:"),
            "{error}"
        );
    }
}

/// Decision 507: the key reaches the partition groups' core, whose state-transfer receiver
/// holds a SEGMENT_LOG (a partition's whole log) to it; it was validated and never used.
#[test]
fn the_transfer_artifact_cap_reaches_the_partition_core() {
    let default = load_ok(NODES);
    let raw = crate::wiring::partition_config(&default).unwrap();
    assert_eq!(raw.transfer_artifact_bytes_max, 1 << 40);
    let text = format!("{NODES}\n[partition]\ntransfer_artifact_bytes_max = \"2 GiB\"");
    let raw = crate::wiring::partition_config(&load_ok(&text)).unwrap();
    assert_eq!(raw.transfer_artifact_bytes_max, 2 << 30);
}

/// Decision 512: `system.memory_prefault_bytes` defaults to 1 GiB, takes 0 for none, and
/// refuses what would not hold one batch or what no machine has.
#[test]
fn the_memory_prefault_is_a_size_with_an_off_switch() {
    assert_eq!(
        load_ok(NODES).system.memory_prefault_bytes,
        crate::memory::PREFAULT_BYTES_DEFAULT
    );
    for (value, bytes) in [
        ("\"0\"", 0),
        ("\"256 MiB\"", 256 << 20),
        ("\"1 MiB\"", 1 << 20),
    ] {
        let text = format!("{NODES}\n[system]\nmemory_prefault_bytes = {value}");
        assert_eq!(
            load_ok(&text).system.memory_prefault_bytes,
            bytes,
            "{value}"
        );
    }
    assert_eq!(
        refuse("[system]\nmemory_prefault_bytes = \"512 KiB\""),
        "config key `system.memory_prefault_bytes`: 524288 is outside 1048576..=1099511627776"
    );
    assert_eq!(
        refuse("[system]\nmemory_prefault_bytes = \"2 TiB\""),
        "config key `system.memory_prefault_bytes`: 2199023255552 is outside 1048576..=1099511627776"
    );
}
