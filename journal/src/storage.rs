//! The one storage interface the journal is written against, and the helpers every layout uses.
//!
//! A [`Storage`] is a flat directory of named files. Every read and write is positional, starts
//! on a [`SECTOR`] boundary and covers whole sectors, so the same layouts run on `O_DIRECT`
//! files and on the in-memory fault backend (which refuses unaligned access, so the simulator
//! catches a layout bug the production backend would turn into `EINVAL`).
//!
//! What is durable when: a write is durable once a later [`Storage::sync`] of the same file has
//! completed; [`Storage::set_len`] likewise. A [`Storage::write_durable`] is durable when it
//! returns, and promises nothing about the file's other unsynced writes. Creating and removing files is durable at once in
//! both backends: the file backends sync the directory after a create or remove, and when they
//! open a data directory they sync it and its parent (and the parent of every directory they
//! create), so no entry a file's durability depends on is left unsynced.
//!
//! The methods are `async fn` with no `Send` bound: one shard owns its storage (thread per
//! core). The in-memory and std-file backends complete on the first poll, so [`block_on`] runs
//! them anywhere; a glommio backend would really suspend.

use crate::file::AlignedBuf;
use std::future::Future;
use std::task::{Context, Poll, Waker};

/// The unit of alignment and of atomicity: every access is a multiple of it, and the fault model
/// tears writes only at its boundaries.
pub const SECTOR: usize = 4096;

/// Why a storage call failed. Environmental failures are reported, never retried: the server
/// fail-stops on them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    /// The OS refused an operation.
    #[error("{op} {name}: {kind:?} (os error {errno:?})")]
    Io {
        /// Which call failed (`open`, `write`, `sync`, ...).
        op: &'static str,
        /// The file.
        name: String,
        /// The error kind.
        kind: std::io::ErrorKind,
        /// The raw OS error, when there is one.
        errno: Option<i32>,
    },
    /// A read or write that does not start and end on a sector boundary.
    #[error("unaligned {op} on {name}: offset {offset}, len {len}")]
    Unaligned {
        /// `read` or `write`.
        op: &'static str,
        /// The file.
        name: String,
        /// Byte offset.
        offset: u64,
        /// Byte length.
        len: usize,
    },
    /// The file does not exist (open without create, remove).
    #[error("no such file: {0}")]
    NotFound(String),
    /// A name with a path separator or otherwise unusable.
    #[error("bad file name: {0}")]
    BadName(String),
    /// The name no longer names the file the handle was opened on (a second descriptor of
    /// it, opened by name, reached another file).
    #[error("{0} names another file than the one opened")]
    Replaced(String),
    /// The fault backend failed a read of a lost sector.
    #[error("sector {sector} of {name} is unreadable")]
    SectorLost {
        /// The file.
        name: String,
        /// Sector index.
        sector: u64,
    },
    /// The fault backend was told to fail this call.
    #[error("injected failure of {op} on {name}")]
    Injected {
        /// Which call.
        op: &'static str,
        /// The file.
        name: String,
    },
}

impl StorageError {
    pub(crate) fn io(op: &'static str, name: &str, error: &std::io::Error) -> StorageError {
        StorageError::Io {
            op,
            name: name.to_owned(),
            kind: error.kind(),
            errno: error.raw_os_error(),
        }
    }

    /// Whether the error is a media fault of the data read (a lost sector, `EIO` on read): the
    /// recovery scan classifies such a region as corrupt instead of failing the boot.
    pub fn is_media(&self) -> bool {
        match self {
            StorageError::SectorLost { .. } => true,
            StorageError::Io { errno, .. } => *errno == Some(libc::EIO),
            _ => false,
        }
    }
}

/// How [`Storage::open`] treats a missing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Create an empty file if it is missing.
    Create,
    /// Fail with [`StorageError::NotFound`] if it is missing.
    Existing,
}

thread_local! {
    /// The default [`Storage::write_filled`]'s buffer, kept between writes (a fresh megabyte
    /// per flush costs its page faults and zeroing every time). Taken while a write runs, so
    /// two writes in flight on one thread each get a buffer of their own.
    static FILL_SCRATCH: std::cell::Cell<Option<AlignedBuf>> = const { std::cell::Cell::new(None) };
}

/// The thread's scratch buffer (taken: put it back after the write), `len` bytes filled by
/// `fill`.
fn scratch_filled(len: usize, fill: impl FnOnce(&mut [u8])) -> AlignedBuf {
    let mut buf = FILL_SCRATCH.take().unwrap_or_else(|| AlignedBuf::zeroed(0));
    buf.reuse(len);
    fill(buf.as_mut_slice());
    buf
}

/// A flat directory of files with sector-aligned positional IO.
#[allow(async_fn_in_trait)] // thread-per-core: futures never cross threads, no Send bound wanted
pub trait Storage {
    /// An open file.
    type File: std::fmt::Debug;

    /// The directory on the local file system, when the storage is one (state-transfer staging
    /// writes its temporary files there with std IO; decision 220). In-memory storage: `None`.
    fn local_dir(&self) -> Option<&std::path::Path> {
        None
    }

    /// Opens (or creates) a file by name. Names contain no `/`.
    async fn open(&self, name: &str, mode: OpenMode) -> Result<Self::File, StorageError>;
    /// Reads `len` bytes from `offset` into a new buffer; shorter only at the end of the file.
    /// `offset` and `len` must be sector multiples. The default zeroes the buffer and calls
    /// [`Storage::read_at`]; a backend that reads into buffers of its own (the DMA backend)
    /// fills the new buffer from them without zeroing it first.
    async fn read_vec(
        &self,
        file: &Self::File,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, StorageError> {
        let mut buf = vec![0u8; len];
        let n = read_exact_at(self, file, offset, &mut buf).await?;
        buf.truncate(n);
        Ok(buf)
    }
    /// Reads into `buf` from `offset`; returns the bytes read, short only at the end of the
    /// file. `offset` and `buf.len()` must be sector multiples.
    async fn read_at(
        &self,
        file: &Self::File,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize, StorageError>;
    /// Writes `data` at `offset` (both sector multiples). Not durable until [`Storage::sync`].
    async fn write_at(
        &self,
        file: &Self::File,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError>;
    /// Writes `len` bytes at `offset` (both sector multiples) that `fill` puts into the
    /// buffer the write goes out from, so a caller that assembles its bytes (a segment flush
    /// gathering its batches) copies them once. `fill` gets exactly `len` bytes of unspecified
    /// content and must write all of them. The default assembles into a buffer of its own and
    /// calls [`Storage::write_at`]; the DMA backend fills its DMA buffer directly.
    async fn write_filled<F: FnOnce(&mut [u8])>(
        &self,
        file: &Self::File,
        offset: u64,
        len: usize,
        fill: F,
    ) -> Result<(), StorageError> {
        let buf = scratch_filled(len, fill);
        let written = self.write_at(file, offset, buf.as_slice()).await;
        FILL_SCRATCH.set(Some(buf));
        written
    }
    /// Writes `data` at `offset` (both sector multiples) and returns once those bytes are
    /// durable: an `O_DSYNC` write, one trip to the device where [`Storage::write_at`] and
    /// [`Storage::sync`] take two (decision 496). Only this write's bytes (and the file length
    /// that covers them) are promised: other writes of the file not yet synced may stay
    /// unsynced, as they do on a device that honours a write-through (FUA) write. The default
    /// writes, then syncs the whole file.
    async fn write_durable(
        &self,
        file: &Self::File,
        offset: u64,
        data: &[u8],
    ) -> Result<(), StorageError> {
        self.write_at(file, offset, data).await?;
        self.sync(file).await
    }
    /// [`Storage::write_filled`] with the promise of [`Storage::write_durable`]. The default
    /// assembles into a buffer of its own and calls [`Storage::write_durable`]; the DMA backend
    /// fills its DMA buffer directly.
    async fn write_filled_durable<F: FnOnce(&mut [u8])>(
        &self,
        file: &Self::File,
        offset: u64,
        len: usize,
        fill: F,
    ) -> Result<(), StorageError> {
        let buf = scratch_filled(len, fill);
        let written = self.write_durable(file, offset, buf.as_slice()).await;
        FILL_SCRATCH.set(Some(buf));
        written
    }
    /// `fdatasync`: every completed write and length change of the file is durable on return.
    async fn sync(&self, file: &Self::File) -> Result<(), StorageError>;
    /// The file's length in bytes.
    async fn len(&self, file: &Self::File) -> Result<u64, StorageError>;
    /// Truncates or extends the file (zero-filled). Durable after [`Storage::sync`].
    async fn set_len(&self, file: &Self::File, len: u64) -> Result<(), StorageError>;
    /// Reserves the file's blocks up to `len` without changing its length (`fallocate` with
    /// `FALLOC_FL_KEEP_SIZE`), so that appends below `len` find their blocks allocated: a
    /// durable append then writes no allocation bitmap (decision 514). Only a hint: the bytes
    /// the file holds and its length do not change, and a backend without it does nothing.
    async fn reserve_blocks(&self, _file: &Self::File, _len: u64) -> Result<(), StorageError> {
        Ok(())
    }
    /// Removes a file, durably.
    async fn remove(&self, name: &str) -> Result<(), StorageError>;
    /// Closes `file` and removes it by `name`, durably: a file its owner is done with (a
    /// reclaimed WAL file). The default drops the handle, then [`Storage::remove`]s the name. A
    /// backend over a file system may drop the last descriptor away from the caller's thread:
    /// that close is where the kernel frees the file's blocks, tens of milliseconds for a
    /// 64 MiB file on a file system mounted with online discard (decision 400).
    async fn retire(&self, file: Self::File, name: &str) -> Result<(), StorageError> {
        drop(file);
        self.remove(name).await
    }
    /// Names of every file, sorted.
    async fn list(&self) -> Result<Vec<String>, StorageError>;
    /// Where the files live, for error messages (a backend over a directory names it).
    fn location(&self) -> String {
        String::from("(storage)")
    }
}

/// The sorted file names of a directory: `list` of both file-backed stores.
pub(crate) fn list_dir(root: &std::path::Path) -> Result<Vec<String>, StorageError> {
    let name = root.display().to_string();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root).map_err(|e| StorageError::io("list", &name, &e))? {
        let entry = entry.map_err(|e| StorageError::io("list", &name, &e))?;
        if let Some(n) = entry.file_name().to_str() {
            names.push(n.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Creates a data directory (and missing ancestors) so that its entry is durable before
/// anything in it can be: the parent of every directory created here is synced, and so are the
/// data directory itself and its parent every time, because an earlier process may have created
/// either (or files inside) and died before the sync (`open` syncs only what it creates).
pub(crate) fn create_root(root: &std::path::Path) -> Result<(), StorageError> {
    let name = root.display().to_string();
    let mut created = Vec::new();
    let mut at = Some(root);
    while let Some(dir) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        created.push(dir.to_owned());
        at = dir.parent();
    }
    std::fs::create_dir_all(root).map_err(|e| StorageError::io("mkdir", &name, &e))?;
    let parent = |dir: &std::path::Path| match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => std::path::PathBuf::from("."),
    };
    // Innermost first: the data directory's own entries, then each entry up the created chain.
    let mut synced = vec![root.to_owned()];
    sync_dir(root)?;
    for dir in std::iter::once(root.to_owned()).chain(created) {
        let up = parent(&dir);
        if !synced.contains(&up) {
            sync_dir(&up)?;
            synced.push(up);
        }
    }
    Ok(())
}

/// Makes a directory's entries (creates, renames, removes) durable.
pub(crate) fn sync_dir(root: &std::path::Path) -> Result<(), StorageError> {
    let name = root.display().to_string();
    let dir = std::fs::File::open(root).map_err(|e| StorageError::io("open dir", &name, &e))?;
    dir.sync_all()
        .map_err(|e| StorageError::io("sync dir", &name, &e))
}

pub(crate) fn check_name(name: &str) -> Result<(), StorageError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." || name.contains('\0') {
        return Err(StorageError::BadName(name.to_owned()));
    }
    Ok(())
}

pub(crate) fn check_aligned(
    op: &'static str,
    name: &str,
    offset: u64,
    len: usize,
) -> Result<(), StorageError> {
    if !offset.is_multiple_of(SECTOR as u64) || !len.is_multiple_of(SECTOR) {
        return Err(StorageError::Unaligned {
            op,
            name: name.to_owned(),
            offset,
            len,
        });
    }
    Ok(())
}

/// Rounds up to a whole number of sectors.
pub const fn sector_ceil(len: u64) -> u64 {
    len.div_ceil(SECTOR as u64) * SECTOR as u64
}

/// Runs a future that never waits on an external event to completion on the current thread:
/// the in-memory and std-file backends complete on their first poll. Panics if the future stays
/// pending for a million polls (it would be waiting for a reactor that is not there).
pub fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut context = Context::from_waker(Waker::noop());
    for _ in 0..1_000_000 {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
    }
    panic!("block_on: future pending without a reactor");
}

/// Whether every byte is zero. Recovery asks this of every slot, ring sector and WAL tail it
/// scans; words are OR-ed a block at a time so the compiler can vectorize it, where a byte-wise
/// `all` stops it at every byte.
pub fn is_zero(bytes: &[u8]) -> bool {
    let mut blocks = bytes.chunks_exact(256);
    for block in &mut blocks {
        let mut acc = 0u64;
        for word in block.chunks_exact(8) {
            acc |= u64::from_ne_bytes(word.try_into().expect("8 bytes"));
        }
        if acc != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|b| *b == 0)
}

/// Reads exactly `buf.len()` bytes or reports how many were there: a helper over
/// [`Storage::read_at`] for layouts that read whole regions.
pub async fn read_exact_at<S: Storage + ?Sized>(
    storage: &S,
    file: &S::File,
    offset: u64,
    buf: &mut [u8],
) -> Result<usize, StorageError> {
    let mut done = 0;
    while done < buf.len() {
        let n = storage
            .read_at(file, offset + done as u64, &mut buf[done..])
            .await?;
        if n == 0 {
            break;
        }
        done += n;
        if !done.is_multiple_of(SECTOR) {
            break; // end of file inside a sector: nothing follows
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::is_zero;

    #[test]
    fn is_zero_sees_any_set_byte_at_any_length() {
        for len in [0usize, 1, 7, 8, 255, 256, 257, 4096, 4100] {
            let mut bytes = vec![0u8; len];
            assert!(is_zero(&bytes), "len {len}");
            for at in 0..len {
                bytes[at] = 0x80;
                assert!(!is_zero(&bytes), "len {len}, byte {at}");
                bytes[at] = 0;
            }
        }
    }
}
