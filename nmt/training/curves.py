"""The training log: JSON lines in the save directory, and a PNG of the curves at the end."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("nmt.train")


class JsonlLog:
    """Appends one JSON object per line; each line is flushed so a crash loses nothing."""

    def __init__(self, path: str | os.PathLike | None, append: bool = True):
        self.path = Path(path) if path is not None else None
        self._f = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._f = open(self.path, "a" if append else "w", encoding="utf-8")
            except OSError as e:
                from nmt.errors import NmtError
                raise NmtError(f"{self.path}: cannot write ({e.strerror})") from None

    def write(self, record: dict[str, Any]) -> None:
        if self._f is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                 for k, v in record.items()}
        self._f.write(json.dumps(clean, sort_keys=False) + "\n")
        self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    out = []
    p = Path(path)
    if not p.exists():
        return out
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue   # a line cut by a crash
    return out


def plot_curves(log_path: str | os.PathLike, png_path: str | os.PathLike) -> Path | None:
    """Training and validation loss/perplexity against updates; None if matplotlib is absent."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed (pip install 'nmt[plot]'): no %s", png_path)
        return None
    records = read_log(log_path)
    train = [r for r in records if r.get("kind") == "train" and r.get("nll_loss") is not None]
    valid = [r for r in records if r.get("kind") == "valid" and r.get("nll_loss") is not None]
    if not train and not valid:
        return None
    fig, axes = plt.subplots(1, 3 if any("bleu" in r for r in valid) else 2, figsize=(12, 4))
    ax = axes[0]
    ax.plot([r["update"] for r in train], [r["loss"] for r in train], label="train loss")
    ax.plot([r["update"] for r in train], [r["nll_loss"] for r in train], label="train nll")
    ax.plot([r["update"] for r in valid], [r["loss"] for r in valid], "o-", label="valid loss")
    ax.plot([r["update"] for r in valid], [r["nll_loss"] for r in valid], "o-", label="valid nll")
    ax.set_xlabel("update")
    ax.set_ylabel("nats per target token")
    ax.legend()
    ax = axes[1]
    ax.plot([r["update"] for r in train], [r["lr"] for r in train], label="learning rate")
    ax.set_xlabel("update")
    ax.set_ylabel("lr")
    ax.legend()
    if len(axes) > 2:
        bleu = [r for r in valid if "bleu" in r]
        axes[2].plot([r["update"] for r in bleu], [r["bleu"] for r in bleu], "o-",
                     label="valid BLEU (beam search)")
        axes[2].set_xlabel("update")
        axes[2].legend()
    fig.tight_layout()
    from nmt.io import atomic_write
    with atomic_write(png_path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return Path(png_path)
