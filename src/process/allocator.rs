//! How a training process's allocator treats the memory a step frees.
//!
//! A training step allocates and frees buffers of megabytes (pulled values, gradients, message
//! blobs, all-reduce results). glibc serves each with a fresh `mmap` and page faults every
//! time; mimalloc reuses them (about +10–20 % steps/s in `bench ps`). cohort's own artifacts
//! (the `cohort` binary and the Python package's native module) make mimalloc their global
//! allocator and call [`keep_freed_memory`] first; a program of the user's may do the same.

/// mimalloc's purge delay: -1 keeps freed memory in the process instead of handing it back
/// to the OS. With any delay (its default is 10 ms; 1 s was measured too) a step's freed
/// buffers are purged between uses, so the next step faults and zeroes them again: about 8 %
/// of all CPU time in `bench ps --workloads goodput`, and 17,800 page faults where -1 has 2,400.
/// A training process reuses the same sizes step after step, so its footprint is its peak,
/// as with the caching allocators of other frameworks.
const ALLOCATOR_PURGE_DELAY_MS: std::ffi::c_long = -1;

/// `mi_option_purge_delay` in mimalloc's option enum (`mimalloc.h`, v2 and v3 alike).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells mimalloc to keep the memory a step frees for the next step instead of handing it back
/// to the OS (freed buffers purged between steps are faulted and zeroed again by the next),
/// unless `MIMALLOC_PURGE_DELAY` in the environment says otherwise. Harmless where mimalloc is
/// not the global allocator.
pub fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one integer option of the allocator; mimalloc allows it at any time.
        #[allow(unsafe_code)]
        unsafe {
            libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS)
        };
    }
}

/// Turns transparent huge pages off for this process (Linux's `PR_SET_THP_DISABLE`), unless
/// `MIMALLOC_ALLOW_THP` in the environment decides: mimalloc asks for them on its arenas
/// (`madvise(MADV_HUGEPAGE)`, before `main` runs), where the system leaves them to programs
/// that ask. Measured on the 2-core build machine (THP `madvise`, a virtual machine): with them,
/// two member processes all-reducing 64 MiB over TCP took 29 to 120 ms a call from run to run,
/// mostly in the kernel (median 77 ms over ten runs); without, 27 to 35 ms every run, and
/// `bench allreduce`'s member processes went from 0.65–0.76× gloo's bus bandwidth to
/// 1.3–1.8× at 64 MiB. The parameter-server and MultiWorkerMirrored benchmarks did not change
/// beyond their noise. The `cohort` binary calls it first thing; children inherit the flag,
/// so what it starts that is not cohort gets the system's setting back
/// ([`with_system_huge_pages`]).
pub fn no_transparent_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with integer arguments; it changes this process's THP flag only. A
        // kernel without it refuses, which changes nothing.
        #[allow(unsafe_code)]
        let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

/// Gives the process `command` starts the system's transparent-huge-page setting, which
/// [`no_transparent_huge_pages`] took from this one (the flag is inherited across fork and
/// exec): for a user's program, a peer measured beside cohort, a job under the chaos runner.
pub fn with_system_huge_pages(command: &mut std::process::Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: the closure runs in the child between fork and exec; it makes one system
        // call (async-signal-safe) and allocates nothing.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0);
                Ok(())
            })
        };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}
