//! Network faults for a real process, from a rules file that another process (the chaos
//! runner) rewrites while it runs.
//!
//! A process started with [`NET_FAULTS_ENV`] (`COHORT_NET_FAULTS=<path>`) binds its transport
//! socket through [`socket_from_env`]: a [`ChaosSocket`] whose [`FaultControl`] follows the
//! file. The file is read once at the bind, then a background task looks at its modification
//! time, length and inode every [`POLL_INTERVAL`] and applies it again when one changed; no
//! datagram ever waits on file IO. The whole file is the plan in force: a rule removed from
//! it is healed. A file that does not parse is logged with its path and line and ignored
//! (the plan in force stays); a missing file is no faults. Without the variable nothing is
//! wrapped.
//!
//! The format, one rule a line, `#` comments:
//!
//! ```text
//! seed 42                                  # the seed of the loss draws
//! loss 0.05                                # every datagram this process sends
//! loss 0.2 127.0.0.1:4001 127.0.0.1:4002   # between two addresses, both directions
//! partition 127.0.0.1:4001 127.0.0.1:4002  # nothing between them, both directions
//! isolate 127.0.0.1:4003                   # nothing to or from it
//! ```
//!
//! Loss is drawn for what this process sends; a partition also drops what it receives, so it
//! holds even when only one side runs under rules. Addresses are the sockets' bound ones.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cohort_transport::socket::AsyncUdpSocket;
use cohort_transport::{BindError, Endpoint, NodeCredentials, TransportConfig};

use crate::plan::{FaultControl, FaultPlan};
use crate::socket::ChaosSocket;

/// The environment variable naming a process's rules file.
pub const NET_FAULTS_ENV: &str = "COHORT_NET_FAULTS";

/// How often the watcher looks at the rules file.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Largest rules file read; a larger one is refused as bad.
pub const RULES_BYTES_MAX: u64 = 1024 * 1024;

/// The rules of one file: the datagram plan they describe.
#[derive(Debug, Clone, PartialEq)]
pub struct Rules {
    /// The plan (its partitions, isolation, loss and seed; no delay, duplicates or reorder).
    pub plan: FaultPlan,
}

/// Why a rules file was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: line {line}: {detail}")]
pub struct RulesError {
    /// The file.
    pub path: String,
    /// Its 1-based line (0 for the file as a whole).
    pub line: usize,
    /// What is wrong.
    pub detail: String,
}

impl Rules {
    /// Parses rules text; `path` only names the source in errors.
    pub fn parse(path: &Path, text: &str) -> Result<Self, RulesError> {
        let mut plan = FaultPlan::none(0);
        for (i, raw) in text.lines().enumerate() {
            let err = |detail: String| RulesError {
                path: path.display().to_string(),
                line: i + 1,
                detail,
            };
            let line = raw.split('#').next().unwrap_or("").trim();
            let words: Vec<&str> = line.split_whitespace().collect();
            let Some((&rule, args)) = words.split_first() else {
                continue;
            };
            let addr = |text: &str| {
                text.parse::<SocketAddr>()
                    .map_err(|_| err(format!("{text:?} is not an ip:port address")))
            };
            let probability = |text: &str| match text.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
                _ => Err(err(format!("{text:?} is not a probability from 0 to 1"))),
            };
            match (rule, args) {
                ("seed", [n]) => {
                    plan.seed = n
                        .parse()
                        .map_err(|_| err(format!("{n:?} is not a seed (0 to 2^64-1)")))?
                }
                ("loss", [p]) => plan.loss = probability(p)?,
                ("loss", [p, a, b]) => {
                    let (a, b) = (addr(a)?, addr(b)?);
                    plan.pair_loss.insert(ordered(a, b), probability(p)?);
                }
                ("partition", [a, b]) => {
                    plan.partitions.insert(ordered(addr(a)?, addr(b)?));
                }
                ("isolate", [a]) => {
                    plan.isolated.insert(addr(a)?);
                }
                ("seed" | "loss" | "partition" | "isolate", _) => {
                    return Err(err(format!(
                        "{line:?}: wrong arguments (seed N | loss P [ADDR ADDR] | partition \
                         ADDR ADDR | isolate ADDR)"
                    )))
                }
                _ => {
                    return Err(err(format!(
                        "unknown rule {rule:?} (rules: seed, loss, partition, isolate)"
                    )))
                }
            }
        }
        Ok(Self { plan })
    }

    /// Reads and parses the file at `path`; a missing file is no rules.
    pub fn load(path: &Path) -> Result<Self, RulesError> {
        let whole = |detail: String| RulesError {
            path: path.display().to_string(),
            line: 0,
            detail,
        };
        match std::fs::metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Self {
                    plan: FaultPlan::none(0),
                })
            }
            Err(e) => return Err(whole(e.to_string())),
            Ok(m) if m.len() > RULES_BYTES_MAX => {
                return Err(whole(format!(
                    "{} bytes, more than the {RULES_BYTES_MAX} a rules file may hold",
                    m.len()
                )))
            }
            Ok(_) => {}
        }
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(path, &text),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self {
                plan: FaultPlan::none(0),
            }),
            Err(e) => Err(whole(e.to_string())),
        }
    }

    /// Writes rules text for `plan` (the inverse of [`Rules::parse`] for what it holds).
    pub fn render(plan: &FaultPlan) -> String {
        let mut text = format!("seed {}\n", plan.seed);
        if plan.loss > 0.0 {
            text.push_str(&format!("loss {}\n", plan.loss));
        }
        for ((a, b), p) in &plan.pair_loss {
            text.push_str(&format!("loss {p} {a} {b}\n"));
        }
        for (a, b) in &plan.partitions {
            text.push_str(&format!("partition {a} {b}\n"));
        }
        for a in &plan.isolated {
            text.push_str(&format!("isolate {a}\n"));
        }
        text
    }
}

/// What identifies one version of the file without reading it.
type Stamp = Option<(SystemTime, u64, u64)>;

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len(), m.ino()))
}

/// Applies the file at `path` to `control` when its stamp differs from `last`; returns the
/// new stamp. A bad file is logged and changes nothing.
fn refresh(path: &Path, control: &FaultControl, last: Stamp) -> Stamp {
    let now = stamp(path);
    if now == last {
        return last;
    }
    match Rules::load(path) {
        Ok(rules) => {
            tracing::info!(
                "network fault rules from {}: {}",
                path.display(),
                summary(&rules.plan)
            );
            control.replace_plan(rules.plan);
        }
        Err(e) => tracing::warn!("network fault rules ignored: {e}"),
    }
    now
}

fn summary(plan: &FaultPlan) -> String {
    if plan.loss == 0.0
        && plan.pair_loss.is_empty()
        && plan.partitions.is_empty()
        && plan.isolated.is_empty()
    {
        return "none".into();
    }
    Rules::render(plan).trim_end().replace('\n', "; ")
}

/// Applies the rules file at `path` to `control` now, then again whenever it changes, every
/// [`POLL_INTERVAL`], on a task of the current tokio runtime (it ends with the runtime).
pub fn watch(path: PathBuf, control: FaultControl) -> tokio::task::JoinHandle<()> {
    let mut last = refresh(&path, &control, None);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(POLL_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // The metadata call is cheap, but it is still IO: keep it off the runtime's
            // threads that carry the datagrams.
            let (p, c) = (path.clone(), control.clone());
            last = match tokio::task::spawn_blocking(move || refresh(&p, &c, last)).await {
                Ok(stamp) => stamp,
                Err(_) => last,
            };
        }
    })
}

/// The transport socket of a process started with [`NET_FAULTS_ENV`]: a [`ChaosSocket`] at
/// `addr` following the rules file (see the module docs); `None` without the variable (bind
/// the plain socket). Must be called inside a tokio runtime.
pub fn socket_from_env(
    addr: SocketAddr,
    config: &TransportConfig,
) -> io::Result<Option<Arc<dyn AsyncUdpSocket>>> {
    let Some(path) = std::env::var_os(NET_FAULTS_ENV).filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let control = FaultControl::new(FaultPlan::none(0));
    let socket = ChaosSocket::bind(addr, config, control.clone())?;
    let path = PathBuf::from(path);
    tracing::info!(
        "network faults: {} follows {} ({NET_FAULTS_ENV})",
        socket.local_addr()?,
        path.display()
    );
    watch(path, control);
    Ok(Some(socket as Arc<dyn AsyncUdpSocket>))
}

/// Binds a process's transport endpoint at `addr`: under the network fault rules of
/// [`NET_FAULTS_ENV`] when it names a file ([`socket_from_env`]), else on the plain socket,
/// untouched. Every endpoint a role or a collective member binds goes through here, so a
/// chaos plan's partitions and loss reach all of a process's traffic.
pub fn bind_endpoint(
    addr: SocketAddr,
    creds: NodeCredentials,
    config: TransportConfig,
) -> Result<Endpoint, BindError> {
    match socket_from_env(addr, &config)? {
        Some(socket) => Endpoint::bind_with_socket(socket, creds, config),
        None => Endpoint::bind(addr, creds, config),
    }
}

fn ordered(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Decision, DropCause};

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn rules_parse_and_render_back() {
        let text = "# a comment\nseed 42\n\nloss 0.05\nloss 0.2 127.0.0.1:9 127.0.0.1:3  # pair\n\
                    partition 127.0.0.1:4 127.0.0.1:1\nisolate 127.0.0.1:7\n";
        let rules = Rules::parse(Path::new("r"), text).unwrap();
        assert_eq!(rules.plan.seed, 42);
        assert_eq!(rules.plan.loss, 0.05);
        assert_eq!(rules.plan.pair_loss[&(addr(3), addr(9))], 0.2);
        assert!(rules.plan.is_partitioned(addr(4), addr(1)));
        assert!(rules.plan.is_partitioned(addr(7), addr(2)));
        let again = Rules::parse(Path::new("r"), &Rules::render(&rules.plan)).unwrap();
        assert_eq!(again, rules);
    }

    #[test]
    fn bad_rules_name_the_file_and_the_line() {
        let cases = [
            ("seed 1\nlos 0.1\n", 2, "unknown rule \"los\""),
            ("loss 1.5\n", 1, "\"1.5\" is not a probability"),
            ("loss NaN\n", 1, "not a probability"),
            (
                "\n\npartition 127.0.0.1:1 nowhere\n",
                3,
                "\"nowhere\" is not an ip:port",
            ),
            ("isolate\n", 1, "wrong arguments"),
            ("seed -3\n", 1, "is not a seed"),
        ];
        for (text, line, expected) in cases {
            let err = Rules::parse(Path::new("/run/net/worker-0.rules"), text).unwrap_err();
            assert_eq!(err.line, line, "{err}");
            let shown = err.to_string();
            assert!(
                shown.starts_with(&format!("/run/net/worker-0.rules: line {line}: ")),
                "{shown}"
            );
            assert!(
                shown.contains(expected),
                "{shown:?} should say {expected:?}"
            );
        }
    }

    #[test]
    fn a_changed_file_is_applied_a_bad_one_ignored_a_missing_one_is_no_faults() {
        let dir = std::env::temp_dir().join(format!(
            "cohort-chaos-rules-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("task.rules");
        let control = FaultControl::new(FaultPlan::none(0));
        let write = |text: &str| {
            let tmp = dir.join("task.rules.tmp");
            std::fs::write(&tmp, text).unwrap();
            std::fs::rename(&tmp, &path).unwrap();
        };
        let mut last = refresh(&path, &control, None);
        assert_eq!(control.plan(), FaultPlan::none(0));
        write("seed 5\npartition 127.0.0.1:1 127.0.0.1:2\n");
        last = refresh(&path, &control, last);
        assert_eq!(
            control.decide(addr(2), addr(1)),
            Decision::Drop(DropCause::Partition)
        );
        // A bad file leaves the partition in force.
        write("seed 5\npartition 127.0.0.1:1\n");
        last = refresh(&path, &control, last);
        assert!(control.is_partitioned(addr(1), addr(2)));
        // The healed file lifts it.
        write("seed 5\n");
        last = refresh(&path, &control, last);
        assert!(!control.is_partitioned(addr(1), addr(2)));
        write("seed 5\nloss 1\n");
        last = refresh(&path, &control, last);
        assert_eq!(
            control.decide(addr(1), addr(3)),
            Decision::Drop(DropCause::Loss)
        );
        std::fs::remove_file(&path).unwrap();
        refresh(&path, &control, last);
        assert_eq!(control.plan().loss, 0.0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
