"""The peers of ``cotsdl bench layers --peer``: our functions written in PyTorch and JAX.

PyTorch (``torch``): ``Tensor.unfold`` patch views + per-site ``bmm`` / ``fold`` for the filter;
L2 pooling as the square root of an average pool of squares; LCN as a zero-padded Gaussian
``conv2d`` renormalized at the borders, its backward written out.  ``torch-funfold``: the
filter's forward, backward-weights and the training step with ``F.unfold`` patches (its
backward-data would be ``torch``'s own ``fold``).  ``torch-compile``: ``torch`` under
``torch.compile``.  JAX (``jax``): ``conv_general_dilated_local`` (jit; backward passes by
``jax.vjp``) for the filter.  Each is checked to compute our function on the shape first
(allclose, on the host); one that disagrees is reported, not timed.

One code path for both devices (:class:`PeerPlan`): beside the numpy and cuda-emu backends the
PyTorch peers run on the CPU; beside ``cuda`` on CuPy's GPU, their inputs taken from CuPy's
arrays by DLPack (no copy), fp32 convolutions without TF32 (as ours), ``torch.compile`` for the
filter passes and the step only, its compiling bounded per shape.  JAX is not run on the GPU:
XLA takes most of the device's memory at its first use by default, beside CuPy's and torch's pools.

:func:`quiet_idle_threads` is called before either library is imported: their idle
worker threads must wait passively, or they steal the cores of whatever is timed next
(cotsdl's backward-weights ran 3x slower right after torch with spinning OpenMP threads).
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .. import backend, ops
from ..ops.lcn import gaussian as _gaussian

POOL = dict(size=(2, 2), stride=(1, 1), eps=0.01)
LCN = dict(size=5, sigma=1.0, eps=1e-4)
TRAIN_LAM = 0.1  # the sparsity weight of the benchmarked training step
FILTER_PASSES = ("filter_forward", "filter_bwd_data", "filter_bwd_weights")
#: The passes ``torch-compile`` runs, by ``--peer-compile`` (None: every pass)
COMPILED: dict[str, tuple[str, ...] | None] = {"all": None, "filter": FILTER_PASSES + ("train_step",), "none": ()}
#: Beside the GPU by default: torch.compile for the filter passes and the step only, and no more compiling
#: on a shape once its compiles (first calls) have taken this many seconds: a compile can take tens of
#: seconds, and a device run has minutes
GPU_COMPILE, GPU_COMPILE_BUDGET = "filter", 30.0
JAX_ON_GPU = ("not run beside the GPU: XLA preallocates most of the device's memory at its first use, "
              "beside CuPy's and torch's pools")


def quiet_idle_threads() -> None:
    """Idle OpenMP workers sleep instead of spinning (set before torch/JAX start their pools)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("GOMP_SPINCOUNT", "0")
    os.environ.setdefault("KMP_BLOCKTIME", "0")
    # JAX is not run beside a GPU; should anything start its GPU backend, no 75% of the device taken at once
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def peers_importable() -> list[str]:
    """The peers whose libraries import here."""
    quiet_idle_threads()
    have = []
    for mod, names in (("torch", ["torch", "torch-funfold", "torch-compile"]), ("jax", ["jax"])):
        try:
            __import__(mod)
        except Exception:  # noqa: BLE001 - not only ImportError: a broken CUDA plugin must not end the bench
            continue
        have += names
    return have


@dataclass
class PeerPlan:
    """Which peers run (``names``, the table's columns), on which device, and what ``torch.compile`` may spend.

    ``device``: torch's device, ``"cpu"`` or ``"cuda:K"`` (JAX runs on the CPU only); ``skipped``: peer ->
    why it does not run; ``compile``: a key of :data:`COMPILED`; ``compile_budget``: seconds of compiling
    (first calls) per shape after which a shape's remaining ``torch-compile`` passes are skipped (None: no limit).
    """

    names: list[str]
    device: str = "cpu"
    skipped: dict[str, str] = field(default_factory=dict)
    compile: str = "all"
    compile_budget: float | None = None

    @property
    def where(self) -> dict[str, str]:
        return {p: "cpu" if p == "jax" else self.device for p in self.names}

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"

    def compiles(self, name: str) -> bool:
        passes = COMPILED[self.compile]
        return "torch-compile" in self.names and (passes is None or name in passes)

    def sync(self) -> None:
        """Wait for all work queued on the GPU, every stream's (CuPy's too; a no-op on the CPU)."""
        if self.on_gpu:
            import torch  # noqa: PLC0415

            torch.cuda.synchronize(self.device)

    def release(self) -> None:
        """Between shapes: drop compiled graphs and hand torch's cached device memory back (CuPy's pool and
        torch's share the device)."""
        if not any(p.startswith("torch") for p in self.names):
            return
        import torch  # noqa: PLC0415

        gc.collect()
        try:
            torch._dynamo.reset()  # a shape's graphs are never run again; reset also keeps under recompile limits
        except Exception:  # noqa: BLE001 - only a cache
            pass
        if self.on_gpu:
            torch.cuda.empty_cache()


def plan(gpu: int | None = None, compile: str | None = None, compile_budget: float | None = None) -> PeerPlan:
    """The peers that import, on the CPU (``gpu`` None) or beside CuPy on GPU number ``gpu``.

    ``compile`` (:data:`COMPILED`) and ``compile_budget``: None for the device's default (on the CPU every
    pass, no limit; on the GPU :data:`GPU_COMPILE`, :data:`GPU_COMPILE_BUDGET`).
    """
    names, skipped = peers_importable(), {}
    if compile is not None and compile not in COMPILED:
        raise ValueError(f"--peer-compile: {compile!r} is not one of {', '.join(COMPILED)}")
    if compile_budget is not None and not compile_budget >= 0:
        raise ValueError(f"--peer-compile-budget must be >= 0 seconds, got {compile_budget}")
    device = "cpu"
    if gpu is not None:
        device = f"cuda:{gpu}"
        compile = GPU_COMPILE if compile is None else compile
        compile_budget = GPU_COMPILE_BUDGET if compile_budget is None else compile_budget
        if "jax" in names:
            names.remove("jax")
            skipped["jax"] = JAX_ON_GPU
        if "torch" in names:
            import torch  # noqa: PLC0415

            why = (f"this PyTorch ({torch.__version__}) has no CUDA" if not torch.cuda.is_available() else
                   f"PyTorch sees {torch.cuda.device_count()} GPU(s), not device {gpu}"
                   if gpu >= torch.cuda.device_count() else None)
            if why:
                skipped.update({p: why for p in names if p.startswith("torch")})
                names = [p for p in names if not p.startswith("torch")]
    compile = compile or "all"
    if compile == "none" and "torch-compile" in names:
        names.remove("torch-compile")
        skipped["torch-compile"] = "--peer-compile none"
    return PeerPlan(names, device, skipped, compile, compile_budget)


def _sites_order(y: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """Our filter output (SH*bh, SW*bw, K, N) -> (SH, SW, M, N), the per-site order the peers produce."""
    H, W, K, N = y.shape
    bh, bw = block
    return y.reshape(H // bh, bh, W // bw, bw, K, N).transpose(0, 2, 1, 3, 4, 5).reshape(H // bh, W // bw, -1, N)


#: Passes through a non-differentiable point, and the share of elements allowed to differ there.
#: LCN's max(s, m, eps): where a pixel's local s and the image mean m agree to float32 rounding,
#: the two sides may take different branches (both are valid subgradients).  On P-paper one such
#: pixel changes its 9x9 x C footprint, about 1e-4 of the elements (float64 shows no difference).
KINKS = {"lcn_backward": 1e-3}
_AGREE_CHUNK = 1 << 22  # elements compared at once: temporaries stay small on gigabyte weights


def _agree(got: np.ndarray, want: np.ndarray, stray: float = 0.0) -> tuple[bool, float]:
    """Same function: allclose at float32 accuracy, scaled by the size of the values, on all but a
    ``stray`` share of the elements; and the relative error over all of them.  Chunk by chunk, in the
    arrays' precision (at least float32; a difference's rounding is far below the tolerance): the
    device run checks gigabytes of weight gradients on the host."""
    got, want = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    if got.shape != want.shape:
        return False, float("inf")
    if got.size == 0:
        return True, 0.0
    ft = np.result_type(got.dtype, want.dtype, np.float32)
    step = max(1, _AGREE_CHUNK // max(1, got[0].size))
    parts = [slice(i, i + step) for i in range(0, got.shape[0], step)]
    # np.max over the parts' maxima, not max(): a NaN anywhere must come through
    scale = float(np.max([np.abs(want[p]).max() for p in parts])) or 1.0
    errs, off = [], 0
    for p in parts:
        w = want[p].astype(ft)
        d = np.subtract(got[p], w, dtype=ft)
        np.abs(d, out=d)
        errs.append(d.max())
        tol = np.abs(w, out=w)
        tol *= 1e-3
        tol += 2e-4 * scale
        off += d.size - int(np.count_nonzero(d <= tol))  # np.isclose's test; a NaN is off
    err = float(np.max(errs)) / scale
    return bool(np.isfinite(err) and off <= stray * got.size), err


def _torch_formulations(sh: Any, data: dict[str, Any], device: str) -> tuple[dict, dict, Callable] | None:
    """Per pass: (function, arguments, converter of its result to our layout, on the host) of ``torch`` and of
    ``torch-funfold``, and the compiler of a ``torch`` one; None when torch does not import.  The arguments
    are on ``device``: a CuPy array's memory is taken by DLPack, a host array's copied there once."""
    try:
        import torch  # noqa: PLC0415
        import torch.nn.functional as F  # noqa: N812, PLC0415
    except ImportError:
        return None
    torch.set_num_threads(ops.num_threads())
    dev = torch.device(device)
    if dev.type == "cuda":
        # fp32 convolutions in fp32, as ours (cuDNN takes TF32 by default; cuBLAS's matmuls do not).  The legacy
        # flag only: mixing it with the new fp32_precision API makes torch (and Inductor reading it) raise.
        try:
            torch.backends.cudnn.allow_tf32 = False
        except Exception:  # noqa: BLE001 - then LCN's agreement check says whether TF32 matters
            pass

    def t(a):  # our array as a tensor on dev
        if backend.is_device_array(a):
            try:
                return torch.from_dlpack(a).to(dev)
            except Exception:  # noqa: BLE001 - DLPack refused: through the host, once
                a = backend.to_numpy(a)
        return torch.from_numpy(np.ascontiguousarray(a)).to(dev)

    nchw = lambda a: t(a).permute(3, 2, 0, 1).contiguous()  # noqa: E731  (H, W, C, N) -> (N, C, H, W)
    host = lambda r: r.detach().cpu().numpy()  # noqa: E731
    back = lambda r: host(r).transpose(2, 3, 1, 0)  # noqa: E731  (N, C, H, W) -> (H, W, C, N)
    x, w, dy = data["x"], data["w"], data["dy"]
    SH, SW, M = w.shape[:3]
    S, r, s = SH * SW, sh.r, sh.s
    H, C = sh.H, sh.C
    bh, bw = sh.block
    # unfold's patch order is (c, p, q); the weights follow it.
    wt = t(w).permute(0, 1, 2, 5, 3, 4).reshape(S, M, -1).contiguous()
    xt = nchw(x)
    dyt = t(dy)  # (SH*bh, SW*bw, K, N) -> per site (S, M, N)
    dys = dyt.reshape(SH, bh, SW, bw, -1, dyt.shape[3]).permute(0, 2, 1, 3, 4, 5).reshape(S, M, -1).contiguous()

    def patches(xt):  # (S, N, R): Tensor.unfold views, one copy; faster than F.unfold's (N, R, S) in bmm
        return xt.unfold(2, r, s).unfold(3, r, s).permute(2, 3, 0, 1, 4, 5).reshape(S, xt.shape[0], -1)

    def patches_f(xt):  # F.unfold's (N, R, S) seen per site; bmm copies it as it needs
        return F.unfold(xt, r, stride=s).permute(2, 0, 1)

    def fwd_with(patches):
        return lambda xt, wt: torch.bmm(patches(xt), wt.transpose(1, 2))  # (S, N, M)

    def bwd_data(dyst, wt):
        cols = torch.bmm(dyst, wt)  # (S, N, R)
        return F.fold(cols.permute(1, 2, 0).contiguous(), (H, H), r, stride=s)  # (N, C, H, W)

    def bwd_weights_with(patches):
        return lambda xt, dys: torch.bmm(dys, patches(xt))  # (S, M, R)

    ps, pst, eps = POOL["size"], POOL["stride"], POOL["eps"]
    area = ps[0] * ps[1]

    def pool_fwd(a):
        return torch.sqrt(F.avg_pool2d(a * a, ps, pst) * area + eps)

    def pool_bwd(g, a, b):
        spread = torch.ops.aten.avg_pool2d_backward(torch.where(b > 0, g / b, 0), a, ps, pst, [0, 0], False, True, 1)
        return spread * a

    # LCN: the Gaussian as one (2 rho + 1)^2 convolution, zero-padded, renormalized by Z at the borders.
    size, sigma, leps = LCN["size"], LCN["sigma"], LCN["eps"]
    rho = size // 2
    g1 = _gaussian(size, sigma)
    Hy, Wy, Cy = data["y"].shape[:3]
    g2 = torch.from_numpy(np.outer(g1, g1).astype(data["y"].dtype)[None, None]).to(dev)
    z = F.conv2d(torch.ones(1, 1, Hy, Wy, dtype=g2.dtype, device=dev), g2, padding=rho)

    def smooth(u):  # (N, 1, H, W)
        return F.conv2d(u, g2, padding=rho) / z

    def smooth_t(u):  # adjoint of smooth: the zero-padded convolution with a symmetric g is self-adjoint
        return F.conv2d(u / z, g2, padding=rho)

    def lcn_parts(a):
        v = a - smooth(a.mean(1, keepdim=True))
        sd = torch.sqrt(smooth((v * v).mean(1, keepdim=True)))
        m = sd.mean((2, 3), keepdim=True)
        return v, sd, m, torch.clamp(torch.maximum(sd, m), min=leps)

    def lcn_fwd(a):
        v, _, _, d = lcn_parts(a)
        return v / d

    def lcn_bwd(g, a):  # the forward recomputed, as ours does
        v, sd, m, d = lcn_parts(a)
        dd = -(g * v).sum(1, keepdim=True) / (d * d)
        s_wins = (sd >= m) & (sd >= leps)
        m_wins = ~s_wins & (m >= leps)
        ds = torch.where(s_wins, dd, 0) + torch.where(m_wins, dd, 0).sum((2, 3), keepdim=True) / (Hy * Wy)
        du = torch.where(sd > 0, ds / (2 * sd), 0)
        dv = g / d + (2.0 / Cy) * v * smooth_t(du)
        return dv - smooth_t(dv.sum(1, keepdim=True)) / Cy

    # One training step of the stage's sparse autoencoder (tied weights; objective.py):
    # J = (||F^T F x - x||^2 + lam * sum P(F x)) / N and dJ/dw, by autograd.
    K = M // (bh * bw)
    N = x.shape[3]

    def loss_with(fwd):
        def loss(xt, wt):
            hs = fwd(xt, wt)  # (S, N, M)
            xhat = bwd_data(hs, wt)
            hh = hs.reshape(SH, SW, N, bh, bw, K).permute(2, 5, 0, 3, 1, 4).reshape(N, K, SH * bh, SW * bw)
            rec = xhat - xt
            return ((rec * rec).sum() + TRAIN_LAM * pool_fwd(hh).sum()) / N
        return loss

    def train_with(loss_fn):
        def train(xt, wt):
            wg = wt.detach().requires_grad_(True)
            (g,) = torch.autograd.grad(loss_fn(xt, wg), wg)
            return g
        return train

    def w_back(o):  # (S, M, (c, p, q)) -> our (SH, SW, M, rh, rw, C)
        return host(o).reshape(SH, SW, M, C, r, r).transpose(0, 1, 2, 4, 5, 3)

    yt, pt, dpt, dynt = nchw(data["y"]), nchw(data["p"]), nchw(data["dp"]), dyt.permute(3, 2, 0, 1).contiguous()
    dyst = dys.transpose(1, 2).contiguous()  # (S, N, M)
    y_back = lambda o: host(o).reshape(SH, SW, -1, M).transpose(0, 1, 3, 2)  # noqa: E731
    fwd, loss = fwd_with(patches), loss_with(fwd_with(patches))
    forms = {
        "filter_forward": (fwd, (xt, wt), y_back),
        "filter_bwd_data": (bwd_data, (dyst, wt), back),
        "filter_bwd_weights": (bwd_weights_with(patches), (xt, dys), w_back),
        "pool_forward": (pool_fwd, (yt,), back),
        "pool_backward": (pool_bwd, (dpt, yt, pt), back),
        "lcn_forward": (lcn_fwd, (yt,), back),
        "lcn_backward": (lcn_bwd, (dynt, yt), back),
        "train_step": (train_with(loss), (xt, wt), w_back),
    }
    funfold = {
        "filter_forward": (fwd_with(patches_f), (xt, wt), y_back),
        "filter_bwd_weights": (bwd_weights_with(patches_f), (xt, dys), w_back),
        "train_step": (train_with(loss_with(fwd_with(patches_f))), (xt, wt), w_back),
    }

    def compile_(name, fn):  # the step: its loss compiled (forward and backward graphs), autograd outside
        return train_with(torch.compile(loss, dynamic=False)) if name == "train_step" else torch.compile(fn, dynamic=False)

    return forms, funfold, compile_


def _jax_formulations(sh: Any, data: dict[str, Any]) -> dict[str, tuple] | None:
    """The filter's passes with ``jax.lax.conv_general_dilated_local`` (jit; the backward passes by ``jax.vjp``)."""
    try:
        import jax  # noqa: PLC0415
    except ImportError:
        return None
    x, w, dy = (backend.to_numpy(data[k]) for k in ("x", "w", "dy"))
    SH, SW, M = w.shape[:3]
    r, s, C = sh.r, sh.s, sh.C
    put = lambda a: jax.device_put(np.ascontiguousarray(a))  # noqa: E731
    xj = put(x.transpose(3, 2, 0, 1))  # (N, C, H, W)
    wj = put(w.transpose(2, 5, 3, 4, 0, 1).reshape(M, C * r * r, SH, SW))  # (O, I = (c, p, q), SH, SW)
    dyj = put(_sites_order(dy, sh.block).transpose(3, 2, 0, 1))  # (N, M, SH, SW)

    def f(a, b):
        return jax.lax.conv_general_dilated_local(a, b, (s, s), "VALID", (r, r),
                                                  dimension_numbers=("NCHW", "OIHW", "NCHW"))

    fwd = jax.jit(f)
    bwd_data = jax.jit(lambda g, b: jax.vjp(lambda a: f(a, b), xj)[1](g)[0])
    bwd_weights = jax.jit(lambda a, g: jax.vjp(lambda b: f(a, b), wj)[1](g)[0])
    ready = lambda fn: (lambda *a: fn(*a).block_until_ready())  # noqa: E731
    return {
        "filter_forward": (ready(fwd), (xj, wj), lambda o: np.asarray(o).transpose(2, 3, 1, 0)),
        "filter_bwd_data": (ready(bwd_data), (dyj, wj), lambda o: np.asarray(o).transpose(2, 3, 1, 0)),
        "filter_bwd_weights": (ready(bwd_weights), (xj, dyj),
                               lambda o: np.asarray(o).reshape(M, C, r, r, SH, SW).transpose(4, 5, 0, 2, 3, 1)),
    }


def _ours_for_peers(name: str, result: Any, block: tuple[int, int]) -> np.ndarray:
    """Our result in the layout the peers' converters give back (the training step: its weight gradient)."""
    if name == "train_step":
        return result[1]
    return _sites_order(result, block) if name == "filter_forward" else result


def peer_callables(sh, data: dict[str, Any], ours: dict[str, np.ndarray], peers: PeerPlan | None = None,
                   say: Callable[..., None] = lambda *a: None) -> dict[str, dict[str, tuple]]:
    """Per pass of ``ours`` (our results, host copies) and peer of ``peers`` (default: all that import, on
    the CPU): (record, callable or None).  The record says whether the peer computes our function on this
    shape (``agrees``, ``max_rel_error`` or ``error``); only one that agrees is timed.  ``torch-compile``'s
    records also give the first call's seconds, compiling included (``compile_seconds``; printed by ``say``,
    one line per shape); past the plan's budget its remaining passes are ``skipped`` (``agrees`` None)."""
    peers = peers or plan()
    found: dict[str, dict[str, tuple]] = {}
    res: dict[str, dict[str, tuple]] = {}

    def failed(names: list[str], e: Exception) -> None:  # a peer that fails is reported, the bench goes on
        for name in ours:
            for peer in names:
                res.setdefault(name, {})[peer] = ({"agrees": False, "error": f"{type(e).__name__}: {e}"[:300]}, None)

    torch_names = [p for p in peers.names if p.startswith("torch")]
    try:
        torch_forms = _torch_formulations(sh, data, peers.device) if torch_names else None
    except Exception as e:  # noqa: BLE001 - its inputs could not be set up (device memory, DLPack, cuDNN)
        torch_forms = None
        failed(torch_names, e)
    if torch_forms is not None:
        forms, funfold, compile_ = torch_forms
        for name, fs in (("torch", forms), ("torch-funfold", funfold)):
            if name in peers.names:
                found[name] = fs
        if "torch-compile" in peers.names:
            found["torch-compile"] = {k: (compile_(k, fn), a, conv) for k, (fn, a, conv) in forms.items()
                                      if peers.compiles(k)}
    if "jax" in peers.names:
        try:
            jax_forms = _jax_formulations(sh, data)
        except Exception as e:  # noqa: BLE001
            jax_forms = None
            failed(["jax"], e)
        if jax_forms is not None:
            found["jax"] = jax_forms
    compiled: dict[str, float] = {}
    for peer, forms in found.items():
        for name, (fn, args, conv) in forms.items():
            if name not in ours:
                continue
            spent = sum(compiled.values())
            if peer == "torch-compile" and peers.compile_budget is not None and spent >= peers.compile_budget:
                why = f"not compiled: compiling on {sh.name} took {spent:.0f} s, the budget {peers.compile_budget:g} s"
                res.setdefault(name, {})[peer] = ({"agrees": None, "skipped": why}, None)
                continue
            t0 = time.perf_counter()
            try:
                out = fn(*args)
                peers.sync()
                first = time.perf_counter() - t0
                got = conv(out)
                del out
            except Exception as e:  # noqa: BLE001 - a peer that fails is reported, the bench goes on
                rec = {"agrees": False, "error": f"{type(e).__name__}: {e}"[:300]}
                if peer == "torch-compile":
                    rec["compile_seconds"] = compiled[name] = time.perf_counter() - t0
                res.setdefault(name, {})[peer] = (rec, None)
                continue
            ok, err = _agree(got, _ours_for_peers(name, ours[name], sh.block), KINKS.get(name, 0.0))
            del got
            rec = {"agrees": ok, "max_rel_error": err}
            if peer == "torch-compile":
                rec["compile_seconds"] = compiled[name] = first
            call = (lambda fn=fn, args=args: fn(*args)) if ok else None
            res.setdefault(name, {})[peer] = (rec, call)
    if compiled:
        say(f"(torch-compile on {sh.name}, {peers.device}: first calls, compiling included: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in compiled.items()) + f"; {sum(compiled.values()):.1f} s in all)")
    return res
