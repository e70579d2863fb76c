"""Choosing checkpoints: the metric's direction, patience, --average-best, and validation
decoding that is exactly nmt-generate + nmt-score."""

import json
import os
import subprocess

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.training import end
from nmt.training.loop import Run, TrainConfig, train
from nmt.training.selection import Selection
from train_support import FakeData, write_reversal_corpus


def run_cfg(tmp, **kw) -> TrainConfig:
    base = dict(arch="transformer_tiny", max_tokens=120, warmup=10, log_interval=1,
                save_dir=str(tmp), device="cpu", save_interval_updates=1)
    base.update(kw)
    return TrainConfig(**base)


def test_selection_direction_ties_and_patience():
    loss = Selection("loss")
    assert loss.observe(1, 3.0) and loss.observe(2, 2.5)
    assert not loss.observe(3, 2.6) and loss.bad_in_a_row == 1
    assert loss.observe(4, 2.5) and loss.best_update == 4      # a tie: the newer wins
    assert loss.bad_in_a_row == 1                               # ... but is no improvement
    assert not loss.observe(5, 9.0) and loss.out_of_patience(2) and not loss.out_of_patience(3)
    assert loss.observe(6, 1.0) and loss.bad_in_a_row == 0
    bleu = Selection("bleu")
    assert bleu.observe(1, 10.0) and not bleu.observe(2, 9.0) and bleu.observe(3, 12.0)
    for u, s in ((1, 10.0), (2, 9.0), (3, 12.0), (4, 12.0)):
        bleu.record_saved(u, s)
    assert bleu.best_updates(2) == [3, 4] and bleu.best_updates(3, {1, 2, 3}) == [1, 2, 3]
    restored = Selection("bleu")
    restored.load_state_dict(bleu.state_dict())
    assert restored.state_dict() == bleu.state_dict()
    other = Selection("loss")
    other.load_state_dict(bleu.state_dict())                    # another metric: afresh
    assert other.best is None


def scripted_validation(monkeypatch, values, key="loss"):
    """Run.validate returns the given scores, one per call, in order."""
    calls = iter(values)

    def validate(self, kind="valid", name=None):
        v = next(calls)
        stats = {"loss": 1.0, "nll_loss": 1.0, "ppl": 2.7, key: v}
        self.jsonl.write({"kind": kind, "update": self.trainer.num_updates, **stats})
        return stats

    monkeypatch.setattr(Run, "validate", validate)


def test_patience_stops_and_names_the_best_checkpoint(tmp_path, monkeypatch):
    scripted_validation(monkeypatch, [5.0, 4.0, 4.5, 4.2, 4.1, 3.0], key="loss")
    out = train(run_cfg(tmp_path, max_update=50, patience=3), FakeData(n_train=40), "fake")
    # saves at updates 1..5: best at 2, then three without improvement -> stop at 5
    assert out == (tmp_path / "checkpoint_best.pt").resolve()
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["progress"]["update"] == 5
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["progress"]["update"] == 2
    # resuming a run that ran out of patience trains nothing more
    train(run_cfg(tmp_path, max_update=50, patience=3), FakeData(n_train=40), "fake")
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["progress"]["update"] == 5


def test_patience_running_out_at_max_update_is_a_finished_run(tmp_path, monkeypatch, caplog):
    """Patience that runs out at the very save --max-update ends on did not stop the run early:
    the end says "finished" (it said "stopped early (--patience)", and a recipe's README
    believed it)."""
    scripted_validation(monkeypatch, [5.0, 4.0, 4.5, 4.2, 4.1], key="loss")
    with caplog.at_level("INFO", logger="nmt.train"):
        train(run_cfg(tmp_path, max_update=5, patience=3), FakeData(n_train=40), "fake")
    text = caplog.text
    assert "finished; " in text and "stopped early" not in text and "stopping:" not in text
    caplog.clear()
    with caplog.at_level("INFO", logger="nmt.train"):      # the same command again
        train(run_cfg(tmp_path, max_update=5, patience=3), FakeData(n_train=40), "fake")
    assert "finished; " in caplog.text and "stopped early" not in caplog.text
    caplog.clear()
    scripted_validation(monkeypatch, [5.0, 4.0, 4.5, 4.2, 4.1], key="loss")
    with caplog.at_level("INFO", logger="nmt.train"):
        train(run_cfg(tmp_path / "b", max_update=6, patience=3), FakeData(n_train=40), "fake")
    assert "stopped early (--patience)" in caplog.text


def test_bleu_is_maximized_and_average_best_keeps_its_checkpoints(tmp_path, monkeypatch):
    scripted_validation(monkeypatch, [10.0, 30.0, 20.0, 25.0, 5.0, 1.0, 2.0], key="bleu")
    monkeypatch.setattr(end, "score_checkpoint", lambda run_end, path: None)
    out = train(run_cfg(tmp_path, max_update=6, best_checkpoint_metric="bleu", keep_last=1,
                        average_best=2), FakeData(n_train=40), "fake")
    assert out.name == "checkpoint_avg_best2.pt"
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["progress"]["update"] == 2
    averaged = load_checkpoint(out)["averaged_from"]
    assert [os.path.basename(p) for p in averaged] == ["checkpoint_2.pt", "checkpoint_4.pt"]
    left = sorted(p.name for p in tmp_path.glob("checkpoint_[0-9]*.pt"))
    assert left == ["checkpoint_2.pt", "checkpoint_4.pt", "checkpoint_6.pt"]   # best 2 + last


def run(args, stdin=None):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, input=stdin, capture_output=True, text=True, env=env,
                          timeout=300)


def train_reversal(tmp_path, updates: int, interval: int, *options: str):
    """nmt-train on the reversal corpus (chrF selection): (save dir, completed process)."""
    data_dir = write_reversal_corpus(tmp_path, run, ())
    save = tmp_path / "ck"
    r = run(["nmt-train", data_dir, "--arch", "transformer_tiny", "-o", "dropout=0",
             "--max-tokens", "100", "--max-update", str(updates), "--warmup", "50",
             "--save-dir", str(save), "--save-interval-updates", str(interval),
             "--best-checkpoint-metric", "chrf", "--threads", "1", *options])
    return save, r


def test_validation_scores_equal_nmt_generate_then_nmt_score(tmp_path):
    # Four validations in 200 updates; the best one by chrF is compared, so that translations
    # are not empty (chrF > 0) whichever CPU's rounding the tiny model's path depends on.
    save, r = train_reversal(tmp_path, 200, 50, "--valid-bleu", "--valid-beam", "3",
                             "--valid-lenpen", "1.0")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str((save / "checkpoint_best.pt").resolve())
    assert "scored against " + str(tmp_path / "valid.yy") in r.stderr      # the raw references
    records = [json.loads(x) for x in (save / "train_log.jsonl").read_text().splitlines()]
    records = [x for x in records if x["kind"] == "valid"]
    assert [x["update"] for x in records] == [50, 100, 150, 200]
    valid = max(records, key=lambda x: (x["chrf"], x["update"]))      # ties: the newer is best
    assert valid["chrf"] > 0
    assert load_checkpoint(save / "checkpoint_best.pt")["progress"]["update"] == valid["update"]
    gen = run(["nmt-generate", str(save / "checkpoint_best.pt"), "--input", str(tmp_path / "valid.xx"),
               "--beam", "3", "--lenpen", "1.0", "--threads", "1", "-q"])
    assert gen.returncode == 0, gen.stderr
    assert len(gen.stdout.splitlines()) == 8
    hyp = tmp_path / "hyp.yy"
    hyp.write_text(gen.stdout)
    for metric in ("bleu", "chrf"):
        sc = run(["nmt-score", "--hyp", str(hyp), "--ref", str(tmp_path / "valid.yy"),
                  "--metric", metric, "--json"])
        assert sc.returncode == 0, sc.stderr
        assert round(json.loads(sc.stdout)["score_exact"], 2) == valid[metric], metric


def test_valid_bleu_with_learned_positions_and_long_sentences(tmp_path):
    # The old validation decoder counted the source's eos in the length limit and never capped
    # at the model's positions: a validation sentence near max_positions crashed it.
    data = FakeData(n_train=30, n_valid=8, max_len=30)
    cfg = run_cfg(tmp_path, max_update=2, valid_bleu=True, max_tokens=400,
                  overrides={"positional": "learned", "max_positions": "12"})
    train(cfg, data, "fake")
    rec = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    valid = [r for r in rec if r["kind"] == "valid"]
    assert len(valid) == 2 and all(r["decoded_sentences"] == 8 for r in valid)


def test_validate_after_updates_skips_early_validations_but_not_the_last(tmp_path, monkeypatch):
    scripted_validation(monkeypatch, [3.0, 2.0, 1.0])
    train(run_cfg(tmp_path, max_update=5, save_interval_updates=2, validate_after_updates=4),
          FakeData(n_train=40), "fake")
    log = [json.loads(line) for line in open(tmp_path / "train_log.jsonl")]
    # saves at 2, 4 and 5 (the end): 2 is before update 4, so only 4 and 5 are validated
    assert [r["update"] for r in log if r["kind"] == "valid"] == [4, 5]
    assert load_checkpoint(tmp_path / "checkpoint_2.pt")["progress"]["update"] == 2


def test_validate_after_updates_must_not_be_negative(tmp_path):
    from nmt.errors import UsageError
    with pytest.raises(UsageError, match="--validate-after-updates must be >= 0"):
        run_cfg(tmp_path, max_update=5, validate_after_updates=-1).check()


def test_final_line_says_when_the_printed_average_is_not_the_best(tmp_path, monkeypatch, caplog):
    scripted_validation(monkeypatch, [10.0, 30.0, 20.0, 25.0, 5.0, 1.0, 2.0], key="bleu")
    monkeypatch.setattr(end, "score_checkpoint", lambda run_end, path: 27.0)
    with caplog.at_level("INFO", logger="nmt"):
        out = train(run_cfg(tmp_path, max_update=6, best_checkpoint_metric="bleu",
                            average_best=2), FakeData(n_train=40), "fake")
    assert out.name == "checkpoint_avg_best2.pt"
    final = [r.getMessage() for r in caplog.records if "best on validation" in r.getMessage()]
    assert len(final) == 1
    assert "best on validation: checkpoint_best.pt" in final[0]
    assert "printed: the average checkpoint_avg_best2.pt" in final[0]


def test_ensemble_best_keeps_lists_and_reports_its_checkpoints(tmp_path, monkeypatch, caplog):
    scripted_validation(monkeypatch, [10.0, 30.0, 20.0, 25.0, 5.0, 1.0, 2.0], key="bleu")
    seen = []

    def validate_ensemble(run_end, paths, name):
        seen.append((list(paths), name))
        return {"bleu": 33.0}

    monkeypatch.setattr(end, "validate_ensemble", validate_ensemble)
    with caplog.at_level("INFO", logger="nmt"):
        out = train(run_cfg(tmp_path, max_update=6, best_checkpoint_metric="bleu", keep_last=1,
                            ensemble_best=3), FakeData(n_train=40), "fake")
    assert out == (tmp_path / "checkpoint_best.pt").resolve()     # one path, as always
    listing = tmp_path / "ensemble_best3.txt"
    names = [os.path.basename(p) for p in listing.read_text().splitlines()]
    assert names == ["checkpoint_2.pt", "checkpoint_3.pt", "checkpoint_4.pt"]
    assert all(os.path.isabs(p) for p in listing.read_text().splitlines())
    assert seen and [p.name for p in seen[0][0]] == names and seen[0][1] == "ensemble_best3.txt"
    left = sorted(p.name for p in tmp_path.glob("checkpoint_[0-9]*.pt"))
    assert left == ["checkpoint_2.pt", "checkpoint_3.pt", "checkpoint_4.pt", "checkpoint_6.pt"]
    final = [r.getMessage() for r in caplog.records if "best on validation" in r.getMessage()]
    assert len(final) == 1 and "best on validation: ensemble_best3.txt" in final[0]
    assert f"nmt-generate $(cat {listing})" in final[0]


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_ensemble_validation_equals_nmt_generate_of_the_listed_checkpoints(tmp_path):
    save, r = train_reversal(tmp_path, 150, 50, "--ensemble-best", "2", "--valid-beam", "3")
    assert r.returncode == 0, r.stderr
    paths = (save / "ensemble_best2.txt").read_text().split()
    assert len(paths) == 2 and all(os.path.exists(p) for p in paths)
    log = [json.loads(x) for x in (save / "train_log.jsonl").read_text().splitlines()]
    ens = [x for x in log if x["kind"] == "valid_ensemble"]
    assert len(ens) == 1 and ens[0]["checkpoint"] == "ensemble_best2.txt"
    gen = run(["nmt-generate", *paths, "--input", str(tmp_path / "valid.xx"), "--beam", "3",
               "--threads", "1", "-q"])
    assert gen.returncode == 0, gen.stderr
    hyp = tmp_path / "hyp.yy"
    hyp.write_text(gen.stdout)
    sc = run(["nmt-score", "--hyp", str(hyp), "--ref", str(tmp_path / "valid.yy"),
              "--metric", "chrf", "--json"])
    assert sc.returncode == 0, sc.stderr
    assert round(json.loads(sc.stdout)["score_exact"], 2) == ens[0]["chrf"]
