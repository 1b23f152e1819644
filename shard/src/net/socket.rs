//! TCP sockets with a congestion control chosen by the operator (decision 501).
//!
//! The name is set before a socket listens or connects. A connection's first congestion
//! control can leave state behind that a later switch does not undo: BBR turns on the kernel's
//! own pacing of the socket, and that stays on under whatever control replaces it. A listening
//! socket passes its choice to every connection it accepts.
//!
//! Used by the node (replica listener and dials, client listeners) and by `strand bench`
//! (its connections and its loopback probes).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::time::Duration;

use futures_lite::AsyncWriteExt;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// The longest name the kernel takes (its `TCP_CA_NAME_MAX` of 16 holds the NUL too).
pub const NAME_MAX: usize = 15;

/// A TCP congestion control's name, as the kernel lists them in
/// `/proc/sys/net/ipv4/tcp_available_congestion_control` (`cubic`, `reno`, `bbr`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CongestionControl(String);

/// Why a name is not a congestion control's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The empty name.
    #[error("the name is empty")]
    Empty,
    /// Longer than [`NAME_MAX`] bytes.
    #[error("the name is {0} bytes, the kernel takes at most {NAME_MAX}")]
    TooLong(usize),
    /// A byte other than an ASCII letter, digit, `_` or `-`.
    #[error("the name has {0:?}; names are ASCII letters, digits, '_' and '-'")]
    Char(char),
}

impl CongestionControl {
    /// Checks the shape of `name` (not whether this kernel has it: [`Self::check`]).
    pub fn new(name: &str) -> Result<CongestionControl, NameError> {
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > NAME_MAX {
            return Err(NameError::TooLong(name.len()));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
        {
            return Err(NameError::Char(c));
        }
        Ok(CongestionControl(name.to_string()))
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.0
    }

    /// Sets it on `socket` (`TCP_CONGESTION`).
    pub fn apply(&self, socket: &impl AsRawFd) -> io::Result<()> {
        let name = self.0.as_bytes();
        // SAFETY: `name` is a live slice for the call and its length is passed with it; the
        // kernel copies at most that many bytes. `socket` owns an open descriptor.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_ptr().cast(),
                name.len() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Whether this kernel lets this process use the name: set on a socket of its own, which
    /// is then closed. The error says which kernel list to look at.
    pub fn check(&self) -> io::Result<()> {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        self.apply(&socket).map_err(|error| {
            let hint = match error.raw_os_error() {
                Some(libc::ENOENT) => {
                    "not available in this kernel (see net.ipv4.tcp_available_congestion_control; \
                     a module such as tcp_bbr may need loading)"
                }
                Some(libc::EPERM) => {
                    "not allowed for this process (see net.ipv4.tcp_allowed_congestion_control)"
                }
                _ => "refused by the kernel",
            };
            io::Error::new(
                error.kind(),
                format!("TCP congestion control {:?}: {hint}: {error}", self.0),
            )
        })
    }
}

impl std::fmt::Display for CongestionControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The congestion control `socket` runs under (`TCP_CONGESTION` read back).
pub fn congestion_control_of(socket: &impl AsRawFd) -> io::Result<String> {
    let mut name = [0u8; NAME_MAX + 1];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: `name` is writable for `len` bytes and `len` is a live location the kernel
    // updates with the bytes it wrote; `socket` owns an open descriptor.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let written = &name[..(len as usize).min(name.len())];
    let end = written
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(written.len());
    Ok(String::from_utf8_lossy(&written[..end]).into_owned())
}

fn tcp_socket(addr: &SocketAddr, congestion: Option<&CongestionControl>) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(*addr),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    if let Some(congestion) = congestion {
        congestion.apply(&socket)?;
    }
    Ok(socket)
}

/// Which address reuse a listener asks for before it binds.
enum Reuse {
    /// `SO_REUSEPORT`, as `glommio::net::TcpListener::bind` (every shard binds the client port).
    Port,
    /// `SO_REUSEADDR`, as `std::net::TcpListener::bind`.
    Address,
}

/// A TCP socket on `addr` with `congestion` set, then `reuse`, bound and listening with a
/// backlog of 1024 (both glommio's and std's).
fn listening(
    addr: SocketAddr,
    congestion: Option<&CongestionControl>,
    reuse: Reuse,
) -> io::Result<Socket> {
    let socket = tcp_socket(&addr, congestion)?;
    match reuse {
        Reuse::Port => socket.set_reuse_port(true)?,
        Reuse::Address => socket.set_reuse_address(true)?,
    }
    socket.bind(&SockAddr::from(addr))?;
    socket.listen(1024)?;
    Ok(socket)
}

/// Binds and listens on `addr` as `glommio::net::TcpListener::bind` does, with `congestion`
/// set before it listens. Call on a glommio executor.
pub fn listener(
    addr: SocketAddr,
    congestion: Option<&CongestionControl>,
) -> io::Result<glommio::net::TcpListener> {
    let socket = listening(addr, congestion, Reuse::Port)?;
    // SAFETY: `into_raw_fd` gives up the descriptor of a TCP socket this function created,
    // bound and set listening, so the listener becomes its only owner.
    Ok(unsafe { glommio::net::TcpListener::from_raw_fd(socket.into_raw_fd()) })
}

/// Connects to `addr` within `timeout`, with `congestion` set before the connection starts.
/// Call on a glommio executor.
pub async fn connect(
    addr: SocketAddr,
    timeout: Duration,
    congestion: Option<&CongestionControl>,
) -> io::Result<glommio::net::TcpStream> {
    let socket = tcp_socket(&addr, congestion)?;
    // Started without blocking the executor, then handed back to blocking mode, which is how
    // glommio keeps the streams it makes (each of its calls asks for no wait itself).
    socket.set_nonblocking(true)?;
    match socket.connect(&SockAddr::from(addr)) {
        Ok(()) => {}
        Err(error) if error.raw_os_error() == Some(libc::EINPROGRESS) => {}
        Err(error) => return Err(error),
    }
    socket.set_nonblocking(false)?;
    let mut stream = glommio::net::TcpStream::from(socket);
    // An empty send waits until the socket can send, which is when the connection is up, and
    // fails with the connection's error if it could not be made.
    let waited = glommio::timer::timeout(timeout, async {
        stream.write(&[]).await.map_err(glommio::GlommioError::from)
    })
    .await;
    match waited {
        Ok(_) => {}
        Err(glommio::GlommioError::IoError(error)) => return Err(error),
        Err(glommio::GlommioError::TimedOut(_)) => {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting to {addr}: no answer within {timeout:?}"),
            ));
        }
        Err(other) => return Err(io::Error::other(format!("connecting to {addr}: {other}"))),
    }
    match socket2::SockRef::from(&stream).take_error()? {
        Some(error) => Err(error),
        None => Ok(stream),
    }
}

/// A blocking [`std::net::TcpListener`] on `addr` with `congestion` set before it listens.
pub fn std_listener(
    addr: SocketAddr,
    congestion: Option<&CongestionControl>,
) -> io::Result<std::net::TcpListener> {
    Ok(listening(addr, congestion, Reuse::Address)?.into())
}

/// A blocking [`std::net::TcpStream`] connected to `addr` within `timeout`, with `congestion`
/// set before the connection starts.
pub fn std_connect(
    addr: SocketAddr,
    timeout: Duration,
    congestion: Option<&CongestionControl>,
) -> io::Result<std::net::TcpStream> {
    let socket = tcp_socket(&addr, congestion)?;
    socket.connect_timeout(&SockAddr::from(addr), timeout)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    use super::*;

    /// `reno` is built into every Linux kernel and allowed for every process.
    fn reno() -> CongestionControl {
        CongestionControl::new("reno").unwrap()
    }

    /// A control this kernel offers that is not its default, so that a socket left alone
    /// would show the default instead.
    fn not_default() -> CongestionControl {
        let default = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .expect("read the kernel's default congestion control");
        if default.trim() == "reno" {
            CongestionControl::new("cubic").unwrap()
        } else {
            reno()
        }
    }

    fn loopback() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }

    #[test]
    fn names_are_checked_for_shape() {
        assert_eq!(reno().name(), "reno");
        assert_eq!(CongestionControl::new(""), Err(NameError::Empty));
        assert_eq!(
            CongestionControl::new("a_name_of_16_byt"),
            Err(NameError::TooLong(16))
        );
        assert_eq!(CongestionControl::new("cu bic"), Err(NameError::Char(' ')));
        assert_eq!(CongestionControl::new("bbr\0"), Err(NameError::Char('\0')));
        assert!(CongestionControl::new("a_name_of_15_by").is_ok());
    }

    #[test]
    fn the_kernel_is_asked_whether_it_has_the_name() {
        reno().check().expect("reno is always there");
        let error = CongestionControl::new("no_such_cc")
            .unwrap()
            .check()
            .expect_err("no kernel has it");
        let message = error.to_string();
        assert!(message.contains("no_such_cc"), "{message}");
        assert!(
            message.contains("tcp_available_congestion_control"),
            "{message}"
        );
    }

    #[test]
    fn blocking_sockets_run_under_the_control_on_both_ends() {
        let cc = not_default();
        let listener = std_listener(loopback(), Some(&cc)).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut dialed = std_connect(addr, Duration::from_secs(5), Some(&cc)).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        assert_eq!(congestion_control_of(&dialed).unwrap(), cc.name());
        assert_eq!(congestion_control_of(&accepted).unwrap(), cc.name());
        dialed.write_all(b"ping").unwrap();
        let mut got = [0; 4];
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        // Without a choice a socket runs under the kernel's default.
        let plain = std_connect(addr, Duration::from_secs(5), None).unwrap();
        assert_ne!(congestion_control_of(&plain).unwrap(), cc.name());
    }

    #[test]
    fn glommio_sockets_run_under_the_control_and_a_refused_or_unanswered_dial_fails() {
        let handle = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(64 << 10)
            .spawn(|| async move {
                let cc = not_default();
                let listener = listener(loopback(), Some(&cc)).unwrap();
                let addr = listener.local_addr().unwrap();
                let dial = glommio::spawn_local({
                    let cc = cc.clone();
                    async move { connect(addr, Duration::from_secs(5), Some(&cc)).await }
                });
                let accepted = listener.accept().await.unwrap();
                let mut dialed = dial.await.unwrap();
                assert_eq!(congestion_control_of(&dialed).unwrap(), cc.name());
                assert_eq!(congestion_control_of(&accepted).unwrap(), cc.name());
                dialed.write_all(b"ping").await.unwrap();
                let mut accepted = accepted;
                let mut got = [0; 4];
                futures_lite::AsyncReadExt::read_exact(&mut accepted, &mut got)
                    .await
                    .unwrap();
                assert_eq!(&got, b"ping");
                // A port nobody listens on: the dial fails, it does not hang or succeed.
                let closed = {
                    let l = std::net::TcpListener::bind(loopback()).unwrap();
                    l.local_addr().unwrap()
                };
                let refused = connect(closed, Duration::from_secs(5), Some(&cc)).await;
                assert!(refused.is_err(), "a dial to a closed port succeeded");
                // A listener whose accept queue is full drops new handshakes: the dial
                // gives up at its timeout with `TimedOut`.
                let full = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
                full.bind(&SockAddr::from(loopback())).unwrap();
                full.listen(0).unwrap();
                let full_addr = full.local_addr().unwrap().as_socket().unwrap();
                let mut queued = Vec::new();
                let started = std::time::Instant::now();
                let timed_out = loop {
                    match connect(full_addr, Duration::from_millis(200), None).await {
                        Ok(stream) => queued.push(stream),
                        Err(error) => break error,
                    }
                    assert!(queued.len() < 16, "the accept queue never filled");
                };
                assert_eq!(timed_out.kind(), io::ErrorKind::TimedOut, "{timed_out}");
                assert!(started.elapsed() < Duration::from_secs(10));
            })
            .unwrap();
        handle.join().unwrap();
    }
}
