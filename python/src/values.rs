//! The f32 values the runtime hands Python (a pull, a read, an all-reduce), lent to NumPy and
//! PyTorch without a copy.
//!
//! [`F32Values`] owns the runtime's `Vec<f32>` and exports it through the buffer protocol:
//! `numpy.frombuffer(values, dtype=numpy.float32)` (and `torch.from_numpy` of that) is a view
//! of the runtime's own memory, writable, kept alive by the arrays viewing it. A step pulling
//! megabytes a step pays no copy on the way into Python.

// The buffer protocol is a C interface: the view is filled through raw pointers.
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

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
        if view.is_null() {
            return Err(PyBufferError::new_err("the buffer view is null"));
        }
        let this = slf.get();
        let wants = |flag: c_int| flags & flag == flag;
        // SAFETY: `view` is the interpreter's, not null, and filled here; the pointers stored
        // in it (values, shape, stride, format) live as long as `slf`, which the view holds.
        unsafe {
            (*view).buf = this.data.as_ptr().cast::<c_void>();
            (*view).len = this.items * this.stride;
            (*view).readonly = 0;
            (*view).itemsize = this.stride;
            (*view).format = if wants(ffi::PyBUF_FORMAT) {
                c"f".as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if wants(ffi::PyBUF_ND) {
                std::ptr::from_ref(&this.items).cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if wants(ffi::PyBUF_STRIDES) {
                std::ptr::from_ref(&this.stride).cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
            (*view).obj = slf.into_any().into_ptr();
        }
        Ok(())
    }

    /// Nothing to release: the values live as long as this object.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}
