"""The one table of metrics: every metric nmt computes, in the order its commands list them.

Each list of metric names elsewhere is derived from it: ``nmt-score --metric`` offers those that
score decoded text (:data:`SCORE_METRICS`), ``nmt-train --best-checkpoint-metric`` those that
validation logs (:data:`VALIDATION_METRICS`), ``Selection`` reads a metric's log key and
direction, and the training curves plot and print the decoded ones by their display names. A
new metric is one row here (and its computation in nmt.metrics.scoring).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str                 # as on the command line, e.g. "bracket-f1"
    display: str              # in plots and logs, e.g. "bracket F1"
    higher_is_better: bool
    needs_decoding: bool      # scored on translations (else on the model's probabilities)
    log_key: str | None       # key in validation statistics / train_log.jsonl (None: not validated)


TABLE = (
    Metric("loss", "loss", False, False, "loss"),
    Metric("bleu", "BLEU", True, True, "bleu"),
    Metric("chrf", "chrF", True, True, "chrf"),
    Metric("ter", "TER", False, True, None),
    Metric("tok-bleu", "tok-BLEU", True, True, None),
    Metric("multi-bleu", "multi-BLEU", True, True, None),
    Metric("bracket-f1", "bracket F1", True, True, "bracket_f1"),
)
BY_NAME = {m.name: m for m in TABLE}

# nmt-score: the metrics of hypotheses against references.
SCORE_METRICS = tuple(m.name for m in TABLE if m.needs_decoding)
# nmt-train --best-checkpoint-metric: what a validation records.
VALIDATION_METRICS = tuple(m.name for m in TABLE if m.log_key is not None)
# Validation statistics' keys of the decoded metrics -> display name (log lines, curves.png).
DECODED_LOG_KEYS = {m.log_key: m.display for m in TABLE if m.log_key and m.needs_decoding}

__all__ = ["Metric", "TABLE", "BY_NAME", "SCORE_METRICS", "VALIDATION_METRICS",
           "DECODED_LOG_KEYS"]
