"""The run planner: per-rank memory, FLOPs, halo traffic and predicted step time of a training
step, without MPI or a GPU (``cotsdl plan``; ``cotsdl bench scaling`` prints its prediction).

- :mod:`.machine` -- machine descriptions (format, presets, loader, the op-time model);
- :mod:`.model` -- per-layer counts on every rank, the operations of a step, memory;
- :mod:`.predict` -- step time on a machine, memory fit, the best grid for P ranks;
- :mod:`.overlap` -- ``parallel.overlap = "auto"``: overlap where the model predicts a gain;
- :mod:`.reduction` -- ``parallel.reduction``: the replicas' gradient sum, flat or two-level.
"""
from .machine import PRESETS, MachineError, load_machine, validate_machine
from .model import layer_counts
from .overlap import OverlapChoice, choose_overlap
from .predict import fit_error, predict_step, smallest_fit, suggest

__all__ = ["PRESETS", "MachineError", "load_machine", "validate_machine", "layer_counts",
           "predict_step", "fit_error", "smallest_fit", "suggest", "OverlapChoice", "choose_overlap"]
