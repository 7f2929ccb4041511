"""cotsdl.cudaemu: run CUDA kernels on the CPU, for tests and for kernel authors.

The same ``.cu`` source that NVRTC compiles for the GPU is compiled by g++ with a
shim header (``shim.h``) that maps the CUDA built-ins, and each block's threads run
as cooperative fibers that switch at ``__syncthreads``, warp operations and exit
(``runtime.h``).  The API mirrors CuPy::

    from cotsdl.cudaemu import RawModule
    mod = RawModule(path="cuda/halo.cu", options=("-DTILE=32",))
    kern = mod.get_function("pack_box_f32")
    kern((blocks,), (256,), (src, buf, np.int64(0), ...), shared_mem=0)

Arguments are checked against the kernel's C parameter types: a pointer takes a
C-contiguous NumPy array of the right dtype, a scalar the exact NumPy type
(``np.int32`` for ``int``, ``np.float32`` for ``float``, ``np.int64`` for
``long long``).  Supported: ``__shared__`` and one ``extern __shared__`` array per
kernel (declared inside it), ``__syncthreads`` and its count/and/or forms,
``__syncwarp``, ``__shfl*_sync``, ``__ballot_sync``/``__any_sync``/``__all_sync``,
atomics, ``__ldg``, the common math intrinsics, vector types, and a functional stand-in
for ``cp.async`` (the kernels call ``cotsdl_emu::cp_async``, ``cp_commit`` and ``cp_wait``
where a GPU build has the inline PTX, as ``cuda/gemm_tile.cuh`` does under
``COTSDL_CUDAEMU``): a copy lands when its thread waits for its group (``cp_wait``, the
latest moment ``cp.async.wait_group`` allows), or with ``COTSDL_EMU_ASYNC=early`` at issue
(the earliest), so that a missing wait or barrier shows as a wrong result in one of the two.
Blocks run one after another (``COTSDL_EMU_THREADS=n`` spreads them over n OS threads).

Debugging aids: ``COTSDL_EMU_ORDER=reverse`` (or ``order="reverse"``) runs the
threads of a block in reverse order, so a missing ``__syncthreads`` shows up as a
different result; ``asan=True`` (or ``COTSDL_EMU_ASAN=1``) builds with
AddressSanitizer, which reports out-of-bounds global and dynamic-shared accesses with
the CUDA block and thread that made them (run such a process with
:func:`asan_environment`, and in a subprocess: a memory error ends it); a launch in
which no thread can proceed raises a "deadlock" error naming the kernel and block.
Uninitialized dynamic shared memory reads as NaN.  Lanes that do not take part in a
shuffle (exited threads, the missing lanes of a partial last warp) return the
caller's own value.  Built libraries are cached in ``COTSDL_EMU_CACHE`` (default
``~/.cache/cotsdl/cudaemu``), keyed by the preprocessed source (an edited header
rebuilds).

Known limits (what the emulator does not check or cannot do): it has no race
detector (a missing ``__syncthreads`` shows only as a difference between the two
thread orders); static ``__shared__`` arrays are not poisoned (they start at zero and
keep the previous block's values), only dynamic shared memory is; ``__activemask``
returns the lanes that have not exited, since the emulator cannot tell which lanes a
GPU would have converged; the thread schedule is not the GPU's, so spin-waits on
other threads never end; ``cp.async`` only through the stand-in above (a copy in flight
is never observed half-landed, and bank conflicts or timing are not modelled; with static
``__shared__`` keeping the previous block's values, a missing wait on an operand the next block
loads identically, such as a site's weights in its next column tile, reads the same values and
goes unseen: the other operand shows it); no inline PTX, half/bfloat16 types, textures, cooperative
groups or ``extern __shared__`` at file scope; kernels must be ``extern "C"``; and g++
accepts some code that NVRTC rejects, which is why ``cotsdl check-kernels`` compiles
every kernel with NVRTC too.
"""
from .module import Function, RawModule, asan_environment

__all__ = ["RawModule", "Function", "asan_environment"]
