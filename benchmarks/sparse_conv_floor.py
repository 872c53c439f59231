"""The tensor-core floor of the sparse-conv workloads S2 and S3 (WORKLOADS.md) on the H200.

A convolution on a kernel map with ``P`` (input, output) pairs does ``2 · P · C_in · C_out``
FLOPs and must at least read its inputs once (``N_in · C_in`` features, the ``M × K`` int32 out-in
table, the ``K · C_in · C_out`` weight) and write ``M · C_out`` outputs. Its floor is the larger of
FLOPs / 790 TFLOP/s (dense bf16/fp16 matmul measured on the H200) and bytes / 4.3 TB/s (copy
bandwidth measured there). The counts come from the real kernel maps, built here on the CPU (they
do not depend on the device):

- S3: ``BIG`` (the KITTI scan tiled 10×, each copy jittered by N(0, 0.05 m), seed 0) voxelized
  on the V3 grid with at most 5 points per voxel and no voxel cap; one SubMConv3d 64 → 64.
- S2: the V3 voxels of the scan, OpenPCDet's ``VoxelBackBone8x``: every conv layer's rows, pairs
  and channels, summed (BatchNorm + ReLU fused into the epilogues, kernel-map building excluded).

    PYTHONPATH=. python benchmarks/sparse_conv_floor.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

import pcops
from pcops import nn as pnn

from common import environment, load_scan

FLOPS = 790e12  # bf16/fp16 dense matmul, measured on the H200 (developers' guide)
BYTES_S = 4.3e12  # copy bandwidth, measured there
GRID = dict(voxel_size=(0.05, 0.05, 0.1), point_cloud_range=(0, -40, -3, 70.4, 40, 1), max_points_per_voxel=5)
V3_CAP = 40_000


def layer_floor(n_in: int, m: int, k: int, pairs: int, c_in: int, c_out: int, elem: int = 2) -> dict:
    flops = 2.0 * pairs * c_in * c_out
    nbytes = n_in * c_in * elem + m * c_out * elem + m * k * 4 + k * c_in * c_out * elem
    t = max(flops / FLOPS, nbytes / BYTES_S)
    return dict(rows=m, inputs=n_in, offsets=k, pairs=pairs, c_in=c_in, c_out=c_out, gflop=round(flops / 1e9, 3),
                mbytes=round(nbytes / 1e6, 3), floor_us=round(t * 1e6, 2),
                bound="compute" if flops / FLOPS >= nbytes / BYTES_S else "memory")  # fmt: skip


def big_scan(scan: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    copies = []
    for _ in range(10):
        c = scan.clone()
        c[:, :3] += torch.randn(c.shape[0], 3, generator=g) * 0.05
        copies.append(c)
    return torch.cat(copies)


def s3(scan: torch.Tensor) -> dict:
    pts = big_scan(scan)
    v = pcops.voxelize(pts, **GRID, max_voxels=pts.shape[0])
    n = int(v.coords.shape[0])
    km = pcops.sparse_conv_kernel_map(v.coords, (40, 1600, 1408), 3, subm=True)
    pairs = int((km.out_in >= 0).sum())
    return dict(points=int(pts.shape[0]), voxels=n, subm_64_64_fp16=layer_floor(n, n, 27, pairs, 64, 64))


def s2(scan: torch.Tensor) -> dict:
    from pcops.models.second import VoxelBackBone8x, mean_vfe

    v = pcops.voxelize(scan, **GRID, max_voxels=V3_CAP)
    feats = mean_vfe(v.voxels, v.num_points)
    net = VoxelBackBone8x(4, (1408, 1600, 40)).eval()
    layers = []

    def hook(mod, inputs, out):
        x = inputs[0]
        out_in = mod._map(x)[0]
        k = math.prod(mod.kernel_size)
        pairs = int((out_in >= 0).sum())
        layers.append(layer_floor(x.features.shape[0], out_in.shape[0], k, pairs, mod.in_channels, mod.out_channels))

    for m in net.modules():
        if isinstance(m, pnn.SparseModule) and hasattr(m, "kernel_size"):
            m.register_forward_hook(hook)
    with torch.no_grad():
        net.forward_voxels(feats, v.coords, 1)
    total = sum(r["floor_us"] for r in layers)
    return dict(voxels=int(v.coords.shape[0]), layers=layers, encoder_floor_us=round(total, 2),
                encoder_gflop=round(sum(r["gflop"] for r in layers), 3))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    scan, source = load_scan("000001")
    res = {"benchmark": "sparse_conv_floor", "environment": environment(), "scan": source,
           "assumed_peaks": {"fp16_tflops": FLOPS / 1e12, "copy_tb_s": BYTES_S / 1e12}, "S3": s3(scan), "S2": s2(scan)}  # fmt: skip
    env = res["environment"]
    res.update(device=f"{env['device']} (counts only; peaks of the H200)", torch=env["torch"], date=env["date"][:10],
               commit=env["commit"])  # fmt: skip
    order = ("floor_us", "bound", "gflop", "mbytes", "pairs", "c_in", "c_out", "rows")
    res["rows"] = [{"workload": f"S3 SubMConv3d 64->64 fp16 ({res['S3']['voxels']} voxels)"}]
    res["rows"][0].update({k: res["S3"]["subm_64_64_fp16"][k] for k in order})
    res["rows"] += [
        {"workload": f"S2 layer {i}", **{k: r[k] for k in order}} for i, r in enumerate(res["S2"]["layers"])
    ]
    res["rows"].append({"workload": "S2 encoder, sum", "gflop": res["S2"]["encoder_gflop"],
                        "floor_us": res["S2"]["encoder_floor_us"]})  # fmt: skip
    print(json.dumps({k: v for k, v in res.items() if k not in ("environment", "S2", "S3")}, indent=1))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "sparse_conv_floor.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
