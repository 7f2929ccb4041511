"""What the trainer says about its steps: rank 0's log lines, the progress line and ``metrics.jsonl``."""
from __future__ import annotations

import json
import math
import sys
from typing import Any

import numpy as np

from ..io.atomic import append_text
from ..progress import Progress

#: Loss terms averaged over the steps since the last log line (one minibatch is noisy).
MEAN_KEYS = ("loss", "reconstruction", "sparsity", "recon_rel", "pooled")


class StepLog:
    """Rank 0 writes (``is_root``); elsewhere every call is silent."""

    def __init__(self, stream: Any, metrics_file: str | None, is_root: bool):
        self.stream, self.metrics_file, self.is_root = stream, metrics_file, is_root
        self.bar = Progress(0, "", stream=stream, enabled=False)  # the stage under way (a bar on a terminal)

    def say(self, msg: str) -> None:
        if self.is_root:
            self.bar.write(msg)  # to this log's stream, the bar (if any) cleared and redrawn

    def begin(self, stage: int, done: int, total: int) -> None:
        """A stage's steps ``done``..``total`` start: a bar on a terminal (elsewhere the log lines say it)."""
        self.bar.close()
        # no plain lines of its own (every = inf): off a terminal the log lines carry step/total and ETA
        self.bar = Progress(total, f"stage {stage}", "steps", self.stream, every=math.inf, start=done,
                            enabled=self.is_root)

    def end(self) -> None:
        self.bar.close()

    def progress(self, rec: dict[str, Any]) -> None:
        """A step not logged: the bar moves (terminals only)."""
        self.bar.update(rec["stage_step"], loss=f"{rec['loss']:.4g}")

    @staticmethod
    def add_means(rec: dict[str, Any], window: list[dict[str, Any]]) -> None:
        """``<key>_mean`` over the finite steps of ``window`` (the steps since the last log line)."""
        good = [r for r in window if not r["skipped"]] or window
        for key in MEAN_KEYS:
            rec[f"{key}_mean"] = float(np.mean([r[key] for r in good]))
        rec["mean_over"] = len(good)

    def report(self, rec: dict[str, Any]) -> None:
        """The log line of a step, and its metrics record."""
        wait = rec.get("read_wait_seconds", 0.0)
        comp = max(rec["seconds"] - rec["exchange_seconds"] - wait, 0.0)
        mean = f", mean of {rec['mean_over']} steps {rec['loss_mean']:.5g}" if rec.get("mean_over", 1) > 1 else ""
        self.bar.update(rec["stage_step"], loss=f"{rec['loss']:.4g}")
        of = f"/{self.bar.total}" if self.bar.total else ""
        self.say(f"stage {rec['stage']} step {rec['stage_step']}{of} (global {rec['step']}): loss {rec['loss']:.5g} "
                 f"(reconstruction {rec['reconstruction']:.5g}, sparsity {rec['sparsity']:.5g}{mean}); "
                 f"{rec['images_per_s']:.1f} images/s; compute {comp * 1e3:.1f} ms, exchange "
                 f"{rec['exchange_seconds'] * 1e3:.1f} ms, read wait {wait * 1e3:.1f} ms; lr {rec['lr']:.3g}"
                 + (f"; {self.bar.eta()}" if self.bar.total else ""))
        self.write(rec)

    def write(self, rec: dict[str, Any]) -> None:
        if self.metrics_file and self.is_root:
            try:
                append_text(self.metrics_file, json.dumps(rec) + "\n")
            except OSError as e:  # rank 0 alone: warn and stop writing rather than leave the others waiting
                print(f"warning: {e}; metrics are no longer written", file=sys.stderr, flush=True)
                self.metrics_file = None
