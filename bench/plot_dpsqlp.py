"""An SVG of bench_dpsqlp.py's retained keys: released against true count, one panel per
horizon, every seed's keys (log-log axes, the diagonal = no error); in process or end to
end (`--broker`), as the JSON says. No plotting library.

    .venv/bin/python bench/plot_dpsqlp.py out0.json out1.json ... --svg docs/figures/dpsqlp.svg
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

W, H, PAD = 360, 300, 48
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")


def _panel(x0: int, title: str, points: list[tuple[int, float, int]], lo: float,
           hi: float) -> list[str]:
    def sx(v: float) -> float:
        return x0 + PAD + (math.log10(max(v, lo)) - math.log10(lo)) / (
            math.log10(hi) - math.log10(lo)) * (W - 2 * PAD)

    def sy(v: float) -> float:
        return H - PAD - (math.log10(max(v, lo)) - math.log10(lo)) / (
            math.log10(hi) - math.log10(lo)) * (H - 2 * PAD)

    out = [f'<text x="{x0 + W / 2}" y="18" text-anchor="middle">{title}</text>',
           f'<rect x="{x0 + PAD}" y="{PAD}" width="{W - 2 * PAD}" height="{H - 2 * PAD}" '
           'fill="none" stroke="#888"/>',
           f'<line x1="{sx(lo)}" y1="{sy(lo)}" x2="{sx(hi)}" y2="{sy(hi)}" stroke="#bbb" '
           'stroke-dasharray="4 3"/>']
    decade = 10 ** math.floor(math.log10(lo))
    while decade <= hi:
        if decade >= lo:
            out.append(f'<text x="{sx(decade)}" y="{H - PAD + 14}" text-anchor="middle" '
                       f'font-size="10">{decade:g}</text>')
            out.append(f'<text x="{x0 + PAD - 4}" y="{sy(decade) + 3}" text-anchor="end" '
                       f'font-size="10">{decade:g}</text>')
        decade *= 10
    out.append(f'<text x="{x0 + W / 2}" y="{H - 8}" text-anchor="middle" font-size="11">'
               'true count</text>')
    out.append(f'<text x="{x0 + 12}" y="{H / 2}" font-size="11" transform="rotate(-90 '
               f'{x0 + 12} {H / 2})" text-anchor="middle">released count</text>')
    if not points:
        out.append(f'<text x="{x0 + W / 2}" y="{H / 2}" text-anchor="middle" '
                   'font-size="12">no key retained</text>')
    for n, y, seed in points:
        out.append(f'<circle cx="{sx(n):.1f}" cy="{sy(y):.1f}" r="2" '
                   f'fill="{COLOURS[seed % len(COLOURS)]}" fill-opacity="0.6"/>')
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+")
    ap.add_argument("--svg", required=True)
    a = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for path in a.inputs:
        with open(path) as f:
            rows += json.load(f)["results"]
    horizons = sorted({r["batches"] for r in rows})
    values = [v for r in rows for n, y in r["pairs"] for v in (n, y) if v > 0]
    lo = 10 ** math.floor(math.log10(min(values, default=1.0)))
    hi = 10 ** math.ceil(math.log10(max(values, default=10.0)))
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W * len(horizons)}" '
             f'height="{H}" font-family="sans-serif" font-size="12">',
             f'<rect width="{W * len(horizons)}" height="{H}" fill="white"/>']
    for i, hz in enumerate(horizons):
        mine = [r for r in rows if r["batches"] == hz]
        ticks = mine[0]["ticks"]
        points = [(n, y, r["seed"]) for r in mine for n, y in r["pairs"]]
        how = "end to end, " if any(r.get("mode") == "end-to-end" for r in mine) else ""
        parts += _panel(i * W, f"{hz} batches ({ticks} ticks), {how}seeds "
                        f"{','.join(str(r['seed']) for r in mine)}", points, lo, hi)
    parts.append("</svg>")
    with open(a.svg, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
