//! `strand inspect data-dir DIR`: what a node's data directory holds, read without writing a
//! byte (issue 10 item 5): the stamp, every superblock (each copy and the one chosen), the
//! metadata journal's head, the snapshots, and per shard the partition WAL's durable-end record,
//! its files and segment ranges, as far as they exist.
//!
//! Nothing here opens the journal's recovery (it repairs as it opens); files are read whole or
//! by sector and decoded with the journal's own decoders.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use journal::superblock::{COPIES, COPY_BYTES, choose, decode_copy};
use server::boot::{METADATA_SLOT_SIZE, STAMP_FILE, metadata_dir};
use wire::header::{Layout as _, PrepareHeader};

/// Prints the report; exits 1 when something is unreadable (the report says what).
pub fn run(dir: &Path, out: &mut impl Write) -> anyhow::Result<ExitCode> {
    let mut healthy = true;
    writeln!(out, "data directory {}", dir.display())?;
    if !dir.is_dir() {
        writeln!(out, "  not a directory")?;
        return Ok(ExitCode::FAILURE);
    }
    let stamp = dir.join(STAMP_FILE);
    match std::fs::read_to_string(&stamp) {
        Ok(text) => {
            writeln!(out, "stamp {}", stamp.display())?;
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                writeln!(out, "  {line}")?;
            }
        }
        Err(e) => {
            writeln!(out, "stamp {}: {e}", stamp.display())?;
            healthy = false;
        }
    }
    let metadata = metadata_dir(dir);
    if metadata.is_dir() {
        writeln!(out, "metadata group {}", metadata.display())?;
        healthy &= superblock(&metadata.join("superblock"), out)?;
        healthy &= metadata_journal(&metadata, out)?;
        for name in ["snapshot.0", "snapshot.1"] {
            let path = metadata.join(name);
            if let Ok(meta) = std::fs::metadata(&path) {
                writeln!(out, "  {name}: {} bytes", meta.len())?;
            }
        }
    } else {
        writeln!(out, "metadata group: {} absent", metadata.display())?;
    }
    let mut shards: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n = name.strip_prefix("shard-")?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    shards.sort();
    for (n, path) in shards {
        healthy &= shard(n, &path, out)?;
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Every copy of a superblock file and the state boot would choose. True when readable.
fn superblock(path: &Path, out: &mut impl Write) -> anyhow::Result<bool> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) => {
            writeln!(out, "  superblock {}: {e}", path.display())?;
            return Ok(false);
        }
    };
    writeln!(
        out,
        "  superblock {} ({} bytes)",
        path.display(),
        bytes.len()
    )?;
    let copies: [_; COPIES] = std::array::from_fn(|i| {
        let copy = bytes
            .get(i * COPY_BYTES..(i + 1) * COPY_BYTES)
            .unwrap_or(&[]);
        if copy.len() < COPY_BYTES {
            Err(None)
        } else {
            decode_copy(copy, i)
        }
    });
    for (i, copy) in copies.iter().enumerate() {
        match copy {
            Ok(None) => writeln!(out, "    copy {i}: empty")?,
            Ok(Some((sequence, _, headers))) => writeln!(
                out,
                "    copy {i}: sequence {sequence}, {} view headers",
                headers.len()
            )?,
            Err(None) => writeln!(out, "    copy {i}: damaged")?,
            Err(Some(version)) => writeln!(out, "    copy {i}: unknown version {version}")?,
        }
    }
    match choose(&copies) {
        Ok(Some((sequence, s, headers))) => {
            writeln!(
                out,
                "    chosen: sequence {sequence}, cluster {:#x}, replica {} of {}, view {}, \
                 log_view {}, commit_max {}, op_head {}, checkpoint_op {}, truncation_ceiling {}, \
                 lost_state {}, offset_frontier {}, {} view headers{}",
                s.cluster,
                s.replica_id,
                s.replica_count,
                s.view,
                s.log_view,
                s.commit_max,
                s.op_head,
                s.checkpoint_op,
                s.truncation_ceiling,
                s.lost_state,
                s.offset_frontier,
                headers.len(),
                if sequence == 1 {
                    " (formatted only)"
                } else {
                    ""
                }
            )?;
            Ok(true)
        }
        Ok(None) => {
            writeln!(out, "    chosen: none (never written)")?;
            Ok(true)
        }
        Err(e) => {
            writeln!(out, "    unreadable: {e}")?;
            Ok(false)
        }
    }
}

/// The metadata journal's slots: which hold an intact prepare, the lowest and highest op
/// (the head), and slots whose header names an op but whose frame does not verify.
fn metadata_journal(dir: &Path, out: &mut impl Write) -> anyhow::Result<bool> {
    let prepares = dir.join(journal::metadata::PREPARES_FILE);
    let ring = dir.join(journal::metadata::HEADERS_FILE);
    let Ok(file) = std::fs::File::open(&prepares) else {
        writeln!(out, "  journal: {} absent", prepares.display())?;
        return Ok(true);
    };
    // The journal's files grow as slots are first written, so the slots scanned are those the
    // files reach (the configured `metadata.journal_slots` may be more).
    let ring_slots = std::fs::metadata(&ring).map_or(0, |m| m.len() / wire::HEADER_SIZE as u64);
    let file_slots = file
        .metadata()
        .map_or(0, |m| m.len().div_ceil(METADATA_SLOT_SIZE));
    let slots = ring_slots.max(file_slots);
    let mut intact: Vec<u64> = Vec::new();
    let mut damaged: Vec<(u64, u64)> = Vec::new();
    for slot in 0..slots {
        let mut head = [0u8; wire::HEADER_SIZE];
        if read_at(&file, slot * METADATA_SLOT_SIZE, &mut head).is_err() || is_zero(&head) {
            continue;
        }
        let Some(header) = PrepareHeader::view(&head[..]) else {
            damaged.push((slot, 0));
            continue;
        };
        let op = header.op.get();
        let size = u64::from(header.frame.size.get()).min(METADATA_SLOT_SIZE);
        let mut frame = vec![0u8; usize::try_from(size).unwrap_or(0)];
        let valid = read_at(&file, slot * METADATA_SLOT_SIZE, &mut frame).is_ok()
            && matches!(
                wire::decode_replica(&frame, wire::MAX_MESSAGE_SIZE_DEFAULT),
                Ok(wire::Message::Prepare { header, .. }) if header.op.get() == op
            );
        if valid {
            intact.push(op);
        } else {
            damaged.push((slot, op));
        }
    }
    intact.sort_unstable();
    match (intact.first(), intact.last()) {
        (Some(low), Some(head)) => writeln!(
            out,
            "  journal: {slots} slots written (of {METADATA_SLOT_SIZE} bytes), {} intact \
             prepares, ops {low}..={head}, head {head}",
            intact.len()
        )?,
        _ => writeln!(out, "  journal: {slots} slots written, no intact prepare")?,
    }
    for (slot, op) in &damaged {
        writeln!(
            out,
            "    slot {slot}: damaged (its header names op {op}; boot holds it faulty when \
             the header ring vouches for it, decision 62)"
        )?;
    }
    Ok(true)
}

/// One shard's directory: the partition WAL (durable end, files) and any segments and group
/// superblocks beneath it.
fn shard(n: u32, path: &Path, out: &mut impl Write) -> anyhow::Result<bool> {
    writeln!(out, "shard {n} {}", path.display())?;
    let mut healthy = true;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for dir in entries.iter().filter(|p| p.is_dir()) {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        if name == "metadata" {
            continue;
        }
        if dir.join(journal::wal::END_FILE).exists() || has_wal_files(dir) {
            healthy &= wal(dir, out)?;
        }
        healthy &= files(dir, out)?;
    }
    Ok(healthy)
}

fn has_wal_files(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("wal."))
    })
}

/// The WAL's durable-end record (journal decision 90) and its files.
fn wal(dir: &Path, out: &mut impl Write) -> anyhow::Result<bool> {
    writeln!(out, "  partition WAL {}", dir.display())?;
    let present = dir.join(journal::wal::END_FILE).exists();
    let end = if present {
        let storage = journal::FileStorage::new(dir, false)
            .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?;
        match journal::storage::block_on(journal::wal::open_end(&storage)) {
            Ok(Ok(record)) => record.end(),
            Ok(Err(fault)) => {
                writeln!(out, "    durable end: unreadable: {fault}")?;
                return Ok(false);
            }
            Err(e) => {
                writeln!(out, "    durable end: {e}")?;
                return Ok(false);
            }
        }
    } else {
        None
    };
    match end {
        Some(end) if end.newest < end.oldest => writeln!(
            out,
            "    durable end: durable lsn {}, floor {}, no file yet",
            end.durable, end.floor
        )?,
        Some(end) => writeln!(
            out,
            "    durable end: durable lsn {}, floor {}, files {}..={}",
            end.durable, end.floor, end.oldest, end.newest
        )?,
        None if has_wal_files(dir) => {
            // A fresh directory writes its record before its first WAL file (decision 481).
            writeln!(
                out,
                "    durable end: absent or never written, while WAL files exist (the open refuses)"
            )?;
            return Ok(false);
        }
        None if present => writeln!(out, "    durable end: never written")?,
        None => writeln!(out, "    durable end: {} absent", journal::wal::END_FILE)?,
    }
    Ok(true)
}

/// WAL files, segments (base offset ranges per prefix) and superblocks in `dir`.
fn files(dir: &Path, out: &mut impl Write) -> anyhow::Result<bool> {
    let mut healthy = true;
    let mut names: Vec<(String, u64)> = std::fs::read_dir(dir)?
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| {
            let len = e.metadata().map_or(0, |m| m.len());
            (e.file_name().to_string_lossy().into_owned(), len)
        })
        .collect();
    names.sort();
    for (name, len) in names.iter().filter(|(n, _)| n.starts_with("wal.")) {
        writeln!(out, "    {name}: {len} bytes")?;
    }
    // Segments: `{prefix}{base:020}.log`, each covering offsets from its base up to the next
    // segment's base (the last one open-ended).
    let mut segments: std::collections::BTreeMap<String, Vec<(u64, u64)>> = Default::default();
    for (name, len) in &names {
        if let Some(stem) = name.strip_suffix(".log")
            && stem.len() >= 20
            && let Ok(base) = stem[stem.len() - 20..].parse::<u64>()
        {
            segments
                .entry(stem[..stem.len() - 20].to_owned())
                .or_default()
                .push((base, *len));
        }
    }
    for (prefix, list) in &segments {
        writeln!(out, "    segments {prefix:?}:")?;
        for (i, (base, len)) in list.iter().enumerate() {
            match list.get(i + 1) {
                Some((next, _)) => writeln!(out, "      offsets {base}..{next}: {len} bytes")?,
                None => writeln!(out, "      offsets {base}..: {len} bytes (newest)")?,
            }
        }
    }
    for (name, _) in names.iter().filter(|(n, _)| n.ends_with("superblock")) {
        healthy &= superblock(&dir.join(name), out)?;
    }
    Ok(healthy)
}

fn read_at(file: &std::fs::File, at: u64, buf: &mut [u8]) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, at)
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("inspect-wal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Decision 481: WAL files beside a `wal-end` that is absent or empty are reported
    /// unhealthy (the open refuses them); a directory with neither, or a record that names no
    /// file yet, is healthy.
    #[test]
    fn wal_files_without_a_record_are_unhealthy() {
        let report = |dir: &Path| {
            let mut out = Vec::new();
            let healthy = wal(dir, &mut out).unwrap();
            (healthy, String::from_utf8(out).unwrap())
        };
        let dir = scratch("none");
        assert!(report(&dir).0, "an empty directory");
        std::fs::write(dir.join("wal.0000000001"), b"").unwrap();
        let (healthy, text) = report(&dir);
        assert!(!healthy && text.contains("the open refuses"), "{text}");
        std::fs::write(dir.join(journal::wal::END_FILE), b"").unwrap();
        let (healthy, text) = report(&dir);
        assert!(!healthy && text.contains("the open refuses"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);

        // A fresh WAL's first record, before its first file.
        let dir = scratch("first");
        let storage = journal::FileStorage::new(&dir, false).unwrap();
        let mut record = journal::storage::block_on(journal::wal::open_end(&storage))
            .unwrap()
            .unwrap();
        let none = journal::wal::WalEnd {
            oldest: 1,
            newest: 0,
            floor: 1,
            durable: 0,
        };
        journal::storage::block_on(record.write(&storage, none)).unwrap();
        let (healthy, text) = report(&dir);
        assert!(healthy && text.contains("no file yet"), "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
