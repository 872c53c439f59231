"""The voxelize launchers' options: the CSR threshold of ``mode="auto"`` and the frozen ``Tuning``."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CSR_MAX_POINTS_PER_SAMPLE", "MODES", "Tuning", "DEFAULT"]

# Hard voxelization of samples below this many points on average takes the CSR mode (``mode=
# "auto"``): scan-sized clouds (V1-V3, a batch of 8 scans) are faster that way; bigger ones keep
# the ranked lists, whose rows kernel has no merge loop for dense voxels (benchmarks/NOTES.md)
CSR_MAX_POINTS_PER_SAMPLE = 2_000_000
MODES = ("auto", "csr", "lists")


@dataclass(frozen=True)
class Tuning:
    """Launch parameters and test hooks of the launchers; the defaults are the product's.

    Tests pass tiny blocks (so a few hundred points span many blocks) and the hooks, which force
    paths that the interpreter's in-order blocks never take; ``benchmarks/bench_voxelize.py``
    sweeps the launch parameters. None of them changes the output.
    """

    # main kernel (points per program = the scan granularity, warps), below / from ``big_n``
    # points; (1024, 16) measured fastest hard and dynamic on V1 and V2 (benchmarks/NOTES.md)
    hard_main: tuple = ((1024, 16), (1024, 16))
    dynamic_main: tuple = ((1024, 16), (1024, 16))
    big_n: int = 400_000
    lookback: int = 128  # descriptors read per look-back / wait step
    scatter_block: int = 1024  # CSR scatter kernel: points per program
    rows: tuple = (16, 4)  # rows kernel: (output rows per program, warps)
    # tests only: lay the CSR segments out in reverse arrival order (every chunk of the rows kernel merges)
    reverse_segments: bool = False
    seen: bool = True  # tests only: False makes the lists ignore earlier blocks' entries (every collision cascades)
    key64: bool = False  # tests only: sort int64 keys in the lists mode even where int32 ones fit
    publish_inclusive: bool = True  # tests only: False makes blocks publish aggregates only (look-backs walk further)

    def main(self, n: int, hard: bool) -> tuple[int, int]:
        small, big = self.hard_main if hard else self.dynamic_main
        return big if n >= self.big_n else small


DEFAULT = Tuning()
