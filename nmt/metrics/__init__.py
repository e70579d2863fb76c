"""Metrics: sacreBLEU BLEU/chrF/TER, the paper's tokenized compound-split BLEU, EVALB bracket F1."""

from nmt.metrics.evalb import EvalbParams, EvalbResult, evaluate, evaluate_files, format_report
from nmt.metrics.scoring import (METRICS, MetricScore, ScoreOptions, corpus_score, parse_metrics,
                                 sentence_scores)
from nmt.metrics.tok_bleu import multi_bleu, split_compounds, tok_bleu

__all__ = ["EvalbParams", "EvalbResult", "evaluate", "evaluate_files", "format_report", "METRICS",
           "MetricScore", "ScoreOptions", "corpus_score", "parse_metrics", "sentence_scores",
           "multi_bleu", "split_compounds", "tok_bleu"]
