"""K1, K2: KNN on SCAN (WORKLOADS.md); B1: ball query (issue 19).

K1: the F1 clouds (8 random 16,384-point subsets of SCAN, seed 0) against themselves, K = 16 and 32.
K2: SCAN xyz (120,268 points) against itself, K = 16.

Baseline (plain torch, same run): ``torch.cdist`` + ``topk`` in query chunks that fit in memory; the
``pcops knn`` rows report how many neighbour indices agree with it. Rows: the op (``"auto"``: the
CUDA kernel for K ≤ 32) eager and captured in a CUDA graph, the Triton backend, and the CUDA path's
parts (Morton sort alone, search kernel alone) and superblock sizes. ``--out DIR`` writes ``knn.json``.
"""

import torch
from bench_fps import f1_clouds, kernel_of, timed

import pcops
from pcops.cuda import knn as cuda_knn
from pcops.triton import knn as triton_knn

from common import bench, load_scan, parse_args, report, row


def torch_knn(query, refs, k, chunk):
    """``cdist`` + ``topk`` per query chunk: squared distances and indices (B, Nq, K)."""
    dists, idx = [], []
    for q0 in range(0, query.shape[1], chunk):
        d = torch.cdist(query[:, q0 : q0 + chunk], refs)
        v, i = d.topk(k, dim=2, largest=False)
        dists.append(v * v)
        idx.append(i)
    return torch.cat(dists, 1), torch.cat(idx, 1)


def cuda_part_rows(wl, pts, lengths, k, d, i, base, rep, notes):
    """The CUDA path in parts (graph-captured): the Morton sort alone, the search kernel alone on one
    prepared sort, and the whole op at other superblock sizes (outputs compared with the op's)."""
    pairs = pts.shape[0] * pts.shape[1]
    out = []
    group = cuda_knn.default_group(pts.shape[1])
    prep = bench(
        lambda: cuda_knn.prepare(pts, pts, lengths, lengths, group), warmup=3, rep=max(20, rep // 2), graph=True
    )
    out.append(row(wl, f"knn cuda prep only (Morton sort, group={group}, graph)", prep))
    prepared = cuda_knn.prepare(pts, pts, lengths, lengths, group)
    dists, idx = torch.empty_like(d), torch.empty_like(i)
    search = lambda: cuda_knn.search(prepared, lengths, lengths, dists, idx, k, group)  # noqa: E731
    ts = bench(search, warmup=3, rep=max(20, rep // 2), graph=True)
    out.append(row(wl, "knn cuda search only (graph)", ts))
    notes[f"{wl} cuda parts"] = f"prep {prep['median_ms']:.4f} ms, search kernel {ts['median_ms']:.4f} ms"
    for g in (4, 8):
        fn = lambda g=g: cuda_knn.knn(pts, pts, lengths, lengths, k, group=g)  # noqa: E731
        tv = bench(fn, warmup=3, rep=max(20, rep // 2), graph=True)
        d_v, i_v = fn()
        out.append(
            row(
                wl,
                f"pcops knn cuda tile=32 group={g} (graph)",
                tv,
                items=pairs,
                unit="queries/s",
                baseline=base,
                identical_to_auto=bool(torch.equal(i_v, i) and torch.equal(d_v, d)),
            )
        )
    return out


def b1_rows(clouds, rep, notes):
    """B1 (issue 19): ball query, r 0.8 m, K 32, centres = the F1 FPS samples (8 x 4,096) in the F1
    clouds; the public op (on CUDA the grid of sorted cells, ``pcops.triton.ball_query_grid``) and
    the scan of every reference (``pcops.triton.knn.ball_query``, the grid's fallback), eager and
    captured; their outputs must be equal."""
    from pcops.triton import knn as triton_knn

    idx = pcops.farthest_point_sample(clouds, 4096)
    centres = pcops.gather_points(clouds, idx).contiguous()
    ql = torch.full((clouds.shape[0],), 4096, dtype=torch.int64, device=clouds.device)
    rl = torch.full((clouds.shape[0],), clouds.shape[1], dtype=torch.int64, device=clouds.device)
    wl, out = "B1 8x4096 in 8x16384 r=0.8 K=32", []
    scan = lambda: triton_knn.ball_query(centres, clouds, ql, rl, 0.8, 32)  # noqa: E731
    public = lambda: pcops.ball_query(centres, clouds, 0.8, 32)  # noqa: E731
    base = bench(scan, warmup=3, rep=rep)
    out.append(row(wl, "scan kernel (pcops.triton.knn)", base, baseline=base))
    out.append(row(wl, "scan kernel (graph)", bench(scan, warmup=3, rep=rep, graph=True), baseline=base))
    out.append(row(wl, "pcops ball_query (grid, default)", bench(public, warmup=3, rep=rep), baseline=base))
    out.append(row(wl, "pcops ball_query (graph)", bench(public, warmup=3, rep=rep, graph=True), baseline=base))
    a, b = scan(), public()
    notes["B1 grid identical to scan"] = bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
    notes["B1 peer (OpenPCDet ball_query, peerkit, stop 27)"] = 2.17
    return out


def main():
    args = parse_args(__doc__)
    rep = 50 if args.quick else 100
    scan, source = load_scan()
    xyz = scan[:, :3].contiguous().cuda()
    clouds = f1_clouds(scan[:, :3]).cuda()
    rows, notes = [], {"scan": source, "scan_points": xyz.shape[0]}
    for wl, pts, k, chunk in (
        ("K1 8x16384 K=16", clouds, 16, 4096),
        ("K1 8x16384 K=32", clouds, 32, 4096),
        ("K2 120268 K=16", xyz[None], 16, 8192),
    ):
        base, (d_base, i_base) = timed(lambda: torch_knn(pts, pts, k, chunk), rep, args.quick)
        pairs = pts.shape[0] * pts.shape[1]
        rows.append(row(wl, "torch cdist+topk (chunked)", base, items=pairs, unit="queries/s", baseline=base))
        t, (d, i) = timed(lambda: pcops.knn(pts, pts, k), rep, args.quick)
        agree = float((i == i_base).float().mean())
        dist_err = float((d - d_base).abs().max())  # cdist's |a|²+|b|²-2ab loses precision near 0
        impl = "cuda" if cuda_knn.supported(pts, k) else "triton"
        notes[f"{wl} kernel"] = kernel_of(lambda: pcops.knn(pts, pts, k))
        rows.append(
            row(
                wl,
                f"pcops knn ({impl})",
                t,
                items=pairs,
                unit="queries/s",
                baseline=base,
                idx_agree_with_cdist=agree,
                max_abs_dist_diff_vs_cdist=dist_err,
            )
        )
        # Morton sort (a few small launches) + one search kernel: the graph replay shows the kernels alone
        tg = bench(lambda: pcops.knn(pts, pts, k), warmup=3, rep=max(20, rep // 2), graph=True)
        rows.append(row(wl, f"pcops knn ({impl}, graph)", tg, items=pairs, unit="queries/s", baseline=base))
        lengths = torch.full((pts.shape[0],), pts.shape[1], dtype=torch.int64, device=pts.device)
        tri_knn = lambda: triton_knn.knn(pts, pts, lengths, lengths, k)  # noqa: E731
        tt, (d_t, i_t) = timed(tri_knn, rep, args.quick)
        ttg = bench(tri_knn, warmup=3, rep=max(20, rep // 2), graph=True)
        same = bool(torch.equal(i_t, i) and torch.equal(d_t, d))
        rows.append(
            row(wl, "pcops knn triton", tt, items=pairs, unit="queries/s", baseline=base, identical_to_auto=same)
        )
        rows.append(row(wl, "pcops knn triton (graph)", ttg, items=pairs, unit="queries/s", baseline=base))
        del d_t, i_t
        if impl == "cuda":
            rows.extend(cuda_part_rows(wl, pts, lengths, k, d, i, base, rep, notes))
        if wl.startswith("K2"):
            del d_base, i_base
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            pcops.knn(pts, pts, k)
            torch.cuda.synchronize()
            notes["K2 peak extra memory MB (pcops, outputs included)"] = (
                torch.cuda.max_memory_allocated() - before
            ) / 2**20
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            torch_knn(pts, pts, k, chunk)
            torch.cuda.synchronize()
            notes["K2 peak extra memory MB (cdist+topk, chunk 8192)"] = (
                torch.cuda.max_memory_allocated() - before
            ) / 2**20
    rows += b1_rows(clouds, rep, notes)
    if not args.quick:  # Triton tile shapes (queries per program, references per tile, tiles per superblock)
        for bq, br, sb in ((32, 32, 16), (64, 64, 8), (16, 32, 16)):
            for wl, pts in (("K1 K=16 tuning", clouds), ("K2 tuning", xyz[None])):
                lengths = torch.full((pts.shape[0],), pts.shape[1], dtype=torch.int64, device=pts.device)
                t = bench(lambda: triton_knn.knn(pts, pts, lengths, lengths, 16, bq=bq, br=br, sb=sb), warmup=2, rep=20)
                rows.append(row(wl, f"knn triton BQ={bq} BR={br} SB={sb}", t))
    notes["peers_ms (issue 6, H200)"] = {"K1 K=16 PyTorch3D": 4.76, "K2 PyTorch3D": 32.0}
    notes["goals_ms"] = {"K1 K=16": 1.0, "K1 K=32": 1.5, "K2": 3.0}
    report(rows, "knn", args.out, notes=notes)
    for k_, v in notes.items():
        print(f"{k_}: {v}")


if __name__ == "__main__":
    main()
