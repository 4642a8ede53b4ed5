//! A test that cannot run here (a tool or a machine feature is missing) says so, and is
//! counted: never reported as a plain pass.
//!
//! [`skip`] prints `SKIPPED <test>: <why>` on stderr (nextest hides it when the test passes),
//! appends one line to the file `COHORT_SKIP_LOG` names (`<part>\t<test>\t<why>`; `.ci/run`
//! prints them all, by count and by name, after the suite), and fails the test when
//! `COHORT_REQUIRE` names the missing part (`COHORT_REQUIRE=python,chromium,netns`), so that a
//! machine which must run everything cannot skip anything silently.
//!
//! Included by the tests that can skip (`mod skip_support;`) and by the support modules whose
//! probes skip (with `#[path]`).

#![allow(dead_code)]

use std::io::Write;

/// The environment variable naming the file every skip is appended to.
pub const SKIP_LOG_ENV: &str = "COHORT_SKIP_LOG";
/// The environment variable naming the parts that must not be missing (comma-separated).
pub const REQUIRE_ENV: &str = "COHORT_REQUIRE";

/// Longest reason kept in the log, in characters.
const WHY_CHARS_MAX: usize = 240;

/// What a skipped test needed and did not find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// python3 with the interop packages (safetensors, numpy, tensorboard, prometheus_client).
    Python,
    /// Debian's Chromium, for the status page's browser check.
    Chromium,
    /// Network namespaces (root and iproute2), for the cluster tests across hosts.
    Netns,
    /// Mount namespaces (`unshare`, root), for the chaos runner's full disk.
    Unshare,
    /// The nvidia-nccl wheel, for loading libnccl without a GPU.
    NcclWheel,
    /// A GPU (or as many as a test needs).
    Gpu,
    /// PyTorch in python3, for the Python package's PyTorch example (`.ci/run` installs it).
    Torch,
    /// The peers' Python (`bash benches/peers/setup.sh`: TensorFlow and PyTorch), for the
    /// check that the comparison programs run.
    Peers,
    /// A machine without a GPU with NCCL: the check of what runs without one.
    NoGpu,
    /// A machine without libnccl outside `LD_LIBRARY_PATH`: the check of the message that
    /// names the missing library.
    NoSystemNccl,
}

impl Part {
    /// The part's name in `COHORT_REQUIRE` and in the skip log.
    pub fn name(self) -> &'static str {
        match self {
            Part::Python => "python",
            Part::Chromium => "chromium",
            Part::Netns => "netns",
            Part::Unshare => "unshare",
            Part::NcclWheel => "nccl-wheel",
            Part::Gpu => "gpu",
            Part::Torch => "torch",
            Part::Peers => "peers",
            Part::NoGpu => "no-gpu",
            Part::NoSystemNccl => "no-system-nccl",
        }
    }
}

/// Records that the running test skips (all of it, or the part `why` names) because `part` is
/// missing; see the module docs. Panics, failing the test, when `COHORT_REQUIRE` names `part`.
pub fn skip(part: Part, why: &str) {
    // libtest names each test's thread after the test.
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    // One line, and a short one: a probe's traceback is not the log's business.
    let mut why = why.replace(['\n', '\t'], " ");
    if let Some((cut, _)) = why.char_indices().nth(WHY_CHARS_MAX) {
        why.truncate(cut);
        why.push_str(" ...");
    }
    eprintln!("SKIPPED {test}: {why}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        let line = format!("{}\t{test}\t{why}\n", part.name());
        // One short write in append mode: lines of tests running at once do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(e) = written {
            panic!("{test}: cannot record its skip in {SKIP_LOG_ENV}={path:?}: {e}");
        }
    }
    if required(part) {
        panic!(
            "{test} needs {} ({REQUIRE_ENV} requires it) and skipped: {why}",
            part.name()
        );
    }
}

/// Whether `COHORT_REQUIRE` names `part`.
fn required(part: Part) -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|list| {
        list.split(',')
            .map(str::trim)
            .any(|name| name == part.name())
    })
}
