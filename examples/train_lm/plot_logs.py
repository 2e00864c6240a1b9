#!/usr/bin/python3
"""Draws the loss curves of several train_lm runs (their log.csv files) in one SVG.

    plot_logs.py OUT.svg LABEL=RUN/log.csv [LABEL=RUN/log.csv ...] [--title TEXT]

Each run gets one colour: its training loss per step as a thin line, its validation loss (the
rows that have one) as a thick line with dots. Python's standard library only.
"""
import csv
import math
import sys
from xml.sax.saxutils import escape

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
W, H = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 40, 60


def read_log(path):
    steps, train, valid = [], [], []
    with open(path, newline="") as f:
        rows = csv.DictReader(f)
        if rows.fieldnames is None or rows.fieldnames[:3] != ["step", "train_loss", "valid_loss"]:
            sys.exit(f"plot_logs.py: '{path}' is not a train_lm log.csv (header {rows.fieldnames})")
        for r in rows:
            steps.append(int(r["step"]))
            train.append(float(r["train_loss"]))
            if r["valid_loss"]:
                valid.append((int(r["step"]), float(r["valid_loss"])))
    if not steps:
        sys.exit(f"plot_logs.py: '{path}' has no rows")
    return steps, train, valid


def nice_ticks(lo, hi, n=6):
    span = hi - lo
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    first = math.ceil(lo / step) * step
    ticks = []
    t = first
    while t <= hi + 1e-9 * span:
        ticks.append(round(t, 10))
        t += step
    return ticks


def main(argv):
    title = "train_lm runs"
    if "--title" in argv:
        i = argv.index("--title")
        if i + 1 >= len(argv):
            sys.exit("plot_logs.py: --title needs a text")
        title = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if len(argv) < 2 or any("=" not in a for a in argv[1:]):
        sys.exit(__doc__)
    out = argv[0]
    runs = [(a.split("=", 1)[0], read_log(a.split("=", 1)[1])) for a in argv[1:]]

    xmax = max(max(steps) for _, (steps, _, _) in runs)
    ys = [y for _, (_, train, valid) in runs for y in train + [v for _, v in valid]]
    ylo, yhi = min(ys), max(ys)
    pad = 0.03 * (yhi - ylo)
    ylo, yhi = ylo - pad, yhi + pad

    def px(x):
        return LEFT + (W - LEFT - RIGHT) * (x - 1) / max(xmax - 1, 1)

    def py(y):
        return TOP + (H - TOP - BOTTOM) * (yhi - y) / (yhi - ylo)

    s = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>']
    for t in nice_ticks(ylo, yhi):
        s.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{LEFT - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for t in nice_ticks(1, xmax):
        s.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{TOP}" y2="{H - BOTTOM}" stroke="#eee"/>')
        s.append(f'<text x="{px(t):.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{t:g}</text>')
    s.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
             'fill="none" stroke="#444"/>')
    s.append(f'<text x="{(LEFT + W - RIGHT) / 2}" y="{H - 22}" text-anchor="middle">step</text>')
    s.append(f'<text transform="translate(18 {(TOP + H - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">'
             'loss (nats per byte)</text>')
    legend = []
    for k, (label, (steps, train, valid)) in enumerate(runs):
        c = COLOURS[k % len(COLOURS)]
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(steps, train))
        s.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="0.8" stroke-opacity="0.55"/>')
        if valid:
            pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in valid)
            s.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2.5"/>')
            s.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{c}"/>' for x, y in valid)
        legend.append((f"{label} train", c, 0.8))
        legend.append((f"{label} validation", c, 2.5))
    text_width = 7 * max(len(text) for text, _, _ in legend)  # about 7 px a character at 12 px
    x = W - RIGHT - 44 - text_width
    s.append(f'<rect x="{x - 6}" y="{TOP + 4}" width="{text_width + 42}" height="{16 * len(legend) + 6}" '
             'fill="white" fill-opacity="0.85" stroke="#ccc"/>')
    for i, (text, c, width) in enumerate(legend):
        y = TOP + 18 + 16 * i
        s.append(f'<line x1="{x}" x2="{x + 24}" y1="{y - 4}" y2="{y - 4}" stroke="{c}" stroke-width="{width}"/>')
        s.append(f'<text x="{x + 30}" y="{y}">{escape(text)}</text>')
    s.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(s) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
