//! The `cohort` binary: every role of a cluster and the tools around it (see `cohort --help`).

/// mimalloc instead of the system allocator: a training step allocates and frees buffers of
/// megabytes (pulled values, gradients, message blobs), which glibc serves with a fresh mmap
/// and page faults every time; mimalloc reuses them (about +10–20 % steps/s in `bench ps`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cohort::cli::run()
}
