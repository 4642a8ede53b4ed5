//! NCCL inside a worker (feature `nccl`): the all-reduce of gradients on the GPUs, between the
//! processes of a [`ProcessGroup`] ([`NcclComm`], one GPU per process) or between the GPUs of
//! one process ([`NcclLocal`]).
//!
//! This module owns the loading of NCCL and of the CUDA driver, the communicators and their
//! life: one per membership generation, bootstrapped over the group, aborted when the group breaks.
//!
//! - Loading: everything is opened at run time, so the crate builds and runs without CUDA.
//!   libnccl is opened by its soname, `libnccl.so.2` (what the `nvidia-nccl-cu12`/`-cu13`
//!   wheels and the `libnccl2` packages ship; `libnccl.so` is tried after it), from the
//!   loader's search path (`LD_LIBRARY_PATH`); the CUDA driver (`libcuda.so.1`) through
//!   cudarc. A missing library or symbol is an [`NcclError::Load`] naming it, never a panic.
//! - Bootstrap: rank 0 makes NCCL's unique id; it reaches the others with the group's
//!   broadcast over QUIC ([`NcclId::exchange`]); each member inits its rank on its GPU with a
//!   non-blocking communicator, polled until ready within the caller's timeout. A member whose
//!   init fails aborts the group, so that the others' inits end too.
//! - Failure: a watcher aborts the communicator (`ncclCommAbort`) as soon as its group breaks
//!   (a member lost, an application abort): a pending call returns
//!   [`NcclError::Aborted`] naming the generation instead of hanging, and so does every later call.
//!   The group re-forms at a new generation ([`ProcessGroup::reform`]); the new group needs a new
//!   communicator. Every wait is bounded by the communicator's timeout.
//! - Data: host tensors are fused per bucket ([`plan_buckets`]) into one device buffer, copied
//!   to the GPU, all-reduced in place on the communicator's stream, and copied back to the
//!   host, where a parameter-server push takes them. MultiWorkerMirrored sums its gradients
//!   this way with `Communication::Nccl` (`ProcessSpan::with_nccl`
//!   makes one communicator per generation of its span).

// The NCCL entry points are C functions loaded at run time: calling them is unsafe, and each
// call below says why its arguments are valid.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t, ncclUniqueId};

use super::{plan_buckets, CollectiveError, Element, ProcessGroup, Reduction};

/// Why an NCCL operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NcclError {
    /// A shared library or one of its symbols could not be loaded.
    #[error("cannot load {library}: {reason}")]
    Load {
        /// The library (or library and symbol).
        library: String,
        /// What the loader said, and where to look.
        reason: String,
    },
    /// A CUDA driver call failed (no such device, out of memory, ...).
    #[error("CUDA {during}: {reason}")]
    Cuda {
        /// What was being done.
        during: String,
        /// The driver's error.
        reason: String,
    },
    /// An NCCL call returned an error.
    #[error("NCCL {call} failed{}: {message} (ncclResult_t {code})", generation_suffix(*.generation))]
    Nccl {
        /// The function.
        call: &'static str,
        /// The communicator's generation, when the call was on one.
        generation: Option<u64>,
        /// The `ncclResult_t`.
        code: i32,
        /// NCCL's error string and last error.
        message: String,
    },
    /// The communicator was aborted (its group broke, or an earlier call failed): every
    /// pending and later call fails with this error. Re-form the group and make a new one.
    #[error("NCCL communicator of group generation {generation} aborted: {reason}")]
    Aborted {
        /// The communicator's membership generation.
        generation: u64,
        /// Why.
        reason: String,
    },
    /// A wait passed the communicator's timeout (the communicator is aborted).
    #[error("NCCL communicator of group generation {generation}: {what} did not finish within {timeout_ms} ms")]
    Timeout {
        /// The communicator's membership generation.
        generation: u64,
        /// What was waited for.
        what: &'static str,
        /// The timeout.
        timeout_ms: u64,
    },
    /// The group's broadcast of the unique id failed.
    #[error("NCCL bootstrap over the group of generation {generation}: {source}")]
    Bootstrap {
        /// The group's generation.
        generation: u64,
        /// The group's error.
        #[source]
        source: CollectiveError,
    },
    /// The caller's arguments cannot work (dtype, device, shapes).
    #[error("NCCL: {0}")]
    InvalidArgument(String),
}

impl NcclError {
    /// Whether this member's own call raised it (a library or the driver, its arguments, an
    /// NCCL call that returned an error): not a peer's failure seen through NCCL (an
    /// asynchronous error, a wait that timed out, an aborted communicator).
    pub fn raised_here(&self) -> bool {
        match self {
            NcclError::Load { .. } | NcclError::Cuda { .. } | NcclError::InvalidArgument(_) => true,
            NcclError::Nccl { call, .. } => *call != ASYNC_CALL,
            NcclError::Aborted { .. } | NcclError::Timeout { .. } | NcclError::Bootstrap { .. } => {
                false
            }
        }
    }
}

/// What an [`NcclError::Nccl`] names as its call when the communicator reported it
/// asynchronously (`ncclCommGetAsyncError`): a failure of the collective, often a peer's.
const ASYNC_CALL: &str = "(asynchronous)";

fn generation_suffix(generation: Option<u64>) -> String {
    generation.map_or_else(String::new, |e| {
        format!(" on the communicator of group generation {e}")
    })
}

// ---------------------------------------------------------------------------------------
// Loading.

type NcclResult = c_int;
type Comm = *mut c_void;
const NCCL_SUCCESS: NcclResult = 0;
const NCCL_IN_PROGRESS: NcclResult = 7;

/// The NCCL entry points this module calls, resolved once.
struct Api {
    library: &'static str,
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> NcclResult,
    init_rank_config:
        unsafe extern "C" fn(*mut Comm, c_int, ncclUniqueId, c_int, *mut Config) -> NcclResult,
    init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        *mut c_void,
    ) -> NcclResult,
    group_start: unsafe extern "C" fn() -> NcclResult,
    group_end: unsafe extern "C" fn() -> NcclResult,
    comm_abort: unsafe extern "C" fn(Comm) -> NcclResult,
    get_async_error: unsafe extern "C" fn(Comm, *mut NcclResult) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    get_last_error: unsafe extern "C" fn(Comm) -> *const c_char,
}

/// The names tried, in order: the soname first (the only name the wheels ship).
const LIBRARY_NAMES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// The config of a non-blocking communicator: the fields of NCCL 2.18's `ncclConfig_t` (the
/// first to have `splitShare`), which every later NCCL reads by the `size` and `version`
/// given here (the rest keep their defaults).
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

const CONFIG_UNDEF_INT: c_int = c_int::MIN;

impl Config {
    fn non_blocking() -> Config {
        Config {
            size: std::mem::size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 21800,
            blocking: 0,
            cga_cluster_size: CONFIG_UNDEF_INT,
            min_ctas: CONFIG_UNDEF_INT,
            max_ctas: CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: CONFIG_UNDEF_INT,
        }
    }
}

fn api() -> Result<&'static Api, NcclError> {
    static API: OnceLock<Result<Api, NcclError>> = OnceLock::new();
    API.get_or_init(load_api).as_ref().map_err(Clone::clone)
}

fn load_api() -> Result<Api, NcclError> {
    let mut tried = Vec::new();
    for name in LIBRARY_NAMES {
        // SAFETY: opening libnccl runs its initializers, which only set up NCCL's own state.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => {
                // The library stays loaded for the life of the process: the entry points below
                // point into it.
                let lib: &'static libloading::Library = Box::leak(Box::new(lib));
                return resolve(name, lib);
            }
            Err(e) => tried.push(error_chain(&e)),
        }
    }
    Err(NcclError::Load {
        library: LIBRARY_NAMES[0].to_string(),
        reason: format!(
            "{} (put the directory holding it on LD_LIBRARY_PATH, e.g. the lib directory of \
             the nvidia-nccl-cu12 or nvidia-nccl-cu13 Python wheel)",
            tried.join("; ")
        ),
    })
}

/// An error and its sources, joined (libloading's own message is only "dlopen failed").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

fn resolve(library: &'static str, lib: &'static libloading::Library) -> Result<Api, NcclError> {
    fn sym<T: Copy>(
        library: &str,
        lib: &'static libloading::Library,
        name: &str,
    ) -> Result<T, NcclError> {
        // SAFETY: each `T` below is the C signature of the symbol of that name in nccl.h.
        unsafe { lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| NcclError::Load {
                library: format!("{library} symbol {name}"),
                reason: error_chain(&e),
            })
    }
    Ok(Api {
        library,
        get_version: sym(library, lib, "ncclGetVersion")?,
        get_unique_id: sym(library, lib, "ncclGetUniqueId")?,
        init_rank_config: sym(library, lib, "ncclCommInitRankConfig")?,
        init_all: sym(library, lib, "ncclCommInitAll")?,
        all_reduce: sym(library, lib, "ncclAllReduce")?,
        group_start: sym(library, lib, "ncclGroupStart")?,
        group_end: sym(library, lib, "ncclGroupEnd")?,
        comm_abort: sym(library, lib, "ncclCommAbort")?,
        get_async_error: sym(library, lib, "ncclCommGetAsyncError")?,
        get_error_string: sym(library, lib, "ncclGetErrorString")?,
        get_last_error: sym(library, lib, "ncclGetLastError")?,
    })
}

impl Api {
    /// The typed error of a failed call: NCCL's string for the code and its last error.
    fn error(
        &self,
        call: &'static str,
        generation: Option<u64>,
        code: NcclResult,
        comm: Comm,
    ) -> NcclError {
        // SAFETY: NCCL returns static or per-thread NUL-terminated strings (or null).
        let text = |p: *const c_char| {
            (!p.is_null())
                .then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
                .filter(|s| !s.is_empty())
        };
        // SAFETY: any code is accepted; a null comm asks for the thread's last error.
        let name = text(unsafe { (self.get_error_string)(code) });
        let last = text(unsafe { (self.get_last_error)(comm) });
        let message = match (name, last) {
            (Some(n), Some(l)) => format!("{n}; {l}"),
            (Some(s), None) | (None, Some(s)) => s,
            (None, None) => "no message".to_string(),
        };
        NcclError::Nccl {
            call,
            generation,
            code,
            message,
        }
    }
}

/// The NCCL library this process loaded and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclVersion {
    /// Major version (2).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
    /// The name the library was opened by.
    pub library: String,
}

impl std::fmt::Display for NcclVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Loads NCCL (once per process) and returns its version (`ncclGetVersion`), or the error
/// naming what failed to load. Needs no GPU.
pub fn nccl_version() -> Result<NcclVersion, NcclError> {
    let api = api()?;
    let mut code: c_int = 0;
    // SAFETY: `code` is a valid out-pointer.
    let rc = unsafe { (api.get_version)(&mut code) };
    if rc != NCCL_SUCCESS {
        return Err(api.error("ncclGetVersion", None, rc, std::ptr::null_mut()));
    }
    let code = code.max(0) as u32;
    // NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9, major*1000 + ... before.
    let (major, minor, patch) = if code >= 10000 {
        (code / 10000, code % 10000 / 100, code % 100)
    } else {
        (code / 1000, code % 1000 / 100, code % 100)
    };
    Ok(NcclVersion {
        major,
        minor,
        patch,
        library: api.library.to_string(),
    })
}

/// A GPU this process sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Its CUDA ordinal.
    pub ordinal: usize,
    /// Its name.
    pub name: String,
}

/// How many GPUs this process sees (`CUDA_VISIBLE_DEVICES` applies), without making a
/// context on any (a GPU in exclusive-process mode may be another process's), or the error
/// naming what failed (no CUDA driver is [`NcclError::Load`]).
pub fn gpu_count() -> Result<usize, NcclError> {
    guarded("cuDeviceGetCount", || {
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| cuda("counting devices", e))
    })
}

/// The GPUs this process sees (`CUDA_VISIBLE_DEVICES` applies), or the error naming what
/// failed (no CUDA driver is [`NcclError::Load`]; a driver without devices is an empty list).
pub fn visible_gpus() -> Result<Vec<Gpu>, NcclError> {
    let count = guarded("cuDeviceGetCount", || {
        CudaContext::device_count().map_err(|e| cuda("counting devices", e))
    })?;
    (0..count.max(0) as usize)
        .map(|ordinal| {
            let ctx = context(ordinal)?;
            let name = ctx
                .name()
                .map_err(|e| cuda(&format!("name of device {ordinal}"), e))?;
            Ok(Gpu { ordinal, name })
        })
        .collect()
}

fn cuda(during: &str, e: impl std::fmt::Debug) -> NcclError {
    NcclError::Cuda {
        during: during.to_string(),
        reason: format!("{e:?}"),
    }
}

/// Runs a CUDA driver call through cudarc, whose loader panics on a missing library or
/// symbol: checks the library first, and turns a panic into [`NcclError::Load`].
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, NcclError>) -> Result<T, NcclError> {
    // SAFETY: only tries to open the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(NcclError::Load {
            library: "libcuda.so.1".to_string(),
            reason: "the CUDA driver is not installed (no GPU on this machine?)".to_string(),
        });
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let reason = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the driver library is too old".to_string());
        Err(NcclError::Load {
            library: format!("libcuda.so.1 ({what})"),
            reason,
        })
    })
}

/// The primary context of GPU `ordinal`.
fn context(ordinal: usize) -> Result<Arc<CudaContext>, NcclError> {
    guarded("cuInit", || {
        let count = CudaContext::device_count().map_err(|e| cuda("counting devices", e))?;
        if ordinal >= count.max(0) as usize {
            return Err(NcclError::InvalidArgument(format!(
                "device {ordinal} does not exist: this process sees {count} GPU(s)"
            )));
        }
        CudaContext::new(ordinal).map_err(|e| cuda(&format!("context of device {ordinal}"), e))
    })
}

// ---------------------------------------------------------------------------------------
// The unique id.

/// NCCL's unique id of one communicator: made by rank 0, the same on every rank.
#[derive(Clone, Copy)]
pub struct NcclId(ncclUniqueId);

impl PartialEq for NcclId {
    fn eq(&self, other: &NcclId) -> bool {
        self.0.internal == other.0.internal
    }
}

impl Eq for NcclId {}

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NcclId(..)")
    }
}

/// Bytes of the id's broadcast: a status byte (1: rank 0 made an id) and the id.
const ID_MESSAGE: usize = 1 + 128;

impl NcclId {
    /// A new id (`ncclGetUniqueId`; it names this host's bootstrap address, needs no GPU).
    pub fn new() -> Result<NcclId, NcclError> {
        let api = api()?;
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a valid out-pointer.
        let rc = unsafe { (api.get_unique_id)(&mut id) };
        if rc != NCCL_SUCCESS {
            return Err(api.error("ncclGetUniqueId", None, rc, std::ptr::null_mut()));
        }
        Ok(NcclId(id))
    }

    /// Rank 0 makes the id and every member of `group` gets it, by the group's broadcast over
    /// QUIC. Every member calls it (it is one collective call of the group). A rank 0 that
    /// cannot make one still broadcasts, so that every member fails with an error, not a wait.
    pub async fn exchange(group: &ProcessGroup) -> Result<NcclId, NcclError> {
        let generation = group.generation();
        let mut message = vec![0u8; ID_MESSAGE];
        let mine = if group.rank() == 0 {
            let made = NcclId::new();
            if let Ok(id) = &made {
                message[0] = 1;
                for (b, c) in message[1..].iter_mut().zip(id.0.internal) {
                    *b = c as u8;
                }
            }
            Some(made)
        } else {
            None
        };
        let tensor = Tensor::from_vec(message, ID_MESSAGE, &Device::Cpu)
            .map_err(|e| NcclError::InvalidArgument(e.to_string()))?;
        let got = group
            .broadcast(0, &tensor)
            .await
            .map_err(|source| NcclError::Bootstrap { generation, source })?;
        if let Some(made) = mine {
            return made;
        }
        let bytes = got
            .to_vec1::<u8>()
            .map_err(|e| NcclError::InvalidArgument(e.to_string()))?;
        if bytes.len() != ID_MESSAGE || bytes[0] != 1 {
            return Err(NcclError::Aborted {
                generation,
                reason: "rank 0 could not make the NCCL unique id".to_string(),
            });
        }
        let mut id = ncclUniqueId { internal: [0; 128] };
        for (c, b) in id.internal.iter_mut().zip(&bytes[1..]) {
            *c = *b as c_char;
        }
        Ok(NcclId(id))
    }
}

// ---------------------------------------------------------------------------------------
// One rank's communicator, shared by both kinds of groups.

/// The raw communicator, behind the lock that orders every NCCL call on it with its abort.
struct RawComm(Comm);

// SAFETY: an ncclComm_t may be used from any thread; every use goes through `Shared::state`'s
// lock, so no two threads call NCCL on it at once.
unsafe impl Send for RawComm {}

struct State {
    comm: Option<RawComm>,
    aborted: Option<String>,
}

/// What the communicator's calls, its watcher and its owner share.
struct Shared {
    api: &'static Api,
    generation: u64,
    state: Mutex<State>,
}

impl Shared {
    fn new(api: &'static Api, generation: u64, comm: Comm) -> Shared {
        Shared {
            api,
            generation,
            state: Mutex::new(State {
                comm: Some(RawComm(comm)),
                aborted: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn aborted(&self, reason: String) -> NcclError {
        NcclError::Aborted {
            generation: self.generation,
            reason,
        }
    }

    /// Aborts the communicator (`ncclCommAbort`: pending work on it ends) and keeps `reason`
    /// for every later call; the first reason wins. Every call after this one is refused at
    /// once: the abort itself runs on a thread of its own (it joins NCCL's threads, which may
    /// take a while), never under the lock and never on the caller's thread.
    fn abort(&self, reason: String) -> NcclError {
        let (comm, reason) = {
            let mut state = self.lock();
            let comm = state.comm.take();
            (comm, state.aborted.get_or_insert(reason).clone())
        };
        if let Some(comm) = comm {
            abort_in_background(self.api, comm);
        }
        self.aborted(reason)
    }

    /// Runs one NCCL call on the live communicator, or refuses with why it was aborted; a
    /// failed call aborts the communicator.
    fn call(
        &self,
        name: &'static str,
        f: impl FnOnce(&'static Api, Comm) -> NcclResult,
    ) -> Result<NcclResult, NcclError> {
        self.call_then(name, true, f)
    }

    /// [`Shared::call`]; inside an open NCCL group (`abort_on_failure` false) a failed call
    /// leaves the abort to the caller, after the group ends: aborting a communicator the open
    /// group still refers to would race its end.
    fn call_then(
        &self,
        name: &'static str,
        abort_on_failure: bool,
        f: impl FnOnce(&'static Api, Comm) -> NcclResult,
    ) -> Result<NcclResult, NcclError> {
        let state = self.lock();
        let Some(comm) = &state.comm else {
            let reason = state.aborted.clone().unwrap_or_default();
            return Err(self.aborted(reason));
        };
        let rc = f(self.api, comm.0);
        if rc == NCCL_SUCCESS || rc == NCCL_IN_PROGRESS {
            return Ok(rc);
        }
        let err = self.api.error(name, Some(self.generation), rc, comm.0);
        drop(state);
        // A failed communicator cannot be used again; abort it so that the peers' calls end.
        if abort_on_failure {
            self.abort(err.to_string());
        }
        Err(err)
    }

    /// Whether the communicator's background work (init, enqueueing) is done: its async error
    /// is `ncclSuccess` (true), `ncclInProgress` (false), or the error.
    fn ready(&self) -> Result<bool, NcclError> {
        let mut state: NcclResult = NCCL_SUCCESS;
        let rc = self.call("ncclCommGetAsyncError", |api, comm| {
            // SAFETY: live comm, valid out-pointer.
            unsafe { (api.get_async_error)(comm, &mut state) }
        })?;
        if rc != NCCL_SUCCESS {
            return Ok(false);
        }
        match state {
            NCCL_SUCCESS => Ok(true),
            NCCL_IN_PROGRESS => Ok(false),
            code => {
                let err = {
                    let s = self.lock();
                    let comm = s.comm.as_ref().map_or(std::ptr::null_mut(), |c| c.0);
                    self.api
                        .error(ASYNC_CALL, Some(self.generation), code, comm)
                };
                self.abort(err.to_string());
                Err(err)
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Abort rather than finalize: finalizing waits for the peers, which may be gone.
        let comm = self.lock().comm.take();
        if let Some(comm) = comm {
            abort_in_background(self.api, comm);
        }
    }
}

/// `ncclCommAbort` on a thread of its own (the comm was taken out of its state: nothing else
/// uses it any more).
fn abort_in_background(api: &'static Api, comm: RawComm) {
    let abort = move || {
        let comm = comm;
        // SAFETY: a live comm, owned by this thread alone.
        let rc = unsafe { (api.comm_abort)(comm.0) };
        if rc != NCCL_SUCCESS {
            tracing::warn!("ncclCommAbort returned {rc}");
        }
    };
    if let Err(e) = std::thread::Builder::new()
        .name("nccl-abort".into())
        .spawn(abort)
    {
        tracing::warn!("NCCL abort thread not started, the communicator leaks: {e}");
    }
}

/// One rank: its communicator, GPU and stream.
struct Rank {
    shared: Arc<Shared>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

/// Element types the NCCL all-reduce takes.
trait NcclElement: DeviceRepr + candle_core::WithDType + Default {
    const NCCL_DTYPE: ncclDataType_t;
}

impl NcclElement for f32 {
    const NCCL_DTYPE: ncclDataType_t = ncclDataType_t::ncclFloat32;
}

impl NcclElement for f64 {
    const NCCL_DTYPE: ncclDataType_t = ncclDataType_t::ncclFloat64;
}

fn nccl_op(op: Reduction) -> ncclRedOp_t {
    match op {
        Reduction::Sum => ncclRedOp_t::ncclSum,
        Reduction::Mean => ncclRedOp_t::ncclAvg,
        Reduction::Max => ncclRedOp_t::ncclMax,
        Reduction::Min => ncclRedOp_t::ncclMin,
    }
}

impl Rank {
    fn bind(&self) -> Result<(), NcclError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda("binding the context", e))
    }

    /// Enqueues an in-place all-reduce of `buf` on the stream.
    /// Inside an open NCCL group (`in_group`), a failure does not abort the communicator: the
    /// caller aborts every rank once the group ended.
    fn enqueue<T: NcclElement>(
        &self,
        op: Reduction,
        send: Option<&CudaSlice<T>>,
        recv: &mut CudaSlice<T>,
        in_group: bool,
    ) -> Result<(), NcclError> {
        self.bind()?;
        let len = recv.len();
        if send.is_some_and(|s| s.len() != len) {
            return Err(NcclError::InvalidArgument(
                "send and receive buffers differ in length".into(),
            ));
        }
        let stream = self.stream.cu_stream() as *mut c_void;
        // The guards record their events when they drop, as this returns: before the
        // non-blocking communicator has put the kernel on the stream. Every later use of these
        // buffers is on this stream after `wait_all`, so nothing relies on those events.
        let (src, _read) = send.map(|s| s.device_ptr(&self.stream)).unzip();
        let (dst, _written) = recv.device_ptr_mut(&self.stream);
        let dst = dst as *mut c_void;
        let src = src.map_or(dst as *const c_void, |p| p as *const c_void);
        self.shared
            .call_then("ncclAllReduce", !in_group, |api, comm| {
                // SAFETY: `src` and `dst` hold `len` elements of T on this rank's device, alive
                // until the stream's work is waited for (the caller's buffers outlive the wait);
                // the stream belongs to the comm's device.
                unsafe {
                    (api.all_reduce)(
                        src,
                        dst,
                        len,
                        T::NCCL_DTYPE as c_int,
                        nccl_op(op) as c_int,
                        comm,
                        stream,
                    )
                }
            })?;
        Ok(())
    }

    fn upload<T: NcclElement>(&self, host: &[T]) -> Result<CudaSlice<T>, NcclError> {
        self.stream
            .clone_htod(host)
            .map_err(|e| cuda("copying a bucket to the device", e))
    }

    fn download<T: NcclElement>(&self, buf: &CudaSlice<T>) -> Result<Vec<T>, NcclError> {
        self.stream
            .clone_dtoh(buf)
            .map_err(|e| cuda("copying a bucket to the host", e))
    }
}

/// Waits until every rank's enqueued work is done, `live` says the group still stands, and
/// nothing failed; aborts every rank's communicator on a failure or at `timeout`.
///
/// First the communicators' background work (a non-blocking communicator may still be
/// connecting or enqueueing: its work is not on the stream yet), then the streams.
async fn wait_all(
    ranks: &[&Rank],
    what: &'static str,
    timeout: Duration,
    live: &(dyn Fn() -> Option<String> + Sync),
) -> Result<(), NcclError> {
    let started = Instant::now();
    let fail = |err: NcclError| {
        for rank in ranks {
            rank.shared.abort(err.to_string());
        }
        err
    };
    let check = || -> Result<(), NcclError> {
        if let Some(reason) = live() {
            return Err(fail(ranks[0].shared.abort(reason)));
        }
        if started.elapsed() >= timeout {
            return Err(fail(NcclError::Timeout {
                generation: ranks[0].shared.generation,
                what,
                timeout_ms: timeout.as_millis() as u64,
            }));
        }
        Ok(())
    };
    loop {
        let mut ready = true;
        for rank in ranks {
            ready &= rank.shared.ready().map_err(fail)?;
        }
        if ready {
            break;
        }
        check()?;
        pause(started).await;
    }
    let mut events = Vec::with_capacity(ranks.len());
    for rank in ranks {
        rank.bind()?;
        events.push(
            rank.stream
                .record_event(None)
                .map_err(|e| fail(cuda("recording an event", e)))?,
        );
    }
    loop {
        let mut done = true;
        for (rank, event) in ranks.iter().zip(&events) {
            // An asynchronous error (a peer's failure seen by NCCL) ends the wait too.
            rank.shared.ready().map_err(fail)?;
            rank.bind()?;
            done &= event
                .try_is_complete()
                .map_err(|e| fail(cuda("waiting for the stream", e)))?;
        }
        if done {
            return Ok(());
        }
        check()?;
        pause(started).await;
    }
}

/// Between two polls: yield at first (a small all-reduce takes microseconds), then sleep.
async fn pause(started: Instant) {
    if started.elapsed() < Duration::from_millis(2) {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

/// The buckets of `tensors`, each checked for an element type NCCL reduces here.
fn buckets(
    tensors: &[Tensor],
    bucket_bytes_max: usize,
) -> Result<Vec<(DType, Range<usize>)>, NcclError> {
    if bucket_bytes_max == 0 {
        return Err(NcclError::InvalidArgument(
            "bucket_bytes_max must be above 0".into(),
        ));
    }
    let mut described = Vec::with_capacity(tensors.len());
    for t in tensors {
        let element =
            Element::of(t.dtype()).map_err(|e| NcclError::InvalidArgument(e.to_string()))?;
        if !matches!(t.dtype(), DType::F32 | DType::F64) {
            return Err(NcclError::InvalidArgument(format!(
                "the NCCL all-reduce takes f32 and f64 tensors, not {:?}",
                t.dtype()
            )));
        }
        // `plan_buckets` weighs bytes.
        described.push((element, t.elem_count() * t.dtype().size_in_bytes()));
    }
    Ok(plan_buckets(&described, bucket_bytes_max)
        .into_iter()
        .map(|r| (tensors[r.start].dtype(), r))
        .collect())
}

/// One bucket's tensors as one host buffer.
fn fuse<T: NcclElement>(tensors: &[Tensor]) -> Result<Vec<T>, NcclError> {
    let mut host = Vec::with_capacity(tensors.iter().map(Tensor::elem_count).sum());
    for t in tensors {
        let flat = t
            .flatten_all()
            .and_then(|f| f.to_vec1::<T>())
            .map_err(|e| NcclError::InvalidArgument(e.to_string()))?;
        host.extend_from_slice(&flat);
    }
    Ok(host)
}

/// A reduced host buffer cut back into the shapes of `like`.
fn split<T: NcclElement>(host: &[T], like: &[Tensor]) -> Result<Vec<Tensor>, NcclError> {
    let mut at = 0;
    like.iter()
        .map(|t| {
            let n = t.elem_count();
            let out = Tensor::from_slice(&host[at..at + n], t.dims(), &Device::Cpu)
                .map_err(|e| NcclError::InvalidArgument(e.to_string()));
            at += n;
            out
        })
        .collect()
}

/// Fuses, uploads, all-reduces (every rank at once, in one NCCL group), waits and downloads
/// one bucket; `inputs[r]` are rank `r`'s tensors of the bucket.
async fn reduce_bucket<T: NcclElement>(
    ranks: &[&Rank],
    op: Reduction,
    inputs: &[&[Tensor]],
    timeout: Duration,
    live: &(dyn Fn() -> Option<String> + Sync),
) -> Result<Vec<Vec<Tensor>>, NcclError> {
    let mut hosts = Vec::with_capacity(ranks.len());
    for tensors in inputs {
        hosts.push(fuse::<T>(tensors)?);
    }
    if hosts.iter().all(Vec::is_empty) {
        // Nothing to move: every rank has the same (empty) bucket, so every rank skips it.
        return inputs.iter().map(|t| split::<T>(&[], t)).collect();
    }
    let mut bufs = Vec::with_capacity(ranks.len());
    for (rank, host) in ranks.iter().zip(&hosts) {
        bufs.push(rank.upload(host)?);
    }
    let api = ranks[0].shared.api;
    let grouped = ranks.len() > 1;
    if grouped {
        // SAFETY: no arguments; paired with the group end below.
        unsafe { (api.group_start)() };
    }
    let mut enqueued = Ok(());
    for (rank, buf) in ranks.iter().zip(bufs.iter_mut()) {
        enqueued = enqueued.and_then(|()| rank.enqueue(op, None, buf, grouped));
    }
    if grouped {
        // SAFETY: closes the group opened above.
        let rc = unsafe { (api.group_end)() };
        if rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS && enqueued.is_ok() {
            enqueued = Err(api.error(
                "ncclGroupEnd",
                Some(ranks[0].shared.generation),
                rc,
                std::ptr::null_mut(),
            ));
        }
    }
    let waited = match enqueued {
        Err(e) => {
            for rank in ranks {
                rank.shared.abort(e.to_string());
            }
            Err(e)
        }
        Ok(()) => wait_all(ranks, "all-reduce", timeout, live).await,
    };
    if let Err(e) = waited {
        // A non-blocking communicator puts the kernel on the stream from a thread of its own,
        // which may still be at it until the abort joins it: freeing the buffers now (a free
        // ordered on the stream) could free them under the kernel. They stay allocated: one
        // bucket per failed communicator, which its group replaces.
        std::mem::forget(bufs);
        return Err(e);
    }
    let mut outs = Vec::with_capacity(ranks.len());
    for ((rank, buf), tensors) in ranks.iter().zip(&bufs).zip(inputs) {
        let host = rank.download(buf)?;
        outs.push(split(&host, tensors)?);
    }
    Ok(outs)
}

/// All-reduces every rank's `inputs` bucket by bucket; result per rank, in input order.
async fn all_reduce_ranks(
    ranks: &[&Rank],
    op: Reduction,
    inputs: &[&[Tensor]],
    bucket_bytes_max: usize,
    timeout: Duration,
    live: &(dyn Fn() -> Option<String> + Sync),
) -> Result<Vec<Vec<Tensor>>, NcclError> {
    let plan = buckets(inputs[0], bucket_bytes_max)?;
    for (r, tensors) in inputs.iter().enumerate().skip(1) {
        let same = tensors.len() == inputs[0].len()
            && tensors
                .iter()
                .zip(inputs[0])
                .all(|(a, b)| a.dims() == b.dims() && a.dtype() == b.dtype());
        if !same {
            return Err(NcclError::InvalidArgument(format!(
                "replica {r}'s tensors differ from replica 0's in number, shape or dtype"
            )));
        }
    }
    let mut outs: Vec<Vec<Tensor>> = vec![Vec::new(); ranks.len()];
    for (dtype, range) in plan {
        let parts: Vec<&[Tensor]> = inputs.iter().map(|t| &t[range.clone()]).collect();
        let reduced = match dtype {
            DType::F64 => reduce_bucket::<f64>(ranks, op, &parts, timeout, live).await?,
            _ => reduce_bucket::<f32>(ranks, op, &parts, timeout, live).await?,
        };
        for (out, r) in outs.iter_mut().zip(reduced) {
            out.extend(r);
        }
    }
    Ok(outs)
}

// ---------------------------------------------------------------------------------------
// Between processes.

/// How often the watcher looks at its group.
const WATCH_EVERY: Duration = Duration::from_millis(20);

/// One process's NCCL communicator in a [`ProcessGroup`] of one membership generation, on one GPU.
pub struct NcclComm {
    rank: Rank,
    group: ProcessGroup,
    timeout: Duration,
}

impl std::fmt::Debug for NcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclComm")
            .field("generation", &self.generation())
            .field("rank", &self.group.rank())
            .field("size", &self.group.size())
            .field("device", &self.rank.ctx.ordinal())
            .finish()
    }
}

impl NcclComm {
    /// The communicator of `group`'s generation on GPU `device`: the id from rank 0 over the group
    /// ([`NcclId::exchange`]), then [`NcclComm::init`]. Every member calls it.
    pub async fn new(
        group: &ProcessGroup,
        device: usize,
        timeout: Duration,
    ) -> Result<NcclComm, NcclError> {
        let id = NcclId::exchange(group).await?;
        NcclComm::init(group, id, device, timeout).await
    }

    /// Inits this member's rank of the communicator of `id` on GPU `device` (non-blocking,
    /// polled until ready within `timeout`, which also bounds every later wait). A member
    /// whose init fails aborts `group`, so that the others' inits end too.
    pub async fn init(
        group: &ProcessGroup,
        id: NcclId,
        device: usize,
        timeout: Duration,
    ) -> Result<NcclComm, NcclError> {
        let result = NcclComm::init_rank(group, id, device, timeout).await;
        if let Err(e) = &result {
            if group.broken().is_none() {
                group.abort(format!("NCCL init failed: {e}")).await;
            }
        }
        result
    }

    async fn init_rank(
        group: &ProcessGroup,
        id: NcclId,
        device: usize,
        timeout: Duration,
    ) -> Result<NcclComm, NcclError> {
        let generation = group.generation();
        if let Some(e) = group.broken() {
            return Err(NcclError::Aborted {
                generation,
                reason: e.to_string(),
            });
        }
        let api = api()?;
        let ctx = context(device)?;
        let stream = ctx.new_stream().map_err(|e| cuda("creating a stream", e))?;
        ctx.bind_to_thread()
            .map_err(|e| cuda("binding the context", e))?;
        let shared = Arc::new(start_init(
            api,
            generation,
            group.size(),
            group.rank(),
            &id,
        )?);
        watch(group.clone(), Arc::downgrade(&shared));
        let nccl = NcclComm {
            rank: Rank {
                shared,
                ctx,
                stream,
            },
            group: group.clone(),
            timeout,
        };
        {
            let live = nccl.live();
            wait_all(&[&nccl.rank], "communicator init", timeout, &live).await?;
        }
        Ok(nccl)
    }

    fn live(&self) -> impl Fn() -> Option<String> + Sync + '_ {
        || self.group.broken().map(|e| e.to_string())
    }

    /// The generation of the group this communicator belongs to.
    pub fn generation(&self) -> u64 {
        self.rank.shared.generation
    }

    /// This member's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.group.size()
    }

    /// The GPU's ordinal.
    pub fn device(&self) -> usize {
        self.rank.ctx.ordinal()
    }

    /// The stream the collectives run on (to allocate device buffers for
    /// [`NcclComm::all_reduce_device`]).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.rank.stream
    }

    /// Why the communicator is aborted, if it is.
    pub fn aborted(&self) -> Option<NcclError> {
        let reason = self.rank.shared.lock().aborted.clone()?;
        Some(self.rank.shared.aborted(reason))
    }

    /// All-reduces host `tensors` (f32 or f64, e.g. gradients) with every member's: fused into
    /// buckets of at most `bucket_bytes_max` bytes (consecutive tensors of one dtype), each
    /// copied to the GPU, reduced in place on the stream and copied back. Every member passes
    /// the same list of shapes and dtypes. The result is on the host, in input order.
    pub async fn all_reduce(
        &self,
        op: Reduction,
        tensors: &[Tensor],
        bucket_bytes_max: usize,
    ) -> Result<Vec<Tensor>, NcclError> {
        self.refuse_if_broken()?;
        let live = self.live();
        let mut outs = all_reduce_ranks(
            &[&self.rank],
            op,
            &[tensors],
            bucket_bytes_max,
            self.timeout,
            &live,
        )
        .await?;
        Ok(outs.pop().unwrap_or_default())
    }

    /// All-reduces a device buffer in place (f32) and waits for it, bounded like every wait.
    pub async fn all_reduce_device(
        &self,
        op: Reduction,
        buf: &mut CudaSlice<f32>,
    ) -> Result<(), NcclError> {
        self.refuse_if_broken()?;
        self.rank.enqueue(op, None, buf, false)?;
        let live = self.live();
        wait_all(&[&self.rank], "all-reduce", self.timeout, &live).await
    }

    /// The group broke: abort (if the watcher has not yet) and refuse.
    fn refuse_if_broken(&self) -> Result<(), NcclError> {
        match self.group.broken() {
            Some(e) => Err(self.rank.shared.abort(e.to_string())),
            None => Ok(()),
        }
    }
}

/// Starts rank `rank`'s non-blocking init of the communicator of `id` (on the device whose
/// context is current on this thread). Synchronous, so that no raw handle lives across an
/// await: the caller's future stays `Send`.
fn start_init(
    api: &'static Api,
    generation: u64,
    size: usize,
    rank: usize,
    id: &NcclId,
) -> Result<Shared, NcclError> {
    let mut comm: Comm = std::ptr::null_mut();
    let mut config = Config::non_blocking();
    // SAFETY: valid out-pointer and config; the id is the one every rank got; the caller made
    // the device's context current on this thread.
    let rc = unsafe {
        (api.init_rank_config)(&mut comm, size as c_int, id.0, rank as c_int, &mut config)
    };
    if rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS {
        let err = api.error("ncclCommInitRankConfig", Some(generation), rc, comm);
        if !comm.is_null() {
            // SAFETY: the handle NCCL returned, never used elsewhere.
            unsafe { (api.comm_abort)(comm) };
        }
        return Err(err);
    }
    Ok(Shared::new(api, generation, comm))
}

/// Aborts the communicator as soon as `group` breaks; ends when the communicator is dropped.
fn watch(group: ProcessGroup, shared: Weak<Shared>) {
    let spawned = std::thread::Builder::new()
        .name(format!("nccl-watch-{}", group.generation()))
        .spawn(move || loop {
            let Some(shared) = shared.upgrade() else {
                return;
            };
            if let Some(e) = group.broken() {
                shared.abort(e.to_string());
                return;
            }
            if shared.lock().comm.is_none() {
                return;
            }
            drop(shared);
            std::thread::sleep(WATCH_EVERY);
        });
    if let Err(e) = spawned {
        // Without a watcher every call still checks the group first and every wait polls it.
        tracing::warn!("NCCL watcher thread not started: {e}");
    }
}

// ---------------------------------------------------------------------------------------
// Within one process.

/// The replicas of one process on its GPUs, one rank per GPU (`ncclCommInitAll`). It has no
/// process group and no generation: its errors name generation 0, and nothing but a failed call or a
/// timeout aborts it.
pub struct NcclLocal {
    ranks: Vec<Rank>,
    timeout: Duration,
}

impl std::fmt::Debug for NcclLocal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclLocal")
            .field("devices", &self.devices())
            .finish()
    }
}

impl NcclLocal {
    /// One rank per GPU of `devices` (distinct ordinals), every wait bounded by `timeout`.
    pub fn new(devices: &[usize], timeout: Duration) -> Result<NcclLocal, NcclError> {
        if devices.is_empty() {
            return Err(NcclError::InvalidArgument("no devices".into()));
        }
        let mut seen = devices.to_vec();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != devices.len() {
            return Err(NcclError::InvalidArgument(format!(
                "devices {devices:?}: one rank per GPU (NCCL refuses two ranks on one GPU)"
            )));
        }
        let api = api()?;
        let mut contexts = Vec::with_capacity(devices.len());
        for &d in devices {
            contexts.push(context(d)?);
        }
        let mut comms: Vec<Comm> = vec![std::ptr::null_mut(); devices.len()];
        let ordinals: Vec<c_int> = devices.iter().map(|&d| d as c_int).collect();
        // SAFETY: `comms` and `ordinals` hold one slot per device.
        let rc = unsafe {
            (api.init_all)(
                comms.as_mut_ptr(),
                devices.len() as c_int,
                ordinals.as_ptr(),
            )
        };
        if rc != NCCL_SUCCESS {
            return Err(api.error("ncclCommInitAll", None, rc, std::ptr::null_mut()));
        }
        let mut ranks = Vec::with_capacity(devices.len());
        for (ctx, comm) in contexts.into_iter().zip(comms) {
            let shared = Arc::new(Shared::new(api, 0, comm));
            let stream = ctx.new_stream().map_err(|e| cuda("creating a stream", e))?;
            ranks.push(Rank {
                shared,
                ctx,
                stream,
            });
        }
        Ok(NcclLocal { ranks, timeout })
    }

    /// The GPUs, in rank order.
    pub fn devices(&self) -> Vec<usize> {
        self.ranks.iter().map(|r| r.ctx.ordinal()).collect()
    }

    /// The ranks' streams, in rank order.
    pub fn streams(&self) -> Vec<Arc<CudaStream>> {
        self.ranks.iter().map(|r| r.stream.clone()).collect()
    }

    /// All-reduces the replicas' host tensors (`replicas[r]`: rank `r`'s list, all alike in
    /// shapes and dtypes) as [`NcclComm::all_reduce`] does; every replica gets the result.
    pub async fn all_reduce(
        &self,
        op: Reduction,
        replicas: &[Vec<Tensor>],
        bucket_bytes_max: usize,
    ) -> Result<Vec<Vec<Tensor>>, NcclError> {
        if replicas.len() != self.ranks.len() {
            return Err(NcclError::InvalidArgument(format!(
                "{} replica lists for {} GPUs",
                replicas.len(),
                self.ranks.len()
            )));
        }
        let ranks: Vec<&Rank> = self.ranks.iter().collect();
        let inputs: Vec<&[Tensor]> = replicas.iter().map(Vec::as_slice).collect();
        all_reduce_ranks(&ranks, op, &inputs, bucket_bytes_max, self.timeout, &|| {
            None
        })
        .await
    }

    /// Enqueues `repeat` out-of-place all-reduces of every rank's device buffers (`send[r]`
    /// into `recv[r]`, on rank `r`'s stream), one NCCL group each, and waits for them all once
    /// (what a benchmark times).
    pub async fn all_reduce_device(
        &self,
        op: Reduction,
        send: &[CudaSlice<f32>],
        recv: &mut [CudaSlice<f32>],
        repeat: usize,
    ) -> Result<(), NcclError> {
        if send.len() != self.ranks.len() || recv.len() != self.ranks.len() {
            return Err(NcclError::InvalidArgument(format!(
                "{} send and {} receive buffers for {} GPUs",
                send.len(),
                recv.len(),
                self.ranks.len()
            )));
        }
        let api = self.ranks[0].shared.api;
        for _ in 0..repeat {
            // SAFETY: no arguments; paired with the group end below.
            unsafe { (api.group_start)() };
            let mut enqueued = Ok(());
            for ((rank, s), r) in self.ranks.iter().zip(send).zip(recv.iter_mut()) {
                enqueued = enqueued.and_then(|()| rank.enqueue(op, Some(s), r, true));
            }
            // SAFETY: closes the group opened above.
            let rc = unsafe { (api.group_end)() };
            if enqueued.is_ok() && rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS {
                enqueued = Err(api.error("ncclGroupEnd", None, rc, std::ptr::null_mut()));
            }
            if let Err(e) = enqueued {
                // Every rank: those whose work was launched would otherwise spin until the
                // timeout, waiting for the ones that failed.
                for rank in &self.ranks {
                    rank.shared.abort(e.to_string());
                }
                return Err(e);
            }
        }
        let ranks: Vec<&Rank> = self.ranks.iter().collect();
        wait_all(&ranks, "all-reduce", self.timeout, &|| None).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_at_most_their_bytes_and_split_by_dtype() {
        let cpu = &Device::Cpu;
        let f32s = |n: usize| Tensor::zeros(n, DType::F32, cpu).unwrap();
        // 1000 f32 are 4000 bytes: two fit in 8000, a third does not.
        let tensors = [
            f32s(1000),
            f32s(1000),
            f32s(1000),
            Tensor::zeros(10, DType::F64, cpu).unwrap(),
            f32s(5000),
        ];
        let plan = buckets(&tensors, 8000).unwrap();
        let ranges: Vec<Range<usize>> = plan.iter().map(|(_, r)| r.clone()).collect();
        assert_eq!(ranges, vec![0..2, 2..3, 3..4, 4..5]);
        let dtypes: Vec<DType> = plan.iter().map(|(d, _)| *d).collect();
        assert_eq!(dtypes, [DType::F32, DType::F32, DType::F64, DType::F32]);
        assert!(matches!(
            buckets(&[Tensor::zeros(3, DType::U32, cpu).unwrap()], 8000),
            Err(NcclError::InvalidArgument(_))
        ));
        assert!(buckets(&tensors, 0).is_err());
    }
}
