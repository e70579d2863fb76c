"""benchmarks/recipe_report.py: the BENCHMARKS.md section of a finished recipe run."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import recipe_report  # noqa: E402


def test_section_lists_validations_averages_and_ensembles(tmp_path):
    log = [{"kind": "train", "update": 10, "loss": 3.0},
           {"kind": "valid", "update": 250, "loss": 2.5, "nll_loss": 1.5, "bracket_f1": 40.5},
           {"kind": "valid", "update": 500, "loss": 2.0, "nll_loss": 1.0, "bracket_f1": 50.25},
           {"kind": "valid_averaged", "update": 500, "checkpoint": "checkpoint_avg_best2.pt",
            "loss": 1.9, "nll_loss": 0.9, "bracket_f1": 51.0},
           {"kind": "valid_ensemble", "update": 500, "checkpoint": "ensemble_best2.txt",
            "bracket_f1": 53.0, "decoded_sentences": 5},
           {"kind": "summary", "update": 500, "seconds": 3600.0, "tgt_tokens_per_s": 1234.0}]
    (tmp_path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    (tmp_path / "f1.txt").write_text("bracket-F1 = 52.0\n")
    out = tmp_path / "B.md"
    out.write_text("# B\n\n<!-- recipe:p -->\nold\n<!-- /recipe:p -->\n")
    recipe_report.main([str(tmp_path), "--name", "P", "--log", "train_log.jsonl",
                        "--scores", "f1.txt", "--test-name", "files 0170-0179",
                        "--command", "run.sh --sample", "--out", str(out), "--marker", "p"])
    text = out.read_text()
    assert "old" not in text and text.count("<!-- recipe:p -->") == 1
    assert "Training: 500 updates in 3,600 s (1.00 h" in text
    assert "| 500 | 2.000 | 1.000 | 50.25 |" in text
    assert "| checkpoint_avg_best2.pt | 1.900 | 0.900 | 51.0 |" in text
    assert "| ensemble_best2.txt | - | - | 53.0 |" in text
    assert "bracket-F1 = 52.0" in text and "files 0170-0179" in text
