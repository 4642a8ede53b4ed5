//! Shared-memory slots between two members of the plaintext plane that run on one host: a
//! chunk's payload is copied once into a slot the sender owns, and the receiver reads it from
//! there (into its place in the result, or reducing straight from it), instead of two copies
//! through the kernel's TCP stack. The TCP link still carries every chunk's header, in order,
//! and the slot's number: it wakes the receiver, keeps the order, and its end still tells that
//! a member went away. Like the plane itself, for members that trust each other.
//!
//! A sender makes its segment when it first has a chunk worth a slot ([`Segment::create`]):
//! a file of `/dev/shm` made afresh under a name of its process id and a random part (mode
//! 0600; files of processes gone, left by one killed before its peer opened its segment, are
//! removed then), every page reserved at
//! once (a full tmpfs is then a refusal here, not a `SIGBUS` on a later write), a header with a
//! random probe. It offers the name, the slot count and size, and the probe over the link; the
//! receiver opens that file read-only ([`Segment::open`]): only a name of the form it makes,
//! a regular file of exactly that size, carrying that probe. So a peer on another host, in
//! another `/dev/shm` (a container), or of another user fails to open it, answers no, and the
//! link goes on over TCP alone. Either side unlinks the file as soon as both have it mapped; a
//! mapping lives on after its file is gone.
//!
//! A slot is the sender's to write until the receiver gives it back (a credit on the reverse
//! direction of the link) once it no longer reads it: at once for a chunk copied into its
//! place, when the chunk is consumed otherwise ([`Received`] dropped). A sender with no free
//! slot waits a little for one, then sends that chunk over TCP instead (`plain.rs`). A receiver refuses a slot
//! number out of range or one it still holds, and a sender a credit for a slot it did not lend.
//!
//! The memory is shared with another process, which Rust's model does not see: the bytes of a
//! slot are read only between the frame that lends it and the credit that returns it, during
//! which a well-behaved sender does not touch it (the frame's write and read are system calls,
//! after a fence on each side). A sender that writes a lent slot anyway can change what the
//! receiver reads, as a peer on TCP can send anything: the plane trusts its members.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::atomic::{fence, Ordering};
use std::sync::{Arc, Mutex};

use memmap2::{MmapOptions, MmapRaw};
use tokio::sync::mpsc;

/// Where segments are made: the host's shared-memory file system.
const SHM_DIR: &str = "/dev/shm";
/// The start of every segment's name (followed by the maker's process id, `-` and 32 hex
/// digits).
const NAME_PREFIX: &str = "cohort-";
/// A segment's header: magic (8), probe (16), padding to a cache line.
const HEADER_BYTES: usize = 64;
const MAGIC: [u8; 8] = *b"cohortsm";
/// Bounds an offer must keep (a peer's offer is input), and so every segment made here.
pub(crate) const SLOTS_MAX: u32 = 1024;
pub(crate) const SEGMENT_BYTES_MAX: usize = 256 << 20;

/// How many slots of `slot_bytes` a segment may have, at most `wanted` (0: none fit).
pub(crate) fn slots_within(wanted: usize, slot_bytes: usize) -> u32 {
    let fit = (SEGMENT_BYTES_MAX - HEADER_BYTES) / slot_bytes.max(1);
    wanted.min(fit).min(SLOTS_MAX as usize) as u32
}

/// The process id in a segment's name, if the name is one [`Segment::create`] makes.
fn maker_of(name: &str) -> Option<u32> {
    let (pid, digits) = name.strip_prefix(NAME_PREFIX)?.split_once('-')?;
    let made_here = !pid.is_empty()
        && pid.len() <= 10
        && pid.bytes().all(|b| b.is_ascii_digit())
        && digits.len() == 32
        && digits.bytes().all(|b| b.is_ascii_hexdigit());
    made_here.then(|| pid.parse().ok()).flatten()
}

/// Removes the segments whose maker is gone (a process killed between making its segment and
/// its peer's opening it leaves the file behind). Best effort; a process id reused since is
/// taken for the maker, and its files stay.
fn remove_left_behind() {
    let Ok(entries) = std::fs::read_dir(SHM_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(maker_of) else {
            continue;
        };
        let Ok(pid) = i32::try_from(pid) else {
            continue;
        };
        let gone = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH);
        if gone {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Reserves every page of `file`'s first `bytes` now: a tmpfs that is full refuses here,
/// instead of killing this process with SIGBUS when a slot is first written.
#[cfg(target_os = "linux")]
fn reserve(file: &std::fs::File, bytes: usize) -> io::Result<()> {
    let len = libc::off_t::try_from(bytes).map_err(io::Error::other)?;
    // SAFETY: a valid descriptor of an open file.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Elsewhere pages cannot be reserved up front: no segments are made there (links stay on TCP).
#[cfg(not(target_os = "linux"))]
fn reserve(_: &std::fs::File, _: usize) -> io::Result<()> {
    Err(io::Error::other(
        "shared-memory segments are made on Linux only",
    ))
}

/// What a sender tells its receiver of its segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Offer {
    pub(crate) name: String,
    pub(crate) slots: u32,
    pub(crate) slot_bytes: u64,
    pub(crate) probe: u128,
}

/// A mapped segment: `slots` slots of `slot_bytes` after the header.
pub(crate) struct Segment {
    map: MmapRaw,
    slots: u32,
    slot_bytes: usize,
    /// The file, while this side may still have to unlink it.
    path: Mutex<Option<PathBuf>>,
}

// SAFETY: the mapping is plain memory; which bytes each side writes or reads when is the
// slot protocol's (module doc), enforced by `Lent` and `Received`, which own their slots.
unsafe impl Send for Segment {}
// SAFETY: as for `Send`.
unsafe impl Sync for Segment {}

fn segment_bytes(slots: u32, slot_bytes: u64) -> Option<usize> {
    let bytes = usize::try_from(slot_bytes)
        .ok()?
        .checked_mul(slots as usize)?
        .checked_add(HEADER_BYTES)?;
    (slots > 0 && slots <= SLOTS_MAX && slot_bytes > 0 && bytes <= SEGMENT_BYTES_MAX)
        .then_some(bytes)
}

impl Segment {
    /// A fresh segment of `slots` slots of `slot_bytes`, and its offer.
    pub(crate) fn create(slots: u32, slot_bytes: usize) -> io::Result<(Segment, Offer)> {
        let bytes = segment_bytes(slots, slot_bytes as u64)
            .ok_or_else(|| io::Error::other(format!("{slots} slots of {slot_bytes} bytes")))?;
        remove_left_behind();
        let probe = rand::random::<u128>();
        let name = format!(
            "{NAME_PREFIX}{}-{:032x}",
            std::process::id(),
            rand::random::<u128>()
        );
        let path = PathBuf::from(SHM_DIR).join(&name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        let made = (|| {
            reserve(&file, bytes)?;
            let map = MmapOptions::new().len(bytes).map_raw(&file)?;
            let mut header = [0u8; HEADER_BYTES];
            header[..8].copy_from_slice(&MAGIC);
            header[8..24].copy_from_slice(&probe.to_le_bytes());
            // SAFETY: the mapping is at least `HEADER_BYTES` long, and nobody else has it yet.
            unsafe {
                std::ptr::copy_nonoverlapping(header.as_ptr(), map.as_mut_ptr(), HEADER_BYTES)
            };
            Ok(map)
        })();
        let map = match made {
            Ok(map) => map,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let offer = Offer {
            name,
            slots,
            slot_bytes: slot_bytes as u64,
            probe,
        };
        let segment = Segment {
            map,
            slots,
            slot_bytes,
            path: Mutex::new(Some(path)),
        };
        Ok((segment, offer))
    }

    /// Maps a peer's segment read-only, after checking its name, type, size and probe, and
    /// unlinks its file (module doc).
    pub(crate) fn open(offer: &Offer) -> io::Result<Segment> {
        let refused = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        if maker_of(&offer.name).is_none() {
            return Err(refused(format!("a segment named {:?}", offer.name)));
        }
        let bytes = segment_bytes(offer.slots, offer.slot_bytes).ok_or_else(|| {
            refused(format!(
                "a segment of {} slots of {} bytes",
                offer.slots, offer.slot_bytes
            ))
        })?;
        let path = PathBuf::from(SHM_DIR).join(&offer.name);
        // Not blocking: a FIFO of that name must not hold this thread before it is refused.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)?;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() || meta.len() != bytes as u64 {
            return Err(refused(format!(
                "{} is not a segment of {bytes} bytes",
                path.display()
            )));
        }
        let map = MmapOptions::new().len(bytes).map_raw_read_only(&file)?;
        let mut header = [0u8; HEADER_BYTES];
        // SAFETY: the mapping is `bytes` >= `HEADER_BYTES` long; its maker wrote the header
        // before it offered the segment.
        unsafe { std::ptr::copy_nonoverlapping(map.as_ptr(), header.as_mut_ptr(), HEADER_BYTES) };
        if header[..8] != MAGIC || header[8..24] != offer.probe.to_le_bytes() {
            return Err(refused(format!(
                "{} does not carry the probe offered",
                path.display()
            )));
        }
        // Both sides have it mapped now (its maker since before the offer): the name can go.
        let _ = std::fs::remove_file(&path);
        Ok(Segment {
            map,
            slots: offer.slots,
            slot_bytes: offer.slot_bytes as usize,
            path: Mutex::new(None),
        })
    }

    /// Removes the file if this side still has to (the mapping stays).
    pub(crate) fn unlink(&self) {
        if let Some(path) = self.path.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = std::fs::remove_file(path);
        }
    }

    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    fn slot_ptr(&self, slot: u32) -> *mut u8 {
        debug_assert!(slot < self.slots);
        // SAFETY: `slot < slots`, so the slot lies within the mapping (its size was checked
        // against `slots * slot_bytes + HEADER_BYTES` when it was made or opened).
        unsafe {
            self.map
                .as_mut_ptr()
                .add(HEADER_BYTES + slot as usize * self.slot_bytes)
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// The sender's side: its segment and which slots are free.
pub(crate) struct Lender {
    segment: Segment,
    /// Per slot: lent to the receiver (not yet given back).
    lent: Mutex<Vec<bool>>,
}

impl Lender {
    pub(crate) fn new(segment: Segment) -> Self {
        let lent = Mutex::new(vec![false; segment.slots as usize]);
        Self { segment, lent }
    }

    pub(crate) fn segment(&self) -> &Segment {
        &self.segment
    }

    /// Copies `bytes` (at most a slot) into a free slot and lends it: its number, or `None`
    /// if every slot is lent or the bytes do not fit.
    #[cfg(test)]
    pub(crate) fn lend(&self, bytes: &[u8]) -> Option<u32> {
        self.lend_with(bytes.len(), |slot| {
            slot.copy_from_slice(bytes);
            Ok::<(), std::convert::Infallible>(())
        })
        .unwrap_or_else(|never| match never {})
    }

    /// A free slot (its number), its first `len` bytes written by `fill`; `Ok(None)` if none is
    /// free or `len` does not fit. A slot whose `fill` failed is free again.
    pub(crate) fn lend_with<E>(
        &self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Option<u32>, E> {
        if len > self.segment.slot_bytes {
            return Ok(None);
        }
        let slot = {
            let mut lent = self.lent.lock().unwrap_or_else(|p| p.into_inner());
            let Some(free) = lent.iter().position(|l| !l) else {
                return Ok(None);
            };
            lent[free] = true;
            free as u32
        };
        // SAFETY: the slot lies in the mapping and holds at least `len` bytes; it was free, so
        // the receiver does not read it (it gave it back), and this side marked it lent under
        // the lock, so no other writer here has it: the slice aliases nothing while it lives.
        let out = unsafe { std::slice::from_raw_parts_mut(self.segment.slot_ptr(slot), len) };
        if let Err(e) = fill(out) {
            self.lent.lock().unwrap_or_else(|p| p.into_inner())[slot as usize] = false;
            return Err(e);
        }
        // The receiver reads it after the frame that names it, written after this.
        fence(Ordering::SeqCst);
        Ok(Some(slot))
    }

    /// The receiver gave `slot` back; an error if it was not lent.
    pub(crate) fn give_back(&self, slot: u32) -> Result<(), SlotError> {
        let mut lent = self.lent.lock().unwrap_or_else(|p| p.into_inner());
        let slots = lent.len();
        match lent.get_mut(slot as usize) {
            Some(was) if *was => {
                *was = false;
                Ok(())
            }
            Some(_) => Err(SlotError::NotLent { slot }),
            None => Err(SlotError::GivenBackOutside { slot, slots }),
        }
    }
}

/// The receiver's side: the peer's segment, and which of its slots this side still reads.
pub(crate) struct Borrower {
    segment: Segment,
    held: Mutex<Vec<bool>>,
    /// Gives a slot back (the link's sender writes the credit).
    credits: mpsc::UnboundedSender<u32>,
}

impl Borrower {
    pub(crate) fn new(segment: Segment, credits: mpsc::UnboundedSender<u32>) -> Arc<Self> {
        let held = Mutex::new(vec![false; segment.slots as usize]);
        Arc::new(Self {
            segment,
            held,
            credits,
        })
    }

    /// The chunk of `len` bytes the peer lent in `slot`; an error naming what is wrong if the
    /// slot does not exist, does not hold `len`, or is still held here.
    pub(crate) fn take(self: &Arc<Self>, slot: u32, len: u64) -> Result<Received, SlotError> {
        if slot >= self.segment.slots || len > self.segment.slot_bytes as u64 {
            return Err(SlotError::ChunkOutside {
                slot,
                len,
                slots: self.segment.slots,
                slot_bytes: self.segment.slot_bytes,
            });
        }
        {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            if std::mem::replace(&mut held[slot as usize], true) {
                return Err(SlotError::LentAgain { slot });
            }
        }
        fence(Ordering::SeqCst);
        Ok(Received {
            borrower: self.clone(),
            slot,
            len: len as usize,
        })
    }
}

/// A slot named by the peer that does not fit the segment or what this side knows of it: the
/// peer is not following the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SlotError {
    /// The receiver gave back a slot the sender did not lend.
    #[error("it gave back slot {slot}, which it did not hold")]
    NotLent {
        /// The slot.
        slot: u32,
    },
    /// The receiver gave back a slot beyond the sender's segment.
    #[error("it gave back slot {slot} of a segment of {slots}")]
    GivenBackOutside {
        /// The slot.
        slot: u32,
        /// The segment's slots.
        slots: usize,
    },
    /// The sender lent a slot beyond its segment, or a chunk longer than a slot.
    #[error(
        "a chunk of {len} bytes in slot {slot} of a segment of {slots} slots of {slot_bytes} bytes"
    )]
    ChunkOutside {
        /// The slot.
        slot: u32,
        /// The chunk's length.
        len: u64,
        /// The segment's slots.
        slots: u32,
        /// The bytes of one slot.
        slot_bytes: usize,
    },
    /// The sender lent a slot the receiver had not given back yet.
    #[error("it lent slot {slot} again before this member gave it back")]
    LentAgain {
        /// The slot.
        slot: u32,
    },
}

/// A chunk read where its sender lent it; the slot goes back when this drops.
pub(crate) struct Received {
    borrower: Arc<Borrower>,
    slot: u32,
    len: usize,
}

impl Received {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the slot lies within the mapping and holds `len` bytes (checked by `take`);
        // it is this `Received`'s until it drops (`held`), and its sender does not write it
        // while it is lent (module doc).
        unsafe { std::slice::from_raw_parts(self.borrower.segment.slot_ptr(self.slot), self.len) }
    }
}

impl Drop for Received {
    fn drop(&mut self) {
        let borrower = &self.borrower;
        borrower.held.lock().unwrap_or_else(|p| p.into_inner())[self.slot as usize] = false;
        // A link that ended takes no credits any more.
        let _ = borrower.credits.send(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(
        slots: u32,
        slot_bytes: usize,
    ) -> (Lender, Arc<Borrower>, mpsc::UnboundedReceiver<u32>) {
        let (segment, offer) = Segment::create(slots, slot_bytes).unwrap();
        let theirs = Segment::open(&offer).unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        (Lender::new(segment), Borrower::new(theirs, tx), rx)
    }

    #[test]
    fn a_lent_chunk_reads_back_and_its_slot_returns_when_dropped() {
        let (lender, borrower, mut credits) = pair(2, 16);
        let a = lender.lend(b"hello").unwrap();
        let b = lender.lend(&[7u8; 16]).unwrap();
        assert_ne!(a, b);
        assert_eq!(lender.lend(b"x"), None, "every slot is lent");
        assert_eq!(lender.lend(&[0u8; 17]), None, "larger than a slot");
        let got = borrower.take(a, 5).unwrap();
        assert_eq!(got.bytes(), b"hello");
        assert!(
            matches!(borrower.take(a, 5), Err(SlotError::LentAgain { slot }) if slot == a),
            "a slot held here lent again"
        );
        drop(got);
        assert_eq!(credits.try_recv().unwrap(), a);
        lender.give_back(a).unwrap();
        assert_eq!(
            lender.give_back(a),
            Err(SlotError::NotLent { slot: a }),
            "given back twice"
        );
        assert_eq!(
            lender.give_back(9),
            Err(SlotError::GivenBackOutside { slot: 9, slots: 2 }),
            "no such slot"
        );
        assert_eq!(lender.lend(b"again").unwrap(), a);
    }

    #[test]
    fn a_receiver_refuses_slots_and_lengths_outside_the_segment() {
        let (_lender, borrower, _credits) = pair(2, 16);
        assert!(matches!(
            borrower.take(2, 1),
            Err(SlotError::ChunkOutside { slot: 2, .. })
        ));
        assert!(matches!(
            borrower.take(0, 17),
            Err(SlotError::ChunkOutside { len: 17, .. })
        ));
    }

    #[test]
    fn only_a_segment_as_offered_opens_and_its_file_goes_once_both_have_it() {
        let (segment, offer) = Segment::create(1, 8).unwrap();
        let path = PathBuf::from(SHM_DIR).join(&offer.name);
        assert!(path.exists());
        for wrong in [
            Offer {
                probe: offer.probe ^ 1,
                ..offer.clone()
            },
            Offer {
                slot_bytes: 16,
                ..offer.clone()
            },
            Offer {
                name: "../etc/passwd".into(),
                ..offer.clone()
            },
            Offer {
                name: offer.name.replacen('-', "-../", 1),
                ..offer.clone()
            },
            Offer {
                slots: SLOTS_MAX + 1,
                ..offer.clone()
            },
        ] {
            assert!(Segment::open(&wrong).is_err(), "{wrong:?} opened");
        }
        assert!(
            path.exists(),
            "a refused offer leaves the file to its maker"
        );
        let _theirs = Segment::open(&offer).unwrap();
        assert!(!path.exists(), "the opener unlinks it");
        drop(segment);
    }

    #[test]
    fn a_segment_left_behind_by_a_process_gone_is_removed_by_the_next_maker() {
        // A process that has exited (reaped): its id names no process now.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let left = PathBuf::from(SHM_DIR).join(format!("{NAME_PREFIX}{gone}-{:032x}", 7u128));
        std::fs::write(&left, b"left behind").unwrap();
        let alive = PathBuf::from(SHM_DIR).join(format!(
            "{NAME_PREFIX}{}-{:032x}",
            std::process::id(),
            9u128
        ));
        std::fs::write(&alive, b"still in use").unwrap();
        let (_segment, _offer) = Segment::create(1, 8).unwrap();
        let (left_there, alive_there) = (left.exists(), alive.exists());
        let _ = std::fs::remove_file(&left);
        let _ = std::fs::remove_file(&alive);
        assert!(!left_there, "a dead maker's segment stays");
        assert!(alive_there, "a live maker's segment went");
    }

    #[test]
    fn a_segment_never_opened_is_unlinked_by_its_maker() {
        let (segment, offer) = Segment::create(1, 8).unwrap();
        let path = PathBuf::from(SHM_DIR).join(&offer.name);
        drop(segment);
        assert!(!path.exists());
    }
}
