//! Cluster certificates and the rustls configurations built from them.
//!
//! A cluster CA signs one certificate per node. The certificate names the node twice: as the
//! DNS name `<role>-<index>.cohort` (what a dialer verifies against the node it meant to reach)
//! and as the common name `<role>/<index>`. Both sides present certificates (mutual TLS) and
//! both verify them against the cluster CA only. TLS 1.3 with the ring provider passed
//! explicitly to every builder: this module never installs a process-wide default provider.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::node::{NodeId, NodeIdError};

/// Errors creating, loading or using cluster certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen could not generate or sign a certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// A PEM file or string does not hold what it should.
    #[error("invalid PEM for {what}: {reason}")]
    Pem {
        /// What was being parsed, e.g. `node certificate`.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// A certificate does not name a valid node.
    #[error("certificate does not name a node: {0}")]
    NodeName(String),
    /// The validity asked for cannot go in a certificate.
    #[error("certificate validity: {0}")]
    Validity(String),
    /// The node id cannot go in a certificate.
    #[error(transparent)]
    NodeId(#[from] NodeIdError),
    /// rustls rejected the configuration (bad key, unusable CA…).
    #[error("TLS configuration rejected: {0}")]
    Config(String),
    /// Reading or writing a credentials file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// A cluster's certificate authority: signs one certificate per node.
pub struct ClusterCa {
    cert_pem: String,
    key_pem: String,
    // rcgen 0.13 signs with an issuer `Certificate`; rebuilt from the PEM when loaded. Same
    // subject and key, so what it signs chains to `cert_pem`.
    issuer: rcgen::Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

/// How long a CA certificate made by [`ClusterCa::generate`] is valid.
pub const CA_VALIDITY_DEFAULT: std::time::Duration =
    std::time::Duration::from_secs(10 * 365 * 86_400);
/// How long a node certificate made by [`ClusterCa::issue`] is valid.
pub const NODE_VALIDITY_DEFAULT: std::time::Duration = std::time::Duration::from_secs(365 * 86_400);
/// How far before now a certificate's validity starts: a peer whose clock is behind this
/// machine's (by up to this much) still accepts it.
const CLOCK_SKEW_ALLOWED: std::time::Duration = std::time::Duration::from_secs(3600);

/// Sets `params` valid from a little before now (clock skew) for `validity`.
fn set_validity(
    params: &mut CertificateParams,
    validity: std::time::Duration,
) -> Result<(), TlsError> {
    let now = time::OffsetDateTime::now_utc();
    let skew = time::Duration::try_from(CLOCK_SKEW_ALLOWED)
        .map_err(|e| TlsError::Validity(e.to_string()))?;
    let span = time::Duration::try_from(validity).map_err(|e| TlsError::Validity(e.to_string()))?;
    params.not_before = now - skew;
    params.not_after = now
        .checked_add(span)
        .ok_or_else(|| TlsError::Validity(format!("{validity:?} from now is past year 9999")))?;
    Ok(())
}

impl ClusterCa {
    /// Generates a fresh CA for the cluster called `cluster_name`, valid for
    /// [`CA_VALIDITY_DEFAULT`].
    pub fn generate(cluster_name: &str) -> Result<Self, TlsError> {
        Self::generate_valid_for(cluster_name, CA_VALIDITY_DEFAULT)
    }

    /// Generates a fresh CA for the cluster called `cluster_name`, valid from now (less an
    /// hour of clock skew) for `validity`.
    pub fn generate_valid_for(
        cluster_name: &str,
        validity: std::time::Duration,
    ) -> Result<Self, TlsError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        set_validity(&mut params, validity)?;
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            format!("cohort cluster CA {cluster_name}"),
        );
        dn.push(DnType::OrganizationName, cluster_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: issuer.pem(),
            key_pem: key.serialize_pem(),
            issuer,
            key,
        })
    }

    /// Loads a CA from its certificate and private key in PEM.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let key = KeyPair::from_pem(key_pem).map_err(|e| TlsError::Pem {
            what: "CA private key",
            reason: e.to_string(),
        })?;
        let params = CertificateParams::from_ca_cert_pem(cert_pem).map_err(|e| TlsError::Pem {
            what: "CA certificate",
            reason: e.to_string(),
        })?;
        let issuer = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            issuer,
            key,
        })
    }

    /// The CA certificate in PEM, for every node's trust store.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key in PEM; keep it off the nodes.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Issues a certificate and key for `node`, usable as both TLS server and client, valid
    /// for [`NODE_VALIDITY_DEFAULT`].
    pub fn issue(&self, node: &NodeId) -> Result<NodeCredentials, TlsError> {
        self.issue_valid_for(node, NODE_VALIDITY_DEFAULT)
    }

    /// Issues a certificate and key for `node`, valid from now (less an hour of clock skew)
    /// for `validity`. A node presenting an expired certificate is refused at the handshake:
    /// issue new ones before then (`cohort certs --force`, or `--add` for new nodes) and restart
    /// the tasks as they pick them up.
    pub fn issue_valid_for(
        &self,
        node: &NodeId,
        validity: std::time::Duration,
    ) -> Result<NodeCredentials, TlsError> {
        node.validate()?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        set_validity(&mut params, validity)?;
        params.subject_alt_names =
            vec![SanType::DnsName(node.dns_name().try_into().map_err(
                |e: rcgen::Error| TlsError::NodeName(e.to_string()),
            )?)];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, node.to_string());
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &self.issuer, &self.key)?;
        Ok(NodeCredentials {
            node: node.clone(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            ca_cert_pem: self.cert_pem.clone(),
        })
    }
}

/// What one node needs to join the cluster: its certificate and key, and the CA to trust.
#[derive(Clone, PartialEq, Eq)]
pub struct NodeCredentials {
    /// The node these credentials were issued for.
    pub node: NodeId,
    /// The node's certificate in PEM.
    pub cert_pem: String,
    /// The node's private key in PEM.
    pub key_pem: String,
    /// The cluster CA certificate in PEM.
    pub ca_cert_pem: String,
}

impl std::fmt::Debug for NodeCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCredentials")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl NodeCredentials {
    /// Writes `ca.pem`, `<role>-<index>.pem` and `<role>-<index>.key` (mode 0600) into `dir`,
    /// creating it if needed.
    pub fn save(&self, dir: &Path) -> Result<(), TlsError> {
        fs::create_dir_all(dir).map_err(|source| io_error(dir, source))?;
        let stem = self.node.file_stem();
        write_file(&dir.join(CA_FILE), &self.ca_cert_pem, false)?;
        write_file(&dir.join(format!("{stem}.pem")), &self.cert_pem, false)?;
        write_file(&dir.join(format!("{stem}.key")), &self.key_pem, true)?;
        Ok(())
    }

    /// Reads the files [`NodeCredentials::save`] writes for `node`, and checks that the
    /// certificate really names `node`.
    pub fn load(dir: &Path, node: &NodeId) -> Result<Self, TlsError> {
        let stem = node.file_stem();
        let read = |name: String| read_pem_file(&dir.join(name));
        let creds = Self {
            node: node.clone(),
            ca_cert_pem: read(CA_FILE.to_owned())?,
            cert_pem: read(format!("{stem}.pem"))?,
            key_pem: read(format!("{stem}.key"))?,
        };
        let named = node_id_from_cert(&first_cert(&creds.cert_pem, "node certificate")?)?;
        if &named != node {
            return Err(TlsError::NodeName(format!(
                "certificate in {} names {named}, not {node}",
                dir.display()
            )));
        }
        Ok(creds)
    }
}

/// Reads the node id from a DER certificate's `<role>-<index>.cohort` DNS name.
pub fn node_id_from_cert(der: &[u8]) -> Result<NodeId, TlsError> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| TlsError::NodeName(e.to_string()))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| TlsError::NodeName(e.to_string()))?
        .ok_or_else(|| TlsError::NodeName("no subject alternative name".into()))?;
    let mut names = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) if dns.ends_with(crate::node::DNS_SUFFIX) => Some(*dns),
            _ => None,
        });
    match (names.next(), names.next()) {
        (Some(dns), None) => Ok(NodeId::from_dns_name(dns)?),
        (None, _) => Err(TlsError::NodeName("no *.cohort DNS name".into())),
        (Some(_), Some(_)) => Err(TlsError::NodeName("more than one *.cohort DNS name".into())),
    }
}

/// The crypto provider every config here is built with: ring's, preferring AES-128-GCM (every
/// packet of the data plane is sealed and opened with it; AES-256 takes 14 rounds to its 10,
/// for no protection this cluster needs beyond 128 bits). Both ends are cohort's, so the
/// client's first choice is what a connection uses; the others stay for any other peer.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    use rustls::crypto::ring::cipher_suite;
    Arc::new(CryptoProvider {
        cipher_suites: vec![
            cipher_suite::TLS13_AES_128_GCM_SHA256,
            cipher_suite::TLS13_AES_256_GCM_SHA384,
            cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
        ],
        ..rustls::crypto::ring::default_provider()
    })
}

/// rustls server config: our certificate, client certificates required and checked against
/// the cluster CA, ALPN `alpn` only.
pub(crate) fn rustls_server_config(
    creds: &NodeCredentials,
    alpn: Vec<u8>,
) -> Result<rustls::ServerConfig, TlsError> {
    let provider = provider();
    let roots = Arc::new(root_store(&creds.ca_cert_pem)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(cert_chain(&creds.cert_pem)?, private_key(&creds.key_pem)?)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![alpn];
    Ok(config)
}

/// rustls client config: server certificates checked against the cluster CA (and, by the
/// server name passed at connect, against the node we dial); our certificate if `client` is
/// given (always, outside tests of refusal).
pub(crate) fn rustls_client_config(
    ca_cert_pem: &str,
    client: Option<&NodeCredentials>,
    alpn: Vec<u8>,
) -> Result<rustls::ClientConfig, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(root_store(ca_cert_pem)?);
    let mut config = match client {
        Some(creds) => builder
            .with_client_auth_cert(cert_chain(&creds.cert_pem)?, private_key(&creds.key_pem)?)
            .map_err(|e| TlsError::Config(e.to_string()))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn];
    Ok(config)
}

fn root_store(ca_cert_pem: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in cert_chain(ca_cert_pem)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::Config(format!("unusable CA certificate: {e}")))?;
    }
    Ok(roots)
}

fn cert_chain(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what: "certificate",
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what: "certificate",
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn first_cert(pem: &str, what: &'static str) -> Result<CertificateDer<'static>, TlsError> {
    cert_chain(pem)?
        .into_iter()
        .next()
        .ok_or_else(|| TlsError::Pem {
            what,
            reason: "empty".into(),
        })
}

fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|e| TlsError::Pem {
        what: "private key",
        reason: e.to_string(),
    })
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), TlsError> {
    use std::io::Write;
    let mut options = fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options
        .open(path)
        .map_err(|source| io_error(path, source))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| io_error(path, source))
}

/// Reads a PEM file of at most [`PEM_FILE_BYTES_MAX`] bytes, so that a wrong path (a huge file,
/// a device) fails with an error naming it rather than filling memory (SEC-1).
///
/// Only a regular file (or a link to one) is read: a FIFO would block the open, and then the
/// read, until a writer came, which is start-up hanging on a typo. The path is checked before
/// it is opened, opened without blocking, and the opened file checked again, in case the path
/// changed in between.
fn read_pem_file(path: &Path) -> Result<String, TlsError> {
    use std::io::Read;
    let before = fs::metadata(path).map_err(|source| io_error(path, source))?;
    require_regular_file(path, &before.file_type())?;
    let file = open_nonblocking(path).map_err(|source| io_error(path, source))?;
    let opened = file.metadata().map_err(|source| io_error(path, source))?;
    require_regular_file(path, &opened.file_type())?;
    let mut bytes = Vec::new();
    file.take(PEM_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| io_error(path, source))?;
    if bytes.len() as u64 > PEM_FILE_BYTES_MAX {
        let reason = format!("larger than {PEM_FILE_BYTES_MAX} bytes; not a PEM credentials file");
        return Err(io_error(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
        ));
    }
    String::from_utf8(bytes).map_err(|_| {
        let reason = "not UTF-8 text; not a PEM credentials file";
        io_error(
            path,
            std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
        )
    })
}

/// Refuses anything but a regular file, naming what it is.
fn require_regular_file(path: &Path, kind: &fs::FileType) -> Result<(), TlsError> {
    if kind.is_file() {
        return Ok(());
    }
    let reason = format!(
        "is {}, not a regular file; expected a PEM credentials file",
        file_kind(kind)
    );
    Err(io_error(
        path,
        std::io::Error::new(std::io::ErrorKind::InvalidInput, reason),
    ))
}

/// What a non-regular file is, in words.
fn file_kind(kind: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if kind.is_socket() {
            return "a socket";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Opens `path` for reading without waiting for a writer, should it have become a FIFO since
/// it was checked.
fn open_nonblocking(path: &Path) -> std::io::Result<fs::File> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // On a regular file O_NONBLOCK changes nothing.
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

fn io_error(path: &Path, source: std::io::Error) -> TlsError {
    TlsError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// File name of the CA certificate in a credentials directory.
pub const CA_FILE: &str = "ca.pem";

/// Largest credentials file read (bytes); real ones are a few kilobytes.
const PEM_FILE_BYTES_MAX: u64 = 1024 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_certificate_names_the_node_and_round_trips_through_files() {
        let ca = ClusterCa::generate("test").unwrap();
        let node = NodeId::new("worker", 7);
        let creds = ca.issue(&node).unwrap();
        let der = first_cert(&creds.cert_pem, "cert").unwrap();
        assert_eq!(node_id_from_cert(&der).unwrap(), node);

        let dir = std::env::temp_dir().join(format!("cohort-tls-{}", std::process::id()));
        creds.save(&dir).unwrap();
        assert!(dir.join("worker-7.pem").exists() && dir.join("worker-7.key").exists());
        assert_eq!(NodeCredentials::load(&dir, &node).unwrap(), creds);
        assert!(NodeCredentials::load(&dir, &NodeId::new("worker", 8)).is_err());
        fs::remove_dir_all(&dir).unwrap();

        let reloaded = ClusterCa::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        let other = reloaded.issue(&NodeId::new("ps", 0)).unwrap();
        assert_eq!(other.ca_cert_pem, ca.cert_pem());
        assert!(rustls_server_config(&other, b"cohort/1".to_vec()).is_ok());
    }

    /// (not before, not after) of a PEM certificate, in seconds since 1970.
    fn validity(pem: &str) -> (i64, i64) {
        use x509_parser::prelude::{FromDer, X509Certificate};
        let der = first_cert(pem, "cert").unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let v = cert.validity();
        (v.not_before.timestamp(), v.not_after.timestamp())
    }

    #[test]
    fn certificates_are_valid_for_a_bounded_time_from_a_little_before_now() {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let near = |got: i64, want: i64| (got - want).abs() <= 300;
        let ca = ClusterCa::generate("test").unwrap();
        let (from, to) = validity(ca.cert_pem());
        assert!(near(from, now - 3600), "{from} vs {now}");
        assert!(near(to, now + CA_VALIDITY_DEFAULT.as_secs() as i64), "{to}");
        let node = ca.issue(&NodeId::new("worker", 0)).unwrap();
        let (from, to) = validity(&node.cert_pem);
        assert!(
            near(from, now - 3600) && near(to, now + 365 * 86_400),
            "{from} {to}"
        );
        let two_days = std::time::Duration::from_secs(2 * 86_400);
        let short = ca.issue_valid_for(&NodeId::new("ps", 0), two_days).unwrap();
        assert!(near(validity(&short.cert_pem).1, now + 2 * 86_400));
        // Past what a certificate can say: a typed error, not a panic.
        let forever = std::time::Duration::from_secs(u64::MAX / 4);
        assert!(matches!(
            ca.issue_valid_for(&NodeId::new("ps", 1), forever),
            Err(TlsError::Validity(_))
        ));
    }

    #[test]
    fn garbage_pem_and_missing_files_are_typed_errors() {
        assert!(matches!(
            ClusterCa::from_pem("junk", "junk"),
            Err(TlsError::Pem { .. })
        ));
        let ca = ClusterCa::generate("test").unwrap();
        assert!(matches!(
            ClusterCa::from_pem("junk", ca.key_pem()),
            Err(TlsError::Pem { .. })
        ));
        let missing = Path::new("/nonexistent/cohort-credentials");
        assert!(matches!(
            NodeCredentials::load(missing, &NodeId::new("worker", 0)),
            Err(TlsError::Io { .. })
        ));
        let mut creds = ca.issue(&NodeId::new("worker", 0)).unwrap();
        creds.key_pem = "not a key".into();
        assert!(rustls_server_config(&creds, b"cohort/1".to_vec()).is_err());
    }

    #[test]
    fn oversized_or_binary_credentials_files_are_refused_with_their_path() {
        let ca = ClusterCa::generate("test").unwrap();
        let node = NodeId::new("worker", 3);
        let dir = std::env::temp_dir().join(format!("cohort-tls-big-{}", std::process::id()));
        ca.issue(&node).unwrap().save(&dir).unwrap();
        // SEC-1: a CA path that leads to an endless source (here /dev/zero) used to be read
        // whole, without bound; now it is refused before it is opened.
        fs::remove_file(dir.join(CA_FILE)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.join(CA_FILE)).unwrap();
        let err = NodeCredentials::load(&dir, &node).unwrap_err();
        assert!(
            matches!(&err, TlsError::Io { path, .. } if path.ends_with(CA_FILE)),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("is a character device, not a regular file"),
            "{err}"
        );

        fs::remove_file(dir.join(CA_FILE)).unwrap();
        fs::write(
            dir.join(CA_FILE),
            vec![b'a'; PEM_FILE_BYTES_MAX as usize + 1],
        )
        .unwrap();
        let err = NodeCredentials::load(&dir, &node).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");

        fs::write(dir.join(CA_FILE), [0xff, 0xfe, 0x00]).unwrap();
        let err = NodeCredentials::load(&dir, &node).unwrap_err();
        assert!(err.to_string().contains("not UTF-8"), "{err}");

        // A link to a regular file is fine (Kubernetes mounts secrets as links).
        fs::remove_file(dir.join(CA_FILE)).unwrap();
        fs::write(dir.join("real-ca.pem"), ca.cert_pem()).unwrap();
        std::os::unix::fs::symlink(dir.join("real-ca.pem"), dir.join(CA_FILE)).unwrap();
        assert!(NodeCredentials::load(&dir, &node).is_ok());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn credentials_paths_that_are_fifos_or_directories_fail_at_once_naming_them() {
        let ca = ClusterCa::generate("test").unwrap();
        let node = NodeId::new("worker", 4);
        let dir = std::env::temp_dir().join(format!("cohort-tls-fifo-{}", std::process::id()));
        ca.issue(&node).unwrap().save(&dir).unwrap();
        let key = dir.join("worker-4.key");
        fs::remove_file(&key).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&key)
            .status()
            .expect("run mkfifo");
        assert!(made.success(), "mkfifo failed");

        // Opening a FIFO for reading blocks until a writer comes, so the load runs on its own
        // thread and the test bounds it: no writer ever comes.
        let (tx, rx) = std::sync::mpsc::channel();
        let (load_dir, load_node) = (dir.clone(), node.clone());
        std::thread::spawn(move || {
            let _ = tx.send(NodeCredentials::load(&load_dir, &load_node));
        });
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("loading credentials from a FIFO must not block");
        let err = result.unwrap_err();
        assert!(
            matches!(&err, TlsError::Io { path, .. } if path.ends_with("worker-4.key")),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("is a named pipe (FIFO), not a regular file"),
            "{err}"
        );

        fs::remove_file(&key).unwrap();
        fs::create_dir(&key).unwrap();
        let err = NodeCredentials::load(&dir, &node).unwrap_err();
        assert!(err.to_string().contains("is a directory"), "{err}");

        // The opened file is checked too: a FIFO opened without blocking is still refused.
        let fifo = dir.join("late.fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        let opened = open_nonblocking(&fifo).expect("with O_NONBLOCK a FIFO opens at once");
        let err = require_regular_file(&fifo, &opened.metadata().unwrap().file_type()).unwrap_err();
        assert!(err.to_string().contains("named pipe"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn invalid_role_cannot_be_issued() {
        let ca = ClusterCa::generate("test").unwrap();
        assert!(matches!(
            ca.issue(&NodeId::new("Bad Role", 0)),
            Err(TlsError::NodeId(_))
        ));
    }
}
