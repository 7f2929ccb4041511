"""Signs that training has stopped being training, watched at every step for next to nothing.

A run can go on to its end, exit 0 and report success while learning nothing: a learning rate
of 1e30 once left every filter at norm 0 after one step (the fixed-norm projection divided by
an overflowed norm), and the loss stayed constant from then on.  Three signs stop the trainer
(exit 1, a message naming the step, the stage and the likely setting), each exact, with no
threshold that a slow but healthy run could cross:

- **filters** (checked after every update, where the constraint fixes the norm): a unit's norm
  before the projection is not finite, zero, or above ``fixed / eps`` of the weights' dtype.
  Past that the filter before the step is below the rounding of the update: every step replaces
  the filters instead of changing them.
- **silence**: every unit of the stage is zero, or the same for every image of the batch,
  for :data:`DEAD_STEPS` steps in a row: the stage's input carries nothing it can learn from.
- **a frozen loss**: the same loss, to the weights' precision (a change of at most eps of their
  dtype, relative), for :data:`DEAD_STEPS` steps in a row at a positive learning rate: the
  weights no longer change (updates below their rounding, or a zero gradient).  Not bit for
  bit: the fixed-norm projection rounds the weights anew at every step, so the loss of a frozen
  float32 stage still moves by about 1e-8 of itself.

The last two need a run of steps: a stage that ends sooner is judged on its last
:data:`MIN_DEAD_STEPS` or more.  Every verdict is reduced across the ranks in the allreduce the
trainer makes anyway (the finiteness check), so all ranks stop together, at the same step.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import backend

#: Steps in a row of silence or of one loss after which a stage is dead.
DEAD_STEPS = 10
#: At the last step of a shorter stage: this many suffice.
MIN_DEAD_STEPS = 3
#: Units looked at first: one that varies settles the question without a pass over the rest.
_FIRST_UNITS = 64


def active(h: Any) -> bool:
    """Whether some unit of ``h`` (..., N: the batch last) varies over the batch, or, with one
    image, is non-zero.  Cheap when the answer is yes, as it is in a healthy run: the first units
    are looked at first (a pass over all of ``h`` only when they are all silent)."""
    if h.size == 0:
        return False
    n = h.shape[-1]
    xp = backend.array_module(h)
    units = h.reshape(-1, n) if h.flags.c_contiguous else None
    first = units[:_FIRST_UNITS] if units is not None else h[(0,) * (h.ndim - 2)]
    return any(bool(_varies(xp, part, n)) for part in (first, h))


def active_array(h: Any) -> Any:
    """:func:`active` as a 0-d array of ``h``'s library, read by nobody yet: one pass over all of
    ``h`` (no early answer), for device work that must not wait for the host (a captured graph)."""
    xp = backend.array_module(h)
    return xp.zeros((), bool) if h.size == 0 else _varies(xp, h, h.shape[-1])  # (no upload: capturable)


def _varies(xp: Any, part: Any, n: int) -> Any:
    """Whether some unit of ``part`` varies over the batch (one image: is non-zero), as a 0-d array."""
    return xp.any(part != 0) if n == 1 else xp.any(part != part[..., :1])


def norm_limit(norm: float, dtype: Any) -> float:
    """The largest norm a unit may have before the projection back to ``norm``: beyond
    ``norm / eps`` its filter before the step is lost in the rounding of the update."""
    return float(norm) / float(np.finfo(dtype).eps)


def norm_problem(count: int, norm: float, dtype: Any, lr: float) -> tuple[str, str]:
    """(why, the likely cause) when ``count`` units failed :func:`bad_norms`."""
    return (f"the update left {count} filter(s) with a norm (before the projection back to {norm:.3g}) that is not "
            f"finite, zero, or above {norm_limit(norm, dtype):.3g}, where the filter before the step is lost in the "
            "update's rounding: every step would replace the filters, not change them",
            f"the learning rate is far too large (train.optimizer.lr; this step's rate {lr:.3g})")


def bad_norms(n: Any, norm: float, dtype: Any) -> int:
    """How many of the units' norms ``n`` (before the projection to ``norm``) are not finite,
    zero or above :func:`norm_limit`."""
    xp = backend.array_module(n)
    with np.errstate(invalid="ignore"):
        ok = xp.isfinite(n) & (n > 0) & (n <= norm_limit(norm, dtype))
    return int(ok.size - int(xp.count_nonzero(ok)))


class Vitals:
    """The streaks of silent steps and of steps with an unchanged loss, of the stage under way.

    Each step: :meth:`signs` gives this rank's verdicts as numbers to sum over the ranks (with
    the finiteness check), :meth:`observe` reads the sums; the streaks are then the same on
    every rank.
    """

    def __init__(self, dtype: Any = np.float32) -> None:
        self.stage: int | None = None
        self.eps = float(np.finfo(dtype).eps)  # a loss that moves less has not changed
        self.reset()

    def reset(self) -> None:
        """No evidence (a new stage, or a step skipped as non-finite)."""
        self.silent = 0  # steps in a row with every unit silent
        self.same = 0  # steps in a row whose loss was the previous step's, at a positive rate
        self.loss: float | None = None

    def begin(self, stage: int) -> None:
        if stage != self.stage:
            self.stage = stage
            self.reset()

    def signs(self, finite: bool, active_units: bool, loss: float) -> np.ndarray:
        """This rank's verdicts, to be summed over the ranks: (not finite, some unit active,
        the loss changed beyond the weights' precision)."""
        changed = self.loss is None or not abs(loss - self.loss) <= self.eps * abs(loss)
        self.loss = loss
        return np.array([not finite, bool(active_units), changed], dtype=np.int64)

    def observe(self, sums: np.ndarray, lr: float, last: bool) -> tuple[str, str] | None:
        """Read the summed verdicts of a finite step: (why the stage is dead, the likely cause), or None.

        ``lr`` is the step's learning rate (a frozen loss at rate 0 is no evidence), ``last``
        whether the stage (this call of it) ends with this step.
        """
        self.silent = self.silent + 1 if sums[1] == 0 else 0
        self.same = self.same + 1 if sums[2] == 0 and lr > 0 else 0
        need = MIN_DEAD_STEPS if last else DEAD_STEPS
        if self.silent >= need:
            why = (f"every unit of the stage was silent (zero, or the same for every image of the batch) for the "
                   f"last {self.silent} steps: its input carries nothing to learn from")
            if self.stage == 0:
                return why, ("the images are constant or all alike (the data file; data.preprocess makes a constant "
                             "image 0)")
            return why, (f"the stages below give stage {self.stage} a constant input (how they trained: the log, "
                         "train.optimizer.lr, train.filter_norm), or the images are constant or all alike")
        if self.same + 1 >= need:
            return (f"the loss stayed at {self.loss:.9g} (to the weights' precision) for the last {self.same + 1} "
                    "steps at a positive "
                    f"learning rate: the weights no longer change (updates below their rounding, or a zero gradient)",
                    f"the learning rate is too small (train.optimizer.lr; this step's rate {lr:.3g})")
        return None

    @property
    def suspect(self) -> str | None:
        """Why the state may be dead already (then no checkpoint is written of it), or None."""
        if self.silent:
            return f"every unit was silent for the last {self.silent} step(s)"
        if self.same:
            return f"the loss has not changed for {self.same + 1} steps"
        return None
