"""Greedy layer-wise training of stacked sparse autoencoders over replicas x model grid.

Stage 1 is trained on the input images; stage k on the output of the frozen stages
1..k-1 (forward only below the trained stage).  The world communicator is split
into ``replicas`` model groups (DESIGN.md section 4): every rank of a group reads the
same images (its window of them); replicas read different images and average their
gradients with fused allreduces.  The trainer is a Python object to script: train a
stage, look at the weights, change the learning rate or ``lam``, continue.
"""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from mpi4py import MPI

from .. import backend
from ..array.collect import gather
from ..array import collective
from ..array.collective import agree, agreed, raise_collectively, sum_values
from ..array.distarray import DistArray
from ..array.grid import split_replicas
from ..io import checkpoint
from ..io.input_lcn import InputLCN
from ..nn.network import Network, filter_norms, project_norm
from ..nn.plan import NetworkPlan
from ..nn import stage_stats as monitor
from . import allreduce, auto, resume, schedules, vitals
from .graph import DeviceGraph
from .objective import StageObjective
from .optim import Optimizer
from .norms import stage_norms
from .state import META_KEYS, TrainState
from .steplog import StepLog


class TrainingInterrupted(Exception):
    """Training stopped at a step boundary because ``should_stop`` asked for it on some rank.

    ``checkpoint`` is the folder written just before stopping (None without ``checkpoint_dir``).
    """

    def __init__(self, step: int, checkpoint: Path | None):
        where = f"; checkpoint {checkpoint}" if checkpoint else ""
        super().__init__(f"training interrupted at global step {step}{where}")
        self.step, self.checkpoint = step, checkpoint


def _state_attr(name: str) -> property:
    """``trainer.<name>`` is ``trainer.state.<name>`` (the state is one object that saves itself)."""
    return property(lambda self: getattr(self.state, name), lambda self, v: setattr(self.state, name, v),
                    doc=f"``state.{name}`` (:class:`TrainState`)")


class GreedyTrainer:
    """Train the stages of ``network`` one after another.

    Parameters
    ----------
    network : Network
    data : DataSource
        Any object with ``image_shape`` and ``read(first, count, window)`` (see ``train.data``).
    optimizer : Optimizer
        A template: every stage starts from a fresh copy of it (its ``comm`` is set to
        the model group); ``trainer.optimizer`` is the current stage's copy.
    comm : MPI.Comm
        All ranks taking part (``replicas`` x grid of them).
    batch : int
        Images per replica per step (the global batch is ``batch * replicas``).
    replicas, grid : int, (Py, Px)
        Data-parallel replicas and the model-parallel grid (chosen for the image if None).
    lam : float
        Weight of the pooled sparsity term.
    tied : bool
        Decoder weights tied to the encoder's (the default) or separate.
    checkpoint_dir, checkpoint_every, keep : where, how often (global steps; 0 = only
        when asked) and how many checkpoints to keep.
    log_every, metrics_file : rank 0 prints a line every ``log_every`` steps and appends
        a JSON line to ``metrics_file``.
    max_bad_steps : int
        Consecutive non-finite steps (skipped) after which training stops.  Training also stops
        (a RuntimeError naming the step, the stage and the likely setting) when a stage stopped
        learning (:mod:`cotsdl.train.vitals`), and refuses steps its schedule would train at rate 0.
    overlap : bool or "auto"
        Hide halo traffic behind computation (same results bit for bit; see ``NetworkPlan``).
        ``"auto"``: where the run planner predicts a gain on this machine (its calibration
        ``./machine.json``, else a rule: on where halos cross nodes), decided once on rank 0 for
        this grid (:func:`cotsdl.planner.overlap.choose_overlap`); ``overlap_reason`` says why.
    fuse : "auto", "on", "off" or stage indices
        Stages whose pool and LCN share one halo exchange, each rank pooling the border its LCN
        reads (``NetworkPlan(fuse=...)``): a training step's forward is the same bit for bit.
        ``"auto"``: where the run planner predicts a gain on this machine (without a calibration:
        none), decided once on rank 0 (:func:`cotsdl.planner.fuse.choose_fuse`); ``fuse_reason`` says why.
    graph : bool
        Launch each step's device work (frozen stages' forward, the objective's forward and backward) as
        one captured CUDA graph (:mod:`cotsdl.train.graph`; cuda backend only, else or where capture fails
        eager, ``trainer.graph.reason`` says why); the update, the checks and the gradient sum stay eager.
    fuse_filter : "auto", "on", "off" or stage indices
        Fused stages whose filter joins their pool and LCN while frozen (``NetworkPlan(fuse_filter=...)``):
        the forward of the stages below the trained one exchanges each stage's input once, computing the
        filter on the sites its pool reads with the neighbours' weights, fetched at the first step after
        another stage was trained (or a weight array replaced; weights changed in place by the caller
        between two ``train_stage`` calls of one stage are not seen); the same bits.  ``"on"``: every fused
        stage; ``"auto"``: chosen with ``fuse`` by the run planner, as ``fuse``.
    reduction : "auto", "flat" or "two-level"
        How the replicas sum their gradients (:data:`cotsdl.train.allreduce.REDUCTIONS`; equal
        results, within a float sum's rounding); ``reduction_reason`` says which and why.
    filter_norm : float, "auto", sequence of them (or None), or None
        Keep every unit's filter (encoder, and decoder when untied) at this L2 norm:
        initialized at it and projected back after every update (as reconstruction
        ICA does), so that the sparsity penalty cannot be paid off by shrinking the
        weights.  One value for every stage, or one per stage; None: unconstrained.
        ``"auto"`` is :data:`train.norms.AUTO_NORM_FRACTION` of ``nn.network.unit_gain_norm``, the
        norm at which the stage's reconstruction has gain 1.
    overwrite : bool
        Allow a new run in a ``checkpoint_dir`` that holds checkpoints already (refused
        by default: ``keep`` would prune them).  ``resume`` continues a run in place.
    should_stop : callable or None
        Asked on every rank after every step; when it returns True on any rank, every
        rank writes a checkpoint (with ``checkpoint_dir``) and raises
        :class:`TrainingInterrupted` (how the command line handles SIGTERM/SIGUSR1).
    """

    def __init__(self, network: Network, data: Any, optimizer: Optimizer, *, comm: MPI.Comm, batch: int,
                 replicas: int = 1, grid: Sequence[int] | None = None, lam: float = 0.1, tied: bool = True,
                 seed: int = 0, dtype: Any = np.float32, checkpoint_dir: str | None = None,
                 checkpoint_every: int = 0, keep: int = 3, log_every: int = 10, metrics_file: str | None = None,
                 max_bad_steps: int = 5, log=sys.stdout, should_stop: Callable[[], bool] | None = None,
                 overwrite: bool = False, overlap: bool | str = True, reduction: str = "auto",
                 filter_norm: float | Sequence[float | None] | None = None, fuse: Any = (), fuse_filter: Any = (),
                 graph: bool = False):
        from ..planner.fuse import resolve as resolve_fuse, resolve_filter, undecided  # noqa: PLC0415

        err = fuse_err = None
        try:
            fixed_fuse = resolve_fuse(fuse, len(network.stages))
            fixed_filter = resolve_filter(fuse_filter, len(network.stages), fixed_fuse)
        except ValueError as e:
            fuse_err, fixed_fuse, fixed_filter = str(e), (), ()
        norms, norm_err = stage_norms(filter_norm, network)
        if tuple(getattr(data, "image_shape", ())) != network.input_shape:
            err = f"the data's images are {getattr(data, 'image_shape', None)}, the network takes {network.input_shape}"
        elif not isinstance(optimizer, Optimizer):
            err = f"optimizer must be a cotsdl.train.optim optimizer, got {type(optimizer).__name__}"
        elif not isinstance(batch, (int, np.integer)) or batch < 1:
            err = f"batch must be a positive integer, got {batch!r}"
        elif not float(lam) >= 0:
            err = f"lam must be >= 0, got {lam!r}"
        elif norm_err:
            err = norm_err
        elif fuse_err:
            err = fuse_err
        elif not (isinstance(overlap, (bool, np.bool_)) or (isinstance(overlap, str) and overlap == "auto")):
            err = f'overlap must be True, False or "auto", got {overlap!r}'
        elif allreduce.setting_error(reduction):
            err = allreduce.setting_error(reduction)
        elif bad := next((f"{k} must be an integer >= {lo}, got {v!r}" for k, v, lo in (
                ("checkpoint_every", checkpoint_every, 0), ("keep", keep, 1), ("log_every", log_every, 0),
                ("max_bad_steps", max_bad_steps, 1), ("seed", seed, 0))
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo), None):
            err = bad
        elif metrics_file and comm.Get_rank() == 0:
            try:
                open(metrics_file, "a").close()
            except OSError as e:
                err = f"metrics_file {metrics_file}: {e.strerror}"
        if err is None and checkpoint_dir and not overwrite and comm.Get_rank() == 0:
            found = checkpoint.latest(checkpoint_dir)
            if found is not None:  # ``keep`` would prune another run's checkpoints
                err = (f"checkpoint_dir {checkpoint_dir} already holds checkpoints (latest {found.name}): continue "
                       "that run with GreedyTrainer.resume(...), or pass overwrite=True to train a new run there "
                       "(its checkpoints are then pruned as the new ones come)")
        raise_collectively(comm, err)
        agree(comm, network=network.describe(), batch=int(batch), replicas=replicas,
              grid=None if grid is None else [int(v) for v in grid], lam=float(lam), tied=bool(tied), seed=int(seed),
              dtype=np.dtype(dtype).name, checkpoint_dir=checkpoint_dir, checkpoint_every=int(checkpoint_every),
              keep=int(keep), max_bad_steps=int(max_bad_steps), overwrite=bool(overwrite),
              overlap=overlap if isinstance(overlap, str) else bool(overlap), reduction=reduction,
              fuse="auto" if fixed_fuse is None else list(fixed_fuse),
              fuse_filter=fixed_filter if fixed_filter is None or isinstance(fixed_filter, str) else list(fixed_filter),
              filter_norm=norms, graph=bool(graph), optimizer=(type(optimizer).__name__, schedules.describe(optimizer.schedule), optimizer.hyper()),
              data=(tuple(data.image_shape), len(data) if hasattr(data, "__len__") else None,
                    getattr(data, "seed", None)))
        if checkpoint_dir:  # checked now, not at the first checkpoint after real work
            need = self._checkpoint_bytes(network, optimizer, np.dtype(dtype), tied)
            raise_collectively(comm, checkpoint.destination_error(checkpoint_dir, need)
                               if comm.Get_rank() == 0 else None, OSError)
        self.world, self.network, self.data = comm, network, data
        self.decomposition = split_replicas(comm, replicas, grid, extent=network.input_shape[:2])
        #: the replicas' gradient sum (flat or two-level), ``reduction_reason`` why (collective)
        self.reduction = allreduce.Reduction(self.decomposition.replica_comm, reduction)
        self.reduction_reason = f"{self.reduction.kind} ({self.reduction.reason})"
        #: why ``overlap="auto"`` chose what it did (None: overlap was given)
        self.overlap_reason: str | None = None
        if isinstance(overlap, str):
            choice = auto.overlap(self.world, self.decomposition.grid.dims, network, int(batch), replicas,
                                  np.dtype(dtype), tied, len(optimizer.slots))
            overlap, self.overlap_reason = choice.on, choice.reason
        #: why ``fuse="auto"`` chose what it did (None: the stages were given)
        self.fuse_reason: str | None = None
        if undecided(fixed_fuse, fixed_filter):
            choice = auto.fuse(self.world, self.decomposition.grid.dims, network, int(batch), replicas,
                               np.dtype(dtype), tied, len(optimizer.slots), bool(overlap), fixed_fuse, fixed_filter)
            fixed_fuse, fixed_filter, self.fuse_reason = choice.stages, choice.filters, choice.describe()
        self.plan = NetworkPlan(network, self.decomposition.grid, int(batch), dtype, overlap=bool(overlap),
                                fuse=fixed_fuse, fuse_filter=fixed_filter)
        #: names the frozen stages' weights for the plan's weight halos: a new value whenever a
        #: ``train_stage`` call trains another stage than the last one did (it may have changed them);
        #: a replaced weight array (another state) the plan sees by itself
        self._frozen_version, self._frozen_stage = 0, None
        self.batch, self.replicas, self.lam, self.tied, self.seed = int(batch), int(replicas), float(lam), tied, int(seed)
        # With the cuda backend the weights, the optimizer state and the images live on the GPU.
        self.xp = backend.xp()
        self.filter_norms = norms
        params = {k: self.xp.asarray(v) for k, v in self.plan.init_params(seed, norms).items()}
        #: Everything that changes as training goes on (what a checkpoint holds).
        self.state = TrainState(params, {} if tied else {i: w.copy() for i, w in params.items()})
        self.template = optimizer
        self._saved_step = -1
        self.max_bad_steps = int(max_bad_steps)
        self.checkpoint_dir, self.checkpoint_every, self.keep = checkpoint_dir, int(checkpoint_every), int(keep)
        self.log_every = int(log_every)
        self.steplog = StepLog(log, metrics_file, comm.Get_rank() == 0)
        self.history: list[dict[str, Any]] = []
        #: End-of-stage filter diagnostics by stage (``nn.stage_stats.stage_stats``)
        self.stage_stats: dict[int, dict[str, float]] = {}
        self._w0: tuple[int, Any] | None = None  # (stage, this rank's initial weights of it)
        self.should_stop = should_stop
        #: the signs of a stage that stopped learning (silence, a frozen loss), step by step
        self.vitals = vitals.Vitals(self.plan.dtype)
        self._read_wait = 0.0  # seconds the last step waited for its minibatch (this rank)
        #: how a step's device work is launched: eagerly, or as a captured CUDA graph
        self.graph = DeviceGraph(bool(graph), model_ranks=self.decomposition.grid.comm.Get_size())

    @staticmethod
    def _checkpoint_bytes(network: Network, optimizer: Optimizer, dtype: np.dtype, tied: bool) -> int:
        """The size of one checkpoint: every layer's weights (twice untied) and the largest
        stage's optimizer slots."""
        sizes = [int(np.prod(network.layers[li].weight_shape(network.shapes[li] + (1,))))
                 for li in network.filter_layers()]
        slots = len(optimizer.slots)  # momentum 1, Adam 2, plain SGD 0
        return dtype.itemsize * ((1 if tied else 2) * sum(sizes) + slots * (1 if tied else 2) * max(sizes))

    params = _state_attr("params")
    decoders = _state_attr("decoders")
    optimizer = _state_attr("optimizer")
    stage = _state_attr("stage")
    stage_step = _state_attr("stage_step")
    step = _state_attr("step")
    position = _state_attr("position")  # images consumed by all replicas so far
    skipped = _state_attr("skipped")
    bad_in_row = _state_attr("bad_in_row")

    # -- inspection -------------------------------------------------------------
    @property
    def filter_layers(self) -> list[int]:
        return self.network.filter_layers()

    def gather_weights(self, stage: int, root: int = 0) -> np.ndarray | None:
        """The whole encoder weights of ``stage`` on ``root`` of the model group (None elsewhere)."""
        li = self.filter_layers[stage]
        shape, box = self.plan.weight_box(li)
        grid_comm = self.decomposition.grid.comm
        return gather(DistArray(grid_comm, shape, box, box, data=self.params[li]), root=root)

    def _say(self, msg: str) -> None:
        self.steplog.say(msg)

    # -- one step -----------------------------------------------------------------
    def _read_images(self) -> Any:
        """This rank's block of the step's images on the backend's device (with the graph: in the array it reads)."""
        first = self.position + self.decomposition.replica * self.batch
        err, x = None, None
        try:
            t0 = time.perf_counter()
            xb = self.data.read(first, self.batch, self.plan.input_owned)
            self._read_wait = time.perf_counter() - t0  # blocked on the data (prefetched: its wait for the thread)
            want = self.plan.input_owned.shape
            if tuple(xb.shape) != want:
                raise ValueError(f"the source returned shape {tuple(xb.shape)}, expected {want}")
            x = self.graph.fixed(self.xp.ascontiguousarray(self.xp.asarray(xb), dtype=self.plan.dtype))
            if hasattr(self.data, "prefetch"):  # the next step's images, read while this one computes
                self.data.prefetch(first + self.batch * self.replicas, self.batch, self.plan.input_owned)
        except Exception as e:  # noqa: BLE001 - reported on every rank below
            err = f"reading images {first}..{first + self.batch - 1}: {type(e).__name__}: {e}"
        raise_collectively(self.world, err, RuntimeError)
        return x

    def _device_step(self, stage: int, objective: StageObjective, images: Any) -> tuple[Any, dict[str, Any]]:
        """The step's device work from its images: the frozen stages' forward, the objective's value and
        gradients ((LossParts or PendingLoss, grads)); with the graph, nothing read back nor sent."""
        x = self.plan.input_array(images)
        if stage > 0:
            x, _ = self.plan.forward(x, self.params, upto=self.network.layer_index(stage, "filter"),
                                     frozen=(stage, self._frozen_version))
        li = self.filter_layers[stage]
        if self.tied:
            parts, dw = objective.value_and_grad(x, self.params[li], pending=self.graph.active)
            return parts, {"w": dw}
        parts, dw, dwd = objective.value_and_grad(x, self.params[li], self.decoders[li], pending=self.graph.active)
        return parts, {"w": dw, "w_dec": dwd}

    def _train_step(self, stage: int, objective: StageObjective, last: bool = False) -> dict[str, Any]:
        t0 = time.perf_counter()
        ex0 = sum(e.seconds for e in self.plan.exchanges())
        msgs0 = sum(e.messages for e in self.plan.exchanges())
        li = self.filter_layers[stage]
        # The step's activations, windows and sums in memory lent by the plan for this step (the
        # gradients are the plan's buffers): the same memory every step, whatever malloc does.
        with self.plan.step(), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            images = self._read_images()  # non-finite steps are handled below
            held = (*self.params.values(), *self.decoders.values())  # a replaced weight array: another graph
            parts, grads = self.graph.run((stage, self._frozen_version, tuple(map(id, held))),
                                          lambda: self._device_step(stage, objective, images), hold=held)
            parts = objective.loss(parts)
        losses = np.array([parts.total, parts.reconstruction, parts.sparsity, parts.signal, parts.pooled])
        if self.replicas > 1:
            grads = allreduce.average(self.decomposition.replica_comm, grads, reduce=self.reduction)
            losses = sum_values(self.decomposition.replica_comm, losses) / self.replicas
        lr = self.optimizer.lr  # the rate of this step (the record reports it, not the next one's)
        finite = bool(np.all(np.isfinite(losses)) and all(_all_finite(g) for g in grads.values()))
        # one allreduce: every rank skips together, and sees the same signs of a dead stage (train.vitals)
        signs = collective.allreduce(self.world, self.vitals.signs(finite, parts.active, float(losses[0])))
        finite = not signs[0]
        if finite:
            self.bad_in_row = 0
            dead = self.vitals.observe(signs, lr, last)
            if dead:
                raise self._dead(stage, *dead)
            params = {"w": self.params[li]} if self.tied else {"w": self.params[li], "w_dec": self.decoders[li]}
            self.optimizer.step(params, grads)
            bad_norms, norm = 0, self.filter_norms[stage]
            if norm is not None:  # per unit: no communication, exact on any split
                for p in params.values():
                    n = filter_norms(p)  # before the projection: what the update made of the filters
                    bad_norms += vitals.bad_norms(n, norm, p.dtype)
                    project_norm(p, norm, n)
            bad = np.array([not all(_all_finite(p) for p in params.values()), bad_norms], dtype=np.int64)
            bad = collective.allreduce(self.world, bad)
            if bad[0]:
                raise agreed(RuntimeError(f"training stopped: the update of stage {stage} step {self.stage_step} made the "
                                   "weights non-finite (learning rate too large?); nothing was saved after it; "
                                   + self._last_saved()))
            if bad[1]:
                raise self._dead(stage, *vitals.norm_problem(int(bad[1]), norm, self.plan.dtype, lr))
        else:
            self.vitals.reset()
            self.bad_in_row += 1
            self.skipped += 1
            self._say(f"warning: stage {stage} step {self.stage_step}: non-finite loss or gradient, step skipped "
                      f"({self.bad_in_row} in a row, {self.skipped} in all)")
            if self.bad_in_row >= self.max_bad_steps:
                raise agreed(RuntimeError(f"training stopped: {self.bad_in_row} consecutive steps with a non-finite loss or "
                                   f"gradient (stage {stage}, step {self.stage_step}). Check the input (its scale: raw "
                                   "pixels need preprocessing, e.g. data.preprocess = \"standardize\"; NaN pixels), "
                                   f"then the learning rate; {self._last_saved()}"))
        self.position += self.batch * self.replicas
        self.stage_step += 1
        self.step += 1
        dt = time.perf_counter() - t0
        ex = sum(e.seconds for e in self.plan.exchanges()) - ex0
        msgs = sum(e.messages for e in self.plan.exchanges()) - msgs0  # halo messages posted (sends + receives)
        ex, wait, msgs = (float(v) for v in collective.allreduce(self.world, np.array([ex, self._read_wait, msgs]),
                                                                  MPI.MAX))
        return {"step": self.step, "stage": stage, "stage_step": self.stage_step, "loss": float(losses[0]),
                "reconstruction": float(losses[1]), "sparsity": float(losses[2]),
                "recon_rel": float(losses[1] / losses[3]) if losses[3] > 0 else float("nan"),
                "pooled": float(losses[4]), "skipped": not finite,
                "seconds": dt, "exchange_seconds": ex, "read_wait_seconds": wait, "halo_messages": int(msgs),
                "images_per_s": self.batch * self.replicas / dt,
                "lr": lr}

    # -- stages -------------------------------------------------------------------
    def _begin_stage(self, stage: int) -> None:
        if not 0 <= stage < len(self.network.stages):
            raise ValueError(f"stage must be in [0, {len(self.network.stages)}), got {stage!r}")
        if stage != self._frozen_stage:  # the frozen weights' halos are fetched again (NetworkPlan.weight_halo)
            self._frozen_version, self._frozen_stage = self._frozen_version + 1, stage
        if self.optimizer is None or stage != self.stage:
            self.optimizer = copy.deepcopy(self.template)
            self.optimizer.comm = self.decomposition.grid.comm
            if stage != self.stage:
                self.stage_step = 0
            self.stage = stage

    def train_stage(self, stage: int, steps: int | None = None, *, epochs: float | None = None) -> list[dict[str, Any]]:
        """Train ``stage`` for ``steps`` more steps, or ``epochs`` passes over the data
        (the stages below it are frozen)."""
        agree(self.world, stage=stage, steps=steps, epochs=epochs)
        if (steps is None) == (epochs is None):
            raise ValueError("give exactly one of steps= and epochs=")
        if steps is not None and (not isinstance(steps, (int, np.integer)) or isinstance(steps, bool) or steps < 0):
            raise ValueError(f"steps must be an integer >= 0, got {steps!r}")
        if epochs is not None and not (isinstance(epochs, (int, float)) and not isinstance(epochs, bool) and epochs >= 0):
            raise ValueError(f"epochs must be a number >= 0, got {epochs!r}")
        if epochs is not None:
            if not hasattr(self.data, "__len__"):
                raise ValueError("epochs= needs a data source with a length (len(data)); give steps= instead")
            steps = int(np.ceil(float(epochs) * len(self.data) / (self.batch * self.replicas)))
        self._begin_stage(stage)
        self.optimizer.comm = self.decomposition.grid.comm  # also for an optimizer swapped in by the user
        self._check_rates(stage, self.optimizer.schedule, self.optimizer.t, int(steps))
        objective = StageObjective(self.plan, stage, self.lam, self.tied)
        records: list[dict[str, Any]] = []
        window: list[dict[str, Any]] = []  # the steps since the last report
        self.steplog.begin(stage, self.stage_step, self.stage_step + int(steps))
        self.vitals.begin(stage)
        try:
            for _ in range(int(steps)):
                rec = self._train_step(stage, objective, last=_ == int(steps) - 1)
                records.append(rec)
                self.history.append(rec)
                window.append(rec)
                last = _ == int(steps) - 1  # this call's last step: the stage's filter diagnostics
                if last:
                    rec.update(self._finish_stage(stage), filter_stats=True)
                if self.log_every and (self.stage_step % self.log_every == 0 or last
                                       or self.stage_step == 1):  # a stage's first loss, to compare with
                    self.steplog.add_means(rec, window)
                    li = self.filter_layers[stage]
                    if not last:  # (the diagnostics above hold these)
                        rec.update(monitor.log_stats(self.plan, self.params[li], self._initial(stage)))
                    if not self.tied:  # the decoder may grow where the encoder shrinks: watch both
                        rec["decoder_median_norm"] = monitor.median_norm(self.plan, self.decoders[li])
                    window = []
                    self.steplog.report(rec)
                else:
                    self.steplog.progress(rec)
                if self.checkpoint_dir and self.checkpoint_every and self.step % self.checkpoint_every == 0:
                    if self.bad_in_row:
                        self._say(f"checkpoint at step {self.step} skipped: the last step was not finite")
                    elif self.vitals.suspect:  # never a checkpoint of what may be a dead state
                        self._say(f"checkpoint at step {self.step} skipped: {self.vitals.suspect}")
                    else:
                        self.save()
                self._check_stop()
        finally:  # a stop on request, an error: the bar is cleared either way
            self.steplog.end()
        return records

    def _initial(self, stage: int) -> Any:
        if self._w0 is None or self._w0[0] != stage:
            self._w0 = (stage, monitor.initial_weights(self.plan, self.filter_layers[stage], self.seed,
                                                        self.filter_norms[stage]))
        return self._w0[1]

    def _finish_stage(self, stage: int) -> dict[str, float]:
        """The end-of-stage filter diagnostics: logged, kept in ``stage_stats`` and returned (for the metrics)."""
        li = self.filter_layers[stage]
        st = monitor.stage_stats(self.plan, li, self.params[li], self._initial(stage))
        self.stage_stats[stage] = st
        gabor = (f", Gabor-like {st['gabor_fraction']:.2f} (oriented {st['oriented_fraction']:.2f}; random weights "
                 f"{st['random_gabor_fraction']:.2f})" if "gabor_fraction" in st else "")
        self._say(f"stage {stage} filters: median cosine to init {st['cosine_to_init']:.3f}, median norm "
                  f"{st['median_norm']:.3g}{gabor}")
        return st

    def _check_stop(self) -> None:
        if self.should_stop is None:
            return
        # one agreed decision: a signal may reach some ranks only, or at different times
        if not self.world.allreduce(int(bool(self.should_stop())), op=MPI.MAX):
            return
        saved = None
        if self.checkpoint_dir:
            saved = self.latest_checkpoint() if self._saved_step == self.step else self.save()
        raise TrainingInterrupted(self.step, saved)

    def _dead(self, stage: int, why: str, likely: str) -> RuntimeError:
        """The error of a stage that stopped learning (the same on every rank): what, where, the likely
        setting, and the checkpoint that is intact (none is written of the dead state)."""
        return agreed(RuntimeError(f"training stopped at step {self.stage_step + 1} of stage {stage} (global step "
                                   f"{self.step + 1}): {why}. Likely: {likely}. No checkpoint was written of this "
                                   f"state; {self._last_saved()}"))

    @staticmethod
    def _check_rates(stage: int, schedule: Any, first: int, steps: int) -> None:
        """Refuse a stage whose next ``steps`` steps from schedule step ``first`` would not all train
        (every rank holds the same schedule and steps, agreed: the same error on each)."""
        zero = schedules.zero_error(schedule, first, first + steps)
        if zero:
            raise agreed(ValueError(f"stage {stage} would train at learning rate 0: {zero}"))

    def _last_saved(self) -> str:
        last = self.latest_checkpoint()
        return f"the last checkpoint, {last}, is intact" if last else "no checkpoint had been written yet"

    def latest_checkpoint(self) -> Path | None:
        return checkpoint.latest(self.checkpoint_dir) if self.checkpoint_dir else None

    def train(self, steps_per_stage: Sequence[int]) -> None:
        """Train every stage from the current one on; a resumed run finishes the current stage first."""
        agree(self.world, steps_per_stage=[int(v) for v in steps_per_stage])
        if len(steps_per_stage) != len(self.network.stages):
            raise ValueError(f"steps_per_stage needs {len(self.network.stages)} entries, got {len(steps_per_stage)}")
        for k in range(self.stage, len(self.network.stages)):  # every stage's rates, before any trains
            now = k == self.stage and self.optimizer is not None
            self._check_rates(k, (self.optimizer if now else self.template).schedule, self.optimizer.t if now else 0,
                              max(0, int(steps_per_stage[k]) - (self.stage_step if now else 0)))
        for k in range(self.stage, len(self.network.stages)):
            done = self.stage_step if k == self.stage and self.optimizer is not None else 0
            if done > int(steps_per_stage[k]) and k + 1 < len(self.network.stages):
                self._say(f"stage {k} has trained {done} steps, more than the {int(steps_per_stage[k])} asked: it is "
                          f"finished as it is, and stage {k + 1} starts with its learning-rate schedule from step 0")
            self.train_stage(k, max(0, int(steps_per_stage[k]) - done))
        if self.checkpoint_dir and self._saved_step != self.step:
            self.save()

    # -- checkpoints ----------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """What a checkpoint records besides the state: the run's settings and what its input is."""
        return {"network": self.network.describe(), "seed": self.seed, "lam": self.lam,
                "filter_norm": self.filter_norms, "tied": self.tied, "batch": self.batch, "replicas": self.replicas,
                "grid": list(self.decomposition.grid.dims), "dtype": self.plan.dtype.name,
                "data": {"kind": type(self.data).__name__, "seed": getattr(self.data, "seed", None),
                         # what the network's input is: part of the model (resume and evaluation check it)
                         "input_lcn": self.data.describe() if isinstance(self.data, InputLCN) else None}}

    def save(self) -> Path:
        """Write a checkpoint of everything needed to continue (collective)."""
        if not self.checkpoint_dir:
            raise ValueError("no checkpoint_dir was given to the trainer")
        path = self.state.to_checkpoint(self.checkpoint_dir, self.world, self.plan, self.settings(),
                                        writer=self.decomposition.replica == 0, keep=self.keep)
        self._saved_step = self.step
        self._say(f"checkpoint {path}")
        return path

    @classmethod
    def resume(cls, path: str, data: Any, optimizer: Optimizer | None = None, *, comm: MPI.Comm,
               batch: int | None = None, replicas: int | None = None, grid: Sequence[int] | None = None,
               lam: float | None = None, filter_norm: Any = None, changes_from: str = "given",
               **kw) -> "GreedyTrainer":
        """A trainer continuing from checkpoint ``path`` (a ``ckpt-*`` folder, or a folder of them:
        the latest written), on any number of ranks and grid.

        On as many ranks as it was saved from, the saved replicas and grid are reused
        (and the run continues bitwise-identically); otherwise ``replicas`` defaults to
        the ranks over the grid's size when ``grid`` is given, else to the saved number
        when it divides the ranks, else 1; ``batch`` to keeping the saved global batch.

        The weights, the position and the optimizer's step count and slots always come
        from the checkpoint.  ``optimizer`` (its kind must be the saved one), ``lam`` and
        ``filter_norm`` apply from here on when given (None: the saved ones); each
        setting that differs from the checkpoint's is logged once, as
        ``train.optimizer.lr: 0.01 (checkpoint) -> 0.005 (given)`` (``changes_from``
        names the source).  A finished stage's filter norm cannot change.
        """
        agree(comm, path=str(path), batch=batch, replicas=replicas, grid=None if grid is None else list(grid))
        p, skipped = resume.find_checkpoint(Path(path), comm)
        meta, err = None, None
        try:
            meta = checkpoint.read_index(p, META_KEYS)["meta"]
        except ValueError as e:
            err = str(e)
        raise_collectively(comm, err)
        batch, replicas, grid = resume.choose_decomposition(meta, comm, batch, replicas, grid)
        raise_collectively(comm, resume.template_error(meta, optimizer))
        saved_opt, err = resume.saved_optimizer(meta, optimizer)
        raise_collectively(comm, err)
        network = Network.from_description(meta["network"])
        saved_norms = meta.get("filter_norm") or [None] * len(network.stages)
        norms, err = (saved_norms, None) if filter_norm is None else stage_norms(filter_norm, network)
        raise_collectively(comm, err or resume.filter_norm_error(saved_norms, norms, meta["stage"]))
        kw.setdefault("checkpoint_dir", str(p.parent))
        kw["overwrite"] = True  # the same run, continued
        tr = cls(network, data, optimizer or saved_opt, comm=comm, batch=batch, replicas=replicas, grid=grid,
                 lam=meta["lam"] if lam is None else lam, tied=meta["tied"], seed=meta["seed"], filter_norm=norms,
                 dtype=np.dtype(meta["dtype"]), **kw)
        tr.state = TrainState.from_checkpoint(p, meta, comm, tr.plan, tr.xp, tr.template, tr.tied)
        if tr.optimizer is not None:
            tr.optimizer.comm = tr.decomposition.grid.comm
        tr._saved_step = tr.step
        saved_seed = meta.get("data", {}).get("seed")
        if saved_seed is not None and getattr(data, "seed", saved_seed) != saved_seed:
            tr._say(f"note: the data source's seed {getattr(data, 'seed')} differs from the saved {saved_seed}: "
                    "the image stream will not continue as before")
        for line in skipped:
            tr._say(f"warning: checkpoint {line}")
        tr._say(f"resumed from {p}: stage {tr.stage}, step {tr.stage_step} of the stage, global step {tr.step}")
        for line in resume.changes(resume.settings_of(saved_opt, meta["lam"], saved_norms),
                                   resume.settings_of(tr.template if saved_opt else None, tr.lam, tr.filter_norms),
                                   changes_from):
            tr._say(f"  {line}")
        return tr


def _all_finite(a: Any) -> bool:
    """No inf or NaN in ``a``.  Host arrays are checked a cache-sized piece at a time: a weight-sized
    mask each step would cost page faults (device arrays: one reduction, CuPy keeps its memory)."""
    xp = backend.array_module(a)
    if xp is not np:
        return bool(xp.isfinite(a).all())
    flat = a.reshape(-1)
    step = 1 << 16
    return all(bool(np.isfinite(flat[i:i + step]).all()) for i in range(0, flat.size, step))
