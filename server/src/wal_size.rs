//! `partition.wal_size` is fixed for a data directory's life (decision 382).
//!
//! Each shard's partition WAL preallocates its files to this size and its recovery reads a
//! file of another length as one that lost its tail (or a longer one as cut at the size), so
//! a node that booted an existing directory with another size would report acknowledged
//! windows as lost. The size a directory was formatted with is recorded in
//! [`WAL_SIZE_FILE`] beside the stamp, and a node configured with another refuses to start.
//! A directory from before the key (WAL files, no record) was formatted with
//! [`WAL_SIZE_BEFORE_KEY`], which is recorded at its first boot with the key.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The record's file name in the data directory.
pub const WAL_SIZE_FILE: &str = "strand.wal-size";

/// The partition WAL's file size before `partition.wal_size` existed.
pub const WAL_SIZE_BEFORE_KEY: u64 = 64 << 20;

/// Why a node refuses its data directory's WAL size.
#[derive(Debug, thiserror::Error)]
pub enum WalSizeError {
    /// Reading or writing the record failed.
    #[error("{path}: {what}: {error}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        error: std::io::Error,
    },
    /// The record does not parse.
    #[error("{path}: the WAL size record does not parse; refusing to start")]
    Unreadable {
        /// The record.
        path: PathBuf,
    },
    /// The config names another size than the directory's WAL files have.
    #[error(
        "{path}: the partition WAL of this data directory was formatted with {recorded}-byte \
         files, but config key `partition.wal_size` is {configured}; refusing to start (rule: \
         the WAL size is fixed for a directory's life, decision 382: the WAL reads files of \
         another size as damaged). Set partition.wal_size = {recorded} again, or move the \
         directory aside and rejoin with an empty one and --rejoin"
    )]
    Changed {
        /// The record.
        path: PathBuf,
        /// The directory's size.
        recorded: u64,
        /// The config's size.
        configured: u64,
    },
}

fn io<'a>(path: &'a Path, what: &'static str) -> impl FnOnce(std::io::Error) -> WalSizeError + 'a {
    move |error| WalSizeError::Io {
        path: path.to_owned(),
        what,
        error,
    }
}

/// Whether any `shard-*/wal` directory under `data` holds a file (a WAL written before the
/// record existed).
fn has_wal_files(data: &Path) -> Result<bool, WalSizeError> {
    let entries = match std::fs::read_dir(data) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(data, "listing")(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io(data, "listing"))?;
        if !entry.file_name().to_string_lossy().starts_with("shard-") {
            continue;
        }
        let wal = entry.path().join("wal");
        match std::fs::read_dir(&wal) {
            Ok(mut files) => {
                if files.next().is_some() {
                    return Ok(true);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&wal, "listing")(e)),
        }
    }
    Ok(false)
}

/// Checks `configured` against the size `data` records, recording it durably first if the
/// directory has no record (the configured size for a fresh directory,
/// [`WAL_SIZE_BEFORE_KEY`] for one whose WAL predates the record). Call after the stamp check
/// and before any partition WAL opens.
pub fn check_or_record(data: &Path, configured: u64) -> Result<(), WalSizeError> {
    let path = data.join(WAL_SIZE_FILE);
    let recorded = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .find(|l| !l.starts_with('#'))
            .and_then(|l| l.trim().parse::<u64>().ok())
            .ok_or(WalSizeError::Unreadable { path: path.clone() })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let recorded = if has_wal_files(data)? {
                WAL_SIZE_BEFORE_KEY
            } else {
                configured
            };
            if recorded == configured {
                write_record(data, &path, recorded)?;
            }
            recorded
        }
        Err(e) => return Err(io(&path, "reading")(e)),
    };
    if recorded != configured {
        return Err(WalSizeError::Changed {
            path,
            recorded,
            configured,
        });
    }
    Ok(())
}

/// A temporary file, fsync, rename, fsync of `data`.
fn write_record(data: &Path, path: &Path, size: u64) -> Result<(), WalSizeError> {
    let temp = data.join(format!("{WAL_SIZE_FILE}.tmp"));
    let mut file = std::fs::File::create(&temp).map_err(io(&temp, "creating"))?;
    write!(
        file,
        "# partition.wal_size this directory was formatted with; never edit it.\n{size}\n"
    )
    .map_err(io(&temp, "writing"))?;
    file.sync_all().map_err(io(&temp, "syncing"))?;
    std::fs::rename(&temp, path).map_err(io(path, "renaming into place"))?;
    std::fs::File::open(data)
        .and_then(|d| d.sync_all())
        .map_err(io(data, "syncing the directory"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory records the configured size and accepts it again; another size is
    /// refused with a message naming the key; a directory whose WAL predates the record is
    /// taken as 64 MiB; a damaged record is refused.
    #[test]
    fn the_wal_size_is_recorded_once_and_a_changed_one_is_refused() {
        let data = crate::scratch_dir("wal-size-fresh");
        check_or_record(&data, 16 << 20).unwrap();
        check_or_record(&data, 16 << 20).unwrap();
        let error = check_or_record(&data, 32 << 20).unwrap_err().to_string();
        assert!(
            error.contains("formatted with 16777216-byte files")
                && error.contains("config key `partition.wal_size` is 33554432"),
            "{error}"
        );
        std::fs::remove_dir_all(&data).unwrap();

        let old = crate::scratch_dir("wal-size-old");
        std::fs::create_dir_all(old.join("shard-1").join("wal")).unwrap();
        std::fs::write(old.join("shard-1").join("wal").join("wal.0000000001"), b"").unwrap();
        assert!(matches!(
            check_or_record(&old, 16 << 20),
            Err(WalSizeError::Changed {
                recorded: WAL_SIZE_BEFORE_KEY,
                ..
            })
        ));
        assert!(
            !old.join(WAL_SIZE_FILE).exists(),
            "nothing recorded on a refusal"
        );
        check_or_record(&old, WAL_SIZE_BEFORE_KEY).unwrap();
        assert!(old.join(WAL_SIZE_FILE).exists());
        std::fs::write(old.join(WAL_SIZE_FILE), "# x\nlots\n").unwrap();
        assert!(matches!(
            check_or_record(&old, WAL_SIZE_BEFORE_KEY),
            Err(WalSizeError::Unreadable { .. })
        ));
        std::fs::remove_dir_all(&old).unwrap();
    }
}
