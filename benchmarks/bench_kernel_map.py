"""S1: sparse-conv index generation on the unique voxels of V3 (SCAN, voxel (0.05, 0.05, 0.1) m,
range [0, -40, -3, 70.4, 40, 1], grid (D, H, W) = (40, 1600, 1408)).

Maps: submanifold 3×3×3, and regular 3×3×3 stride 2 padding 1 (output coords + kernel map);
each figure is the whole map (coords → out_coords, out-in table and pairs), host syncs included.
Rows: the public op (eager), the Triton launcher alone (no dispatch / checks), the padded-pairs
form (``pad_pairs=True``), and for the forms with no host sync (submanifold ``pad_pairs``, strided
``static_shapes``) the same call captured in a CUDA graph (replays timed: what a captured backbone
pays).
Every pcops row says what one call runs: kernels and copies (torch profiler), host syncs
(``torch.cuda.set_sync_debug_mode``; through the custom op torch 2.11 reported the default
submanifold map's one sync, one device-to-host copy, twice), the host µs per call with the GPU
not awaited, plus the GPU µs per kernel in the JSON.
Baseline: the plain-torch reference (sort + searchsorted per offset, torch.unique for the output
set) run on the GPU in the same process. Peers: spconv's CUDA wheels are not installed here.
The voxels are computed here in plain torch (floor + unique), independent of pcops.voxelize.
Floor: launches (≈ 7-12 µs of host time each) dominate; the bytes (coords in, 4.8 MB of out_in
out for subm) take ≈ 1-2 µs at 4.3 TB/s.
"""

import warnings

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
    idx = (
        ((points[:, :3] - torch.tensor(LOW, device=points.device)) / torch.tensor(VOXEL, device=points.device))
        .floor()
        .long()
    )
    keep = ((idx >= 0) & (idx < torch.tensor(GRID_XYZ, device=points.device))).all(1)
    idx = torch.unique(idx[keep][:, [2, 1, 0]], dim=0)
    return torch.cat([torch.zeros_like(idx[:, :1]), idx], 1).int()


def host_syncs(fn) -> int:
    """Synchronising torch calls one call of ``fn`` makes (``.item()``, ``.tolist()``, ...)."""
    fn()
    torch.cuda.synchronize()
    prev = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(prev)
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def host_us(fn, calls: int = 50) -> float:
    """Host µs per call, the GPU not waited for between calls (with no host sync in ``fn`` this is
    the pure launch + Python overhead; with one, it includes waiting for the GPU)."""
    import time

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / calls * 1e6


def launches(fn) -> dict:
    """Kernels, copies, host syncs, GPU µs and host µs of one call."""
    act = gpu_activities(fn)
    act["host_syncs"] = host_syncs(fn)
    act["host_us"] = host_us(fn)
    return act


def main():
    args = parse_args(__doc__)
    rep = 30 if args.quick else 100
    points, source = load_scan()
    coords = s1_coords(points.to(DEVICE))
    n = coords.shape[0]
    rows, notes = (
        [],
        {"scan": source, "voxels": n, "spatial_shape": SHAPE, "peers_unavailable": ["spconv", "torchsparse"]},
    )
    maps = {
        "S1 subm 3x3x3": dict(kernel_size=3, subm=True),
        "S1 3x3x3 s2 p1": dict(kernel_size=3, stride=2, padding=1),
    }
    from pcops.kernel_map import _output_shape
    from pcops.triton import kernel_map as tri

    summary = []
    for wl, kw in maps.items():
        stride, padding = kw.get("stride", 1), kw.get("padding", 0)
        subm = kw.get("subm", False)
        out_shape = _output_shape(SHAPE, (3,) * 3, (stride,) * 3, (padding,) * 3, (1,) * 3, subm, False)
        pad = (1, 1, 1) if subm else (padding,) * 3
        ref_args = (coords, SHAPE, out_shape, (3, 3, 3), (stride,) * 3, pad, (1, 1, 1), subm, False)
        base = bench(lambda: ref.sparse_conv_kernel_map(*ref_args), rep=rep)
        rows.append(row(wl, "torch sort+searchsorted (reference)", base, items=n, unit="voxels/s", baseline=base))
        expected = ref.sparse_conv_kernel_map(*ref_args)

        def add(impl, fn, graph=False, check=None):
            t = bench(fn, rep=rep, graph=graph)
            extra = {}
            if not graph:
                extra["launches"] = launches(fn)
                act = extra["launches"]
                summary.append(
                    f"{wl:<16} {impl:<40} kernels {act.get('kernels', '?'):>4}  copies {act.get('copies', '?'):>4}"
                    f"  host syncs {act['host_syncs']}  GPU µs {act.get('gpu_us', float('nan')):.1f}"
                    f"  host µs {act['host_us']:.1f}"
                )
            rows.append(row(wl, impl, t, items=n, unit="voxels/s", baseline=base, **extra))
            if check is not None:
                notes[f"{wl} {impl} equal to reference"] = check

        fn = lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, **kw)
        km = fn()
        add("pcops triton (public op)", fn, check=all(torch.equal(a, b) for a, b in zip(km[:1] + km[2:], expected)))
        rows[-1].update(outputs=km.out_coords.shape[0], pairs=km.pair_in.numel())
        add("pcops triton launcher (no dispatch)", lambda: tri.sparse_conv_kernel_map(*ref_args))
        fp = lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, **kw, pad_pairs=True)
        kp = fp()
        p = int(kp.offsets[-1])
        add(
            "pcops pad_pairs (public op)",
            fp,
            check=all(torch.equal(a, b) for a, b in zip(kp[:1] + kp[3:], expected[:1] + expected[3:]))
            and torch.equal(kp.pair_in[:p], expected[1])
            and torch.equal(kp.pair_out[:p], expected[2]),
        )
        add("pcops launcher pad_pairs", lambda: tri.sparse_conv_kernel_map(*ref_args, pad_pairs=True))
        if subm:
            # no host sync: the whole map replays from a CUDA graph
            add("pcops pad_pairs, CUDA graph", fp, graph=True)
            add(
                "pcops launcher pad_pairs, graph",
                lambda: tri.sparse_conv_kernel_map(*ref_args, pad_pairs=True),
                graph=True,
            )
        else:
            # static_shapes: no host sync for the strided map either (outputs padded to N·J rows)
            fs = lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, **kw, static_shapes=True, batch_size=1)
            ks = fs()
            m, p = expected[0].shape[0], int(ks.offsets[-1])
            ok = (
                torch.equal(ks.out_coords[:m], expected[0])
                and torch.equal(ks.out_in[:m], expected[4])
                and torch.equal(ks.offsets, expected[3])
                and torch.equal(ks.pair_in[:p], expected[1])
                and torch.equal(ks.pair_out[:p], expected[2])
                and bool((ks.out_coords[m:] == -1).all())
            )
            add("pcops static_shapes (public op)", fs, check=ok)
            rows[-1].update(rows_allocated=ks.out_coords.shape[0])
            add("pcops static_shapes, CUDA graph", fs, graph=True)
            add(
                "pcops launcher static_shapes, graph",
                lambda: tri.sparse_conv_kernel_map(*ref_args, static_shapes=True, batch_size=1),
                graph=True,
            )

    # the plain-torch convolution on the subm map (16 → 16 channels), forward
    km = pcops.sparse_conv_kernel_map(coords, SHAPE, 3, subm=True)
    f = torch.randn(n, 16, device=DEVICE)
    w = torch.randn(27, 16, 16, device=DEVICE)
    t = bench(lambda: pcops.sparse_conv3d(f, km, w), rep=rep)
    rows.append(row("S1 subm conv 16->16", "pcops sparse_conv3d (plain torch)", t, items=n, unit="voxels/s"))
    notes["per_call"] = summary
    report(rows, "kernel_map", args.out, notes=notes)
    print("\nper call (torch profiler; host syncs from torch.cuda.set_sync_debug_mode):")
    for line in summary:
        print("  " + line)


if __name__ == "__main__":
    main()
