//! The memory the runtime hands Python, lent to NumPy and PyTorch without a copy: f32 values
//! (a pull, a read, an all-reduce) and bytes (a step's payload).
//!
//! [`F32Values`] owns the runtime's `Vec<f32>` and exports it through the buffer protocol:
//! `numpy.frombuffer(values, dtype=numpy.float32)` (and `torch.from_numpy` of that) is a view
//! of the runtime's own memory, writable, kept alive by the arrays viewing it. A step pulling
//! megabytes a step pays no copy on the way into Python. [`ByteValues`] does the same for a
//! `Vec<u8>`: a step's payload (its arguments on a worker, its value on the chief), which
//! `cohort._steps` unpickles from views of the message itself; going out, a payload's parts
//! (its header, pickle stream and out-of-band buffers) are copied once, into the message
//! ([`concat`]).

// The buffer protocol is a C interface: the view is filled through raw pointers.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// f32 values (native order, flat) that Python reads as a buffer; see the module docs.
#[pyclass(module = "cohort._native", frozen)]
pub(crate) struct F32Values {
    /// The values, an owned boxed slice (freed on drop). Written only through the buffers
    /// this object exports, as a `bytearray`'s are.
    data: NonNull<f32>,
    /// The buffer's shape: its one dimension, the number of values. Kept here (not in the
    /// view) because an exported view points at it until the view is released.
    items: isize,
    /// The buffer's one stride, in bytes, pointed at by exported views as `items` is.
    stride: isize,
}

// SAFETY: `F32Values` owns its allocation alone (no other Rust reference to it exists); the
// values are read and written only through exported buffers, under the interpreter's rules for
// any writable buffer (a `bytearray` is no safer), and freed once, on drop.
unsafe impl Send for F32Values {}
// SAFETY: see `Send`: no Rust code reads or writes the values after construction.
unsafe impl Sync for F32Values {}

impl F32Values {
    /// Takes ownership of `values` for Python.
    pub(crate) fn new(values: Vec<f32>) -> Self {
        let items = values.len() as isize;
        let boxed: Box<[f32]> = values.into_boxed_slice();
        // A boxed slice's pointer is never null (dangling but aligned when empty).
        let data = NonNull::from(Box::leak(boxed)).cast::<f32>();
        Self {
            data,
            items,
            stride: std::mem::size_of::<f32>() as isize,
        }
    }

    /// `values` as a new Python object.
    pub(crate) fn into_py(py: Python<'_>, values: Vec<f32>) -> PyResult<Bound<'_, F32Values>> {
        Bound::new(py, Self::new(values))
    }
}

impl Drop for F32Values {
    fn drop(&mut self) {
        // SAFETY: `data` and `items` are the boxed slice leaked in `new`, freed here only; no
        // exported view outlives this object (each view holds a reference to it).
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.data.as_ptr(),
                self.items as usize,
            )));
        }
    }
}

#[pymethods]
impl F32Values {
    /// The number of values.
    fn __len__(&self) -> usize {
        self.items as usize
    }

    /// Exports the values: one dimension of `float` (`"f"`), writable, contiguous.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let (data, items, stride) = (
            this.data.as_ptr().cast::<c_void>(),
            &this.items,
            &this.stride,
        );
        // SAFETY: the values, shape and stride live as long as `slf`, which the view holds.
        unsafe {
            export(
                view,
                flags,
                Export {
                    data,
                    items,
                    stride,
                    format: c"f",
                },
                slf.clone().into_any(),
            )
        }
    }

    /// Nothing to release: the values live as long as this object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Bytes the runtime hands Python (a step's payload, whose layout is `cohort._steps`'s), lent
/// without a copy as [`F32Values`] lends values: a view of
/// them (and every NumPy array unpickled from such a view) is the runtime's own memory,
/// writable, kept alive by the views.
#[pyclass(module = "cohort._native", frozen)]
pub(crate) struct ByteValues {
    /// The bytes, an owned boxed slice (freed on drop), written only through exported buffers.
    data: NonNull<u8>,
    /// The number of bytes (the buffer's one dimension, pointed at by exported views).
    items: isize,
    /// The buffer's one stride, 1.
    stride: isize,
}

// SAFETY: as for `F32Values`: it owns its allocation alone, which Python reads and writes only
// through exported buffers, and frees it once, on drop.
unsafe impl Send for ByteValues {}
// SAFETY: see `Send`.
unsafe impl Sync for ByteValues {}

impl ByteValues {
    /// Takes ownership of `bytes` for Python, as a new Python object.
    pub(crate) fn into_py(py: Python<'_>, bytes: Vec<u8>) -> PyResult<Bound<'_, ByteValues>> {
        let items = bytes.len() as isize;
        let data = NonNull::from(Box::leak(bytes.into_boxed_slice())).cast::<u8>();
        Bound::new(
            py,
            Self {
                data,
                items,
                stride: 1,
            },
        )
    }
}

impl Drop for ByteValues {
    fn drop(&mut self) {
        // SAFETY: the boxed slice leaked in `into_py`, freed here only; no exported view
        // outlives this object.
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.data.as_ptr(),
                self.items as usize,
            )));
        }
    }
}

#[pymethods]
impl ByteValues {
    /// The number of bytes.
    fn __len__(&self) -> usize {
        self.items as usize
    }

    /// Exports the bytes: one dimension of unsigned bytes (`"B"`), writable, contiguous.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        let (data, items, stride) = (
            this.data.as_ptr().cast::<c_void>(),
            &this.items,
            &this.stride,
        );
        // SAFETY: the bytes, shape and stride live as long as `slf`, which the view holds.
        unsafe {
            export(
                view,
                flags,
                Export {
                    data,
                    items,
                    stride,
                    format: c"B",
                },
                slf.clone().into_any(),
            )
        }
    }

    /// Nothing to release: the bytes live as long as this object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// One message of Python's `parts` (each a contiguous buffer of bytes), each copied once.
pub(crate) fn concat(py: Python<'_>, parts: &[PyBuffer<u8>]) -> PyResult<Vec<u8>> {
    let len = parts.iter().map(|p| p.item_count()).sum();
    let mut out = vec![0u8; len];
    let mut at = 0;
    for part in parts {
        let end = at + part.item_count();
        part.copy_to_slice(py, &mut out[at..end])?;
        at = end;
    }
    Ok(out)
}

/// What one exported buffer shows: its memory, its one dimension and stride (each kept in
/// the exporting object, which views point at), and its item format.
struct Export<'a> {
    data: *mut c_void,
    items: &'a isize,
    stride: &'a isize,
    format: &'static std::ffi::CStr,
}

/// Fills `view` with `export`, one writable contiguous dimension, held by `owner`.
///
/// # Safety
/// `view` is the interpreter's; `export`'s memory, `items` and `stride` live as long as
/// `owner`, whose reference the view takes.
unsafe fn export(
    view: *mut ffi::Py_buffer,
    flags: c_int,
    export: Export<'_>,
    owner: Bound<'_, PyAny>,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("the buffer view is null"));
    }
    let wants = |flag: c_int| flags & flag == flag;
    // SAFETY: `view` is not null and the interpreter's to fill; the pointers stored in it
    // live as long as `owner` (the caller's contract), which the view holds.
    unsafe {
        (*view).buf = export.data;
        (*view).len = *export.items * *export.stride;
        (*view).readonly = 0;
        (*view).itemsize = *export.stride;
        (*view).format = if wants(ffi::PyBUF_FORMAT) {
            export.format.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).ndim = 1;
        (*view).shape = if wants(ffi::PyBUF_ND) {
            std::ptr::from_ref(export.items).cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).strides = if wants(ffi::PyBUF_STRIDES) {
            std::ptr::from_ref(export.stride).cast_mut()
        } else {
            std::ptr::null_mut()
        };
        (*view).suboffsets = std::ptr::null_mut();
        (*view).internal = std::ptr::null_mut();
        (*view).obj = owner.into_ptr();
    }
    Ok(())
}
