"""S2 (WORKLOADS.md): SECOND's middle encoder (OpenPCDet VoxelBackBone8x) on pcops.nn, and one
SubMConv3d 16 → 16, on the V3 voxels of the KITTI scan (mean of their points: 4 channels).

    PYTHONPATH=. python benchmarks/bench_sparse_conv.py [--scan PATH] [--out DIR]   # writes DIR/sparse_conv.json

Eager rows: median CUDA-event time of single calls after warm-up, kernel maps included (a fresh
``SparseConvTensor`` per call, as a detector's forward builds it). Static rows: the fixed-capacity
form (``voxelize(pad_to_max=True)``, ``SparseConvTensor(static=True)``), eager and replayed from
one CUDA graph. Train rows: forward + backward with BatchNorm in training mode (eager, and the
static form's whole step in one CUDA graph, masked BatchNorm); their gradients are checked
bit-identical between two runs. TF32 off on every row but the one that says TF32
(``torch.backends.cuda.matmul.allow_tf32 = False``, spconv's default ``SPCONV_ALLOW_TF32=0``). Peers are not measured here (spconv needs its wheel carried over in
three runs: ``../shared/tools/spconv/README.md``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import pcops
from pcops import nn as pnn

from common import S2_STATIC_CAPACITY, bench, captured_train_step, load_scan, set_sparse_precision
from common import S2_V3 as V3


def timed(fn, warmup=5, rep=50):
    """(median, min, max) ms of single calls (``common.bench``)."""
    r = bench(fn, warmup=warmup, rep=rep)
    return r["median_ms"], r["min_ms"], r["max_ms"]


def main() -> None:
    from pcops.models.second import VoxelBackBone8x, mean_vfe

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scan", default=None, help="a KITTI .bin scan (default: common.load_scan's 000001)")
    p.add_argument("--out", default=None, help="folder for sparse_conv.json (or a .json file path)")
    p.add_argument("--quick", action="store_true", help="accepted for scripts/gpu_check.py (no effect)")
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.scan:
        pts = torch.from_numpy(__import__("numpy").fromfile(a.scan, dtype="float32").reshape(-1, 4)).cuda()
    else:
        pts = load_scan("000001")[0].cuda()
    v = pcops.voxelize(pts, **V3)
    feats, coords = mean_vfe(v.voxels, v.num_points), v.coords
    vp = pcops.voxelize(pts, pad_to_max=True, **V3)  # the static form's input (capture)
    feats_p = mean_vfe(vp.voxels, vp.num_points)
    rows, results = [], {"voxels": int(coords.shape[0])}
    torch.manual_seed(0)
    # static rows: the strided convs keep S2_STATIC_CAPACITY rows (each row records the dropped count: 0)
    net = VoxelBackBone8x(4, (1408, 1600, 40), static_capacity=S2_STATIC_CAPACITY).cuda()
    for dtype in (torch.float32, torch.float16):
        model = net.to(dtype)
        f = feats.to(dtype)

        def fwd():
            with torch.no_grad():
                return model.forward_voxels(f, coords, 1)["encoded_spconv_tensor"].features

        model.eval()
        med, lo, hi = timed(fwd)  # the default eager call: the encoder replays its graph (eager_graph)
        rows.append(dict(row=f"S2 forward eval {str(dtype)[6:]}", ms=med, min=lo, max=hi))
        model.eager_graph = False
        op_by_op = fwd()
        med, lo, hi = timed(fwd)
        model.eager_graph = True
        rows.append(dict(row=f"S2 forward eval {str(dtype)[6:]}, op by op (eager_graph=False)", ms=med, min=lo,
                         max=hi, graph_equals_op_by_op=bool(torch.equal(op_by_op, fwd()))))  # fmt: skip
        fused = pnn.fuse_for_inference(model)  # BN folded, ReLU in the GEMM epilogue

        def fwd_fused():
            with torch.no_grad():
                return fused.forward_voxels(f, coords, 1)["encoded_spconv_tensor"].features

        med, lo, hi = timed(fwd_fused)
        err = float((fwd_fused().float() - fwd().float()).abs().max())
        rows.append(dict(row=f"S2 forward eval {str(dtype)[6:]}, fuse_for_inference", ms=med, min=lo, max=hi,
                         max_abs_diff_vs_unfused=err))  # fmt: skip
        fp = feats_p.to(dtype)

        def fwd_static_out():
            with torch.no_grad():
                return model(pnn.SparseConvTensor(fp, vp.coords, model.sparse_shape, 1, static=True))

        dropped = int(fwd_static_out()["encoded_spconv_tensor"].num_dropped)

        def fwd_static():
            with torch.no_grad():
                t = pnn.SparseConvTensor(fp, vp.coords, model.sparse_shape, 1, static=True)
                return model(t)["encoded_spconv_tensor"].features

        r = bench(fwd_static, graph=True)
        rows.append(dict(row=f"S2 forward eval {str(dtype)[6:]}, static form, CUDA graph", ms=r["median_ms"],
                         min=r["min_ms"], max=r["max_ms"], dropped_voxels=dropped))  # fmt: skip
        med, lo, hi = timed(fwd_static)
        rows.append(dict(row=f"S2 forward eval {str(dtype)[6:]}, static form, eager", ms=med, min=lo, max=hi))

        def fwd_static_fused():
            with torch.no_grad():
                t = pnn.SparseConvTensor(fp, vp.coords, fused.sparse_shape, 1, static=True)
                return fused(t)["encoded_spconv_tensor"].features

        r = bench(fwd_static_fused, graph=True)
        rows.append(dict(row=f"S2 forward eval {str(dtype)[6:]}, static form, fuse_for_inference, CUDA graph",
                         ms=r["median_ms"], min=r["min_ms"], max=r["max_ms"]))  # fmt: skip
        if dtype == torch.float32:  # the same with TF32 tensor cores (the fp32/tf32 goal)
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                r = bench(fwd_static_fused, graph=True)
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
            rows.append(dict(row="S2 forward eval float32 TF32, static form, fuse_for_inference, CUDA graph",
                             ms=r["median_ms"], min=r["min_ms"], max=r["max_ms"], tf32=True))  # fmt: skip
            # 3×TF32 (precision="tf32x3"): float32's accuracy on tensor cores, TF32 flags off
            ieee_out = fwd_static_fused()[:2000].double()
            set_sparse_precision(fused, "tf32x3")
            set_sparse_precision(model, "tf32x3")
            err = float((fwd_static_fused()[:2000].double() - ieee_out).abs().max() / ieee_out.abs().max())
            r = bench(fwd_static_fused, graph=True)
            rows.append(dict(row="S2 forward eval float32 tf32x3, static form, fuse_for_inference, CUDA graph",
                             ms=r["median_ms"], min=r["min_ms"], max=r["max_ms"], max_rel_diff_vs_ieee=err))  # fmt: skip
            med, lo, hi = timed(fwd)
            rows.append(dict(row="S2 forward eval float32 tf32x3", ms=med, min=lo, max=hi))
            set_sparse_precision(model, "auto")
        model.train()

        def step_static():
            t = pnn.SparseConvTensor(fp, vp.coords, model.sparse_shape, 1, static=True)
            model(t)["encoded_spconv_tensor"].features.float().square().mean().backward()

        r = captured_train_step(model, step_static)
        rows.append(dict(row=f"S2 forward+backward train {str(dtype)[6:]}, static form, CUDA graph",
                         ms=r["median_ms"], min=r["min_ms"], max=r["max_ms"],
                         grads_bit_identical=r["grads_bit_identical"], dropped_voxels=dropped))  # fmt: skip
        if dtype == torch.float32:
            set_sparse_precision(model, "tf32x3")
            r = captured_train_step(model, step_static)
            set_sparse_precision(model, "auto")
            rows.append(dict(row="S2 forward+backward train float32 tf32x3, static form, CUDA graph",
                             ms=r["median_ms"], min=r["min_ms"], max=r["max_ms"],
                             grads_bit_identical=r["grads_bit_identical"]))  # fmt: skip

        def step():
            model.zero_grad(set_to_none=True)
            out = model.forward_voxels(f, coords, 1)["encoded_spconv_tensor"].features
            out.float().square().mean().backward()
            return [p.grad.clone() for p in model.parameters()]

        med, lo, hi = timed(step, rep=30)
        g1, g2 = step(), step()
        same = all(torch.equal(x, y) for x, y in zip(g1, g2))
        rows.append(dict(row=f"S2 forward+backward train {str(dtype)[6:]}", ms=med, min=lo, max=hi,
                         grads_bit_identical=same))  # fmt: skip
    conv = pnn.SubMConv3d(16, 16, 3, indice_key="s").cuda()
    f16 = torch.randn(coords.shape[0], 16, device="cuda")
    x = pnn.SparseConvTensor(f16, coords, [41, 1600, 1408], 1)
    conv(x)  # builds and keeps the map under "s"
    with torch.no_grad():
        med, lo, hi = timed(lambda: conv(pnn.SparseConvTensor(f16, coords, [41, 1600, 1408], 1)))
        rows.append(dict(row="SubMConv3d 16->16 incl. its map, fp32", ms=med, min=lo, max=hi))
        med, lo, hi = timed(lambda: conv(x))
        rows.append(dict(row="SubMConv3d 16->16 map kept (indice_key), fp32", ms=med, min=lo, max=hi))
    # E3: the whole SECOND detector (second.yaml; random weights: the time, not the detections)
    from pcops.models.second import SECOND

    torch.manual_seed(0)
    det = SECOND().cuda()
    med, lo, hi = timed(lambda: det(pts))
    rows.append(dict(row="E3 SECOND forward eval fp32, eager", ms=med, min=lo, max=hi))
    det.backbone_3d = pnn.fuse_for_inference(det.backbone_3d)
    med, lo, hi = timed(lambda: det(pts))
    rows.append(dict(row="E3 SECOND forward eval fp32, eager, fuse_for_inference", ms=med, min=lo, max=hi))
    # S3: BIG (the scan tiled 10x, jittered) on the V3 grid without the voxel cap; one SubMConv3d
    # 64 -> 64 fp16 with its map kept, against the floor of sparse_conv_floor.py (same counts)
    from sparse_conv_floor import GRID, big_scan, layer_floor

    big = big_scan(pts.cpu()).cuda()
    vb = pcops.voxelize(big, **GRID, max_voxels=big.shape[0])
    n3 = int(vb.coords.shape[0])
    conv3 = pnn.SubMConv3d(64, 64, 3, bias=False, indice_key="s3").cuda().half()
    x3 = pnn.SparseConvTensor(torch.randn(n3, 64, device="cuda").half(), vb.coords, [40, 1600, 1408], 1)
    with torch.no_grad():
        conv3(x3)  # the map, kept under "s3"
        out_in = x3.indice_dict["s3"].out_in
        floor = layer_floor(n3, n3, 27, int((out_in >= 0).sum()), 64, 64)
        med, lo, hi = timed(lambda: conv3(x3))
        rows.append(dict(row=f"S3 SubMConv3d 64->64 fp16, map kept ({n3} voxels)", ms=med, min=lo, max=hi,
                         floor_ms=floor["floor_us"] / 1000, over_floor=med / (floor["floor_us"] / 1000)))  # fmt: skip
        r = bench(lambda: conv3(x3), graph=True)
        rows.append(dict(row="S3 SubMConv3d 64->64 fp16, map kept, CUDA graph", ms=r["median_ms"], min=r["min_ms"],
                         max=r["max_ms"], over_floor=r["median_ms"] / (floor["floor_us"] / 1000)))  # fmt: skip
    for r in rows:
        print(f"{r['row']:50s} {r['ms']:8.3f} ms  [{r['min']:.3f}, {r['max']:.3f}]" + (
            f"  grads bit-identical: {r['grads_bit_identical']}" if "grads_bit_identical" in r else ""))  # fmt: skip
    results.update(device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows, tf32=False)
    try:
        import triton

        results["triton"] = triton.__version__
    except ImportError:
        pass
    if a.out:
        out = Path(a.out)
        if out.suffix != ".json":
            out.mkdir(parents=True, exist_ok=True)
            out = out / "sparse_conv.json"
        out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
