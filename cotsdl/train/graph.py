"""A training step's device work launched eagerly or as one captured CUDA graph.

A step of a small network on a GPU is mostly launch and Python overhead (tens of small kernels
for LCN alone).  :class:`DeviceGraph` runs a function that only queues device work (no host
read, no synchronization, no MPI message, the same shapes each time) eagerly ``warmup`` times,
then captures it once on a side stream (CuPy stream capture) and from then on replays the graph:
the same kernels, the same memory addresses, one launch.

Rules the captured function keeps (the trainer's device part does):

- its inputs are arrays at fixed addresses (the graph reads them where they were at capture);
- its results are arrays it writes every call: the graph keeps the captured call's results and
  returns those same objects after each replay (valid until the next call, as eagerly);
- the arrays it makes come from a private memory pool used only by this graph's warm-up and
  capture: no allocation outside it can be handed memory the graph writes into on replay.

A key (e.g. the stage and the identity of the weight arrays) names what was captured: a new key
captures again.  Where capture is impossible (a host backend) or fails (an operation that
synchronizes), the function runs eagerly and ``reason`` says why (a failure is reported, not raised).
"""
from __future__ import annotations

from typing import Any, Callable

from .. import backend

#: Eager calls of a key before it is captured: the first makes the persistent arrays (the plan's
#: buffers, lent memory), the second leaves the private pool holding what a call allocates.
WARMUP = 2


class DeviceGraph:
    """Launch a step's device work eagerly or as a captured CUDA graph.

    Parameters
    ----------
    enabled : bool
        Capture and replay (only on the ``cuda`` backend); False: always eager.
    warmup : int
        Eager calls of a key before it is captured.
    model_ranks : int
        Ranks of the model group: more than one exchange halos inside the step, which a graph cannot
        hold (every rank then runs eagerly, and ``reason`` says why).
    """

    def __init__(self, enabled: bool = False, warmup: int = WARMUP, model_ranks: int = 1):
        self.enabled = bool(enabled)
        self.warmup = max(1, int(warmup))
        #: why the work runs eagerly although the graph was asked for (None: it is not, or not yet)
        self.reason: str | None = None
        #: replays of a captured graph so far, and captures made
        self.replays = self.captures = 0
        self._key: Any = None
        self._held: Any = None
        self._input: Any = None
        self._calls = 0
        self._graph: Any = None
        self._out: Any = None
        self._stream = self._pool = None
        self._constants: list = []
        if self.enabled and backend.name() != "cuda":
            self.reason = f"not available on backend {backend.name()} (CUDA graphs need the cuda backend)"
        elif self.enabled and model_ranks > 1:  # halo exchanges post MPI messages inside the step's work
            self.reason = (f"not available on a model group of {model_ranks} ranks (the step exchanges halos "
                           "over MPI; a graph serves one rank per model group)")

    @property
    def active(self) -> bool:
        """Whether the work goes (or will go) through a graph: asked for, possible, not failed."""
        return self.enabled and self.reason is None

    def pool_bytes(self) -> int:
        """Bytes the graph's private memory pool holds (0 without one)."""
        return int(self._pool.total_bytes()) if self._pool is not None else 0

    def fixed(self, x: Any) -> Any:
        """``x`` itself eagerly; with the graph, ``x`` copied into one array kept at one address (the
        graph reads its input where it was at capture; another shape or dtype captures again)."""
        if not self.active:
            return x
        if self._input is None or self._input.shape != x.shape or self._input.dtype != x.dtype:
            self._input = backend.array_module(x).empty_like(x)
        backend.array_module(x).copyto(self._input, x)
        return self._input

    def run(self, key: Any, fn: Callable[[], Any], hold: Any = None) -> Any:
        """``fn()``'s result: eagerly, or by replaying the graph captured for ``key``.  ``hold``: what
        the key names (e.g. arrays by ``id``), kept referenced while the key is current so that no
        other object can take its identity."""
        if not self.active:
            return fn()
        cp = backend.cupy_module()
        key = (key, id(self._input))
        if key != self._key:  # another stage, other weights: warm up and capture again
            self._key, self._held, self._calls, self._graph, self._out = key, hold, 0, None, None
        if self._stream is None:
            self._stream, self._pool = cp.cuda.Stream(non_blocking=True), cp.cuda.MemoryPool()
        if self._graph is None:
            self._calls += 1
            if self._calls <= self.warmup:
                try:
                    return self._on_side_stream(cp, fn)
                except Exception as e:  # noqa: BLE001 - reported; the work is run again eagerly (it only computes)
                    self.reason = f"warm-up on the capture stream failed: {type(e).__name__}: {e}"
                    return fn()
            try:
                self._capture(cp, fn)
            except Exception as e:  # noqa: BLE001 - reported, and the step runs eagerly
                self.reason = f"capture failed: {type(e).__name__}: {e}"
                self._graph = self._out = None
                return fn()
        self._graph.launch(stream=cp.cuda.get_current_stream())
        self.replays += 1
        return self._out

    def _on_side_stream(self, cp: Any, fn: Callable[[], Any]) -> Any:
        """``fn()`` on the capture stream with the private pool, finished before the caller goes on
        (the side stream does not wait for the default stream by itself)."""
        cp.cuda.get_current_stream().synchronize()
        with cp.cuda.using_allocator(self._pool.malloc), self._stream:
            out = fn()
        self._stream.synchronize()
        return out

    def _capture(self, cp: Any, fn: Callable[[], Any]) -> None:
        cp.cuda.get_current_stream().synchronize()  # what the graph reads is written (no event waits in capture)
        mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None)
        with cp.cuda.using_allocator(self._pool.malloc), self._stream:
            self._stream.begin_capture(**({} if mode is None else {"mode": mode}))
            try:
                out = fn()
            except BaseException:
                try:  # a stream left capturing would break every later call; the first error is the one to report
                    self._stream.end_capture()
                except Exception:  # noqa: BLE001, S110 - the capture was invalidated already
                    pass
                raise
            graph = self._stream.end_capture()
        self._graph, self._out = graph, out
        # the device tables kernels read through backend.constant (a bounded cache): the graph holds
        # their addresses, so it holds them too, lest an eviction free memory a replay reads
        self._constants = backend.kept_constants()
        self.captures += 1

    def describe(self) -> str:
        """One line: how the device work is launched."""
        if not self.enabled:
            return "eager"
        if self.reason:
            return f"eager ({self.reason})"
        return f"CUDA graph ({self.captures} capture(s), {self.replays} replay(s))"
