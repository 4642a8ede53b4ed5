//! The peers `cohort bench ... --peers` measures in the same invocation: the programs of
//! `benches/peers/` (TensorFlow's strategies, PyTorch's DDP and RPC parameter server, gloo's
//! all-reduce, on cohort's benchmark workloads), run by the Python `benches/peers/setup.sh`
//! makes, each printing one JSON line with its figure (`steps_per_second`, or `seconds` per
//! all-reduce) and its framework's `version`. A peer that cannot run is "not measured", with
//! the reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bound on the peer's run, its start included.
const PEER_RUN_MAX: Duration = Duration::from_secs(900);

/// Why a peer was not measured: what its column says.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(super) enum PeerError {
    /// The command was run without `--peers`.
    #[error("not asked for (--peers)")]
    NotAsked,
    /// The peer program is not in `benches/peers/`.
    #[error("benches/peers/{0} not found (run from the repository)")]
    NoProgram(String),
    /// The Python that runs the peers does not exist.
    #[error("{} does not exist (bash benches/peers/setup.sh makes it, or give --python)", .0.display())]
    NoPython(PathBuf),
    /// The program (the peers' Python, or cohort itself) could not be started.
    #[error("cannot start {}: {reason}", program.display())]
    Start {
        /// The program.
        program: PathBuf,
        /// Why.
        reason: String,
    },
    /// The peer ran past [`PEER_RUN_MAX`] and was killed.
    #[error("ran past {0:?}")]
    TimedOut(Duration),
    /// The peer exited with an error; the last lines of its stderr.
    #[error("{status}: {stderr_tail}")]
    Failed {
        /// How it exited.
        status: String,
        /// Its last stderr lines, joined by ` | `.
        stderr_tail: String,
    },
    /// The peer's last line is not its result.
    #[error("its output {line:?}: {reason}")]
    BadOutput {
        /// The line.
        line: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// The peer program `script` of `benches/peers/` with `args`, run by `python` (`None`: the
/// command was not asked to measure peers): its steps per second and its framework's version,
/// or why it could not be measured.
pub(super) fn run_peer(
    python: Option<&Path>,
    script: &str,
    args: &[String],
) -> Result<(f64, String), PeerError> {
    run_peer_figure(python, script, args, "steps_per_second")
}

/// [`run_peer`], for the figure `key` of the peer's line (a positive number).
pub(super) fn run_peer_figure(
    python: Option<&Path>,
    script: &str,
    args: &[String],
    key: &str,
) -> Result<(f64, String), PeerError> {
    let python = python.ok_or(PeerError::NotAsked)?;
    let script = peer_script(script)?;
    if !python.exists() {
        return Err(PeerError::NoPython(python.to_path_buf()));
    }
    let mut command = Command::new(python);
    crate::process::with_system_huge_pages(&mut command);
    command.arg(&script).args(args);
    run_figure(command, key)
}

/// Runs `command` (bounded by [`PEER_RUN_MAX`]) and reads the figure `key` of the JSON line it
/// prints last, as a peer prints it: the figure and the `version` beside it.
pub(super) fn run_figure(mut command: Command, key: &str) -> Result<(f64, String), PeerError> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| PeerError::Start {
            program: PathBuf::from(command.get_program()),
            reason: e.to_string(),
        })?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let read = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut text);
            }
            text
        })
    };
    let out = read(stdout.map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let err = read(stderr.map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let deadline = Instant::now() + PEER_RUN_MAX;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PeerError::TimedOut(PEER_RUN_MAX));
            }
        }
    };
    let (out, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    if !status.success() {
        return Err(PeerError::Failed {
            status: status.to_string(),
            stderr_tail: err.lines().rev().take(3).collect::<Vec<_>>().join(" | "),
        });
    }
    parse_peer_line(&out, key)
}

/// The peer's result line: `{"<key>": R, "version": V, ...}` (the last line).
fn parse_peer_line(out: &str, key: &str) -> Result<(f64, String), PeerError> {
    let line = out.lines().last().unwrap_or_default();
    let bad = |reason: String| PeerError::BadOutput {
        line: line.to_string(),
        reason,
    };
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
    let rate = value[key]
        .as_f64()
        .filter(|r| r.is_finite() && *r > 0.0)
        .ok_or_else(|| bad(format!("no positive {key}")))?;
    let version = value["version"].as_str().unwrap_or("?").to_string();
    Ok((rate, version))
}

/// A peer program of `benches/peers/`: beside the binary's source tree when run from it, else
/// in the working directory's `benches/peers/`.
fn peer_script(name: &str) -> Result<PathBuf, PeerError> {
    let candidates = [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers").join(name),
        Path::new("benches/peers").join(name),
    ];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .ok_or_else(|| PeerError::NoProgram(name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_line_gives_its_rate_and_a_bad_one_says_why() {
        let line = r#"{"peer": "tensorflow-mwms", "version": "2.15.1", "workers": 2, "steps_per_second": 151.7}"#;
        assert_eq!(
            parse_peer_line(&format!("noise\n{line}\n"), "steps_per_second"),
            Ok((151.7, "2.15.1".to_string()))
        );
        let gloo = r#"{"peer": "gloo", "version": "2.5.1", "members": 2, "mib": 64, "seconds": 0.09}"#;
        assert_eq!(
            parse_peer_line(gloo, "seconds"),
            Ok((0.09, "2.5.1".to_string()))
        );
        for bad in ["", "not json", r#"{"steps_per_second": 0}"#, r#"{"version": "1"}"#] {
            assert!(parse_peer_line(bad, "steps_per_second").is_err(), "{bad:?}");
        }
        assert!(parse_peer_line(line, "seconds").is_err());
    }

    #[test]
    fn a_missing_python_is_not_measured_naming_it() {
        let why = run_peer(Some(Path::new("/nonexistent/python")), "tf_mwms.py", &[]).unwrap_err();
        assert_eq!(why, PeerError::NoPython("/nonexistent/python".into()));
        assert!(why.to_string().contains("/nonexistent/python"), "{why}");
        assert_eq!(
            run_peer(None, "tf_mwms.py", &[]).unwrap_err(),
            PeerError::NotAsked
        );
    }
}
