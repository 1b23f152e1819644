//! The byte transport under a replica connection: a glommio TCP stream, optionally carrying an
//! established rustls session, split into a read half and a write half that run in two tasks.
//!
//! futures-rustls drives the TLS handshakes; once a session is established it is taken out of
//! the futures-rustls stream ([`Stream`]) because a session must be able to move to another
//! shard with its socket ([`Detached`], which is `Send`), and futures-rustls cannot rebuild a
//! stream from a moved session. The two halves then share the session through a `RefCell`,
//! borrowed only inside synchronous sections, never across an await.

use std::cell::RefCell;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::rc::Rc;

use bytes::Bytes;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use socket2::SockRef;

/// Ciphertext read per socket read on a TLS connection.
const TLS_READ_CHUNK: usize = 64 * 1024;

/// An established connection, not yet split.
pub struct Stream {
    pub(crate) tcp: TcpStream,
    pub(crate) tls: Option<rustls::Connection>,
}

/// A connection in transit between shards: the socket (a `F_DUPFD_CLOEXEC` duplicate; the
/// sending shard has closed its own descriptor) and the established TLS session if any.
#[derive(Debug)]
pub struct Detached {
    pub(crate) socket: socket2::Socket,
    /// Boxed: a session is about a kilobyte, and a detached connection travels through
    /// channels by value.
    pub(crate) tls: Option<Box<rustls::Connection>>,
}

fn duplicate(tcp: &TcpStream) -> io::Result<socket2::Socket> {
    // socket2 duplicates with F_DUPFD_CLOEXEC: the copy is close-on-exec atomically.
    SockRef::from(tcp).try_clone()
}

impl Stream {
    /// Moves the connection out of this executor: duplicates the socket and closes this
    /// executor's descriptor (the kernel socket lives on through the duplicate).
    pub fn detach(self) -> io::Result<Detached> {
        let socket = duplicate(&self.tcp)?;
        drop(self.tcp);
        Ok(Detached {
            socket,
            tls: self.tls.map(Box::new),
        })
    }

    /// Registers a detached connection with the current executor.
    pub fn attach(detached: Detached) -> Stream {
        Stream {
            tcp: TcpStream::from(detached.socket),
            tls: detached.tls.map(|session| *session),
        }
    }

    /// Splits into the halves the reader and writer tasks own. Each half gets its own
    /// descriptor of the socket so that the two tasks never share a glommio stream.
    pub fn split(self) -> io::Result<(ReadHalf, WriteHalf)> {
        let write_tcp = TcpStream::from(duplicate(&self.tcp)?);
        let tls = self.tls.map(|session| Rc::new(RefCell::new(session)));
        Ok((
            ReadHalf {
                tcp: self.tcp,
                tls: tls.clone(),
                cipher: Vec::new(),
                pending: 0..0,
            },
            WriteHalf {
                tcp: write_tcp,
                tls,
                out: Vec::new(),
            },
        ))
    }

    /// Closes both directions now; a pending read on any descriptor of the socket returns EOF.
    pub fn shutdown(&self) {
        let _ = SockRef::from(&self.tcp).shutdown(Shutdown::Both);
    }
}

/// The reading half.
pub struct ReadHalf {
    tcp: TcpStream,
    tls: Option<Rc<RefCell<rustls::Connection>>>,
    cipher: Vec<u8>,
    pending: std::ops::Range<usize>,
}

fn invalid_data(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

impl ReadHalf {
    /// Reads plaintext into `buf`; `Ok(0)` is the end of the stream. Returns whether the TLS
    /// session now has records to send (a key update answer), so the caller can wake the writer.
    pub async fn read(&mut self, buf: &mut [u8]) -> io::Result<(usize, bool)> {
        let Some(session) = &self.tls else {
            return Ok((self.tcp.read(buf).await?, false));
        };
        let session = session.clone();
        if self.cipher.is_empty() {
            self.cipher = vec![0; TLS_READ_CHUNK];
        }
        loop {
            {
                let mut session = session.borrow_mut();
                match session.reader().read(buf) {
                    Ok(n) => return Ok((n, session.wants_write())),
                    Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                    Err(error) => return Err(error),
                }
                if !self.pending.is_empty() {
                    // The plaintext buffer is empty here, so read_tls has room.
                    let mut input = &self.cipher[self.pending.clone()];
                    let before = input.len();
                    session.read_tls(&mut input)?;
                    self.pending.start += before - input.len();
                    session.process_new_packets().map_err(invalid_data)?;
                    continue;
                }
            }
            let n = self.tcp.read(&mut self.cipher).await?;
            if n == 0 {
                return Ok((0, false));
            }
            self.pending = 0..n;
        }
    }
}

/// Writes every byte of `parts`, in order, to a plaintext stream: vectored `sendmsg` calls
/// (one system call for all parts when the socket has room); when the socket is full, glommio
/// waits for room and sends the next slice. Parts are never joined.
pub async fn write_vectored_all(tcp: &mut TcpStream, parts: &[Bytes]) -> io::Result<()> {
    let mut cursor = Cursor::default();
    cursor.advance(parts, 0);
    while !cursor.done(parts) {
        let slices = cursor.slices(parts);
        let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        match SockRef::from(&*tcp).send_vectored_with_flags(&slices, flags) {
            Ok(n) => cursor.advance(parts, n),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                let n = tcp.write(&slices[0]).await?;
                cursor.advance(parts, n);
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// The writing half.
pub struct WriteHalf {
    tcp: TcpStream,
    tls: Option<Rc<RefCell<rustls::Connection>>>,
    out: Vec<u8>,
}

/// A position inside a batch of frames.
#[derive(Debug, Default, Clone, Copy)]
struct Cursor {
    frame: usize,
    offset: usize,
}

impl Cursor {
    fn slices<'a>(&self, frames: &'a [Bytes]) -> Vec<IoSlice<'a>> {
        frames[self.frame.min(frames.len())..]
            .iter()
            .enumerate()
            .map(|(i, frame)| {
                let skip = if i == 0 { self.offset } else { 0 };
                IoSlice::new(&frame[skip..])
            })
            .filter(|slice| !slice.is_empty())
            .collect()
    }

    fn advance(&mut self, frames: &[Bytes], mut n: usize) {
        while n > 0 && self.frame < frames.len() {
            let left = frames[self.frame].len() - self.offset;
            if n < left {
                self.offset += n;
                return;
            }
            n -= left;
            self.frame += 1;
            self.offset = 0;
        }
        // Skip empty frames so `done` sees the end.
        while self.frame < frames.len() && frames[self.frame].len() == self.offset {
            self.frame += 1;
            self.offset = 0;
        }
    }

    fn done(&self, frames: &[Bytes]) -> bool {
        self.frame >= frames.len()
    }
}

impl WriteHalf {
    /// Writes every byte of `frames`, in order: vectored `sendmsg` calls on plaintext (one
    /// system call for the whole batch when the socket has room), or the session's records.
    pub async fn write_frames(&mut self, frames: &[Bytes]) -> io::Result<()> {
        let mut cursor = Cursor::default();
        cursor.advance(frames, 0);
        if let Some(session) = self.tls.clone() {
            while !cursor.done(frames) {
                let written = session
                    .borrow_mut()
                    .writer()
                    .write_vectored(&cursor.slices(frames))?;
                cursor.advance(frames, written);
                self.flush_tls(&session).await?;
            }
            return Ok(());
        }
        write_vectored_all(&mut self.tcp, frames).await
    }

    /// Sends whatever records the session holds (after a batch, or a key update answer).
    pub async fn flush(&mut self) -> io::Result<()> {
        match self.tls.clone() {
            Some(session) => self.flush_tls(&session).await,
            None => Ok(()),
        }
    }

    async fn flush_tls(&mut self, session: &RefCell<rustls::Connection>) -> io::Result<()> {
        loop {
            self.out.clear();
            {
                let mut session = session.borrow_mut();
                while session.wants_write() {
                    session.write_tls(&mut self.out)?;
                }
            }
            if self.out.is_empty() {
                return Ok(());
            }
            self.tcp.write_all(&self.out).await?;
        }
    }

    /// Closes both directions of the socket; the reader sees EOF.
    pub fn shutdown(&self) {
        let _ = SockRef::from(&self.tcp).shutdown(Shutdown::Both);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_walks_frames_and_partial_writes() {
        let frames = vec![
            Bytes::from_static(b"abc"),
            Bytes::new(),
            Bytes::from_static(b"defg"),
        ];
        let mut cursor = Cursor::default();
        assert_eq!(cursor.slices(&frames).len(), 2);
        cursor.advance(&frames, 2);
        let slices = cursor.slices(&frames);
        assert_eq!(&*slices[0], b"c");
        assert_eq!(&*slices[1], b"defg");
        cursor.advance(&frames, 3);
        assert_eq!(&*cursor.slices(&frames)[0], b"fg");
        assert!(!cursor.done(&frames));
        cursor.advance(&frames, 2);
        assert!(cursor.done(&frames));
        assert!(cursor.slices(&frames).is_empty());
    }
}
