"""The training log: JSON lines in the save directory, optional TensorBoard scalars, and a PNG
of the curves at the end."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from nmt.metrics.table import DECODED_LOG_KEYS

log = logging.getLogger("nmt.train")

# Decoding scores of validation records (nmt.training.validate) and their legend labels.
DECODING_METRICS = DECODED_LOG_KEYS


def decoding_log_suffix(stats: dict) -> str:
    """`` | bleu 12.34 | chrf 45.67`` for the decoding scores in ``stats`` (a log line's end)."""
    return "".join(f" | {k} {stats[k]:.2f}" for k in DECODING_METRICS if k in stats)


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
        try:
            self._f.write(json.dumps(clean, sort_keys=False) + "\n")
            self._f.flush()
        except OSError as e:             # a full disk: name the log, not "output"
            from nmt.errors import NmtError
            try:
                self._f.close()          # retries the flush, fails again, closes anyway
            except OSError:
                pass
            self._f = None
            raise NmtError(f"{self.path}: cannot write ({e.strerror or e})") from None

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


# What each kind of train_log.jsonl record sends to TensorBoard, as the tag KIND/KEY.
TENSORBOARD_KEYS = {
    "train": ("loss", "nll_loss", "ppl", "rdrop_kl", "lr", "gnorm", "tgt_tokens_per_s"),
    "valid": ("loss", "nll_loss", "ppl", *DECODING_METRICS),
}
TENSORBOARD_HINT = "pip install 'nmt[tensorboard]' or pip install tensorboard"


class TensorBoardLog:
    """The scalars of train_log.jsonl records, also as TensorBoard events (--tensorboard-logdir).

    Does nothing without a directory, or (after one warning line) without the tensorboard
    package. ``purge_step``: TensorBoard hides the events of earlier runs in the directory
    from this update on (a resumed run replaces what followed its checkpoint; a fresh run,
    ``purge_step=1``, replaces everything)."""

    def __init__(self, logdir: str | os.PathLike | None, purge_step: int | None = None):
        self._w = None
        if not logdir:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            log.warning("--tensorboard-logdir: TensorBoard is not available (%s); training goes "
                        "on without it: %s", e, TENSORBOARD_HINT)
            return
        try:
            self._w = SummaryWriter(log_dir=str(logdir), purge_step=purge_step)
        except OSError as e:
            from nmt.errors import NmtError
            raise NmtError(f"--tensorboard-logdir {logdir}: cannot write "
                           f"({e.strerror or e})") from None

    def write(self, record: dict[str, Any]) -> None:
        """Send the record's scalars at step record['update']; flushed, as the JSON lines."""
        keys = TENSORBOARD_KEYS.get(record.get("kind"), ())
        # A validation that a signal stopped is done again, whole, by the resumed run at the
        # same step: sending both would draw two points there.
        if self._w is None or not keys or record.get("decoding_stopped"):
            return
        for key in keys:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._w.add_scalar(f"{record['kind']}/{key}", float(value), record["update"])
        self._w.flush()

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self._w = None


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


MATPLOTLIB_HINT = ("pip install 'matplotlib>=3.7,<4' (a dependency of nmt that "
                   "pip install --no-deps leaves out)")


def _latest(records: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The records of ``kind`` with a loss, the last one per update (a resumed run logs the
    updates after its checkpoint again), in update order."""
    by_update = {r["update"]: r for r in records
                 if r.get("kind") == kind and r.get("nll_loss") is not None
                 and isinstance(r.get("update"), int)}
    return [by_update[u] for u in sorted(by_update)]


def _xy(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Updates and values of ``key`` (null, written for a non-finite value, becomes NaN)."""
    pts = [(r["update"], r[key]) for r in records if key in r]
    return [u for u, _ in pts], [math.nan if v is None else float(v) for _, v in pts]


def draw_curves(fig, records: list[dict[str, Any]]) -> None:
    """Draw train_log.jsonl records on a matplotlib Figure: losses, learning rate and (when
    validation decoded) BLEU/chrF/bracket F1 against updates, side by side."""
    train, valid = _latest(records, "train"), _latest(records, "valid")
    metrics = [k for k in DECODING_METRICS if any(r.get(k) is not None for r in valid)]
    axes = fig.subplots(1, 3 if metrics else 2, squeeze=True)
    ax = axes[0]
    for recs, name, style in ((train, "train", "-"), (valid, "valid", "o-")):
        for key, label in (("loss", "loss"), ("nll_loss", "nll")):
            if recs:
                ax.plot(*_xy(recs, key), style, label=f"{name} {label}")
    ax.set_xlabel("update")
    ax.set_ylabel("nats per target token")
    ax.legend()
    axes[1].plot(*_xy(train, "lr"), label="learning rate")
    axes[1].set_xlabel("update")
    axes[1].set_ylabel("lr")
    axes[1].legend()
    best = best_update(records)
    if best is not None:
        ax.axvline(best, color="0.4", linestyle="--", label=f"checkpoint_best.pt ({best})")
        ax.legend()
    if metrics:
        for key in metrics:
            axes[2].plot(*_xy(valid, key), "o-", label=f"valid {DECODING_METRICS[key]}")
        if best is not None:
            axes[2].axvline(best, color="0.4", linestyle="--",
                            label=f"checkpoint_best.pt ({best})")
        axes[2].set_xlabel("update")
        axes[2].set_ylabel("score (decoded validation split)")
        axes[2].legend()


def best_update(records: list[dict[str, Any]]) -> int | None:
    """The update whose save is checkpoint_best.pt: the last "best" record (written when a
    save's validation is the best so far). A run resumed from an earlier checkpoint logs
    updates again; the "best" records its predecessor wrote from there on are dropped."""
    best: list[int] = []
    seen = 0
    for r in records:
        u = r.get("update")
        if not isinstance(u, int):
            continue
        if r.get("kind") == "best":
            best.append(u)
        elif r.get("kind") == "train":
            if u <= seen:               # resumed: the updates from u on are done again
                best = [b for b in best if b < u]
            seen = max(seen, u)
    return best[-1] if best else None


def plot_curves(log_path: str | os.PathLike, png_path: str | os.PathLike) -> Path | None:
    """Draw train_log.jsonl into a PNG: training and validation losses, the learning rate and
    the validation decoding scores against updates. None (after one warning line) when
    matplotlib cannot be imported or the picture cannot be written; None when there is
    nothing to draw. Uses matplotlib's Agg canvas directly, so pyplot's global backend is
    left alone, and imports matplotlib only here (``import nmt`` stays fast)."""
    records = read_log(log_path)
    if not _latest(records, "train") and not _latest(records, "valid"):
        return None
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        log.warning("no %s: matplotlib cannot be imported (%s); %s", Path(png_path).name, e,
                    MATPLOTLIB_HINT)
        return None
    from nmt.errors import NmtError
    from nmt.io import atomic_write

    try:
        fig = Figure(figsize=(12, 4), layout="tight")
        FigureCanvasAgg(fig)
        draw_curves(fig, records)
        with atomic_write(png_path, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
    except (NmtError, OSError, ValueError, RuntimeError) as e:
        # The run itself is done and saved: a picture that cannot be drawn is not an error.
        log.warning("no %s: %s", Path(png_path).name, e)
        return None
    return Path(png_path)
