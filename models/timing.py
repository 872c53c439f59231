"""Per-stage timing of the PointPillars pipeline (CUDA events on the GPU, perf_counter on the CPU)."""

from __future__ import annotations

import contextlib
import statistics
import time

import torch

__all__ = ["StageTimer", "null_timer"]


@contextlib.contextmanager
def _nothing():
    yield


def null_timer(name: str):
    """The default stage timer: records nothing."""
    return _nothing()


class StageTimer:
    """Collects per-stage durations over repeated runs; call ``timer(name)`` as a context manager.

    On CUDA each stage is bracketed by two events (no synchronisation until :meth:`summary`), so
    timing does not serialise the pipeline more than a real run would; on the CPU the stage is timed
    with ``time.perf_counter``. :meth:`new_run` starts a repetition; :meth:`summary` returns the median
    (and min/max) in milliseconds of every stage over the recorded runs, plus ``total``.
    """

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.runs: list[list[tuple[str, object, object]]] = []

    def new_run(self) -> None:
        self.runs.append([])

    def reset(self) -> None:
        self.runs = []

    @contextlib.contextmanager
    def __call__(self, name: str):
        if not self.runs:
            self.new_run()
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self.runs[-1].append((name, start, end))

    def _ms(self, start, end) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end)
        return (end - start) * 1e3

    def summary(self) -> dict[str, dict[str, float]]:
        """``{stage: {"median_ms", "min_ms", "max_ms"}}`` in first-seen stage order, plus ``"total"``
        (the sum of the stages of each run, not counting gaps between them)."""
        per_stage: dict[str, list[float]] = {}
        totals = []
        for run in self.runs:
            sums: dict[str, float] = {}
            for name, start, end in run:  # a stage entered twice in one run counts once, summed
                sums[name] = sums.get(name, 0.0) + self._ms(start, end)
            for name, ms in sums.items():
                per_stage.setdefault(name, []).append(ms)
            if sums:
                totals.append(sum(sums.values()))
        out = {k: _stats(v) for k, v in per_stage.items()}
        if totals:
            out["total"] = _stats(totals)
        return out


def _stats(v: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(v), "min_ms": min(v), "max_ms": max(v)}
