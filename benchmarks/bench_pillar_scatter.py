"""P1: pillar scatter, 16,000 pillars × 64 channels into (B, 64, 496, 432), batch 1 and 4.

Baseline: plain torch index assignment into a zero canvas, as OpenPCDet's PointPillarScatter.
Floor: the canvas must be written once (B·64·496·432·4 bytes: 54.9 MB per sample, ≈ 13 µs at
4.3 TB/s); eager launches (3 in the forward) cost more than that on the host, so the graph
figure is the one a captured pipeline sees. "[graph x8 steady]" rows (``common.bench_steady``): the
per-call time of 8 calls in one CUDA graph, each on its own copy of the inputs (8 canvases of
55 MB: nothing stays in the L2), for the forward, the backward alone (each backend's gather:
``"auto"`` = the CUDA C++ stream, ``"triton"`` = the Triton stream) and forward + backward
(autograd captured), next to the torch baseline timed the same way; and the tiles of the forward's
canvas kernels (CUDA C++ quads: vectors per thread; Triton: cells x channels, channels per program,
warps), through their launchers.
"""

import torch

from common import bench, bench_steady, parse_args, report, row

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


K_STEADY = 8
TRITON_SWEEP = [
    (512, 16, C, 4),
    (512, 16, 16, 4),
    (512, 8, 16, 4),
    (1024, 8, 16, 4),
    (1024, 16, 16, 8),
    (512, 16, 32, 4),
    (256, 16, 16, 2),
    (1024, 4, 8, 4),
    (2048, 8, 8, 8),
    (1024, 8, 8, 4),
]


def steady_rows(batch_size, rep):
    """``[graph x8 steady]`` rows: forward (torch, Triton, CUDA canvas kernels), backward alone (each
    backend's gather), forward + backward (autograd captured; torch and pcops)."""
    from pcops.cuda import pillar_scatter as cps

    wl, n, out = f"P1 B={batch_size}", P * batch_size, []
    tag = f" [graph x{K_STEADY} steady]"
    copies = [make(batch_size, seed=k) for k in range(K_STEADY)]
    grads = [torch.randn(batch_size, C, H, W, device="cuda") for _ in range(K_STEADY)]

    def fwd_fns(fn):
        return [lambda f=f, c=c: fn(f, c) for f, c in copies]

    base = bench_steady(fwd_fns(lambda f, c: torch_baseline(f, c, batch_size)), rep=rep)
    out.append(row(wl, "torch index assign (fwd)" + tag, base, items=n, unit="pillars/s", baseline=base))
    for backend in ("triton", "cuda"):
        t = bench_steady(
            fwd_fns(lambda f, c, b=backend: pcops.pillar_scatter(f, c, batch_size, (H, W), backend=b)), rep=rep
        )
        out.append(
            row(
                wl,
                f"pcops {backend} (fwd){tag}",
                t,
                items=n,
                unit="pillars/s",
                baseline=base,
                gbps=batch_size * C * H * W * 4 / t["median_ms"] / 1e6,
            )
        )
    # the CUDA quad kernel's vectors per thread (grid z = C / 4 / vecs), through the launcher
    for vecs in (1, 2, 4, 8):
        t = bench_steady(
            fwd_fns(lambda f, c, v=vecs: cps.pillar_scatter(f, c, batch_size, H, W, vecs_per_slice=v)), rep=rep
        )
        out.append(
            row(
                wl,
                f"cuda launcher vecs_per_slice={vecs} (fwd){tag}",
                t,
                items=n,
                unit="pillars/s",
                baseline=base,
                gbps=batch_size * C * H * W * 4 / t["median_ms"] / 1e6,
            )
        )
    # the Triton canvas pass: tile (cells x channels), channels per program (grid axis 2), warps
    from pcops.triton import pillar_scatter as tri

    for block_hw, block_c, per, warps in TRITON_SWEEP if batch_size == 1 else ():
        t = bench_steady(
            fwd_fns(
                lambda f, c: tri.pillar_scatter(
                    f, c, batch_size, H, W, block_hw=block_hw, block_c=block_c, c_per_program=per, num_warps=warps
                )
            ),
            rep=rep,
        )
        out.append(
            row(
                wl,
                f"triton canvas hw={block_hw} c={block_c} per={per} warps={warps} (fwd){tag}",
                t,
                items=n,
                unit="pillars/s",
                baseline=base,
            )
        )
    # the backward alone: the gather op on the 8 canvas gradients
    winners = [torch.ops.pcops.pillar_scatter(f, c, batch_size, H, W, "triton")[1] for f, c in copies]
    for backend in ("auto", "triton"):
        t = bench_steady(
            [
                lambda k=k, b=backend: torch.ops.pcops.pillar_gather(grads[k], copies[k][1], winners[k], b)
                for k in range(K_STEADY)
            ],
            rep=rep,
        )
        out.append(row(wl, f"pcops gather backend={backend} (bwd alone){tag}", t, items=n, unit="pillars/s"))
    # forward + backward, autograd captured (each call accumulates into its own leaf's .grad)
    leaves = [f.clone().requires_grad_(True) for f, _ in copies]

    def fb_fns(fn):
        return [lambda k=k: fn(leaves[k], copies[k][1]).backward(grads[k]) for k in range(K_STEADY)]

    base_fb = bench_steady(fb_fns(lambda f, c: torch_baseline(f, c, batch_size)), rep=rep)
    out.append(row(wl, "torch index assign (fwd+bwd)" + tag, base_fb, items=n, unit="pillars/s", baseline=base_fb))
    for backend in ("auto", "triton", "cuda"):
        t = bench_steady(
            fb_fns(lambda f, c, b=backend: pcops.pillar_scatter(f, c, batch_size, (H, W), backend=b)), rep=rep
        )
        out.append(row(wl, f"pcops {backend} (fwd+bwd){tag}", t, items=n, unit="pillars/s", baseline=base_fb))
    return out


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
        base_g = bench(lambda: torch_baseline(feats, coords, batch_size), rep=rep, graph=True)
        rows.append(row(wl, "torch index assign (fwd, graph)", base_g, items=n, unit="pillars/s", baseline=base))
        for backend in ("triton", "cuda"):
            fn = lambda: pcops.pillar_scatter(feats, coords, batch_size, (H, W), backend=backend)
            t = bench(fn, rep=rep)
            rows.append(
                row(
                    wl,
                    f"pcops {backend} (fwd)",
                    t,
                    items=n,
                    unit="pillars/s",
                    baseline=base,
                    gbps=batch_size * C * H * W * 4 / t["median_ms"] / 1e6,
                )
            )
            tg = bench(fn, rep=rep, graph=True)
            rows.append(
                row(
                    wl,
                    f"pcops {backend} (fwd, graph)",
                    tg,
                    items=n,
                    unit="pillars/s",
                    baseline=base,
                    gbps=batch_size * C * H * W * 4 / tg["median_ms"] / 1e6,
                )
            )
        # forward + backward
        fr = feats.clone().requires_grad_(True)
        grad = torch.randn(batch_size, C, H, W, device="cuda")
        base_fb = bench(lambda: torch_baseline(fr, coords, batch_size).backward(grad), rep=rep)
        rows.append(row(wl, "torch index assign (fwd+bwd)", base_fb, items=n, unit="pillars/s", baseline=base_fb))
        for backend in ("auto", "triton", "cuda"):
            t = bench(
                lambda: pcops.pillar_scatter(fr, coords, batch_size, (H, W), backend=backend).backward(grad), rep=rep
            )
            rows.append(row(wl, f"pcops {backend} (fwd+bwd)", t, items=n, unit="pillars/s", baseline=base_fb))
    rows += steady_rows(1, rep)
    # the backward gather alone, eager (the canvas-pass tiles are swept in steady_rows)
    feats, coords = make(1)
    from pcops.triton import pillar_scatter as tri

    canvas, winner = tri.pillar_scatter(feats, coords, 1, H, W)
    grad = torch.randn_like(canvas)
    tg = bench(lambda: torch.ops.pcops.pillar_gather(grad, coords, winner, "auto"), rep=rep)
    rows.append(row("P1 B=1", "pcops gather op alone (bwd)", tg, items=P, unit="pillars/s"))
    fr = feats.clone().requires_grad_(True)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        for _ in range(5):
            pcops.pillar_scatter(fr, coords, 1, (H, W)).backward(grad)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12))
    report(rows, "pillar_scatter", args.out, notes={"floor_ms_B1": C * H * W * 4 / 4.3e12 * 1e3})


if __name__ == "__main__":
    main()
