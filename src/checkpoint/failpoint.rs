//! Crash injection points inside a checkpoint save, for tests of CKPT-1.
//!
//! Two ways to fire one:
//! - the environment: `COHORT_FAILPOINT=checkpoint.before_manifest` (a comma-separated list of
//!   site names) makes the process exit at once with [`FAILPOINT_EXIT_CODE`] when the save
//!   reaches that site, without unwinding or cleaning up: on disk, a crash;
//! - a [`FailpointHook`] installed on the manager, for in-process tests: returning
//!   [`FailAction::Crash`] stops the save there with [`super::SaveError::InjectedCrash`] and
//!   leaves the files exactly as a crash would (no cleanup).

use std::fmt;
use std::sync::Arc;

/// Environment variable naming the failpoint sites that end the process.
pub const FAILPOINT_ENV: &str = "COHORT_FAILPOINT";

/// Exit code of a process stopped by a failpoint from [`FAILPOINT_ENV`]. It stands for a crash,
/// so it asks for a restart like one (≥ 128, see [`crate::process::restart_wanted`]), apart
/// from cohort's other codes and from 128 + any signal.
pub const FAILPOINT_EXIT_CODE: i32 = 173;

/// A point in the save protocol where a crash can be injected, in protocol order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailSite {
    /// The temporary directory exists, no shard written yet.
    BeforeShards,
    /// Half of the first shard file's bytes are written (a torn write).
    MidShard,
    /// Every shard is written and fsynced, the manifest is not.
    BeforeManifest,
    /// The manifest is written and fsynced, the directory is not yet renamed into place.
    BeforePublish,
    /// The new checkpoint is published and durable, older ones are not yet removed.
    BeforeRetention,
}

/// What a [`FailpointHook`] asks the save to do at a site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailAction {
    /// Go on with the save.
    Continue,
    /// Stop here as if the process had died: return an error, clean nothing up.
    Crash,
}

/// In-process failpoint: called at every [`FailSite`] of every save.
pub type FailpointHook = Arc<dyn Fn(FailSite) -> FailAction + Send + Sync>;

impl FailSite {
    /// Every site, in protocol order.
    pub const ALL: [FailSite; 5] = [
        FailSite::BeforeShards,
        FailSite::MidShard,
        FailSite::BeforeManifest,
        FailSite::BeforePublish,
        FailSite::BeforeRetention,
    ];

    /// The site's name, as used in [`FAILPOINT_ENV`].
    pub fn as_str(self) -> &'static str {
        match self {
            FailSite::BeforeShards => "checkpoint.before_shards",
            FailSite::MidShard => "checkpoint.mid_shard",
            FailSite::BeforeManifest => "checkpoint.before_manifest",
            FailSite::BeforePublish => "checkpoint.before_publish",
            FailSite::BeforeRetention => "checkpoint.before_retention",
        }
    }
}

impl fmt::Display for FailSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Consults the environment, then the hook. Exits the process if the environment names `site`.
pub(crate) fn check(site: FailSite, hook: Option<&FailpointHook>) -> FailAction {
    if let Ok(list) = std::env::var(FAILPOINT_ENV) {
        if list.split(',').any(|s| s.trim() == site.as_str()) {
            eprintln!("cohort: failpoint {site} fired, exiting with code {FAILPOINT_EXIT_CODE}");
            std::process::exit(FAILPOINT_EXIT_CODE);
        }
    }
    hook.map_or(FailAction::Continue, |h| h(site))
}
