"""A stand-in GPU for tests without one: arrays that claim to live on a device and act as CuPy's do.

``DeviceArray`` is host memory with ``__cuda_array_interface__``, so the package takes
its device paths; like a CuPy array it refuses to be mixed with a host array in an
operation (CuPy raises ``TypeError`` there), and ``get()`` is the way to the host.
``fake_cupy()`` is a module standing in for ``cupy``: numpy's functions whose array
results are device arrays.  :func:`device_backend` installs both under the ``cuda``
backend, runs the ``.cu`` kernels on the emulator, and fails on any host-only step:
a kernel handed a host array, or an operation sent to the CPU implementation.
"""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

import numpy as np


class HostOnlyCall(AssertionError):
    """A host array reached code that runs on the device (the bug this stand-in exists to find)."""


def _host_arrays(obj: Any):
    if isinstance(obj, np.ndarray) and not isinstance(obj, DeviceArray) and obj.ndim > 0:
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _host_arrays(o)


class DeviceArray(np.ndarray):
    gets = 0

    @property
    def __cuda_array_interface__(self):
        return {**self.__array_interface__, "version": 3}

    def get(self, out=None, stream=None):
        DeviceArray.gets += 1
        host = np.array(self.view(np.ndarray), copy=True)
        if out is not None:
            np.copyto(out, host)
            return out
        return host

    def set(self, src):
        np.copyto(self.view(np.ndarray), src)

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        if any(True for _ in _host_arrays(list(inputs) + list(kw.get("out", ())))):
            raise HostOnlyCall(f"{ufunc.__name__}: a host (NumPy) array mixed with a device array")
        if "out" in kw:
            kw["out"] = _plain(kw["out"])
        return _dev(getattr(ufunc, method)(*_plain(inputs), **kw))

    def __array_function__(self, func, types_, args, kwargs):
        if any(True for _ in _host_arrays(list(args) + list(kwargs.values()))):
            raise HostOnlyCall(f"numpy.{func.__name__}: a host (NumPy) array mixed with a device array")
        # as CuPy does: the function runs "on the device" and its array results are device arrays
        return _dev(func(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()}))

    def __float__(self):  # CuPy allows these on one element (a synchronizing copy)
        return float(self.view(np.ndarray))


def _plain(x: Any) -> Any:
    if isinstance(x, DeviceArray):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def _dev(x: Any) -> Any:
    if isinstance(x, np.ndarray) and not isinstance(x, DeviceArray):
        return x.view(DeviceArray)
    if isinstance(x, tuple):
        return tuple(_dev(v) for v in x)
    return x


def fake_cupy() -> types.ModuleType:
    """A ``cupy`` module over numpy whose array results are :class:`DeviceArray`."""
    mod = types.ModuleType("cupy")
    mod.ndarray = DeviceArray

    def asarray(a, dtype=None, order=None):
        if isinstance(a, DeviceArray) and (dtype is None or np.dtype(dtype) == a.dtype):
            return a
        return np.array(np.asarray(a, dtype=dtype, order=order), copy=True).view(DeviceArray)

    def array(a, dtype=None, copy=True, order="K"):
        return np.array(a.view(np.ndarray) if isinstance(a, DeviceArray) else a, dtype=dtype, copy=True,
                        order=order).view(DeviceArray)

    def asnumpy(a, out=None):
        return a.get(out=out) if isinstance(a, DeviceArray) else np.asarray(a)

    mod.asarray, mod.array, mod.asnumpy = asarray, array, asnumpy
    stream = types.SimpleNamespace(synchronize=lambda: None)
    mod.cuda = types.SimpleNamespace(Device=lambda i=0: types.SimpleNamespace(id=0, use=lambda: None),
                                     get_current_stream=lambda: stream,
                                     runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))

    def __getattr__(name):
        attr = getattr(np, name)
        if callable(attr) and not isinstance(attr, type):
            def wrapped(*a, **k):
                return _dev(attr(*a, **k))
            wrapped.__name__ = name
            return wrapped
        return attr

    mod.__getattr__ = __getattr__
    return mod


@contextlib.contextmanager
def device_backend(monkeypatch):
    """The ``cuda`` backend on stand-in device arrays; yields counters of kernel launches and host copies."""
    from cotsdl import backend
    from cotsdl.ops import cpu

    counts = {"launches": 0}
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    monkeypatch.setitem(sys.modules, "cupyx", types.SimpleNamespace(
        empty_pinned=lambda shape, dtype: np.empty(shape, dtype)))
    real_kernel, real_launch = backend.kernel, backend.launch
    monkeypatch.setattr(backend, "kernel", lambda f, fn, defines=None, device_array=True:
                        real_kernel(f, fn, defines, False))

    def launch(kern, grid, block, args, shared_mem=0):
        host = [i for i, a in enumerate(args) if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray)]
        if host:
            raise HostOnlyCall(f"kernel {getattr(kern, 'name', kern)}: argument(s) {host} are host arrays")
        counts["launches"] += 1
        real_launch(kern, grid, block, args, shared_mem)

    monkeypatch.setattr(backend, "launch", launch)
    for name in dir(cpu):  # nothing may fall back to the CPU implementation of an operation
        fn = getattr(cpu, name)
        if callable(fn) and not name.startswith("_") and getattr(fn, "__module__", "").startswith("cotsdl.ops.cpu"):
            monkeypatch.setattr(cpu, name, _refuse(name))
    DeviceArray.gets = 0
    with backend.using("cuda"):
        yield counts
    counts["gets"] = DeviceArray.gets


def _refuse(name: str):
    def refuse(*a, **k):
        raise HostOnlyCall(f"ops.cpu.{name} called under the cuda backend: an array left the device")
    return refuse
