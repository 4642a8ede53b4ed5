//! Certificates rotated without a restart: a watch of one node's files in its certificates
//! directory (`ca.pem`, `<role>-<index>.pem`, `<role>-<index>.key`, as
//! [`NodeCredentials::save`] writes them and as a Kubernetes Secret mounted there is updated)
//! that puts new credentials in place on the endpoint ([`Endpoint::rotate_credentials`]) for
//! the handshakes that follow. Connections already up keep theirs until they end.
//!
//! A change is seen by the files' sizes and modification times, checked every `every`. Files
//! caught half-written, or credentials that do not load (another node's certificate, a key
//! that does not match), are not put in place: the ones in place stay, and the watch says why
//! once per change of the files.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::endpoint::Endpoint;
use crate::tls::{NodeCredentials, TlsError, CA_FILE};

/// How often a process checks its certificates directory by default.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// What the watch knows of one file: its size and modification time (`None` if unreadable).
type Stamp = Vec<Option<(u64, SystemTime)>>;

/// Watches `dir` for new credentials of `endpoint`'s node, checking every `every`, and puts
/// them in place when they change. The watch does not keep the endpoint alive: it ends at the
/// first check after every other handle of the endpoint is dropped (or when aborted).
pub fn watch_credentials(
    endpoint: &Endpoint,
    dir: PathBuf,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    let weak = std::sync::Arc::downgrade(&endpoint.inner);
    let mut seen = stamp(&dir, endpoint);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(inner) = weak.upgrade() else {
                return;
            };
            let endpoint = Endpoint { inner };
            let now = stamp(&dir, &endpoint);
            if now == seen {
                continue;
            }
            seen = now;
            match reload(&endpoint, &dir) {
                Ok(true) => tracing::info!(
                    dir = %dir.display(),
                    "certificates reloaded: new connections use them"
                ),
                Ok(false) => {}
                Err(reason) => tracing::warn!(
                    dir = %dir.display(),
                    "certificates changed but not reloaded ({reason}); the ones in place stay"
                ),
            }
        }
    })
}

/// Loads the node's credentials from `dir` and puts them in place if they differ from the
/// ones in place: whether they did, or why they could not be.
pub fn reload(endpoint: &Endpoint, dir: &Path) -> Result<bool, TlsError> {
    let creds = NodeCredentials::load(dir, endpoint.node())?;
    if creds == endpoint.credentials() {
        return Ok(false);
    }
    endpoint.rotate_credentials(creds)?;
    Ok(true)
}

fn stamp(dir: &Path, endpoint: &Endpoint) -> Stamp {
    let stem = endpoint.node().file_stem();
    [
        CA_FILE.to_owned(),
        format!("{stem}.pem"),
        format!("{stem}.key"),
    ]
    .iter()
    .map(|name| {
        let meta = std::fs::metadata(dir.join(name)).ok()?;
        Some((meta.len(), meta.modified().ok()?))
    })
    .collect()
}
