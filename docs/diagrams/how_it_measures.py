"""Draws docs/images/how-it-measures.png: the step clock, steady state and contention.

Run from the repository's root: `python docs/diagrams/how_it_measures.py`.
The figures in it are illustrative, not measured.
"""

import pathlib

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

WAIT = "#e8710a"
COMPUTE = "#1a73e8"
APART = "#bdbdbd"
OUT = pathlib.Path(__file__).resolve().parents[1] / "images" / "how-it-measures.png"


def _step(axis, y, start, wait, compute, apart=False, height=0.5):
    wait_color, compute_color = (APART, APART) if apart else (WAIT, COMPUTE)
    axis.barh(y, wait, left=start, height=height, color=wait_color, edgecolor="white")
    axis.barh(y, compute, left=start + wait, height=height, color=compute_color, edgecolor="white")
    return start + wait + compute


def _clock(axis):
    axis.set_title(
        "1. The step clock: every training step, split at the moment its batch is ready",
        loc="left",
        fontsize=11,
    )
    t = 0.0
    t = _step(axis, 1, t, 0.4, 3.2, apart=True)  # the first step traces the function
    axis.text(1.8, 1.45, "first step: tracing,\nreported apart", ha="center", fontsize=8)
    steps = [(2.0, 1.0), (2.1, 1.0), (1.9, 1.0), (2.0, 1.0)]
    first_clocked = t
    for wait, compute in steps:
        t = _step(axis, 1, t, wait, compute)
    epoch = t
    axis.axvline(epoch, color="black", linestyle=":", linewidth=1)
    axis.text(epoch + 0.1, 0.45, "epoch 2 begins", fontsize=8)
    for _ in range(2):  # a new iterator and a refilling shuffle buffer
        t = _step(axis, 1, t, 2.6, 1.0, apart=True)
    axis.text(
        (epoch + t) / 2, 1.45, "first 2 steps of an epoch:\nreported apart", ha="center", fontsize=8
    )
    for wait, compute in steps[:2]:
        t = _step(axis, 1, t, wait, compute)
    # The stamps of one step.
    start = first_clocked
    ready = start + steps[0][0]
    end = ready + steps[0][1]
    for x, name in ((start, "start"), (ready, "ready"), (end, "end")):
        axis.annotate(
            name,
            xy=(x, 0.74),
            xytext=(x, 0.25),
            ha="center",
            fontsize=8,
            arrowprops=dict(arrowstyle="-|>", color="black", linewidth=0.8),
        )
    axis.annotate(
        "", xy=(start, 0.5), xytext=(ready, 0.5), arrowprops=dict(arrowstyle="<->", color=WAIT)
    )
    axis.annotate(
        "", xy=(ready, 0.5), xytext=(end, 0.5), arrowprops=dict(arrowstyle="<->", color=COMPUTE)
    )
    axis.text(
        t + 0.2,
        1,
        "input share =\ntotal wait / total step time\n(steady steps only)",
        va="center",
        fontsize=9,
    )
    axis.set_xlim(-0.2, t + 5.5)
    axis.set_ylim(0, 1.9)


def _contention(axis):
    axis.set_title(
        "2. After training, on the CPU: the same step with input free (cached batches replayed)",
        loc="left",
        fontsize=11,
    )
    t = 0.0
    for _ in range(4):  # the pipeline's threads slow the step: compute looks longer
        t = _step(axis, 1.2, t, 0.3, 2.0)
    axis.text(
        t + 0.2,
        1.2,
        "steps on the real pipeline:\nlittle wait, slow compute",
        va="center",
        fontsize=9,
    )
    real = t
    t = 0.0
    for _ in range(4):
        t = _step(axis, 0.45, t, 0.05, 1.0)
    axis.text(t + 0.2, 0.45, "replayed steps, input free", va="center", fontsize=9)
    axis.text(
        real + 0.2,
        0.0 + 1.85,
        "input cost = 1 - replayed / real\n(it decides when larger than the wait's share)",
        va="top",
        fontsize=9,
    )
    axis.set_xlim(-0.2, real + 9)
    axis.set_ylim(0, 1.9)


def main():
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 5.2), dpi=110)
    _clock(top)
    _contention(bottom)
    for axis in (top, bottom):
        axis.set_yticks([])
        axis.set_xticks([])
        for side in ("left", "right", "top"):
            axis.spines[side].set_visible(False)
        axis.set_xlabel("time", loc="right", fontsize=8)
    figure.legend(
        handles=[
            Patch(color=WAIT, label="input wait"),
            Patch(color=COMPUTE, label="compute"),
            Patch(color=APART, label="one-off cost, reported apart"),
        ],
        loc="lower center",
        ncol=3,
        frameon=False,
        fontsize=9,
    )
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(OUT)
    print(OUT)


if __name__ == "__main__":
    main()
