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

use std::ffi::{c_int, c_void, CStr};
use std::ptr::NonNull;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// Memory the runtime hands Python: an owned boxed slice of `T` (freed on drop), read and
/// written only through the buffers its Python object exports, as a `bytearray`'s are. Its
/// one dimension and stride live here, not in a view, because an exported view points at them
/// until it is released.
struct Lent<T> {
    data: NonNull<T>,
    /// The buffer's one dimension: the number of items.
    items: isize,
    /// The buffer's one stride, in bytes (the item's size).
    stride: isize,
    /// The item's format for the buffer protocol (`"f"`, `"B"`).
    format: &'static CStr,
}

// SAFETY: a `Lent` owns its allocation alone (no other Rust reference to it exists); the items
// are read and written only through exported buffers, under the interpreter's rules for any
// writable buffer (a `bytearray` is no safer), and freed once, on drop.
unsafe impl<T> Send for Lent<T> {}
// SAFETY: see `Send`: no Rust code reads or writes the items after construction.
unsafe impl<T> Sync for Lent<T> {}

impl<T> Lent<T> {
    /// Takes ownership of `items`, exported with `format`.
    fn new(items: Vec<T>, format: &'static CStr) -> Self {
        let len = items.len() as isize;
        // A boxed slice's pointer is never null (dangling but aligned when empty).
        let data = NonNull::from(Box::leak(items.into_boxed_slice())).cast::<T>();
        Self {
            data,
            items: len,
            stride: std::mem::size_of::<T>() as isize,
            format,
        }
    }

    /// Fills `view` with these items, one writable contiguous dimension, held by `owner`.
    ///
    /// # Safety
    /// `view` is the interpreter's, and `owner` is the Python object holding this `Lent`, whose
    /// reference the view takes (so the items, shape and stride outlive the view).
    unsafe fn export(
        &self,
        view: *mut ffi::Py_buffer,
        flags: c_int,
        owner: Bound<'_, PyAny>,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("the buffer view is null"));
        }
        let wants = |flag: c_int| flags & flag == flag;
        // SAFETY: `view` is not null and the interpreter's to fill; the pointers stored in it
        // live as long as `owner` (the caller's contract), which the view holds.
        unsafe {
            (*view).buf = self.data.as_ptr().cast::<c_void>();
            (*view).len = self.items * self.stride;
            (*view).readonly = 0;
            (*view).itemsize = self.stride;
            (*view).format = if wants(ffi::PyBUF_FORMAT) {
                self.format.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if wants(ffi::PyBUF_ND) {
                std::ptr::from_ref(&self.items).cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if wants(ffi::PyBUF_STRIDES) {
                std::ptr::from_ref(&self.stride).cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = owner.into_ptr();
        }
        Ok(())
    }
}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        // SAFETY: `data` and `items` are the boxed slice leaked in `new`, freed here only; no
        // exported view outlives the object holding this (each view holds a reference to it).
        unsafe {
            drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.data.as_ptr(),
                self.items as usize,
            )));
        }
    }
}

/// f32 values (native order, flat) that Python reads as a buffer; see the module docs.
#[pyclass(module = "cohort._native", frozen)]
pub(crate) struct F32Values(Lent<f32>);

impl F32Values {
    /// `values` as a new Python object.
    pub(crate) fn into_py(py: Python<'_>, values: Vec<f32>) -> PyResult<Bound<'_, F32Values>> {
        Bound::new(py, Self(Lent::new(values, c"f")))
    }
}

#[pymethods]
impl F32Values {
    /// The number of values.
    fn __len__(&self) -> usize {
        self.0.items as usize
    }

    /// Exports the values: one dimension of `float` (`"f"`), writable, contiguous.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: `slf` holds the values; the view takes a reference to it.
        unsafe { slf.get().0.export(view, flags, slf.clone().into_any()) }
    }

    /// Nothing to release: the values live as long as this object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// Bytes the runtime hands Python (a step's payload, whose layout is `cohort._steps`'s), lent
/// without a copy as [`F32Values`] lends values: a view of them (and every NumPy array
/// unpickled from such a view) is the runtime's own memory, writable, kept alive by the views.
#[pyclass(module = "cohort._native", frozen)]
pub(crate) struct ByteValues(Lent<u8>);

impl ByteValues {
    /// Takes ownership of `bytes` for Python, as a new Python object.
    pub(crate) fn into_py(py: Python<'_>, bytes: Vec<u8>) -> PyResult<Bound<'_, ByteValues>> {
        Bound::new(py, Self(Lent::new(bytes, c"B")))
    }
}

#[pymethods]
impl ByteValues {
    /// The number of bytes.
    fn __len__(&self) -> usize {
        self.0.items as usize
    }

    /// Exports the bytes: one dimension of unsigned bytes (`"B"`), writable, contiguous.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: `slf` holds the bytes; the view takes a reference to it.
        unsafe { slf.get().0.export(view, flags, slf.clone().into_any()) }
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
