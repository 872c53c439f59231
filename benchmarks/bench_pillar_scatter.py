"""P1: pillar scatter, 16,000 pillars × 64 channels into (B, 64, 496, 432), batch 1 and 4.

Baseline: plain torch index assignment into a zero canvas, as OpenPCDet's PointPillarScatter.
Floor: the canvas must be written once (B·64·496·432·4 bytes: 54.9 MB per sample, ≈ 13 µs at
4.3 TB/s); eager launches (3 in the forward) cost more than that on the host, so the graph
figure is the one a captured pipeline sees.
"""
import torch

from common import bench, parse_args, report, row

import pcops

H, W, C, P = 496, 432, 64, 16000


def make(batch_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    coords = []
    for b in range(batch_size):
        lin = torch.randperm(H * W, generator=g)[:P]
        coords.append(torch.stack([torch.full_like(lin, b), torch.zeros_like(lin), lin // W, lin % W], 1))
    coords = torch.cat(coords).int().cuda()
    feats = torch.randn(P * batch_size, C, generator=g).cuda()
    return feats, coords


def torch_baseline(feats, coords, batch_size):
    canvas = feats.new_zeros(batch_size, C, H * W)
    canvas[coords[:, 0].long(), :, (coords[:, 2] * W + coords[:, 3]).long()] = feats
    return canvas.view(batch_size, C, H, W)


def main():
    args = parse_args(__doc__)
    rep = 30 if args.quick else 100
    rows = []
    for batch_size in (1, 4):
        feats, coords = make(batch_size)
        wl = f"P1 B={batch_size}"
        n = P * batch_size
        base = bench(lambda: torch_baseline(feats, coords, batch_size), rep=rep)
        rows.append(row(wl, "torch index assign (fwd)", base, items=n, unit="pillars/s", baseline=base))
        for backend in ("triton", "cuda"):
            fn = lambda: pcops.pillar_scatter(feats, coords, batch_size, (H, W), backend=backend)
            t = bench(fn, rep=rep)
            rows.append(row(wl, f"pcops {backend} (fwd)", t, items=n, unit="pillars/s", baseline=base,
                            gbps=batch_size * C * H * W * 4 / t["median_ms"] / 1e6))
            tg = bench(fn, rep=rep, graph=True)
            rows.append(row(wl, f"pcops {backend} (fwd, graph)", tg, items=n, unit="pillars/s", baseline=base,
                            gbps=batch_size * C * H * W * 4 / tg["median_ms"] / 1e6))
        # forward + backward
        fr = feats.clone().requires_grad_(True)
        grad = torch.randn(batch_size, C, H, W, device="cuda")
        base_fb = bench(lambda: torch_baseline(fr, coords, batch_size).backward(grad), rep=rep)
        rows.append(row(wl, "torch index assign (fwd+bwd)", base_fb, items=n, unit="pillars/s", baseline=base_fb))
        for backend in ("triton", "cuda"):
            t = bench(lambda: pcops.pillar_scatter(fr, coords, batch_size, (H, W), backend=backend).backward(grad), rep=rep)
            rows.append(row(wl, f"pcops {backend} (fwd+bwd)", t, items=n, unit="pillars/s", baseline=base_fb))
    report(rows, "pillar_scatter", args.out, notes={"floor_ms_B1": C * H * W * 4 / 4.3e12 * 1e3})


if __name__ == "__main__":
    main()
