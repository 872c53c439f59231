"""The voxelizer's dense-voxel cost: V1 (SCAN, PointPillars grid, ``pad_to_max``, graph replay) plus K
points at one location inside the range (10, 0, 0): a voxel of K points, as zero padding or a sentinel
value inside the range gives. The default CSR mode's rows kernel walks that voxel's segment c / 32
chunks in one program; the ranked lists (``mode="lists"``) do not. Every row says whether its output
equals the lists'. ``--out DIR`` writes ``voxelize_dense.json``.

Measured figures: ``benchmarks/NOTES.md`` (``pcops.voxelize``'s docstring quotes them).
"""

import torch

from bench_voxelize import V1
from common import bench, load_scan, parse_args, report, row

import pcops


def main():
    args = parse_args(__doc__)
    scan, source = load_scan()
    rows = []
    for k in (0, 10_000, 100_000, 1_000_000):
        pts = torch.cat([scan, torch.tensor([[10.0, 0.0, 0.0, 0.5]]).repeat(k, 1)]).cuda()
        outs = {}
        for label, mode in (("lists", "lists"), ("csr (default)", "auto")):
            fn = lambda: pcops.voxelize(pts, **V1, pad_to_max=True, mode=mode)  # noqa: E731
            t = bench(fn, warmup=3, rep=10 if args.quick else 30, graph=True)
            outs[label] = fn()
            same = all(torch.equal(a, b) for a, b in zip(outs[label], outs["lists"]))
            rows.append(row(f"V1 + {k:,} points in one voxel", label, t, items=pts.shape[0], identical_to_lists=same))
    report(rows, "voxelize_dense", args.out, notes={"scan": source})


if __name__ == "__main__":
    main()
