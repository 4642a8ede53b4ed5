//! The `cohort` binary: every role of a cluster and the tools around it (see `cohort --help`).

/// mimalloc instead of the system allocator: see [`cohort::process::keep_freed_memory`].
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cohort::process::keep_freed_memory();
    cohort::process::no_transparent_huge_pages();
    cohort::cli_main()
}
