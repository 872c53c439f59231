"""Render benchmarks/results/*.json as the README's benchmark table (between the markers).

    python scripts/results_table.py            # rewrite README.md's table in place
    python scripts/results_table.py --print    # print it only
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def table() -> str:
    lines = []
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        res = json.loads(path.read_text())
        env = res["environment"]
        lines.append(f"\n**{res['benchmark']}** — {env['device']}, torch {env['torch']}, triton {env['triton']}, "
                     f"{env['date'][:10]}, commit `{env['commit']}` (`benchmarks/results/{path.name}`)\n")
        lines.append("| workload | implementation | median ms | min–max ms | throughput | × baseline |")
        lines.append("| --- | --- | ---: | ---: | ---: | ---: |")
        for r in res["results"]:
            tp = f"{r['throughput']:.3g} {r.get('throughput_unit', '')}" if "throughput" in r else ""
            sp = f"{r['speedup_vs_baseline']:.2f}" if "speedup_vs_baseline" in r else ""
            lines.append(f"| {r['workload']} | {r['impl']} | {r['median_ms']:.4f} | {r['min_ms']:.4f}–{r['max_ms']:.4f} | {tp} | {sp} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    t = table()
    if "--print" in sys.argv:
        print(t)
        return
    readme = ROOT / "README.md"
    text = readme.read_text()
    if BEGIN not in text:
        raise SystemExit(f"README.md has no {BEGIN} marker")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(head + BEGIN + "\n" + t + END + tail)


if __name__ == "__main__":
    main()
