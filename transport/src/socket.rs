//! UDP sockets under QUIC: the real one, sized for bulk transfers; the wrapper every endpoint
//! puts around its socket so that quinn's batches of datagrams never exceed one UDP send
//! ([`WholeBatches`]); and the quinn socket traits re-exported so that `chaos` can put a
//! faulty socket under an [`Endpoint`] without importing quinn.
//!
//! [`Endpoint`]: crate::Endpoint

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::{Runtime, TokioRuntime};
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::TransportConfig;

pub use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
pub use quinn::{AsyncUdpSocket, UdpPoller};

/// Binds a UDP socket at `addr` with send and receive buffers of `socket_buffer_bytes`.
///
/// The kernel may cap the sizes (`net.core.rmem_max`); a warning is logged when it does.
pub fn bind_udp(addr: SocketAddr, config: &TransportConfig) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        // Dual-stack where the platform allows; not fatal where it does not.
        let _ = socket.set_only_v6(false);
    }
    socket.set_recv_buffer_size(config.socket_buffer_bytes)?;
    socket.set_send_buffer_size(config.socket_buffer_bytes)?;
    let recv = socket.recv_buffer_size()?;
    let send = socket.send_buffer_size()?;
    if recv < config.socket_buffer_bytes || send < config.socket_buffer_bytes {
        // Linux caps silently at net.core.rmem_max / wmem_max; bulk transfers may then drop.
        tracing::warn!(
            requested = config.socket_buffer_bytes,
            recv,
            send,
            "UDP socket buffers smaller than requested; raise net.core.rmem_max/wmem_max"
        );
    }
    socket.bind(&addr.into())?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// Wraps a bound std socket as quinn's tokio socket (must run inside a tokio runtime).
pub fn wrap_udp(socket: std::net::UdpSocket) -> io::Result<Arc<dyn AsyncUdpSocket>> {
    TokioRuntime.wrap_udp_socket(socket)
}

/// The most bytes one UDP send carries, its datagrams' payloads together: an IPv4 packet of
/// 65,535 bytes less its 20-byte IP header and the 8-byte UDP header (IPv6 allows 20 more).
pub const UDP_SEND_MAX: usize = 65_507;

/// The socket under every endpoint's quinn: sends each batch of datagrams quinn hands it in as
/// few system calls as the kernel takes.
///
/// quinn builds up to 10 datagrams of the path's MTU into one segmentation-offload send
/// (`UDP_SEGMENT`), and the kernel refuses (`EMSGSIZE`) a send whose datagrams together pass
/// [`UDP_SEND_MAX`]: with datagrams of 6,551 bytes or more (loopback, jumbo frames) every full
/// batch was lost and sent again. A batch that does not fit goes out here as several sends of
/// as many whole datagrams as fit each (one datagram alone where only one fits), in order, so
/// path-MTU discovery may settle on any datagram size a path carries, up to 65,507 bytes on
/// loopback, and each datagram still carries its own QUIC packet. Receiving is the inner
/// socket's, unchanged.
#[derive(Debug)]
pub struct WholeBatches {
    inner: Arc<dyn AsyncUdpSocket>,
}

impl WholeBatches {
    /// Wraps `inner` (the real socket, or one a test or `chaos` made).
    pub fn new(inner: Arc<dyn AsyncUdpSocket>) -> Self {
        Self { inner }
    }
}

impl AsyncUdpSocket for WholeBatches {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        let segment = match transmit.segment_size {
            Some(segment) if segment > 0 && transmit.contents.len() > UDP_SEND_MAX => segment,
            _ => return self.inner.try_send(transmit),
        };
        // Whole datagrams per send (the last datagram of a batch may be shorter than the
        // segment size, never longer).
        let per_send = (UDP_SEND_MAX / segment).max(1) * segment;
        for (i, part) in transmit.contents.chunks(per_send).enumerate() {
            let sent = self.inner.try_send(&Transmit {
                destination: transmit.destination,
                ecn: transmit.ecn,
                contents: part,
                segment_size: (part.len() > segment).then_some(segment),
                src_ip: transmit.src_ip,
            });
            match sent {
                Ok(()) => {}
                // Nothing went out yet: quinn keeps the batch and tries it again when the
                // socket is writable.
                Err(e) if i == 0 => return Err(e),
                // Part of the batch went out: the rest counts as lost on the way, which QUIC
                // detects and sends again (a batch tried again whole would send the first
                // part twice).
                Err(_) => return Ok(()),
            }
        }
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A socket that records each send's datagram sizes and, like the kernel, refuses a send
    /// of more than [`UDP_SEND_MAX`] bytes; `would_block_at` makes that send (by number) fail
    /// with `WouldBlock`.
    #[derive(Debug, Default)]
    struct Recording {
        sends: Mutex<Vec<Vec<usize>>>,
        would_block_at: Option<usize>,
    }

    #[derive(Debug)]
    struct NeverWritable;

    impl UdpPoller for NeverWritable {
        fn poll_writable(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncUdpSocket for Recording {
        fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
            Box::pin(NeverWritable)
        }

        fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
            let mut sends = self.sends.lock().unwrap();
            if self.would_block_at == Some(sends.len()) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if transmit.contents.len() > UDP_SEND_MAX {
                return Err(io::Error::from_raw_os_error(90)); // EMSGSIZE
            }
            let segment = transmit.segment_size.unwrap_or(transmit.contents.len());
            sends.push(transmit.contents.chunks(segment).map(<[u8]>::len).collect());
            Ok(())
        }

        fn poll_recv(
            &self,
            _: &mut Context<'_>,
            _: &mut [IoSliceMut<'_>],
            _: &mut [RecvMeta],
        ) -> Poll<io::Result<usize>> {
            Poll::Pending
        }

        fn local_addr(&self) -> io::Result<SocketAddr> {
            Ok(SocketAddr::from(([127, 0, 0, 1], 9)))
        }
    }

    fn send(
        socket: &WholeBatches,
        segment: usize,
        datagrams: usize,
        last: usize,
    ) -> io::Result<()> {
        let contents = vec![7u8; segment * (datagrams - 1) + last];
        socket.try_send(&Transmit {
            destination: SocketAddr::from(([127, 0, 0, 1], 10)),
            ecn: None,
            contents: &contents,
            segment_size: (datagrams > 1).then_some(segment),
            src_ip: None,
        })
    }

    fn wrapped(would_block_at: Option<usize>) -> (Arc<Recording>, WholeBatches) {
        let inner = Arc::new(Recording {
            would_block_at,
            ..Recording::default()
        });
        (inner.clone(), WholeBatches::new(inner))
    }

    /// A batch that fits goes out as quinn built it; one that does not goes out as several
    /// sends of whole datagrams, in order, each within one UDP send, none lost or cut.
    #[test]
    fn a_batch_of_datagrams_goes_out_whole_in_sends_the_kernel_takes() {
        let (inner, socket) = wrapped(None);
        send(&socket, 6_400, 10, 6_400).unwrap();
        send(&socket, 9_000, 10, 100).unwrap();
        send(&socket, 65_000, 3, 20).unwrap();
        send(&socket, 65_507, 1, 65_507).unwrap();
        let sends = inner.sends.lock().unwrap().clone();
        assert_eq!(
            sends,
            vec![
                vec![6_400; 10],
                vec![9_000; 7],
                vec![9_000, 9_000, 100],
                vec![65_000],
                vec![65_000],
                vec![20],
                vec![65_507],
            ]
        );
    }

    /// A batch refused before any of it went out is refused (quinn tries it again when the
    /// socket is writable); once part of it went out, the rest counts as lost, so no datagram
    /// is sent twice.
    #[test]
    fn a_full_socket_refuses_a_batch_only_before_any_of_it_went_out() {
        let (inner, socket) = wrapped(Some(0));
        let err = send(&socket, 65_000, 3, 65_000).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(inner.sends.lock().unwrap().is_empty());
        let (inner, socket) = wrapped(Some(1));
        send(&socket, 65_000, 3, 65_000).unwrap();
        assert_eq!(inner.sends.lock().unwrap().clone(), vec![vec![65_000]]);
    }
}
