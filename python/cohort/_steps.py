"""Steps by reference: how a function scheduled on the chief runs on a worker.

Code never travels. The chief sends a function's module and qualified name with its pickled
arguments; the worker imports the function itself (its ``__main__`` is the same script, stopped
in the strategy's constructor) and sends back the pickled value. This module owns that payload,
the checks the chief makes before anything is sent, and the worker's side of a step: the step
context it lends to ``cohort`` calls made inside the step, and each worker's per-worker
iterators.

A payload is pickled with protocol 5, the memory of contiguous NumPy arrays and of CPU PyTorch
tensors (as NumPy arrays) of at least ``_OUT_OF_BAND_MIN`` bytes taken out of the pickle
stream as out-of-band buffers. It travels as one message: a header (the number of buffers,
little-endian u32; each buffer's length and the stream's, little-endian u64), the stream, and
each buffer at the next multiple of ``_ALIGN`` bytes from the message's start (which the
runtime's allocator aligns to 16 bytes: an array of any NumPy dtype is aligned). Going out, the
runtime copies each part once, into the message; coming in, it lends Python the message itself
(``ByteValues``), and the arrays unpickled from it are views of it, writable and the
receiver's own: no copy. They keep the whole message alive while any of them lives. Tensors
arrive as tensors of their own memory: two that shared storage when sent (``x`` and
``x[1:]``) no longer do, and attributes set on a tensor object are not sent.
"""

from __future__ import annotations

import importlib
import inspect
import io
import pickle
import struct
import sys
import threading
import traceback
from typing import Any, Callable

from .errors import ArgumentsError, NotInStepError, StepInterrupted, StepNotImportableError

# The module-level names of the script when its strategy was made: on a worker the script stops
# there, so only these exist in its ``__main__``.
_main_names_at_start: frozenset[str] | None = None

_PICKLE_PROTOCOL = 5
# Where each out-of-band buffer starts in a payload: a multiple of this many bytes.
_ALIGN = 64
# The most out-of-band buffers one payload carries (a header naming more is refused; past it,
# a payload's buffers stay in the stream).
_BUFFERS_MAX = 1 << 16
# A buffer smaller than this stays in the stream (its copy costs less than its padding).
_OUT_OF_BAND_MIN = 1024


def note_main_names() -> None:
    """Records the names the script's ``__main__`` holds now (the strategy is being made)."""
    global _main_names_at_start
    main = sys.modules.get("__main__")
    _main_names_at_start = frozenset(vars(main)) if main is not None else frozenset()


def reference(fn: Callable[..., Any], what: str = "step") -> tuple[str, str]:
    """``(module, qualname)`` of ``fn``, checked importable by a worker, or
    ``StepNotImportableError`` naming it and why not."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not callable(fn) or not isinstance(module, str) or not isinstance(qualname, str):
        raise StepNotImportableError(
            f"{what} {fn!r} is not a function the workers can import (they import a step by "
            "its module and name)"
        )
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise StepNotImportableError(
            f"{what} {qualname!r} is a lambda or is defined inside a function: the workers "
            "import a step by its module and name; define it at the top level of a module or "
            "of the script"
        )
    if module == "__main__":
        top = qualname.split(".")[0]
        if _main_names_at_start is not None and top not in _main_names_at_start:
            raise StepNotImportableError(
                f"{what} {qualname!r} is defined in the script after its strategy was made: "
                "the workers stop in the strategy's constructor and never define it; define it "
                "before `ParameterServerStrategy(...)`, or in a module"
            )
    try:
        resolve((module, qualname))
    except StepNotImportableError as e:
        raise StepNotImportableError(f"{what}: {e}") from None
    return module, qualname


def resolve(ref: tuple[str, str]) -> Callable[..., Any]:
    """The function ``ref`` names, imported here."""
    module_name, qualname = ref
    try:
        if module_name == "__main__":
            module = sys.modules["__main__"]
        else:
            module = importlib.import_module(module_name)
    except Exception as e:  # an import error of any kind names the module
        raise StepNotImportableError(
            f"{qualname!r}: cannot import module {module_name!r}: {e}"
        ) from None
    found: Any = module
    for part in qualname.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise StepNotImportableError(
                f"{qualname!r}: module {module_name!r} has no {part!r}"
            ) from None
    if not callable(found):
        raise StepNotImportableError(f"{module_name}.{qualname} is not callable")
    return found


def _tensor_from_numpy(array: Any) -> Any:
    """A PyTorch tensor viewing ``array`` (how a tensor pickled by :class:`_Pickler` comes
    back)."""
    import torch

    return torch.from_numpy(array)


class _Pickler(pickle.Pickler):
    """Protocol 5, out-of-band: a CPU PyTorch tensor (dense, contiguous, with no gradient to
    keep) is pickled as the NumPy array of its memory, so that its memory leaves the stream as
    a NumPy array's does; any other value as ``pickle`` does."""

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is None or type(obj) is not torch.Tensor:
            return NotImplemented
        if (
            obj.device.type != "cpu"
            or obj.layout != torch.strided
            or obj.requires_grad
            or not obj.is_contiguous()
        ):
            return NotImplemented
        try:
            array = obj.numpy()
        except (TypeError, RuntimeError):  # a dtype NumPy has not (bfloat16...)
            return NotImplemented
        return (_tensor_from_numpy, (array,))


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def pack(value: Any) -> list[Any]:
    """The parts of ``value``'s payload (see the module doc), for the runtime to copy into one
    message; raises what pickling raises."""
    raws: list[memoryview] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        """False (out of the stream) for a buffer worth it, while the header has room."""
        raw = buffer.raw()
        if raw.nbytes < _OUT_OF_BAND_MIN or len(raws) >= _BUFFERS_MAX:
            return True
        raws.append(raw)
        return False

    stream = io.BytesIO()
    _Pickler(stream, protocol=_PICKLE_PROTOCOL, buffer_callback=out_of_band).dump(value)
    data = stream.getbuffer()
    lengths = [raw.nbytes for raw in raws]
    header = struct.pack(f"<I{len(raws) + 1}Q", len(raws), *lengths, data.nbytes)
    parts: list[Any] = [header, data]
    at = len(header) + data.nbytes
    for raw in raws:
        start = _aligned(at)
        if start > at:
            parts.append(bytes(start - at))
        parts.append(raw)
        at = start + raw.nbytes
    return parts


def unpack(message: Any) -> Any:
    """The value of a payload (see the module doc), its arrays views of ``message``; a message
    that does not parse raises ``ValueError`` naming what is wrong."""
    view = memoryview(message).cast("B")
    size = view.nbytes
    if size < 4:
        raise ValueError(f"a step's payload of {size} bytes is cut short: it has no header")
    (count,) = struct.unpack_from("<I", view, 0)
    if count > _BUFFERS_MAX:
        raise ValueError(
            f"a step's payload names {count} out-of-band buffers (at most {_BUFFERS_MAX})"
        )
    header = 4 + 8 * (count + 1)
    if size < header:
        raise ValueError(
            f"a step's payload of {size} bytes is cut short: its header needs {header}"
        )
    *lengths, stream_len = struct.unpack_from(f"<{count + 1}Q", view, 4)
    at = header + stream_len
    spans = []
    for length in lengths:
        start = _aligned(at)
        spans.append((start, start + length))
        at = start + length
    if at != size:
        raise ValueError(
            f"a step's payload of {size} bytes does not hold what its header names ({at} bytes)"
        )
    return pickle.loads(view[header : header + stream_len], buffers=[view[a:b] for a, b in spans])


def encode(ref: tuple[str, str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """The payload's parts of a scheduled step (:func:`pack`), or ``ArgumentsError`` naming
    what cannot be pickled."""
    try:
        return pack((ref, tuple(args), dict(kwargs)))
    except Exception as e:
        for position, arg in enumerate(args):
            if not _picklable(arg):
                raise ArgumentsError(
                    f"step {ref[1]!r}: argument {position} ({type(arg).__name__}) cannot be "
                    f"pickled: {e}"
                ) from None
        for key, arg in kwargs.items():
            if not _picklable(arg):
                raise ArgumentsError(
                    f"step {ref[1]!r}: argument {key!r} ({type(arg).__name__}) cannot be "
                    f"pickled: {e}"
                ) from None
        raise ArgumentsError(f"step {ref[1]!r}: its arguments cannot be pickled: {e}") from None


def _picklable(value: Any) -> bool:
    try:
        pickle.dumps(value, protocol=_PICKLE_PROTOCOL)
        return True
    except Exception:
        return False


def decode_value(message: Any) -> Any:
    """A step's value, as its worker packed it (:func:`unpack`)."""
    return unpack(message)


class _Worker(threading.local):
    context: Any = None


_worker = _Worker()
# This worker's per-worker iterators, by dataset id (made on a step's first `next`).
_iterators: dict[int, Any] = {}


def current_context() -> Any:
    """The step context of the step running on this thread, or ``NotInStepError``."""
    context = _worker.context
    if context is None:
        raise NotInStepError(
            "this call reads or changes the job from a worker: make it inside a function "
            "scheduled with `coordinator.schedule`"
        )
    return context


def in_step() -> bool:
    """True inside a step on a worker."""
    return _worker.context is not None


def run(context: Any, payload: Any) -> list[Any]:
    """A worker's handler of one step: imports the function, calls it with its arguments
    (unpacked from ``payload``, the message the runtime lends) and this step's context lent,
    returns its value's payload parts (:func:`pack`). A failure raises with the function's
    name and traceback (the chief's ``fetch`` and ``join`` raise it as a ``ClosureError``)."""
    (ref, args, kwargs) = unpack(payload)
    name = f"{ref[0]}.{ref[1]}"
    fn = resolve(ref)
    _worker.context = context
    try:
        value = fn(*args, **kwargs)
    except StepInterrupted:
        # The runtime's own error ends the step (a lost server re-runs it elsewhere).
        raise
    except BaseException:
        raise RuntimeError(f"step {name} failed:\n{traceback.format_exc()}") from None
    finally:
        _worker.context = None
    try:
        return pack(value)
    except Exception as e:
        raise RuntimeError(
            f"step {name}: its value ({type(value).__name__}) cannot be pickled: {e}"
        ) from None


class InputContext:
    """What a per-worker dataset function is told: TensorFlow's ``tf.distribute.InputContext``
    with one input pipeline per worker."""

    def __init__(self, num_input_pipelines: int, input_pipeline_id: int) -> None:
        self.num_input_pipelines = num_input_pipelines
        self.input_pipeline_id = input_pipeline_id
        self.num_replicas_in_sync = num_input_pipelines

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """One worker's share of a global batch; it must divide evenly."""
        if global_batch_size % self.num_replicas_in_sync:
            raise ValueError(
                f"global batch size {global_batch_size} does not divide over "
                f"{self.num_replicas_in_sync} workers"
            )
        return global_batch_size // self.num_replicas_in_sync


def worker_iterator(dataset_id: int, ref: tuple[str, str]) -> Any:
    """This worker's iterator of per-worker dataset ``dataset_id``, made from its function on
    first use (with an :class:`InputContext` when the function takes an argument)."""
    iterator = _iterators.get(dataset_id)
    if iterator is None:
        context = current_context()
        fn = resolve(ref)
        takes_context = _takes_an_argument(fn)
        if takes_context:
            dataset = fn(InputContext(context.num_workers(), context.worker_index()))
        else:
            dataset = fn()
        iterator = iter(dataset)
        _iterators[dataset_id] = iterator
    return iterator


def _takes_an_argument(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        for p in parameters
    )
