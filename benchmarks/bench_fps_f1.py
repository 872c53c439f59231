"""F1 (WORKLOADS.md): farthest point sampling, 8 clouds of 16,384 SCAN points -> 4,096, start 0:
the public op (``backend="cuda"``) under the settings that decide its time, in one short run.

Rows: the op as a user calls it (eager) and captured in a CUDA graph (``graph replay``: the same
kernels without the host time between launches); the op with each one-CTA kernel shape
(``_tile_md_shape``: "" the plain step, "s" hoisted shared-memory addresses, "k" records kept unless
their group changed, "sk" both, the default) and Morton key width (``_order_keys32``); the
preparation alone (keys kernel + sort, eager and graph, 64- and 32-bit keys); the Triton backend;
and the plain-torch reference (one Python step of ~10 launches per sample) as the same-run
baseline. Every row says whether its indices equal the Triton backend's. ``bench_sampling.py``
measures all workloads and the kernel variants; this script is the quick F1 check. ``--out DIR``
writes ``fps_f1.json``.
"""
import torch

from bench_sampling import f1_clouds, timed, torch_fps
from common import bench, load_scan, parse_args, patched, report, row

import pcops


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
    from pcops.cuda import sampling as cu

    def op():
        return pcops.farthest_point_sample(pts, m, backend="cuda")

    default = (cu._tile_md_shape, cu._tile_md_unroll, cu._order_keys32)
    for shape, unroll, keys32 in (("sk", 1, True), ("sk", 1, False), ("sk", 2, True), ("esk", 1, True),
                                  ("k", 1, True), ("s", 1, True), ("", 1, True), ("", 1, False)):
        with patched(cu, {"_tile_md_shape": shape, "_tile_md_unroll": unroll, "_order_keys32": keys32}):
            t, got = timed(op, rep, args.quick)
            label = (f"pcops cuda, {shape or 'plain'} u{unroll}, {32 if keys32 else 64}-bit keys"
                     + (" (default)" if (shape, unroll, keys32) == default else ""))
            same = bool(torch.equal(got, expected))
            rows.append(row("F1", label, t, items=items, unit="samples/s", baseline=base, identical_to_triton=same,
                            kernel=cu.last_launch))
            if (shape, unroll, keys32) == default or (shape, keys32) == ("", False):
                g = bench(op, warmup=3, rep=rep, graph=True)
                rows.append(row("F1", label + ", graph replay", g, items=items, unit="samples/s", baseline=base,
                                identical_to_triton=same, kernel=cu.last_launch))
    lengths = torch.full((pts.shape[0],), pts.shape[1], device=pts.device)
    dummy = torch.empty(0, dtype=torch.int64, device=pts.device)
    for keys32 in (True, False):
        with patched(cu, {"_order_keys32": keys32}):
            for graph in (False, True):
                prep = bench(lambda: cu._Inputs(pts, lengths, lengths, dummy, m).order(), warmup=3, rep=30, graph=graph)
                rows.append(row("F1", f"prep only (keys + sort), {32 if keys32 else 64}-bit keys"
                                + (", graph replay" if graph else ""), prep))
    notes["goal_ms"] = 3.0
    notes["peers_ms (issue 6, H200)"] = {"F1 OpenPCDet": 14.3}
    report(rows, "fps_f1", args.out, notes=notes)


if __name__ == "__main__":
    main()
