"""Plots of a training run (matplotlib, Agg backend; an edge module)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gyre_hpc.files.io import atomic_write_bytes  # noqa: E402


def reward_curve(rewards: Sequence[float], path: Path, window: int = 3) -> Path:
    """Mean reward per optimizer step, with a trailing moving average over ``window`` steps."""
    import io

    import numpy as np

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = np.arange(len(rewards))
    ax.plot(steps, rewards, "o-", alpha=0.5, label="mean reward of the step's runs")
    if len(rewards) >= window:
        smooth = np.convolve(rewards, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1:], smooth, "-", lw=2, label=f"moving average ({window} steps)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic_write_bytes(path, buf.getvalue())
