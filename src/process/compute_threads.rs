//! How many compute threads a process's numerical kernels use: as many as the CPUs this
//! process may run on, counting a container's CPU quota.
//!
//! candle's CPU kernels (gemm, and its rayon pool) size themselves from `RAYON_NUM_THREADS`,
//! else from the machine's physical cores, which ignores a cgroup's CPU quota: a pod limited to
//! 2 CPUs on a 64-core node would run 64 threads fighting for 2 CPUs' worth of time, several
//! times slower than 2. [`follow_cpu_quota`] sets `RAYON_NUM_THREADS` to
//! [`std::thread::available_parallelism`], which counts the scheduler affinity and the cgroup
//! quota (v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us` and v2 `cpu.max`, rounded up), unless the
//! user set `RAYON_NUM_THREADS` or `CANDLE_NUM_THREADS` already. cohort's entry points
//! (`cohort`'s `main`, [`crate::program::Program::main`], the MultiWorkerMirrored main) call it
//! first, before any thread starts; the local launcher gives each of its tasks one thread
//! (they share one machine's cores).

/// The variable candle and rayon read for their thread count.
pub const COMPUTE_THREADS_ENV: &str = "RAYON_NUM_THREADS";
/// candle's own override, honoured as the user's choice too.
const CANDLE_THREADS_ENV: &str = "CANDLE_NUM_THREADS";

/// Where this process's compute thread count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeThreads {
    /// The user (or a launcher) set `RAYON_NUM_THREADS` or `CANDLE_NUM_THREADS`: left alone.
    Given,
    /// Set to the CPUs this process may use (affinity and CPU quota).
    FromQuota(usize),
}

/// Sets `RAYON_NUM_THREADS` from the CPUs this process may use, unless the thread count was
/// given (see the module docs). Call it before this process starts any thread: setting the
/// environment while another thread reads it is not safe.
pub fn follow_cpu_quota() -> ComputeThreads {
    *DECIDED.get_or_init(|| {
        let given = |key: &str| std::env::var_os(key).is_some_and(|v| !v.is_empty());
        if given(COMPUTE_THREADS_ENV) || given(CANDLE_THREADS_ENV) {
            return ComputeThreads::Given;
        }
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        std::env::set_var(COMPUTE_THREADS_ENV, threads.to_string());
        ComputeThreads::FromQuota(threads)
    })
}

/// Whether the user gave this process's compute threads (`RAYON_NUM_THREADS` or
/// `CANDLE_NUM_THREADS` set before [`follow_cpu_quota`], which sets the first itself): a
/// launcher that shares one machine among its tasks gives each a share unless they were given.
pub fn compute_threads_given() -> bool {
    match DECIDED.get() {
        Some(decided) => *decided == ComputeThreads::Given,
        None => [COMPUTE_THREADS_ENV, CANDLE_THREADS_ENV]
            .iter()
            .any(|key| std::env::var_os(key).is_some_and(|v| !v.is_empty())),
    }
}

/// What [`follow_cpu_quota`] decided, once called.
static DECIDED: std::sync::OnceLock<ComputeThreads> = std::sync::OnceLock::new();

/// This process's compute threads in words, for its start-up log line: `2 compute threads (the
/// CPUs this process may use)`, or the variable that set them.
pub fn describe_compute_threads() -> String {
    let from_env = |key: &str| {
        std::env::var(key)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| format!("{} compute threads ({key})", v.trim()))
    };
    match DECIDED.get() {
        Some(ComputeThreads::FromQuota(n)) => {
            format!("{n} compute threads (the CPUs this process may use)")
        }
        _ => from_env(CANDLE_THREADS_ENV)
            .or_else(|| from_env(COMPUTE_THREADS_ENV))
            .unwrap_or_else(|| "compute threads: candle's default".to_string()),
    }
}
