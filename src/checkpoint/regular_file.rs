//! Opening the files a checkpoint or a warm start reads: only regular files, opened without
//! waiting. A named pipe put where a file should be would hold a plain open until someone
//! writes to it, and a device such as `/dev/zero` never ends; both are refused naming what
//! they are.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::Path;

/// Why a file was not opened.
#[derive(Debug)]
pub(crate) enum OpenRefused {
    /// The open, its `fstat` or the read failed.
    Io(io::Error),
    /// It is not a regular file: what it is instead, in words.
    NotAFile(&'static str),
}

impl From<io::Error> for OpenRefused {
    fn from(e: io::Error) -> Self {
        OpenRefused::Io(e)
    }
}

/// Opens `path` for reading, refusing anything but a regular file (a link to one is one).
/// With `O_NONBLOCK` a named pipe opens at once and is then refused; on a regular file the
/// flag changes nothing, except under another process's write lease (an NFS delegation, a
/// Samba oplock), where the open fails at once instead of waiting for the lease's break: a
/// regular file is then opened again the plain way, waiting as any reader would.
fn open_regular(path: &Path) -> Result<File, OpenRefused> {
    let mut options = fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = match options.open(path) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock && fs::metadata(path)?.is_file() => {
            File::open(path)?
        }
        opened => opened?,
    };
    let kind = file.metadata().map_err(OpenRefused::Io)?.file_type();
    if kind.is_file() {
        Ok(file)
    } else {
        Err(OpenRefused::NotAFile(described(&kind)))
    }
}

/// Reads at most `read_max` bytes of the regular file at `path` ([`open_regular`]): a caller
/// that must refuse a longer file asks for one byte more than it accepts and looks.
pub(crate) fn read_regular(path: &Path, read_max: u64) -> Result<Vec<u8>, OpenRefused> {
    let mut bytes = Vec::new();
    open_regular(path)?.take(read_max).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// What a file that is not a regular one is, in words.
fn described(kind: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a named pipe";
        }
        if kind.is_char_device() || kind.is_block_device() {
            return "a device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}
