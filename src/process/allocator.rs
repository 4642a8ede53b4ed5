//! How a training process's allocator treats the memory a step frees.
//!
//! A training step allocates and frees buffers of megabytes (pulled values, gradients, message
//! blobs). glibc serves each with a fresh `mmap` and page faults every time; mimalloc reuses
//! them (about +10–20 % steps/s in `bench ps`). cohort's own artifacts (the `cohort` binary and
//! the Python package's native module) make mimalloc their global allocator and call
//! [`keep_freed_memory`] first; a program of the user's may do the same.

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
