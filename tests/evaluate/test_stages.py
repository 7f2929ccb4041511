"""evaluate.stages: silent fractions on any grid rule, and recon_rel from the training log."""
import math

import numpy as np
from mpi4py import MPI

from cotsdl.evaluate import responses, stages


def test_recon_rel_pooled_and_decoder_norm_from_the_training_log():
    records = [{"stage": 0, "stage_step": 1, "recon_rel": 0.9, "pooled": 2.0, "decoder_median_norm": 0.1},
               {"stage": 0, "stage_step": 100, "recon_rel": 0.3, "recon_rel_mean": 0.35, "pooled": 1.0,
                "pooled_mean": 1.2, "decoder_median_norm": 0.1},
               {"stage": 1, "stage_step": 5, "recon_rel": 0.5, "pooled": 0.4},  # resumed: its first step not logged
               {"stage": 2, "stage_step": 1, "loss": 1.0}]       # an old log without recon_rel
    rows = [{"stage": 0}, {"stage": 1}, {"stage": 2}]
    stages.add_training_log(rows, records)
    assert (rows[0]["recon_rel"], rows[0]["random_recon_rel"]) == (0.35, 0.9)
    assert (rows[0]["pooled"], rows[0]["random_pooled"], rows[0]["decoder_median_norm"]) == (1.2, 2.0, 0.1)
    assert "decoder_median_norm" not in rows[1] and rows[1]["pooled"] == 0.4
    assert rows[1]["recon_rel"] == 0.5 and math.isnan(rows[1]["random_recon_rel"])
    assert math.isnan(rows[2]["recon_rel"]) and math.isnan(rows[2]["random_recon_rel"])


def test_silent_fraction_counts_units_whose_peak_is_tiny():
    info = responses.LayerInfo(0, "filter", 0, (2, 2, 5), 0)  # 20 units
    R = np.random.default_rng(0).uniform(1, 2, (30, 20))
    R[:, [3, 7]] *= 1e-3   # two quiet units
    R[:, 11] = 0.0         # one dead unit
    (frac,) = stages.silent_fractions(R, np.arange(20), [info], MPI.COMM_SELF)
    assert frac == 3 / 20
