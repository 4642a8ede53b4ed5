//! [`PeerAddr`]: where to dial a peer. Either a socket address, or a `host:port` name that is
//! resolved again on every dial (bounded by [`PeerAddr::RESOLVE_WAIT`]), so that a peer
//! recreated under the same name with a new IP (a Kubernetes pod) is reached at its new
//! address, and a name that does not resolve yet is a dial that fails for now (the caller
//! retries within its own wait), not a fatal error. Owns the name lookup and its last answer;
//! does no other IO.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Looks names up. The system resolver by default ([`SystemResolver`]); a test or a deployment
/// may give its own. `lookup` may block: it runs on a blocking thread, abandoned when it does
/// not answer within [`PeerAddr::RESOLVE_WAIT`].
pub trait Resolver: Send + Sync + 'static {
    /// The addresses `host:port` names now, best first; an error says why there are none.
    fn lookup(&self, host_port: &str) -> Result<Vec<SocketAddr>, LookupError>;
}

/// Why a [`Resolver`] has no address for a name.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    /// The system resolver failed (`getaddrinfo`: an unknown name, no DNS server, a
    /// malformed `host:port`).
    #[error(transparent)]
    System(#[from] std::io::Error),
    /// The resolver knows no address for the name (not yet, or not any more).
    #[error("no such host")]
    NoSuchHost,
}

/// The system resolver (`getaddrinfo`: `/etc/hosts`, DNS).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolver for SystemResolver {
    fn lookup(&self, host_port: &str) -> Result<Vec<SocketAddr>, LookupError> {
        Ok(host_port.to_socket_addrs()?.collect())
    }
}

/// Where to dial a peer: a fixed socket address, or a `host:port` name resolved on every dial.
/// Cheap to clone; clones share the last resolution.
#[derive(Clone)]
pub struct PeerAddr(Kind);

#[derive(Clone)]
enum Kind {
    Fixed(SocketAddr),
    Name {
        host_port: Arc<str>,
        resolver: Arc<dyn Resolver>,
        last: Arc<Mutex<Option<SocketAddr>>>,
    },
}

impl PeerAddr {
    /// Bound on one name lookup.
    pub const RESOLVE_WAIT: Duration = Duration::from_secs(5);

    /// `host:port`: a literal socket address is used as it is; anything else is a name that
    /// the system resolver looks up on every dial.
    pub fn new(host_port: &str) -> PeerAddr {
        Self::with_resolver(host_port, Arc::new(SystemResolver))
    }

    /// Like [`new`](Self::new), with names looked up by `resolver`.
    pub fn with_resolver(host_port: &str, resolver: Arc<dyn Resolver>) -> PeerAddr {
        match host_port.parse::<SocketAddr>() {
            Ok(addr) => PeerAddr(Kind::Fixed(addr)),
            Err(_) => PeerAddr(Kind::Name {
                host_port: host_port.into(),
                resolver,
                last: Arc::new(Mutex::new(None)),
            }),
        }
    }

    /// The address last dialed: the fixed one, or the name's last resolution (`None` before
    /// the first).
    pub fn last_resolved(&self) -> Option<SocketAddr> {
        match &self.0 {
            Kind::Fixed(addr) => Some(*addr),
            Kind::Name { last, .. } => *last.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Whether this is a name (resolved on every dial) rather than a fixed address.
    pub fn is_name(&self) -> bool {
        matches!(self.0, Kind::Name { .. })
    }

    /// Resolves the address now, within [`RESOLVE_WAIT`](Self::RESOLVE_WAIT). IPv4 answers come
    /// first: a node binds `0.0.0.0` on its port when its own address is a name. `Err` says
    /// why the name does not resolve (yet), naming it.
    pub async fn resolve(&self) -> Result<SocketAddr, ResolveError> {
        let (host_port, resolver, last) = match &self.0 {
            Kind::Fixed(addr) => return Ok(*addr),
            Kind::Name {
                host_port,
                resolver,
                last,
            } => (host_port, resolver, last),
        };
        let lookup = {
            let (host_port, resolver) = (Arc::clone(host_port), Arc::clone(resolver));
            // A blocking lookup that does not answer in time is abandoned on its thread.
            tokio::task::spawn_blocking(move || resolver.lookup(&host_port))
        };
        let wait = Self::RESOLVE_WAIT;
        let host_port = host_port.to_string();
        let addrs = match tokio::time::timeout(wait, lookup).await {
            Ok(Ok(Ok(addrs))) => addrs,
            Ok(Ok(Err(reason))) => return Err(ResolveError::Refused { host_port, reason }),
            Ok(Err(source)) => return Err(ResolveError::LookupFailed { host_port, source }),
            Err(_) => return Err(ResolveError::TimedOut { host_port, wait }),
        };
        let addr = pick(&addrs).ok_or(ResolveError::NoAddress { host_port })?;
        *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(addr);
        Ok(addr)
    }
}

/// Why a peer's `host:port` name does not resolve (yet): a dial that fails for now.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The resolver answered that the name has no address.
    #[error("{host_port} does not resolve: {reason}")]
    Refused {
        /// The name.
        host_port: String,
        /// The resolver's reason.
        #[source]
        reason: LookupError,
    },
    /// The lookup's thread ended without an answer (it panicked, or the runtime is shutting
    /// down).
    #[error("{host_port} does not resolve: the name lookup failed: {source}")]
    LookupFailed {
        /// The name.
        host_port: String,
        /// How the lookup's thread ended.
        source: tokio::task::JoinError,
    },
    /// The lookup did not answer within [`PeerAddr::RESOLVE_WAIT`].
    #[error("{host_port} does not resolve: the name lookup did not answer within {wait:?}")]
    TimedOut {
        /// The name.
        host_port: String,
        /// How long the lookup was waited for.
        wait: Duration,
    },
    /// The resolver answered with an empty list.
    #[error("{host_port} resolves to no address")]
    NoAddress {
        /// The name.
        host_port: String,
    },
}

/// The first IPv4 address, else the first one.
fn pick(addrs: &[SocketAddr]) -> Option<SocketAddr> {
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
}

impl From<SocketAddr> for PeerAddr {
    fn from(addr: SocketAddr) -> Self {
        PeerAddr(Kind::Fixed(addr))
    }
}

impl From<&PeerAddr> for PeerAddr {
    fn from(addr: &PeerAddr) -> Self {
        addr.clone()
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Fixed(addr) => write!(f, "{addr}"),
            Kind::Name { host_port, .. } => f.write_str(host_port),
        }
    }
}

impl fmt::Debug for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Fixed(addr) => write!(f, "PeerAddr({addr})"),
            Kind::Name { host_port, .. } => {
                write!(f, "PeerAddr({host_port} -> {:?})", self.last_resolved())
            }
        }
    }
}

impl PartialEq for PeerAddr {
    /// Same fixed address, or same name.
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Kind::Fixed(a), Kind::Fixed(b)) => a == b,
            (Kind::Name { host_port: a, .. }, Kind::Name { host_port: b, .. }) => a == b,
            _ => false,
        }
    }
}

impl Eq for PeerAddr {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct Flip(AtomicBool, SocketAddr);

    impl Resolver for Flip {
        fn lookup(&self, _: &str) -> Result<Vec<SocketAddr>, LookupError> {
            if self.0.load(Ordering::SeqCst) {
                Ok(vec!["[::1]:9".parse().unwrap(), self.1])
            } else {
                Err(LookupError::NoSuchHost)
            }
        }
    }

    #[tokio::test]
    async fn a_literal_address_is_fixed_and_a_name_is_looked_up_on_every_resolve() {
        let fixed = PeerAddr::new("127.0.0.1:7000");
        assert!(!fixed.is_name());
        assert_eq!(
            fixed.resolve().await.unwrap(),
            "127.0.0.1:7000".parse().unwrap()
        );

        let target: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let flip = Arc::new(Flip(AtomicBool::new(false), target));
        let name = PeerAddr::with_resolver("ps-0.job:7001", flip.clone());
        assert!(name.is_name());
        assert_eq!(name.to_string(), "ps-0.job:7001");
        // Not resolvable yet: an error naming the name, nothing cached.
        let err = name.resolve().await.unwrap_err();
        assert!(
            matches!(&err, ResolveError::Refused { host_port, reason: LookupError::NoSuchHost }
                if host_port == "ps-0.job:7001"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "ps-0.job:7001 does not resolve: no such host"
        );
        assert_eq!(name.last_resolved(), None);
        // Resolvable now: IPv4 first, remembered by every clone.
        flip.0.store(true, Ordering::SeqCst);
        let clone = name.clone();
        assert_eq!(name.resolve().await.unwrap(), target);
        assert_eq!(clone.last_resolved(), Some(target));
        // Gone again: the dial fails, the last answer stays for reference.
        flip.0.store(false, Ordering::SeqCst);
        assert!(name.resolve().await.is_err());
        assert_eq!(name.last_resolved(), Some(target));
    }

    #[tokio::test]
    async fn the_system_resolver_answers_or_fails_within_its_bound() {
        let local = PeerAddr::new("localhost:7002");
        assert!(local.is_name());
        let addr = local.resolve().await.expect("localhost resolves");
        assert!(addr.ip().is_loopback() && addr.port() == 7002);
        // Either the resolver says no or the bound expires: an error, never a hang.
        let err = PeerAddr::new("no-such-host.invalid:1")
            .resolve()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ResolveError::Refused { host_port, .. }
                | ResolveError::LookupFailed { host_port, .. }
                | ResolveError::TimedOut { host_port, .. }
                | ResolveError::NoAddress { host_port }
                if host_port == "no-such-host.invalid:1"),
            "{err}"
        );
    }
}
