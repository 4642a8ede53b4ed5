//! A command's output on standard output, which its reader may close early
//! (`cohort ckpt show --json DIR | head`).
//!
//! `println!` panics when standard output is a closed pipe. Rust ignores SIGPIPE, and cohort
//! keeps it so (a role that logs to a pipe whose reader died, or writes to a closed socket,
//! must see an error, not die of a signal), so every line a command prints goes through
//! [`outln!`]: on a closed pipe the process stops at once with
//! [`STDOUT_CLOSED_EXIT_CODE`], what a Unix tool killed by SIGPIPE reports, and prints nothing;
//! any other write error ends it with [`TRAINING_ERROR_EXIT_CODE`] and a message naming it.

use std::io::Write;

use super::exit_codes::TRAINING_ERROR_EXIT_CODE;

/// Exit code of a command whose reader closed its standard output: 128 + SIGPIPE, as a shell
/// reports a tool killed by SIGPIPE (`yes | head`).
pub const STDOUT_CLOSED_EXIT_CODE: i32 = 141;

/// Writes one line to standard output; see the module docs for what a failed write does.
pub(crate) fn write_line(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(line)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(error) = written {
        exit_on_write_error(&error);
    }
}

/// Ends the process after `error` writing standard output (the module docs say how).
fn exit_on_write_error(error: &std::io::Error) -> ! {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(STDOUT_CLOSED_EXIT_CODE);
    }
    eprintln!("error: writing standard output: {error}");
    std::process::exit(TRAINING_ERROR_EXIT_CODE);
}

/// `println!` for a command's output, which stops the process cleanly when its reader has
/// gone (see the module docs).
macro_rules! outln {
    () => {
        $crate::process::stdout::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::process::stdout::write_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;
