"""A decode step's host and device time, drawn from ``benchmarks/host_path.py``'s JSON files: one bar
pair per file (chapter 6's picture of CUDA graphs; notebook 06 draws it from the H100's files in
``docs/data/``).

    python -m chapters.host_path_picture OUT.png LABEL=FILE.json [LABEL=FILE.json ...] [--title T]

For each workload of the files (latency: 1 request; decode: 48) and each file, two bars: the host's
median time per part of the step, stacked in the order the step runs them (the device wait left
out: it is waiting, not work), and the device's time for the forward and the logits
(``forward (device)``). The step's median is written at the end of the host bar.
"""

from __future__ import annotations

import argparse
import json

import matplotlib.pyplot as plt

# The host parts, grouped as a reader of chapter 6 names them, in the order a step runs them.
GROUPS = {
    "schedule": ("schedule",),
    "prepare and copy inputs": ("update_states", "prepare_inputs", "copy_inputs"),
    "launch forward and logits": ("forward", "compute_logits"),
    "sample": ("sampler", "append_tokens"),
    "update_from_output": ("update_from_output",),
    "executor calls": ("executor",),
}
COLOURS = ("#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974", "#64b5cd")
DEVICE_COLOUR = "#333333"


def plot_host_path(runs: list[tuple[str, dict]], title: str = "") -> plt.Figure:
    """The figure for ``runs``: (label, the JSON of ``benchmarks/host_path.py``), top to bottom."""
    workloads = list(runs[0][1]["workloads"])
    fig, axes = plt.subplots(len(workloads), 1, figsize=(9, 1.3 + 1.2 * len(runs) * len(workloads)), squeeze=False)
    for ax, workload in zip(axes[:, 0], workloads):
        labels, y = [], 0.0
        for label, data in reversed(runs):
            parts = data["workloads"][workload]
            left = 0.0
            for (group, keys), colour in zip(GROUPS.items(), COLOURS):
                width = sum(parts[k] for k in keys)
                ax.barh(y + 0.4, width, left=left, height=0.35, color=colour, label=group)
                left += width
            ax.text(left, y + 0.4, f"  step {parts['step']:.2f} ms", va="center", fontsize=8)
            device = parts.get("forward (device)")
            if device is not None:
                ax.barh(y, device, height=0.35, color=DEVICE_COLOUR, label="device: forward and logits")
                ax.text(device, y, f"  {device:.2f} ms", va="center", fontsize=8)
            labels.append((y + 0.2, label))
            y += 1.0
        ax.set_yticks([pos for pos, _ in labels], [label for _, label in labels])
        num = runs[0][1]["workloads"][workload]["num_requests"]
        ax.set_title(f"{workload}: {num} request{'s' if num > 1 else ''}, median of the decode steps", fontsize=10)
        ax.set_xlabel("ms per decode step (upper bar of each pair: host, by part; lower: device)")
    handles, names = axes[0, 0].get_legend_handles_labels()
    unique = dict(zip(names, handles))
    fig.legend(unique.values(), unique.keys(), loc="lower center", ncol=4, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("runs", nargs="+", help="LABEL=FILE.json")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    runs = [(label, json.loads(open(path).read())) for label, path in (run.split("=", 1) for run in args.runs)]
    plot_host_path(runs, args.title).savefig(args.out, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
