"""F1 (WORKLOADS.md): farthest point sampling, 8 clouds of 16,384 SCAN points -> 4,096, start 0:
the public op (``backend="cuda"``) under the settings that decide its time, in one short run.

Rows: the op with each compiled unroll of the one-CTA kernel (``_tile_md_unroll``); the
preparation alone (keys kernel + sort); the Triton backend; and the plain-torch
reference (one Python step of ~10 launches per sample) as the same-run baseline. Every row says
whether its indices equal the Triton backend's. ``bench_sampling.py`` measures all workloads and
the kernel variants; this script is the quick F1 check. ``--out DIR`` writes ``fps_f1.json``.
(The recorded ``fps_f1.json`` of 6b03102 also has rows of a per-cloud 32-bit sort of the Morton
keys, measured slower than the one 1-D sort and removed.)
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

    default = cu._tile_md_unroll
    for unroll in (1, 2):
        with patched(cu, {"_tile_md_unroll": unroll}):
            t, got = timed(lambda: pcops.farthest_point_sample(pts, m, backend="cuda"), rep, args.quick)
            label = f"pcops cuda, u{unroll}" + (" (default)" if unroll == default else "")
            rows.append(row("F1", label, t, items=items, unit="samples/s", baseline=base,
                            identical_to_triton=bool(torch.equal(got, expected)), kernel=cu.last_launch))
    lengths = torch.full((pts.shape[0],), pts.shape[1], device=pts.device)
    dummy = torch.empty(0, dtype=torch.int64, device=pts.device)
    prep = bench(lambda: cu._Inputs(pts, lengths, lengths, dummy, m).order(), warmup=3, rep=30)
    rows.append(row("F1", "prep only (keys + sort)", prep))
    notes["goal_ms"] = 3.0
    notes["peers_ms (issue 6, H200)"] = {"F1 OpenPCDet": 14.3}
    report(rows, "fps_f1", args.out, notes=notes)


if __name__ == "__main__":
    main()
