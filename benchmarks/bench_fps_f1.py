"""F1 (WORKLOADS.md): farthest point sampling, 8 clouds of 16,384 SCAN points -> 4,096, start 0:
the public op in one short run (``bench_fps.py`` measures F1 and F2 in full).

Rows: the op as a user calls it (``backend="cuda"``, eager) and captured in a CUDA graph (``graph
replay``: the same kernels without the host time between launches); the Morton order alone (keys
kernel + sort, eager and graph) with 32-bit keys (the default up to 4,096 clouds) and 64-bit keys
(the path of larger batches); the Triton backend; and the plain-torch reference (one Python step
of ~10 launches per sample) as the same-run baseline. Every row says whether its indices equal the
Triton backend's. ``--out DIR`` writes ``fps_f1.json``.
"""

import torch
from bench_fps import f1_clouds, kernel_of, timed, torch_fps

import pcops

from common import bench, load_scan, parse_args, report, row


def main():
    args = parse_args(__doc__)
    rep = 50 if args.quick else 100
    scan, source = load_scan()
    pts = f1_clouds(scan[:, :3]).cuda()
    m = 4096
    items = pts.shape[0] * m
    rows, notes = [], {"scan": source}
    base, _ = timed(lambda: torch_fps(pts, m), rep, args.quick, warm=lambda: torch_fps(pts, 32))
    rows.append(row("F1", "torch reference (per-step ops)", base, items=items, unit="samples/s", baseline=base))
    t, expected = timed(lambda: pcops.farthest_point_sample(pts, m, backend="triton"), rep, args.quick)
    rows.append(row("F1", "pcops triton", t, items=items, unit="samples/s", baseline=base))
    from pcops.cuda import fps as cu

    def op():
        return pcops.farthest_point_sample(pts, m, backend="cuda")

    t, got = timed(op, rep, args.quick)
    kernel = kernel_of(op)
    same = bool(torch.equal(got, expected))
    rows.append(
        row(
            "F1", "pcops cuda", t, items=items, unit="samples/s", baseline=base, identical_to_triton=same, kernel=kernel
        )
    )
    g = bench(op, warmup=3, rep=rep, graph=True)
    rows.append(
        row(
            "F1",
            "pcops cuda, graph replay",
            g,
            items=items,
            unit="samples/s",
            baseline=base,
            identical_to_triton=same,
            kernel=kernel,
        )
    )
    lengths = torch.full((pts.shape[0],), pts.shape[1], device=pts.device)
    for keys32 in (True, False):
        for graph in (False, True):
            prep = bench(lambda: cu.order(pts, lengths, keys32=keys32), warmup=3, rep=30, graph=graph)
            rows.append(
                row(
                    "F1",
                    f"prep only (keys + sort), {32 if keys32 else 64}-bit keys" + (", graph replay" if graph else ""),
                    prep,
                )
            )
    notes["goal_ms"] = 3.0
    notes["peers_ms (issue 6, H200)"] = {"F1 OpenPCDet": 14.3}
    report(rows, "fps_f1", args.out, notes=notes)


if __name__ == "__main__":
    main()
