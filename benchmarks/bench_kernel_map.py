"""S1: sparse-conv index generation on the unique voxels of V3 (SCAN, voxel (0.05, 0.05, 0.1) m,
range [0, -40, -3, 70.4, 40, 1], grid (D, H, W) = (40, 1600, 1408)).

Maps: submanifold 3×3×3, and regular 3×3×3 stride 2 padding 1 (output coords + kernel map);
each figure is the whole map (coords → out_coords, out-in table and pairs), host syncs included.
Baseline: the plain-torch reference (sort + searchsorted per offset, torch.unique for the output
set) run on the GPU in the same process. Peers: spconv's CUDA wheels are not installed here.
The voxels are computed here in plain torch (floor + unique), independent of pcops.voxelize.
Floor: launches (≈ 7-12 µs of host time each) dominate; the bytes (coords in, 4.8 MB of out_in
out for subm) take ≈ 1-2 µs at 4.3 TB/s.
"""
import torch

from common import bench, gpu_activities, load_scan, parse_args, report, row

import pcops
from pcops.reference import kernel_map as ref

VOXEL = (0.05, 0.05, 0.1)
LOW = (0.0, -40.0, -3.0)
GRID_XYZ = (1408, 1600, 40)
SHAPE = (40, 1600, 1408)  # (D, H, W) = (z, y, x)
DEVICE = "cuda"


def s1_coords(points: torch.Tensor) -> torch.Tensor:
    """Unique V3 voxels as ``(N, 4)`` int32 ``(0, z, y, x)``, sorted lexicographically."""
    idx = ((points[:, :3] - torch.tensor(LOW, device=points.device)) / torch.tensor(VOXEL, device=points.device)).floor().long()
    keep = ((idx >= 0) & (idx < torch.tensor(GRID_XYZ, device=points.device))).all(1)
    idx = torch.unique(idx[keep][:, [2, 1, 0]], dim=0)
    return torch.cat([torch.zeros_like(idx[:, :1]), idx], 1).int()


def main():
    args = parse_args(__doc__)
    rep = 30 if args.quick else 100
    points, source = load_scan()
    coords = s1_coords(points.to(DEVICE))
    n = coords.shape[0]
    rows, notes = [], {"scan": source, "voxels": n, "spatial_shape": SHAPE, "peers_unavailable": ["spconv", "torchsparse"]}
    maps = {
        "S1 subm 3x3x3": dict(kernel_size=3, subm=True),
        "S1 3x3x3 s2 p1": dict(kernel_size=3, stride=2, padding=1),
    }
    from pcops.kernel_map import _output_shape
    from pcops.triton import kernel_map as tri

    for wl, kw in maps.items():
        stride, padding = kw.get("stride", 1), kw.get("padding", 0)
        subm = kw.get("subm", False)
        out_shape = _output_shape(SHAPE, (3,) * 3, (stride,) * 3, (padding,) * 3, (1,) * 3, subm, False)
        pad = (1, 1, 1) if subm else (padding,) * 3
        ref_args = (coords, SHAPE, out_shape, (3, 3, 3), (stride,) * 3, pad, (1, 1, 1), subm, False)
        base = bench(lambda: ref.sparse_conv_kernel_map(*ref_args), rep=rep)
        rows.append(row(wl, "torch sort+searchsorted (reference)", base, items=n, unit="voxels/s", baseline=base))
        fn = lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, **kw)
        t = bench(fn, rep=rep)
        km = fn()
        rows.append(row(wl, "pcops triton (public op)", t, items=n, unit="voxels/s", baseline=base,
                        launches=gpu_activities(fn), outputs=km.out_coords.shape[0], pairs=km.pair_in.numel()))
        t = bench(lambda: tri.sparse_conv_kernel_map(*ref_args), rep=rep)
        rows.append(row(wl, "pcops triton launcher (no dispatch)", t, items=n, unit="voxels/s", baseline=base))
        # exactness in the same run
        expected = ref.sparse_conv_kernel_map(*ref_args)
        notes[f"{wl} equal to reference"] = all(torch.equal(a, b) for a, b in zip(km[:1] + km[2:], expected))

    # the plain-torch convolution on the subm map (16 → 16 channels), forward
    km = pcops.sparse_conv_kernel_map(coords, SHAPE, 3, subm=True)
    f = torch.randn(n, 16, device=DEVICE)
    w = torch.randn(27, 16, 16, device=DEVICE)
    t = bench(lambda: pcops.sparse_conv3d(f, km, w), rep=rep)
    rows.append(row("S1 subm conv 16->16", "pcops sparse_conv3d (plain torch)", t, items=n, unit="voxels/s"))
    report(rows, "kernel_map", args.out, notes=notes)


if __name__ == "__main__":
    main()
