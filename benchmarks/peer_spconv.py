"""spconv 2.3.8 beside pcops in one process, on the same inputs (issues 19 and 21).

    PYTHONPATH=.:/tmp/spconv_site python benchmarks/peer_spconv.py [--out DIR]   # DIR/peer_spconv.json

spconv comes from ``../shared/tools/spconv/`` (its wheel needs three GPU runs to arrive); without
it the script stops with a message. Rows (KITTI 000001; SECOND grid V3: 0.05 × 0.05 × 0.1 m,
range (0, -40, -3, 70.4, 40, 1), 5 points and 40,000 voxels; V1 the PointPillars grid), each
the median of CUDA-event times of single eager calls, both libraries on the same tensors:

- V1 / V3 hard voxelization: ``spconv.pytorch.utils.PointToVoxel`` vs ``pcops.voxelize``.
- S1 subm 3³ and strided 3³ s2 kernel maps: ``spconv.pytorch.ops.get_indice_pairs`` (Native)
  vs ``pcops.sparse_conv_kernel_map`` (default form, and ``pad_pairs`` for the subm map, which is
  the form ``pcops.nn`` layers use).
- SubMConv3d 16 → 16 including its map, and with the map kept (``indice_key``).
- S2 SECOND middle encoder (OpenPCDet ``VoxelBackBone8x``, same weights on both sides): eval
  forward fp32 / fp16, train forward + backward fp32 / fp16 (gradients checked bit-identical
  over two runs on both sides); outputs compared through ``dense()``.
- S3 one SubMConv3d 64 → 64 fp16 on BIG (≈ 288,000 voxels), map kept.

TF32 is off on both sides (torch flags off; spconv's default ``SPCONV_ALLOW_TF32`` unset = off),
except the rows that name pcops' ``tf32x3`` (float32 accuracy on tensor cores) or ``tf32`` (one TF32
pass) precision; spconv stays at its default there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

import pcops
from pcops import nn as pnn

from common import S2_STATIC_CAPACITY, bench, captured_train_step, load_scan, set_sparse_precision
from common import S2_V3 as V3

V1 = dict(voxel_size=(0.16, 0.16, 4.0), point_cloud_range=(0, -39.68, -3, 69.12, 39.68, 1), max_points_per_voxel=32,
          max_voxels=16000)  # fmt: skip
SHAPE = [41, 1600, 1408]


def med(fn, rep=100, warmup=10):
    r = bench(fn, warmup=warmup, rep=rep)
    return r["median_ms"]


def spconv_encoder(spconv, input_channels=4):
    """OpenPCDet's VoxelBackBone8x on spconv 2 (the same module names as pcops')."""
    import torch.nn as nn

    sp = spconv.pytorch

    def block(cin, cout, k, stride=1, padding=0, key=None, kind="subm"):
        if kind == "subm":
            conv = sp.SubMConv3d(cin, cout, k, bias=False, indice_key=key)
        else:
            conv = sp.SparseConv3d(cin, cout, k, stride=stride, padding=padding, bias=False, indice_key=key)
        return sp.SparseSequential(conv, nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU())

    m = nn.Module()
    m.conv_input = sp.SparseSequential(
        sp.SubMConv3d(input_channels, 16, 3, padding=1, bias=False, indice_key="subm1"),
        nn.BatchNorm1d(16, eps=1e-3, momentum=0.01),
        nn.ReLU(),
    )
    m.conv1 = sp.SparseSequential(block(16, 16, 3, padding=1, key="subm1"))
    m.conv2 = sp.SparseSequential(
        block(16, 32, 3, 2, 1, "spconv2", "spconv"), block(32, 32, 3, key="subm2"), block(32, 32, 3, key="subm2")
    )
    m.conv3 = sp.SparseSequential(
        block(32, 64, 3, 2, 1, "spconv3", "spconv"), block(64, 64, 3, key="subm3"), block(64, 64, 3, key="subm3")
    )
    m.conv4 = sp.SparseSequential(
        block(64, 64, 3, 2, (0, 1, 1), "spconv4", "spconv"),
        block(64, 64, 3, key="subm4"),
        block(64, 64, 3, key="subm4"),
    )
    m.conv_out = sp.SparseSequential(
        sp.SparseConv3d(64, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
        nn.BatchNorm1d(128, eps=1e-3, momentum=0.01),
        nn.ReLU(),
    )

    def forward(x):
        for name in ("conv_input", "conv1", "conv2", "conv3", "conv4", "conv_out"):
            x = getattr(m, name)(x)
        return x

    m.forward = forward
    return m


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    try:
        import spconv
        import spconv.pytorch  # noqa: F401
        from spconv.core import ConvAlgo
        from spconv.pytorch.ops import get_indice_pairs
        from spconv.pytorch.utils import PointToVoxel
    except Exception as e:  # noqa: BLE001
        print(f"spconv not importable ({e!r}): bring it with ../shared/tools/spconv/README.md", file=sys.stderr)
        sys.exit(2)
    from pcops.models.second import VoxelBackBone8x, mean_vfe

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rep = 30 if a.quick else 100
    pts = load_scan("000001")[0].cuda()
    rows = []

    def add(workload, spconv_ms, pcops_ms, **extra):
        r = dict(workload=workload, spconv_ms=spconv_ms, pcops_ms=pcops_ms, speedup=spconv_ms / pcops_ms, **extra)
        rows.append(r)
        print(f"{workload:58s} spconv {spconv_ms:8.3f}  pcops {pcops_ms:8.3f}  ×{r['speedup']:.2f}", flush=True)

    # V1 / V3 hard voxelization
    for name, cfg in (("V1", V1), ("V3", V3)):
        lo, hi = cfg["point_cloud_range"][:3], cfg["point_cloud_range"][3:]
        gen = PointToVoxel(vsize_xyz=list(cfg["voxel_size"]), coors_range_xyz=list(lo) + list(hi),
                           num_point_features=4, max_num_voxels=cfg["max_voxels"],
                           max_num_points_per_voxel=cfg["max_points_per_voxel"], device=pts.device)  # fmt: skip
        sv = gen(pts)
        pv = pcops.voxelize(pts, **cfg)
        add(f"{name} hard voxelization", med(lambda: gen(pts), rep), med(lambda: pcops.voxelize(pts, **cfg), rep),
            voxels_spconv=int(sv[0].shape[0]), voxels_pcops=int(pv.coords.shape[0]))  # fmt: skip
    v = pcops.voxelize(pts, **V3)
    feats, coords = mean_vfe(v.voxels, v.num_points), v.coords
    n = int(coords.shape[0])
    vp = pcops.voxelize(pts, pad_to_max=True, **V3)  # pcops' static form (CUDA-graph rows)
    feats_p = mean_vfe(vp.voxels, vp.num_points)

    # S1 kernel maps
    def sp_pairs(subm):
        if subm:
            return get_indice_pairs(coords, 1, SHAPE, ConvAlgo.Native, [3] * 3, [1] * 3, [1] * 3, [1] * 3, [0] * 3, True,
                                    False)  # fmt: skip
        return get_indice_pairs(coords, 1, SHAPE, ConvAlgo.Native, [3] * 3, [2] * 3, [1] * 3, [1] * 3, [0] * 3, False,
                                False)  # fmt: skip

    s_subm = med(lambda: sp_pairs(True), rep)
    add("S1 subm 3^3 kernel map", s_subm, med(lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, 3, subm=True), rep))
    add("S1 subm 3^3 kernel map, pcops pad_pairs", s_subm,
        med(lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, 3, subm=True, pad_pairs=True), rep))  # fmt: skip
    so = sp_pairs(False)[0].shape[0]
    km = pcops.sparse_conv_kernel_map(coords, SHAPE, 3, 2, 1)
    add("S1 strided 3^3 s2 kernel map", med(lambda: sp_pairs(False), rep),
        med(lambda: pcops.sparse_conv_kernel_map(coords, SHAPE, 3, 2, 1), rep),
        outputs_spconv=int(so), outputs_pcops=int(km.out_coords.shape[0]))  # fmt: skip

    # one SubMConv3d 16 -> 16
    torch.manual_seed(0)
    f16 = torch.randn(n, 16, device="cuda")
    sconv = spconv.pytorch.SubMConv3d(16, 16, 3, bias=False, indice_key="s").cuda()
    pconv = pnn.SubMConv3d(16, 16, 3, bias=False, indice_key="s").cuda()
    with torch.no_grad():
        pconv.weight.copy_(sconv.weight)  # both (C_out, kz, ky, kx, C_in)
        sx = spconv.pytorch.SparseConvTensor(f16, coords, SHAPE, 1)
        px = pnn.SparseConvTensor(f16, coords, SHAPE, 1)
        so_, po_ = sconv(sx), pconv(px)
        err = float((so_.features - po_.features).abs().max())
        add("SubMConv3d 16->16 incl. its map, fp32",
            med(lambda: sconv(spconv.pytorch.SparseConvTensor(f16, coords, SHAPE, 1)), rep),
            med(lambda: pconv(pnn.SparseConvTensor(f16, coords, SHAPE, 1)), rep), max_abs_diff=err)  # fmt: skip
        add("SubMConv3d 16->16 map kept (indice_key), fp32", med(lambda: sconv(sx), rep), med(lambda: pconv(px), rep))

    # S2: the SECOND middle encoder, same weights
    torch.manual_seed(0)
    pnet = VoxelBackBone8x(4, (1408, 1600, 40)).cuda()
    snet = spconv_encoder(spconv).cuda()
    missing = snet.load_state_dict(pnet.state_dict(), strict=False)
    for dtype in (torch.float32, torch.float16):
        pnet.to(dtype).eval()
        snet.to(dtype).eval()
        f = feats.to(dtype)
        with torch.no_grad():
            so_ = snet(spconv.pytorch.SparseConvTensor(f, coords, SHAPE, 1))
            po_ = pnet.forward_voxels(f, coords, 1)["encoded_spconv_tensor"]
            diff = float((so_.dense().float() - po_.dense().float()).abs().max())
            scale = float(so_.dense().float().abs().max())
            spconv_eval = med(lambda: snet(spconv.pytorch.SparseConvTensor(f, coords, SHAPE, 1)).features, rep)
            # pcops eager: the default call replays the encoder's graph (eager_graph); op by op too
            add(f"S2 forward eval {str(dtype)[6:]}", spconv_eval,
                med(lambda: pnet.forward_voxels(f, coords, 1)["encoded_spconv_tensor"].features, rep),
                max_abs_diff=diff, max_abs=scale)  # fmt: skip
            pnet.eager_graph = False
            op_by_op = pnet.forward_voxels(f, coords, 1)["encoded_spconv_tensor"]
            add(f"S2 forward eval {str(dtype)[6:]}: pcops op by op (eager_graph=False)", spconv_eval,
                med(lambda: pnet.forward_voxels(f, coords, 1)["encoded_spconv_tensor"].features, rep))  # fmt: skip
            pnet.eager_graph = True
            rows[-2]["pcops_graph_equals_op_by_op"] = bool(
                torch.equal(op_by_op.features, po_.features) and torch.equal(op_by_op.indices, po_.indices)
            )
            pfused = pnn.fuse_for_inference(pnet)
            add(f"S2 forward eval {str(dtype)[6:]}: pcops fuse_for_inference, eager", spconv_eval,
                med(lambda: pfused.forward_voxels(f, coords, 1)["encoded_spconv_tensor"].features, rep))  # fmt: skip
        pnet.train()
        snet.train()

        def step_s():
            snet.zero_grad(set_to_none=True)
            snet(spconv.pytorch.SparseConvTensor(f, coords, SHAPE, 1)).features.float().square().mean().backward()
            return [q.grad.clone() for q in snet.parameters()]

        def step_p():
            pnet.zero_grad(set_to_none=True)
            pnet.forward_voxels(f, coords, 1)["encoded_spconv_tensor"].features.float().square().mean().backward()
            return [q.grad.clone() for q in pnet.parameters()]

        same_s = all(torch.equal(x, y) for x, y in zip(step_s(), step_s()))
        same_p = all(torch.equal(x, y) for x, y in zip(step_p(), step_p()))
        spconv_train = med(step_s, 30, 5)
        add(f"S2 forward+backward train {str(dtype)[6:]}", spconv_train, med(step_p, 30, 5),
            grads_bit_identical_spconv=same_s, grads_bit_identical_pcops=same_p)  # fmt: skip
        # pcops' static form (pad_to_max voxels, strided convs capped at S2_STATIC_CAPACITY rows), whole
        # step / forward in one CUDA graph, against spconv's eager rows (spconv cannot be captured)
        snet_static = VoxelBackBone8x(4, (1408, 1600, 40), static_capacity=S2_STATIC_CAPACITY).cuda().to(dtype)
        snet_static.load_state_dict(pnet.state_dict())
        fp = feats_p.to(dtype)
        with torch.no_grad():  # the capacities hold every voxel (recorded with the static rows)
            dropped = int(snet_static.eval()(pnn.SparseConvTensor(fp, vp.coords, SHAPE, 1, static=True))[
                "encoded_spconv_tensor"].num_dropped)  # fmt: skip

        def step_static():
            t = pnn.SparseConvTensor(fp, vp.coords, SHAPE, 1, static=True)
            snet_static(t)["encoded_spconv_tensor"].features.float().square().mean().backward()

        r = captured_train_step(snet_static.train(), step_static)
        add(f"S2 forward+backward train {str(dtype)[6:]}: pcops static form, CUDA graph", spconv_train,
            r["median_ms"], grads_bit_identical_pcops=r["grads_bit_identical"], dropped_voxels=dropped)  # fmt: skip
        fused = pnn.fuse_for_inference(snet_static.eval())

        def fwd_static():
            with torch.no_grad():
                return fused(pnn.SparseConvTensor(fp, vp.coords, SHAPE, 1, static=True))["encoded_spconv_tensor"]

        add(f"S2 forward eval {str(dtype)[6:]}: pcops static form, fuse_for_inference, CUDA graph", spconv_eval,
            bench(fwd_static, graph=True)["median_ms"], dropped_voxels=dropped)  # fmt: skip
        if dtype == torch.float32:  # pcops' float32 as 3×TF32 (precision="tf32x3"; TF32 flags stay off)
            set_sparse_precision(fused, "tf32x3")
            add("S2 forward eval float32: pcops tf32x3, static form, fuse_for_inference, CUDA graph", spconv_eval,
                bench(fwd_static, graph=True)["median_ms"])  # fmt: skip
            # one TF32 pass (precision="tf32": 10-bit mantissas, about 1e-3 relative error), against
            # spconv's float32 with its default SPCONV_ALLOW_TF32 off
            set_sparse_precision(fused, "tf32")
            add("S2 forward eval float32: pcops tf32 (one pass; spconv TF32 off), static form, fuse_for_inference, "
                "CUDA graph", spconv_eval, bench(fwd_static, graph=True)["median_ms"])  # fmt: skip
            set_sparse_precision(pnet, "tf32x3")
            pnet.eval()
            with torch.no_grad():
                add("S2 forward eval float32: pcops tf32x3, eager", spconv_eval,
                    med(lambda: pnet.forward_voxels(f, coords, 1)["encoded_spconv_tensor"].features, rep))  # fmt: skip
            set_sparse_precision(pnet, "auto")
            set_sparse_precision(snet_static, "tf32x3")
            r = captured_train_step(snet_static.train(), step_static)
            add("S2 forward+backward train float32: pcops tf32x3, static form, CUDA graph", spconv_train,
                r["median_ms"], grads_bit_identical_pcops=r["grads_bit_identical"])  # fmt: skip
    # S3: one SubMConv3d 64 -> 64 fp16 on BIG, map kept
    sys.path.insert(0, str(Path(__file__).parent))
    from sparse_conv_floor import GRID, big_scan

    big = big_scan(pts.cpu()).cuda()
    vb = pcops.voxelize(big, **GRID, max_voxels=big.shape[0])
    n3 = int(vb.coords.shape[0])
    f3 = torch.randn(n3, 64, device="cuda").half()
    s3 = spconv.pytorch.SubMConv3d(64, 64, 3, bias=False, indice_key="s3").cuda().half()
    p3 = pnn.SubMConv3d(64, 64, 3, bias=False, indice_key="s3").cuda().half()
    with torch.no_grad():
        p3.weight.copy_(s3.weight)
        sx3 = spconv.pytorch.SparseConvTensor(f3, vb.coords, [40, 1600, 1408], 1)
        px3 = pnn.SparseConvTensor(f3, vb.coords, [40, 1600, 1408], 1)
        d3 = float((s3(sx3).features.float() - p3(px3).features.float()).abs().max())
        add(f"S3 SubMConv3d 64->64 fp16, map kept ({n3} voxels)", med(lambda: s3(sx3), rep), med(lambda: p3(px3), rep),
            max_abs_diff=d3)  # fmt: skip
    res = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        spconv=spconv.__version__,
        tf32=False,
        voxels=n,
        load_state_dict=str(missing),
        rows=rows,
        commit=os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip(),
        date=__import__("datetime").date.today().isoformat(),
    )
    try:
        import triton

        res["triton"] = triton.__version__
    except ImportError:
        pass
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "peer_spconv.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
