"""The example recipes (examples/): dry runs check every command against the real CLIs, tiny
runs go from the shipped fixture archives to BLEU for real, and the download/verify/resume
helpers are tested on their own (a local HTTP server, never the network)."""

from __future__ import annotations

import http.server
import os
import json
import re
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
FIXTURES = ROOT / "tests" / "fixtures" / "examples"
sys.path.insert(0, str(EXAMPLES))

from common import fetch, textprep  # noqa: E402
from common.recipe import Recipe, validate_command  # noqa: E402
from nmt.checkpoint import load_checkpoint  # noqa: E402
from nmt.errors import NmtError  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def run_example(script: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, str(EXAMPLES / script), *map(str, args)],
                       capture_output=True, text=True, env=ENV, timeout=240)
    if check and p.returncode != 0:
        raise AssertionError(f"{script} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def commands(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line and not line.startswith("#")]


def averaged_by(command: str, save_dir: Path, updates: range) -> list[str]:
    """Run the $(...) of a printed `nmt-train --average $(ls ... | sort -V | tail -n N)` with
    bash in ``save_dir`` filled with numbered checkpoints plus checkpoint_best/last.pt."""
    m = re.search(r"--average \$\((.*?)\) --output", command)
    assert m, command
    save_dir.mkdir(parents=True)
    for name in [*(f"checkpoint_{u}.pt" for u in updates), "checkpoint_best.pt",
                 "checkpoint_last.pt", "averaged_last5.pt"]:
        (save_dir / name).touch()
    p = subprocess.run(["bash", "-c", m.group(1)], capture_output=True, text=True, check=True)
    return [Path(x).name for x in p.stdout.split()]


# --- dry runs: the whole chain of commands, each parsed by the real click command -----------

def test_wmt14_en_de_dry_run_base_one_gpu(tmp_path):
    out = run_example("wmt14_en_de/run.py", "--dry-run", "--work-dir", tmp_path / "w").stdout
    cmds = commands(out)
    assert [c.split()[0] for c in cmds] == ["nmt-preprocess", "nmt-train", "nmt-train",
                                           "nmt-generate", "nmt-score"]
    pre, train, avg, gen, score = cmds
    for opt in ("--moses", "--subword bpe", "--joined-dictionary", "--vocab-size 37000",
                "--max-len 250", "--max-len-ratio 1.5"):
        assert opt in pre
    # ~25k tokens per update on 1 GPU: 3125 tokens x update-freq 8.
    for opt in ("--arch transformer_base", "--max-update 100000", "--max-tokens 3125",
                "--update-freq 8"):
        assert opt in train
    assert "tail -n 5" in avg and "--average" in avg
    for opt in ("--beam 4", "--lenpen 0.6", "--max-len-a 1", "--max-len-b 50"):
        assert opt in gen
    assert "--metric tok-bleu,bleu" in score and "--lang de" in score
    # Downloads are described, with the published md5 of the test sets.
    assert "a8cd784e006feb32ac6f3d9ec7eb389a" in out and "europarl-v7" in out
    assert not (tmp_path / "w").exists(), "a dry run must not write anything"
    # Only numbered checkpoints, the last 5 by update (best/last would count one twice).
    assert averaged_by(avg, tmp_path / "w" / "checkpoints-base", range(1400, 15401, 1400)) == \
        [f"checkpoint_{u}.pt" for u in (9800, 11200, 12600, 14000, 15400)]


def test_wmt14_big_models_multi_gpu_dry_run(tmp_path):
    de = commands(run_example("wmt14_en_de/run.py", "--dry-run", "--model", "big", "--gpus", 8,
                              "--stages", "train,average", "--work-dir", tmp_path).stdout)
    assert de[0].startswith("torchrun --standalone --nproc_per_node 8 --no-python nmt-train")
    assert "--arch transformer_big" in de[0] and "--max-update 300000" in de[0]
    assert "--update-freq 1" in de[0] and "dropout" not in de[0]
    assert "tail -n 20" in de[1]
    assert averaged_by(de[1], tmp_path / "checkpoints-big", range(600, 15001, 600)) == \
        [f"checkpoint_{u}.pt" for u in range(3600, 15001, 600)]
    fr = commands(run_example("wmt14_en_fr/run.py", "--dry-run", "--model", "big", "--gpus", 2,
                              "--stages", "preprocess,train", "--work-dir", tmp_path).stdout)
    assert "--subword wordpiece" in fr[0] and "--vocab-size 32000" in fr[0]
    assert "--override dropout=0.1" in fr[1] and "--update-freq 4" in fr[1]


def test_multi30k_dry_run(tmp_path):
    out = run_example("multi30k/run.py", "--dry-run", "--work-dir", tmp_path).stdout
    pre, train, gen, score, lit = commands(out)
    assert "--vocab-size 8000" in pre and "--joined-dictionary" in pre and "--subword bpe" in pre
    for opt in ("--arch transformer_small", "--max-tokens 4096", "--max-update 1000",
                "--warmup 4000", "--threads 2"):
        assert opt in train
    assert "OMP_NUM_THREADS=2" in train
    assert "--beam 4 --lenpen 0.6 --max-len-a 1 --max-len-b 50" in gen
    assert "test_2016_flickr" in gen and "--metric bleu" in score
    assert "--metric multi-bleu --lowercase --lang de" in lit
    assert "raw.githubusercontent.com/multi30k/dataset" in out


def test_multi30k_converge_dry_run_en_fr(tmp_path):
    out = run_example("multi30k/run.py", "--recipe", "converge", "--target", "fr", "--dry-run",
                      "--work-dir", tmp_path).stdout
    pre, train, gen, score, lit = commands(out)
    assert "-s en -t fr" in pre and "val.fr" in out and "test_2016_flickr.fr" in out
    for opt in ("--arch transformer_small --override dropout=0.3", "--max-update 3000", "--warmup 1000",
                "--lr-scale 1.5", "--average-last 5", "--valid-bleu"):
        assert opt in train
    assert "checkpoints-converge/checkpoint_avg5.pt" in gen and "hyp.fr" in gen
    assert "--metric bleu,chrf,tok-bleu --lang fr" in score
    assert "--metric multi-bleu --lowercase --lang fr" in lit


def test_multi30k_base_dry_run(tmp_path):
    out = run_example("multi30k/run.py", "--recipe", "base", "--dry-run",
                      "--work-dir", tmp_path).stdout
    pre, train, gen, score, lit = commands(out)
    assert "--vocab-size 8000" in pre
    for opt in ("--arch transformer_base --override pre_norm=true --override dropout=0.1", "--max-tokens 2500",
                "--max-update 600", "--warmup 200", "--lr-scale 0.32",
                "--save-interval-updates 100"):
        assert opt in train
    assert "--max-tokens 4096" not in train and "--average-last" not in train
    assert "checkpoints-base/checkpoint_last.pt" in gen
    assert "--beam 4 --lenpen 0.6" in gen


def test_multi30k_literature_dry_run(tmp_path):
    out = run_example("multi30k/run.py", "--recipe", "literature", "--dry-run",
                      "--work-dir", tmp_path).stdout
    pre, train, *tuning, gen, _, lit = commands(out)
    assert "--vocab-size 10000" in pre and "data-bin-10000" in train
    # beam and alpha are chosen on the validation split, scored as the literature scores
    assert len(tuning) == 12 and all("raw/val." in c for c in tuning)
    assert all("checkpoint_avg10.pt" in c for c in tuning[::2])
    assert "--beam 5 --lenpen 1.5" in tuning[10] and "--lowercase" in tuning[11]
    assert "test_2016" not in " ".join(tuning)
    assert "--keep-last 12" in train and "[average-" not in out
    # --tune-windows: the averages of the last N are tried as well (the run writes its own 10)
    out = run_example("multi30k/run.py", "--recipe", "literature", "--dry-run",
                      "--work-dir", tmp_path, "--tune-windows", "5,10,12").stdout
    tuning = [c for c in commands(out) if "raw/val." in c]
    assert len(tuning) == 36 and "checkpoint_avg5.pt" in tuning[0]
    assert "checkpoint_avg12.pt" in tuning[34] and "--beam 5 --lenpen 1.5" in tuning[34]
    for w in (5, 12):
        assert f"# [average-checkpoints-literature-{w}] average the last {w} " in out
    assert "[average-checkpoints-literature-10]" not in out
    for opt in ("--arch transformer_tiny --override encoder_layers=4 --override decoder_layers=4 --override d_model=128 "
                "--override d_ff=256 --override heads=4 --override dropout=0.3", "--max-update 8000", "--warmup 2000",
                "--lr-scale 2.53", "--average-last 10", "--validate-interval-updates 1000"):
        assert opt in train
    assert "checkpoints-literature/checkpoint_avg10.pt" in gen
    assert "--metric multi-bleu --lowercase --lang de" in lit


def test_multi30k_literature_rdrop_dry_run(tmp_path):
    out = run_example("multi30k/run.py", "--recipe", "literature-rdrop", "--dry-run",
                      "--work-dir", tmp_path).stdout
    pre, train, *tuning, gen, _, lit = commands(out)
    # the plain recipe's data and schedule; batches of 2,048 tokens, each passed twice
    assert "--vocab-size 10000" in pre and "data-bin-10000 " in train + " "
    for opt in ("--rdrop-alpha 5.0", "--max-tokens 2048", "--max-update 8000",
                "--lr-scale 2.53", "--average-last 10"):
        assert opt in train
    # the wider grid: alpha 2.0 added
    assert len(tuning) == 16 and all("raw/val." in c for c in tuning)
    assert "--beam 5 --lenpen 2.0" in tuning[14] and "test_2016" not in " ".join(tuning)
    assert "checkpoints-literature-rdrop/checkpoint_avg10.pt" in gen
    assert "--metric multi-bleu --lowercase --lang de" in lit
    plain = commands(run_example("multi30k/run.py", "--recipe", "literature", "--dry-run",
                                 "--work-dir", tmp_path).stdout)[1]
    assert "--rdrop-alpha" not in plain and "--max-tokens 4096" in plain


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_multi30k_tiny_end_to_end_en_fr(tmp_path):
    p = run_example("multi30k/run.py", "--tiny", "--target", "fr", "--work-dir", tmp_path)
    assert "BLEU|nrefs:1" in p.stdout and "chrF2" in p.stdout
    assert fetch.count_lines(tmp_path / "results-tiny" / "test_2016_flickr.hyp.fr") == 15


def test_validate_command_rejects_bad_options():
    validate_command(["nmt-train", "d", "--max-update", "5", "--override", "dropout=0.1"])
    with pytest.raises(NmtError, match="no such option --max-updates"):
        validate_command(["nmt-train", "d", "--max-updates", "5"])
    with pytest.raises(NmtError, match="--subword"):
        validate_command(["nmt-preprocess", "-s", "en", "-t", "de", "--subword", "bpe2"])
    with pytest.raises(NmtError, match="beam"):
        validate_command(["torchrun", "--no-python", "nmt-generate", "a.pt", "--beam", "four"])


# --- tiny runs: everything for real on the fixtures ------------------------------------------

@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_wmt14_en_de_tiny_end_to_end_and_resume(tmp_path):
    work = tmp_path / "w"
    p = run_example("wmt14_en_de/run.py", "--tiny", "--jobs", 1, "--work-dir", work)
    assert "tok-BLEU" in p.stdout and "BLEU|nrefs:1" in p.stdout
    text = work / "text"
    # Empty training pair dropped (3 corpora x 20 lines, one with an empty side).
    assert fetch.count_lines(text / "train.en") == fetch.count_lines(text / "train.de") == 59
    # Test set: every segment kept; the reference exactly as sacreBLEU extracts it.
    ref = (text / "test.ref.de").read_text(encoding="utf-8").splitlines()
    assert len(ref) == 12 and "Leute Reparieren" in ref[4]
    hyp = work / "results-tiny" / "newstest2014.hyp.de"
    assert fetch.count_lines(hyp) == 12
    assert (work / "checkpoints-tiny" / "averaged_last2.pt").is_file()
    # Second run: every stage is complete and skipped; the scores are printed again.
    again = run_example("wmt14_en_de/run.py", "--tiny", "--jobs", 1, "--work-dir", work)
    assert again.stderr.count("already complete, skipping") == 16
    assert "$ nmt-" not in again.stderr and "tok-BLEU" in again.stdout
    # A changed input redoes the step that reads it; its failure is one line, no traceback.
    with open(text / "test.ref.de", "a", encoding="utf-8") as f:
        f.write("one line too many\n")
    third = run_example("wmt14_en_de/run.py", "--tiny", "--jobs", 1, "--work-dir", work,
                        "--stages", "score", check=False)
    assert "$ nmt-score" in third.stderr and "Traceback" not in third.stderr
    assert third.returncode == 1 and "command failed with exit code" in third.stderr


def test_wmt14_en_fr_tiny_data_and_preprocess(tmp_path):
    # giga-fren's .gz members inside a .tar, the UN corpus, wordpiece: up to binarization.
    run_example("wmt14_en_fr/run.py", "--tiny", "--jobs", 1, "--work-dir", tmp_path,
                "--stages", "data,preprocess")
    assert fetch.count_lines(tmp_path / "text" / "train.fr") == 100
    assert (tmp_path / "orig" / "giga-fren.release2.fixed.en").read_text().count("\n") == 20
    assert (tmp_path / "data-bin" / "meta.json").is_file()


@pytest.mark.slow
def test_wmt14_en_fr_tiny_end_to_end(tmp_path):
    p = run_example("wmt14_en_fr/run.py", "--tiny", "--jobs", 1, "--work-dir", tmp_path)
    assert "tok-BLEU" in p.stdout
    assert "the paper (Table 2), transformer_base: tok-BLEU 38.1" in p.stdout


@pytest.mark.parametrize("per_update,gpus,cap,expected", [
    (25000, 1, 3125, (3125, 8)),         # the defaults: 8 x 3,125
    (25000, 8, 3125, (3125, 1)),
    (25000, 2, 3125, (3125, 4)),
    (25000, 1, 4096, (3572, 7)),         # 7 x 3,572 = 25,004, not 7 x 4,096 = 28,672
    (25000, 4, 5000, (3125, 2)),
])
def test_wmt14_update_is_split_evenly_under_the_cap(per_update, gpus, cap, expected):
    from common.wmt14 import update_batches

    max_tokens, update_freq = update_batches(per_update, gpus, cap)
    assert (max_tokens, update_freq) == expected
    assert max_tokens <= cap
    assert per_update <= gpus * max_tokens * update_freq < per_update + gpus * update_freq


def test_wmt14_a_micro_batch_larger_than_the_update_is_refused(tmp_path):
    p = run_example("wmt14_en_de/run.py", "--dry-run", "--gpus", 8, "--max-tokens", 6000,
                    "--stages", "train", "--work-dir", tmp_path, check=False)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "--gpus 8 x --max-tokens 6000 = 48,000 tokens per update" in p.stderr
    assert "lower --max-tokens to 3125" in p.stderr


@pytest.mark.slow        # two tiny trainings and their decodings, about 30 s
def test_multi30k_seeds_report_the_ensemble_beside_the_single_model(tmp_path):
    p = run_example("multi30k/run.py", "--tiny", "--seeds", 2, "--work-dir", tmp_path)
    single, ensemble = tmp_path / "results-tiny", tmp_path / "results-tiny-ensemble2"
    for results in (single, ensemble):
        assert fetch.count_lines(results / "test_2016_flickr.hyp.de") == 15
        assert (results / "tuning.json").is_file() and (results / "scores.txt").is_file()
    seed2 = load_checkpoint(tmp_path / "checkpoints-tiny-seed2" / "checkpoint_last.pt")
    assert seed2["train_config"]["seed"] == 2
    # both results printed, the single model's first
    assert p.stdout.count("BLEU|nrefs:1") == 2
    assert p.stdout.index("ensemble of 2 seeds:") > p.stdout.index("BLEU|nrefs:1")
    # the ensemble is tuned and decoded with both checkpoints
    decode = next(line for line in p.stderr.splitlines() if "nmt-generate" in line
                  and "results-tiny-ensemble2/test_2016_flickr" in line)
    assert "checkpoints-tiny/checkpoint_last.pt" in decode
    assert "checkpoints-tiny-seed2/checkpoint_last.pt" in decode


def test_multi30k_tiny_end_to_end(tmp_path):
    p = run_example("multi30k/run.py", "--tiny", "--work-dir", tmp_path)
    assert "BLEU|nrefs:1" in p.stdout
    assert fetch.count_lines(tmp_path / "results-tiny" / "test_2016_flickr.hyp.de") == 15
    # the tune stage decoded val with each setting and the test set with the best one
    tuning = json.loads((tmp_path / "results-tiny" / "tuning.json").read_text())
    assert [(x["beam"], x["alpha"]) for x in tuning["rows"]] == [(1, 0.6), (2, 1.0)]
    best = tuning["best"]
    assert best == max(tuning["rows"], key=lambda x: x["multi_bleu"])
    assert f"--beam {best['beam']} --lenpen {best['alpha']}" in \
        next(line for line in p.stderr.splitlines() if "nmt-generate" in line
             and "test_2016_flickr.en" in line)
    # an alpha at the top of the grid is chosen with a warning that val may rise past it
    assert ("is the largest the tune grid tries" in p.stderr) == (best["alpha"] == 1.0), \
        p.stderr


def test_multi30k_tune_grid_from_the_command_line(tmp_path):
    def tuned(*extra):
        out = run_example("multi30k/run.py", "--recipe", "literature", "--dry-run",
                          "--work-dir", tmp_path, *extra).stdout
        return [re.search(r"--beam (\d+) --lenpen ([\d.]+)", c).groups()
                for c in commands(out) if "nmt-generate" in c and "raw/val.en" in c]

    assert tuned() == [(b, a) for b in ("4", "5") for a in ("0.6", "1.0", "1.5")]
    assert tuned("--tune-alphas", "1.5,2.5,3") == [
        (b, a) for b in ("4", "5") for a in ("1.5", "2.5", "3.0")]
    assert tuned("--tune-beams", "4,8", "--tune-alphas", "2,2.5") == [
        (b, a) for b in ("4", "8") for a in ("2.0", "2.5")]
    out = run_example("multi30k/run.py", "--recipe", "literature", "--dry-run", "--work-dir",
                      tmp_path, "--tune-windows", "12,10,12", "--tune-beams", "4",
                      "--tune-alphas", "1").stdout
    assert [re.search(r"checkpoint_avg(\d+)\.pt", c).group(1) for c in commands(out)
            if "nmt-generate" in c and "raw/val.en" in c] == ["12", "10"]
    # --tiny's own grid stays the base of a grid given in part
    out = run_example("multi30k/run.py", "--tiny", "--dry-run", "--work-dir", tmp_path / "t",
                      "--tune-alphas", "0.6,2").stdout
    assert [re.search(r"--beam (\d+) --lenpen ([\d.]+)", c).groups() for c in commands(out)
            if "nmt-generate" in c and "raw/val.en" in c] == [
        (b, a) for b in ("1", "2") for a in ("0.6", "2.0")]
    # a recipe without a grid tunes around its own decoding pair (beam 4, alpha 0.6)
    out = run_example("multi30k/run.py", "--recipe", "converge", "--dry-run", "--work-dir",
                      tmp_path / "c", "--tune-beams", "4,5").stdout
    assert [c for c in commands(out) if "raw/val.en" in c and "--beam 5 --lenpen 0.6" in c]
    for bad, words in ((("--tune-beams", "0"), "0 is not a beam"),
                       (("--tune-windows", "5,0"), "0 is not a number of checkpoints"),
                       (("--tune-windows", "2.5"), "expected comma-separated whole numbers"),
                       (("--tune-alphas", "x"), "expected comma-separated numbers"),
                       (("--tune-alphas", "11"), "11.0 is not a length-penalty alpha")):
        p = run_example("multi30k/run.py", "--dry-run", "--work-dir", tmp_path, *bad,
                        check=False)
        assert p.returncode == 2 and words in p.stderr, p.stderr


@pytest.mark.slow        # 20-45 s; CI runs it (.ci/run: -m slow)
def test_multi30k_other_test_sets_are_decoded_once_each_with_the_tuned_pair(tmp_path):
    run_example("multi30k/run.py", "--tiny", "--work-dir", tmp_path)
    # a set added to the finished folder: only it is fetched, translated and scored
    p = run_example("multi30k/run.py", "--tiny", "--test-sets", "test_2016_flickr,heldout",
                    "--work-dir", tmp_path)
    ran = [line.split("| recipe | $ ")[1] for line in p.stderr.splitlines() if " | $ " in line]
    assert len(ran) == 3 and all("heldout" in c for c in ran), ran
    assert (tmp_path / "test-sets" / "heldout.en").is_file()
    assert not (tmp_path / "raw" / "heldout.en").exists()
    results = tmp_path / "results-tiny"
    assert fetch.count_lines(results / "test_2016_flickr.hyp.de") == 15
    assert fetch.count_lines(results / "heldout.hyp.de") == 10
    for name in ("scores.txt", "scores-multi-bleu.txt", "scores.heldout.txt",
                 "scores-multi-bleu.heldout.txt"):
        assert (results / name).stat().st_size > 0
    # each set's scores printed under its name, in the order given
    assert p.stdout.index("test_2016_flickr:") < p.stdout.index("heldout:")
    assert p.stdout.count("BLEU|nrefs:1") == 2 and p.stdout.count("multi-BLEU|") == 2
    best = json.loads((results / "tuning.json").read_text())["best"]
    assert f"--beam {best['beam']} --lenpen {best['alpha']}" in ran[0]
    again = run_example("multi30k/run.py", "--tiny", "--test-sets", "heldout,test_2016_flickr",
                        "--work-dir", tmp_path)
    assert " | $ " not in again.stderr
    assert again.stdout.index("heldout:") < again.stdout.index("test_2016_flickr:")


@pytest.mark.parametrize("value,message", [
    ("val", "val is not a test set"),
    ("test_2016_flickr,train", "train is not a test set"),
    ("../secret", "is not a file name stem"),
    (",", "needs at least one name"),
])
def test_multi30k_test_sets_refuses_what_is_not_a_test_set(tmp_path, value, message):
    p = run_example("multi30k/run.py", "--dry-run", "--test-sets", value, "--work-dir",
                    tmp_path, check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert message in p.stderr.strip().splitlines()[-1]


def test_multi30k_other_test_sets_dry_run(tmp_path):
    out = run_example("multi30k/run.py", "--recipe", "literature", "--dry-run", "--test-sets",
                      "test_2016_flickr,test_2017_flickr,test_2017_mscoco", "--work-dir",
                      tmp_path).stdout
    for name in ("test_2017_flickr.en", "test_2017_mscoco.de"):
        assert f"raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{name}.gz" \
            in out
    gen = [c for c in commands(out) if " nmt-generate " in c and "/val." not in c]
    assert [c.split("--input ")[1].split()[0].rsplit("/", 1)[1] for c in gen] == [
        "test_2016_flickr.en", "test_2017_flickr.en", "test_2017_mscoco.en"]
    assert sum("--metric multi-bleu --lowercase --lang de" in c and "/val." not in c
               for c in commands(out)) == 3


def test_multi30k_a_test_set_of_ones_own_comes_from_the_folder_only(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("m30k_run", EXAMPLES / "multi30k" / "run.py")
    m30k = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = m30k          # (its dataclasses look their module up)
    try:
        spec.loader.exec_module(m30k)
    finally:
        del sys.modules[spec.name]
    # not a set of the release: never downloaded, refused before anything runs
    with pytest.raises(NmtError, match="mytest is not a test set of the Multi30k release"):
        m30k.test_set_names("test_2016_flickr,mytest", have_folder=False)
    assert m30k.test_set_names("test_2017_mscoco", have_folder=False) == ["test_2017_mscoco"]
    with pytest.raises(NmtError, match="mytest.en is not a file of the Multi30k release"):
        m30k.get_raw("mytest.en", tmp_path / "mytest.en", None, verify=False)
    # from a folder: taken as it is (nothing to check it against)
    src = tmp_path / "src"
    src.mkdir()
    (src / "mytest.en").write_text("a\nb\n")
    m30k.get_raw("mytest.en", tmp_path / "mytest.en", src, verify=False)
    assert (tmp_path / "mytest.en").read_text() == "a\nb\n"
    # the release's other test sets are checked like the rest: lines and sha256
    (src / "test_2017_mscoco.de").write_text("a\n" * 460)
    with pytest.raises(NmtError, match="460 lines, sha256 .* expected 461 lines"):
        m30k.get_raw("test_2017_mscoco.de", tmp_path / "t.de", src, verify=True)
    assert not (tmp_path / "t.de").exists()
    # a missing file of one's own is named in a one-line error
    p = run_example("multi30k/run.py", FIXTURES / "multi30k", "--no-verify", "--stages", "data",
                    "--test-sets", "mytest", "--work-dir", tmp_path / "w", check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "has neither mytest.en nor mytest.en.gz" in p.stderr.strip().splitlines()[-1]


def test_multi30k_rejects_a_copy_that_is_not_the_release(tmp_path):
    # The fixtures are excerpts: line counts and sha256 differ from the real files.
    p = run_example("multi30k/run.py", FIXTURES / "multi30k", "--work-dir", tmp_path,
                    "--stages", "data", check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "train.en: 150 lines" in p.stderr and "expected 29000" in p.stderr


def test_wmt14_missing_local_archive_is_one_line_error(tmp_path):
    p = run_example("wmt14_en_de/run.py", "--data-dir", tmp_path, "--work-dir", tmp_path / "w",
                    "--stages", "data", check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "training-parallel-europarl-v7.tgz not found in" in p.stderr


# --- helpers ------------------------------------------------------------------------------------

def _tiny_tgz(tmp_path: Path) -> Path:
    arch = tmp_path / "training-parallel-nc-v12.tgz"
    with tarfile.open(arch, "w:gz") as tar:
        tar.add(FIXTURES / "wmt14" / arch.name / "training", arcname="training")
    return arch


def test_extract_detects_truncated_archive_and_missing_members(tmp_path):
    arch = _tiny_tgz(tmp_path)
    names = ["news-commentary-v12.de-en.en", "news-commentary-v12.de-en.de"]
    files = fetch.extract_members(arch, names, tmp_path / "out")
    counts = fetch.check_line_counts(files, parallel=[tuple(names)])
    assert counts == {names[0]: 20, names[1]: 20}
    with pytest.raises(NmtError, match="not in the archive: nope"):
        fetch.extract_members(arch, ["nope"], tmp_path / "out2")
    data = arch.read_bytes()
    arch.write_bytes(data[: len(data) - 40])     # cut the gzip trailer (CRC) and some data
    with pytest.raises(NmtError, match="corrupt or truncated"):
        fetch.extract_members(arch, names, tmp_path / "out3")


def test_line_count_checks(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("1\n2\n3\n")
    b.write_text("1\n2\n3")                      # no final newline still counts
    assert fetch.check_line_counts({"a": a, "b": b}, {"a": 3}, [("a", "b")]) == {"a": 3, "b": 3}
    b.write_text("1\n2\n")
    with pytest.raises(NmtError, match="parallel files do not match"):
        fetch.check_line_counts({"a": a, "b": b}, parallel=[("a", "b")])
    with pytest.raises(NmtError, match="expected 4"):
        fetch.check_line_counts({"a": a}, {"a": 4})


def test_sgm_segments_match_sacrebleu_extraction():
    path = FIXTURES / "wmt14" / "test-full.tgz" / "test-full" / "newstest2014-deen-src.en.sgm"
    segs = fetch.sgm_segments(path)
    assert len(segs) == 12
    assert all(s == " ".join(s.split()) for s in segs)   # whitespace collapsed and stripped
    import re
    raw = [line for line in path.read_text(encoding="utf-8").splitlines()
           if line.startswith("<seg ")]
    # sacrebleu's FakeSGMLDataset: regex substitution then whitespace clean-up.
    want = [re.sub(r"\s+", " ", re.sub(r"<seg.*?>(.*)</seg>.*?", "\\1", x).strip()) for x in raw]
    assert segs == want


def test_clean_line_normalises_and_drops_control_characters():
    assert textprep.clean_line("„Hallo“  Welt\u200b !", "de") == '"Hallo" Welt !'
    assert textprep.remove_non_printing("a\x07b") == "a b"


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    payload = b""
    cut_first = False      # first response stops early (a dropped connection)
    calls: list = []

    def do_GET(self):  # noqa: N802
        rng = self.headers.get("Range")
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        type(self).calls.append(start)
        body = self.payload[start:]
        self.send_response(206 if rng else 200)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(self.payload) - 1}/"
                                              f"{len(self.payload)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if type(self).cut_first and len(type(self).calls) == 1:
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_download_resumes_after_a_dropped_connection(tmp_path, monkeypatch):
    payload = os.urandom(300_000)
    _RangeHandler.payload, _RangeHandler.cut_first, _RangeHandler.calls = payload, True, []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(fetch.time, "sleep", lambda s: None)
    try:
        url = f"http://127.0.0.1:{server.server_port}/f.tgz"
        dest = tmp_path / "f.tgz"
        fetch.download(url, dest, retries=3, timeout=10)
        assert dest.read_bytes() == payload and not (tmp_path / "f.tgz.part").exists()
        assert _RangeHandler.calls[0] == 0 and _RangeHandler.calls[1] > 0   # resumed, not redone
        # obtain(): md5 checked; a wrong one deletes the download and says so.
        import hashlib
        fetch.obtain(url, dest, None, {"md5": hashlib.md5(payload).hexdigest()})
        with pytest.raises(NmtError, match="md5 of the download"):
            fetch.obtain(url, dest, None, {"md5": "0" * 32})
        assert not dest.exists()
    finally:
        server.shutdown()
        server.server_close()


def test_recipe_markers_redo_on_changed_outputs_or_params(tmp_path):
    runs = []

    def make(out: Path):
        def act():
            runs.append(out.name)
            out.write_text("x")
        return act

    r = Recipe(tmp_path)
    out = tmp_path / "o.txt"
    assert r.step("s", [out], make(out), params={"a": 1}, python=True)
    assert not r.step("s", [out], make(out), params={"a": 1}, python=True)
    out.write_text("longer")                      # changed output -> redo
    assert r.step("s", [out], make(out), params={"a": 1}, python=True)
    assert r.step("s", [out], make(out), params={"a": 2}, python=True)   # changed params
    assert runs == ["o.txt"] * 3
    with pytest.raises(NmtError, match="did not produce"):
        r.step("t", [tmp_path / "never"], lambda: None, python=True)
    assert not r.marker("t").exists()


def test_recipe_on_stale_refuses_a_changed_finished_step_only(tmp_path):
    out, refusals, runs = tmp_path / "o.txt", [], []

    def refuse():
        refusals.append(1)
        if (tmp_path / "finished").exists():
            raise NmtError("finished elsewhere")

    def act():
        runs.append(1)
        out.write_text("x")

    def step(force=False, **params):
        return Recipe(tmp_path, force=force).step("s", [out], act, params=params,
                                                  on_stale=refuse, python=True)
    assert step(a=1) and refusals == []                    # first run: nothing to refuse
    (tmp_path / "finished").write_text("")
    assert not step(a=1) and step(force=True, a=1)         # unchanged, even with --force
    assert refusals == []
    with pytest.raises(NmtError, match="finished elsewhere"):
        step(a=2)
    assert r_marker_exists(tmp_path)                       # refused: the old marker stays
    (tmp_path / "finished").unlink()                       # the user deletes the old run
    with pytest.raises(KeyboardInterrupt):                 # the new run is interrupted ...
        Recipe(tmp_path).step("s", [out], lambda: (_ for _ in ()).throw(KeyboardInterrupt()),
                              params={"a": 2}, on_stale=refuse, python=True)
    (tmp_path / "finished").write_text("")                 # ... after writing its checkpoint
    assert step(a=2) and runs == [1, 1, 1]                 # and resumes, not refused


def r_marker_exists(work: Path) -> bool:
    return Recipe(work).marker("s").exists()


# --- parsing_wsj/run.sh (bash) -------------------------------------------------------------

PARSING_RUN_SH = str(EXAMPLES / "parsing_wsj" / "run.sh")


def parsing_run_sh(*args, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", PARSING_RUN_SH, *map(str, args)], capture_output=True,
                          text=True, env=ENV, timeout=timeout)


def test_parsing_run_sh_dry_run_commands_are_valid(tmp_path):
    import shlex
    p = subprocess.run(["bash", str(EXAMPLES / "parsing_wsj" / "run.sh"), "--dry-run", "--gpus",
                        "2", "/data/treebank_3/parsed/mrg/wsj", str(tmp_path / "w")],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 0, p.stderr
    cmds = commands(p.stdout)
    assert len(cmds) == 6 and not (tmp_path / "w").exists()
    assert "--split train=0200-2199 --split valid=2200-2299 --split test=2300-2399" in cmds[0]
    assert "--subword none --vocab-size 16000" in cmds[1]
    assert cmds[2].startswith("torchrun --standalone --nproc_per_node 2")
    assert "--arch transformer_parse" in cmds[2] and "--update-freq 4" in cmds[2]
    assert "--beam 21 --lenpen 0.3 --max-len-a 1 --max-len-b 300" in cmds[3]
    assert "--metric bracket-f1" in cmds[5]
    for c in cmds:
        words = shlex.split(c.split(" > ")[0])
        validate_command(words)        # options and values accepted by the real CLIs


def test_parsing_run_sh_sample_dry_run(tmp_path):
    """--sample: the free ptb-sample's splits, lexicalized trees over a joined word vocabulary
    with signatures for rare words, transformer_small selected by validation bracket F1, the
    test decoded with and without tree constraints by the ensemble of the 5 best checkpoints
    that nmt-train lists."""
    import shlex
    script = str(EXAMPLES / "parsing_wsj" / "run.sh")
    work = tmp_path / "w"
    p = subprocess.run(["bash", script, "--dry-run", "--sample", "/data/ptb-sample", str(work)],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 0, p.stderr
    cmds = commands(p.stdout)
    assert len(cmds) == 9 and not work.exists()
    prepare, preprocess, train, gen, delin, score, gen_free, delin_free, score_free = cmds
    assert prepare.endswith(f"/data/ptb-sample {work}/text --split train=0001-0159 "
                            "--split valid=0160-0169 --split test=0170-0179 --leaves words "
                            "--signatures 2 --substitute 2")
    # valid.gold (written by prepare.py into WORK/text) lies beside the valid split's files,
    # where meta.json's source_path points: validation scores bracket F1 against it.
    assert preprocess.startswith("nmt-preprocess -s sig -t lin ")
    assert f"--validpref {work}/text/valid " in preprocess
    assert "--subword none --joined-dictionary --threshold 4" in preprocess
    assert "--vocab-size" not in preprocess
    for opt in ["--arch transformer_small", "--override dropout=0.3", "--max-update 6250",
                "--max-tokens 4096", "--best-checkpoint-metric bracket-f1", "--valid-beam 4",
                "--lr-period 750",
                "--valid-lenpen 1.0 --valid-max-len-a 1 --valid-max-len-b 300",
                "--validate-after-updates 1000", "--patience 10",
                "--ensemble-best 5", "--device cpu --threads 2",
                f"> {work}/results/checkpoint.txt"]:
        assert opt in train, opt
    # a fixed number of updates, the same model on any machine: no time cap
    assert "--max-time" not in train
    assert "torchrun" not in train
    listing = f"{work}/checkpoints/ensemble_best5.txt"
    assert f"listed in {listing}" in p.stdout
    for g in (gen, gen_free):
        # the sources with signatures in, the trees over the words themselves; alpha 1.0,
        # chosen on validation F1, where the full treebank keeps section 6.3's 0.3
        assert g.startswith(f"nmt-generate $(cat {listing}) --input {work}/text/test.sig ")
        assert "--beam 21 --lenpen 1.0 --max-len-a 1 --max-len-b 300" in g
    for d in (delin, delin_free):
        assert f"delinearize.py {work}/text/test.words " in d
    assert "--no-tree-constraints" in gen_free and "--no-tree-constraints" not in gen
    assert "--tags" in delin and f"2> {work}/results/repairs.txt" in delin
    assert f"2> {work}/results/repairs.free.txt" in delin_free
    assert f"--ref {work}/text/test.gold" in score and "--metric bracket-f1" in score
    assert "test.free.trees" in score_free and "bracket_f1.free.txt" in score_free
    for c in cmds:
        validate_command(shlex.split(c.split(" > ")[0]))
    short = subprocess.run(["bash", script, "--dry-run", "--sample", "/data/ptb-sample",
                            "--max-update", "10"], capture_output=True, text=True, env=ENV,
                           timeout=60)
    assert short.returncode == 0 and "--max-update 10 " in short.stdout
    assert "parsing_wsj_sample/text" in short.stdout          # the default work folder


# The default run has the Multi30k chain end to end; CI runs this one (.ci/run: -m slow).
@pytest.mark.slow        # 20-45 s
def test_parsing_run_sh_tiny_end_to_end(tmp_path):
    script = str(EXAMPLES / "parsing_wsj" / "run.sh")
    p = subprocess.run(["bash", script, "--tiny", str(FIXTURES.parent / "parsing" / "mini"),
                        str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=240)
    assert p.returncode == 0, p.stderr
    assert "bracket-F1" in p.stdout
    assert fetch.count_lines(tmp_path / "results" / "test.trees") == 5
    again = subprocess.run(["bash", script, "--tiny", "", str(tmp_path)], capture_output=True,
                           text=True, env=ENV, timeout=60)
    assert again.returncode == 0 and again.stderr.count("already complete, skipping") == 6
    # another --max-update: the steps from training on run again, the ones before do not
    other = subprocess.run(["bash", script, "--tiny", "--max-update", "3", "", str(tmp_path)],
                           capture_output=True, text=True, env=ENV, timeout=240)
    assert other.returncode == 0, other.stderr
    assert other.stderr.count("already complete, skipping") == 2
    assert "train: its settings changed since it ran" in other.stderr
    # Validation by bracket F1 reads <source_path>.gold: prepare.py's gold trees.
    import json
    meta = json.loads((tmp_path / "data-bin" / "meta.json").read_text())
    assert Path(meta["splits"]["valid"]["source_path"] + ".gold") == \
        (tmp_path / "text" / "valid.gold").resolve()
    assert (tmp_path / "text" / "valid.gold").is_file()


def test_parsing_run_sh_seeds_and_rdrop_dry_run(tmp_path):
    """--seeds 3 --rdrop-alpha 0.5 with --sample: R-Drop in every run's training; runs 2 and 3
    (seeds 2, 3, their own checkpoint folders) after the single model's test, then the valid
    and test splits decoded by the ensemble of the three runs' 5-best listings."""
    import shlex
    work = tmp_path / "w"
    p = parsing_run_sh("--dry-run", "--sample", "--seeds", 3, "--rdrop-alpha", 0.5,
                       "/data/ptb-sample", work)
    assert p.returncode == 0, p.stderr
    cmds = commands(p.stdout)
    assert len(cmds) == 9 + 2 + 6 and not work.exists()
    train, seed2, seed3 = cmds[2], cmds[9], cmds[10]
    assert "--rdrop-alpha 0.5" in train and "--seed" not in train
    assert f"--save-dir {work}/checkpoints " in train
    for k, c in ((2, seed2), (3, seed3)):
        assert c.startswith("nmt-train ") and "--rdrop-alpha 0.5" in c
        assert c.endswith(f"--seed {k} > {work}/results/checkpoint-seed{k}.txt")
        assert f"--save-dir {work}/checkpoints-seed{k} " in c
    listings = " ".join(f"$(cat {work}/checkpoints{s}/ensemble_best5.txt)"
                        for s in ("", "-seed2", "-seed3"))
    gen_valid, delin_valid, score_valid, gen_test, delin_test, score_test = cmds[11:]
    assert gen_valid.startswith(f"nmt-generate {listings} --input {work}/text/valid.sig ")
    assert "--beam 4 --lenpen 1.0" in gen_valid and "--beam 21 --lenpen 1.0" in gen_test
    assert gen_test.startswith(f"nmt-generate {listings} --input {work}/text/test.sig ")
    assert f"{work}/text/valid.words " in delin_valid and "--tags" in delin_valid
    assert f"--ref {work}/text/test.gold" in score_test and "--metric bracket-f1" in score_valid
    for c in cmds:
        validate_command(shlex.split(c.split(" > ")[0]))
    plain = parsing_run_sh("--dry-run", "--sample", "/data/ptb-sample")
    assert "--rdrop-alpha" not in plain.stdout and "seed" not in plain.stdout
    for bad, word in ((["--seeds", "0"], "--seeds"), (["--rdrop-alpha", "x"], "--rdrop-alpha"),
                      (["--rdrop-alpha", "1.2.3"], "--rdrop-alpha")):
        b = parsing_run_sh("--dry-run", "--sample", *bad, "/data/ptb-sample")
        assert b.returncode == 2 and word in b.stderr and len(b.stderr.splitlines()) == 1


@pytest.mark.slow        # 20-45 s; CI runs it (.ci/run: -m slow)
def test_parsing_run_sh_tiny_seeds_end_to_end(tmp_path):
    """The tiny chain with --seeds 2 --rdrop-alpha 1 for real: the second run trained with
    seed 2, both runs' checkpoints decode the valid and test splits as one ensemble, one tree
    per sentence, scored and printed after the single model's; a rerun skips every step."""
    script = str(EXAMPLES / "parsing_wsj" / "run.sh")
    mini = str(FIXTURES.parent / "parsing" / "mini")
    args = ["bash", script, "--tiny", "--seeds", "2", "--rdrop-alpha", "1", mini, str(tmp_path)]
    p = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=240)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "results"
    for split in ("valid", "test"):
        assert fetch.count_lines(out / f"{split}.seeds2.trees") == 5
        assert "bracket-F1" in (out / f"bracket_f1.{split}.seeds2.txt").read_text()
    assert (tmp_path / "checkpoints-seed2" / "checkpoint_last.pt").is_file()
    assert p.stdout.index("bracket-F1") < p.stdout.index("the ensemble of 2 runs")
    assert "--seed 2" in (tmp_path / ".done" / "train_seed2").read_text()
    assert "--rdrop-alpha 1" in (tmp_path / ".done" / "train").read_text()
    again = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=120)
    assert again.returncode == 0 and again.stderr.count("already complete, skipping") == 13
    # nmt-train would resume the alpha-1 model: another alpha in this folder is refused
    for other in (["--rdrop-alpha", "0.5"], []):
        bad = subprocess.run(["bash", script, "--tiny", *other, mini, str(tmp_path)],
                             capture_output=True, text=True, env=ENV, timeout=60)
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
        assert "trained with --rdrop-alpha 1, not" in bad.stderr
    same = subprocess.run(["bash", script, "--tiny", "--rdrop-alpha", "1.0", "--dry-run", mini,
                           str(tmp_path)], capture_output=True, text=True, env=ENV, timeout=60)
    assert same.returncode == 0, same.stderr


def test_parsing_run_sh_extra_test_dry_run(tmp_path):
    """--extra-test NAME=FIRST-LAST: those files prepared beside the same train split (same
    options, so the same vocabulary and signatures), then parsed and scored as the test split
    is, by the single model and, with --seeds, by the ensemble."""
    import shlex
    work = tmp_path / "w"
    p = parsing_run_sh("--dry-run", "--sample", "--seeds", 2, "--extra-test", "more=0180-0199",
                       "/data/ptb-sample", work)
    assert p.returncode == 0, p.stderr
    cmds = commands(p.stdout)
    assert len(cmds) == 9 + 1 + 6 + 1 + 6
    prepare, gen, delin, score, gen_ens = cmds[16], cmds[17], cmds[18], cmds[19], cmds[20]
    assert prepare.endswith(f"/data/ptb-sample {work}/text-more --split train=0001-0159 "
                            "--split more=0180-0199 --leaves words --signatures 2")
    listing = f"$(cat {work}/checkpoints/ensemble_best5.txt)"
    assert gen.startswith(f"nmt-generate {listing} --input {work}/text-more/more.sig "
                          f"--output {work}/results/more.lin --beam 21 --lenpen 1.0 ")
    assert f"delinearize.py {work}/text-more/more.words " in delin and "--tags" in delin
    assert f"--ref {work}/text-more/more.gold" in score
    assert score.endswith(f"> {work}/results/bracket_f1.more.txt")
    assert gen_ens.startswith(f"nmt-generate {listing} $(cat {work}/checkpoints-seed2/")
    assert cmds[-1].endswith(f"> {work}/results/bracket_f1.more.seeds2.txt")
    for c in cmds:
        validate_command(shlex.split(c.split(" > ")[0]))
    for bad in (["test=0170-0179"], ["more=0180"], ["more=x-y"], ["a.b=0001-0002"],
                ["a-b=0001-0002"], ["more=0199-0180"],
                ["more=0001-0002", "--extra-test", "more=0003-0003"]):
        b = parsing_run_sh("--dry-run", "--sample", "--extra-test", *bad, "/data/ptb-sample")
        assert b.returncode == 2 and "--extra-test" in b.stderr
        assert len(b.stderr.splitlines()) == 1
    # a range without a file is refused before anything runs (the files are read after
    # training)
    mini = FIXTURES.parent / "parsing" / "mini"
    b = parsing_run_sh("--tiny", "--extra-test", "more=0180-0199", mini, work)
    assert b.returncode == 2 and "no .mrg file numbered 0180-0199" in b.stderr
    assert not work.exists()


@pytest.mark.slow        # 20-45 s; CI runs it (.ci/run: -m slow)
def test_parsing_run_sh_tiny_extra_test_end_to_end(tmp_path):
    """The tiny chain with --extra-test for real: one tree per sentence of those files,
    scored and printed after the test split's; adding another to the finished folder runs
    only its own steps."""
    mini = FIXTURES.parent / "parsing" / "mini"
    p = parsing_run_sh("--tiny", "--extra-test", "first=0001-0001", mini, tmp_path, timeout=240)
    assert p.returncode == 0, p.stderr
    out = tmp_path / "results"
    words = (tmp_path / "text-first" / "first.words").read_text().splitlines()
    assert 0 < len(words) < 5 and fetch.count_lines(out / "first.trees") == len(words)
    assert "bracket-F1" in (out / "bracket_f1.first.txt").read_text()
    assert p.stdout.index("first (files 0001-0001)") > p.stdout.index("bracket-F1")
    # the extra files were prepared with the run's own train split
    assert (tmp_path / "text-first" / "train.words").read_text() == \
        (tmp_path / "text" / "train.words").read_text()
    more = parsing_run_sh("--tiny", "--extra-test", "first=0001-0001", "--extra-test",
                          "rest=0002-0003", mini, tmp_path, timeout=240)
    assert more.returncode == 0, more.stderr
    assert more.stderr.count("already complete, skipping") == 6 + 4
    assert "$ nmt-train" not in more.stderr and "$ nmt-generate" in more.stderr
    assert fetch.count_lines(out / "rest.trees") == 5 - len(words)


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_parsing_learning_curve_from_train_sentences(tmp_path):
    script = str(EXAMPLES / "parsing_wsj" / "run.sh")
    mini = str(FIXTURES.parent / "parsing" / "mini")

    def run(*args, work):
        return subprocess.run(["bash", script, "--tiny", *map(str, args), mini, str(work)],
                              capture_output=True, text=True, env=ENV, timeout=240)
    small, full = tmp_path / "small", tmp_path / "full"
    assert run("--train-sentences", 4, work=small).returncode == 0
    assert run(work=full).returncode == 0
    assert fetch.count_lines(small / "text" / "train.words") == 4
    assert fetch.count_lines(small / "text" / "train.lin") == 4
    n_full = fetch.count_lines(full / "text" / "train.words")
    assert n_full > 4
    # valid and test are untouched: the same sentences score both runs
    assert ((small / "text" / "test.gold").read_bytes()
            == (full / "text" / "test.gold").read_bytes())
    # a work dir holds one size: another size there is refused, not mixed in
    other = run("--train-sentences", 5, work=small)
    assert other.returncode == 2 and "made with --train-sentences 4, not 5" in other.stderr
    # a folder prepared before the option existed (no size file) holds all sentences
    (full / ".train-sentences").unlink()
    other = run("--train-sentences", 6, work=full)
    assert other.returncode == 2 and "made with --train-sentences all, not 6" in other.stderr
    assert run(work=full).returncode == 0
    for bad in (0, "00", "2/3"):
        p = run("--train-sentences", bad, work=tmp_path / "z")
        assert p.returncode == 2 and "take positive numbers" in p.stderr
    # a prepare that failed records nothing: another size may follow in the same folder
    failed = run("--train-sentences", 10_000, work=tmp_path / "f")
    assert failed.returncode != 0 and "has only" in failed.stderr
    assert run("--train-sentences", 3, work=tmp_path / "f").returncode == 0
    png = tmp_path / "curve.png"
    p = subprocess.run([sys.executable, str(EXAMPLES / "parsing_wsj" / "learning_curve.py"),
                        str(full), str(small), "--out", str(png)], capture_output=True,
                       text=True, env=ENV, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| ") and "|---" not in
            line][1:]
    assert [r.split("|")[1].strip() for r in rows] == ["4", f"{n_full:,}"]   # by size
    f1 = float((small / "results" / "bracket_f1.txt").read_text().split(" = ")[1].split()[0])
    assert f"| {f1:.2f} |" in rows[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([sys.executable, str(EXAMPLES / "parsing_wsj" / "learning_curve.py"),
                          str(tmp_path / "z")], capture_output=True, text=True, env=ENV,
                         timeout=60)
    assert bad.returncode != 0 and "not a finished run.sh work dir" in bad.stderr
    assert "Traceback" not in bad.stderr

    def curve(*works):
        return subprocess.run([sys.executable, str(EXAMPLES / "parsing_wsj" / "learning_curve.py"),
                               *map(str, works)], capture_output=True, text=True, env=ENV,
                              timeout=60)
    # a dry run refuses another size too, as the real run would
    dry = run("--dry-run", "--train-sentences", 5, work=small)
    assert dry.returncode == 2 and "made with --train-sentences 4, not 5" in dry.stderr
    # points tested on different sentences are not one curve
    shutil.copytree(small, tmp_path / "other")
    gold = tmp_path / "other" / "text" / "test.gold"
    gold.write_text(gold.read_text().replace("(", "( ", 1))
    p = curve(small, tmp_path / "other")
    assert p.returncode != 0 and "were tested on different sentences" in p.stderr, p.stderr
    # a rerun with other settings stopped midway (training refused: the save dir is in use)
    # leaves the old scores unvouched for: not read as the new run's
    from nmt.lock import WriterLock

    with WriterLock(small / "checkpoints" / ".nmt.lock", small / "checkpoints", "test"):
        stopped = run("--train-sentences", 4, "--max-update", 3, work=small)
    assert stopped.returncode != 0 and "in use" in stopped.stderr, stopped.stderr
    assert sorted(p.name for p in (small / ".done").iterdir()) == ["prepare", "preprocess"]
    assert (small / "results" / "bracket_f1.txt").exists()
    p = curve(small)
    assert p.returncode != 0 and "not a finished run.sh work dir" in p.stderr
    assert run("--train-sentences", 4, "--max-update", 3, work=small).returncode == 0
    assert curve(small).returncode == 0


def test_prepare_train_sentences_is_checked(tmp_path):
    from nmt.tasks.parsing import SplitSpec, prepare_treebank

    from nmt.tasks.signatures import Signatures

    mini = FIXTURES.parent / "parsing" / "mini"
    with pytest.raises(NmtError, match="has only"):
        prepare_treebank([mini], tmp_path, [SplitSpec.parse("train=0001-0001")],
                         train_sentences=10_000)
    with pytest.raises(NmtError, match="'train' split"):
        prepare_treebank([mini], tmp_path, [SplitSpec.parse("test=0001-0001")],
                         train_sentences=2)
    # the signatures count the kept sentences only
    specs = [SplitSpec.parse("train=0001-0003"), SplitSpec.parse("test=0001-0003")]
    prepare_treebank([mini], tmp_path / "all", specs, signatures=2)
    prepare_treebank([mini], tmp_path / "two", specs, signatures=2, train_sentences=2)
    train = (tmp_path / "all" / "train.words").read_text(encoding="utf-8").splitlines()
    assert (tmp_path / "two" / "train.words").read_text(encoding="utf-8").splitlines() == \
        train[:2]
    sig = Signatures.from_sentences((line.split() for line in train[:2]), 2)
    test = (tmp_path / "two" / "test.words").read_text(encoding="utf-8").splitlines()
    got = (tmp_path / "two" / "test.sig").read_text(encoding="utf-8").splitlines()
    assert got == [" ".join(sig.map(line.split())) for line in test]
    assert got != (tmp_path / "all" / "test.sig").read_text(encoding="utf-8").splitlines()


def test_parsing_run_sh_help_is_the_whole_header():
    p = subprocess.run(["bash", str(EXAMPLES / "parsing_wsj" / "run.sh"), "--help"],
                       capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("Section 6.3 of the paper")
    # every option, and the header's last line; no code after it
    for opt in ("--gpus N", "--max-update N", "--sample", "--tiny", "--train-sentences N",
                "--extra-test NAME=FIRST-LAST"):
        assert opt in p.stdout, opt
    assert p.stdout.rstrip().endswith("nmt-train finds it complete).")
    assert "set -euo" not in p.stdout


def test_parsing_run_sh_needs_a_treebank(tmp_path):
    script = str(EXAMPLES / "parsing_wsj" / "run.sh")
    p = subprocess.run(["bash", script], capture_output=True, text=True, env=ENV, timeout=60)
    assert p.returncode == 2 and "Penn Treebank" in p.stderr
    p = subprocess.run(["bash", script, str(tmp_path / "nope")], capture_output=True, text=True,
                       env=ENV, timeout=60)
    assert p.returncode == 1 and "no such file or folder" in p.stderr
    p = subprocess.run(["bash", script, "--sample"], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert p.returncode == 2 and "Penn Treebank sample" in p.stderr
    p = subprocess.run(["bash", script, "--sample", "--gpus", "2", "x"], capture_output=True,
                       text=True, env=ENV, timeout=60)
    assert p.returncode == 2 and "--gpus" in p.stderr
    p = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, env=ENV,
                       timeout=60)
    assert p.returncode == 0 and "--sample" in p.stdout and "0170-0179" in p.stdout


@pytest.mark.slow        # ~10 s; CI runs it (.ci/run: -m slow)
def test_multi30k_a_shorter_max_update_than_the_finished_run_is_refused(tmp_path):
    """A larger --max-update resumes the run in the work dir; a smaller one would train
    nothing and report the longer run's results as its own: refused in one line. A work
    folder that is a file is a one-line error too, not a traceback."""
    args = ("--tiny", "--stages", "data,preprocess,train", "--work-dir", tmp_path)
    run_example("multi30k/run.py", *args)
    p = run_example("multi30k/run.py", *args, "--max-update", 3, check=False)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and last.startswith("multi30k/run.py: error: "), p.stderr
    assert "holds a run at update 6, past --max-update 3" in last
    (tmp_path / "afile").write_text("x")
    p = run_example("multi30k/run.py", "--tiny", "--work-dir", tmp_path / "afile", check=False)
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and last.startswith("multi30k/run.py: error: "), p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.slow        # ~15 s; CI runs it (.ci/run: -m slow)
def test_multi30k_tune_stage_chooses_the_average_on_val(tmp_path):
    """--tune-windows 1,2 (--tiny: a checkpoint every 2 updates): each average is the mean of
    the run's last N checkpoints, each is decoded on val with each pair, and the test set
    with the best of them all; --stages without tune decodes with that choice."""
    args = ("--tiny", "--recipe", "literature", "--tune-windows", "1,2", "--work-dir", tmp_path)
    p = run_example("multi30k/run.py", *args)
    ckpt = tmp_path / "checkpoints-tiny"
    assert "--save-interval-updates 2 --keep-last 3" in p.stderr
    last = [load_checkpoint(ckpt / f"checkpoint_{u}.pt")["model"] for u in (4, 6)]
    avg1, avg2 = (load_checkpoint(ckpt / f"checkpoint_avg{n}.pt")["model"] for n in (1, 2))
    for k, v in last[1].items():
        if v.is_floating_point():
            assert torch.equal(avg1[k], v), k
            assert torch.allclose(avg2[k], (last[0][k] + v) / 2, atol=1e-6), k
    assert not all(torch.equal(avg2[k], last[1][k]) for k in avg2)
    tuning = json.loads((tmp_path / "results-tiny" / "tuning.json").read_text())
    assert [(x["window"], x["beam"], x["alpha"]) for x in tuning["rows"]] == [
        (w, b, a) for w in (1, 2) for b, a in ((1, 0.6), (2, 1.0))]
    best = tuning["best"]
    assert best["multi_bleu"] == max(x["multi_bleu"] for x in tuning["rows"])
    test_cmd = next(line for line in p.stderr.splitlines() if "nmt-generate" in line
                    and "test_2016_flickr.en" in line)
    assert f"checkpoint_avg{best['window']}.pt " in test_cmd
    assert f"--beam {best['beam']} --lenpen {best['alpha']}" in test_cmd
    again = run_example("multi30k/run.py", *args)
    for step in ("average-checkpoints-tiny-1", "average-checkpoints-tiny-2",
                 "tune-checkpoints-tiny", "generate-tiny"):
        assert f"{step}: already complete, skipping" in again.stderr, step
    again = run_example("multi30k/run.py", *args, "--stages", "generate,score")
    assert f"window {best['window']} beam {best['beam']} alpha {best['alpha']}: chosen on " \
        f"val" in again.stderr
    assert "generate-tiny: already complete, skipping" in again.stderr


def literature_dry_run(work: Path, *args) -> list[str]:
    """The commands multi30k/run.py --recipe literature --dry-run prints, with ARGS."""
    return commands(run_example("multi30k/run.py", "--recipe", "literature", "--dry-run",
                                "--work-dir", work, *args).stdout)


def test_multi30k_vocab_size_dry_run(tmp_path):
    """--vocab-size N: the recipe on another joined vocabulary, in folders of its own, so that
    it never resumes or reports over the recipe's own run; the recipe's size is the recipe."""
    def dry(*args):
        return literature_dry_run(tmp_path / "w", *args)
    plain, same, other = dry(), dry("--vocab-size", 10000), dry("--vocab-size", 5000)
    assert same == plain
    pre = next(c for c in other if "nmt-preprocess" in c)
    assert "--vocab-size 5000" in pre and f"--destdir {tmp_path / 'w' / 'data-bin-5000'} " in pre
    train = next(c for c in other if "--max-update" in c)
    assert train == next(c for c in plain if "--max-update" in c).replace(
        "data-bin-10000", "data-bin-5000").replace("checkpoints-literature ",
                                                   "checkpoints-literature-vocab5000 ")
    assert all("results-literature-vocab5000/" in c for c in other if "nmt-score" in c)
    for args, line in ((("--vocab-size", "50"), "--vocab-size must be >= 100, got 50"),
                       (("--tiny", "--vocab-size", "500"), "--vocab-size does not go with --tiny")):
        p = run_example("multi30k/run.py", "--work-dir", tmp_path / "k", *args, check=False)
        assert p.returncode == 1 and line in p.stderr.splitlines()[-1], p.stderr
        assert not (tmp_path / "k").exists()


def test_multi30k_label_smoothing_dry_run(tmp_path):
    """--label-smoothing E: the recipe trained with another epsilon, in folders of its own; the
    recipe's own epsilon (the paper's 0.1) is the recipe."""
    def dry(*args):
        return literature_dry_run(tmp_path / "w", *args)
    plain, same, other = dry(), dry("--label-smoothing", 0.1), dry("--label-smoothing", 0.2)
    assert same == plain
    train = next(c for c in other if "--max-update" in c)
    assert train == next(c for c in plain if "--max-update" in c).replace(
        "dropout=0.3 ", "dropout=0.3 --override label_smoothing=0.2 ").replace(
        "checkpoints-literature ", "checkpoints-literature-ls0.2 ")
    assert all("results-literature-ls0.2/" in c for c in other if "nmt-score" in c)
    # with another vocabulary too, each in the folder names
    both = dry("--label-smoothing", 0, "--vocab-size", 5000)
    train = next(c for c in both if "--max-update" in c)
    assert "--override label_smoothing=0 " in train and "checkpoints-literature-vocab5000-ls0 " in train
    for args, line in ((("--label-smoothing", "1"), "--label-smoothing must be in [0, 1), got 1"),
                       (("--label-smoothing", "-0.1"), "must be in [0, 1), got -0.1"),
                       (("--tiny", "--label-smoothing", "0.2"),
                        "--label-smoothing does not go with --tiny")):
        p = run_example("multi30k/run.py", "--work-dir", tmp_path / "k", *args, check=False)
        assert p.returncode == 1 and line in p.stderr.splitlines()[-1], p.stderr
        assert not (tmp_path / "k").exists()


def test_multi30k_tune_windows_dry_run(tmp_path):
    # a recipe that averages nothing has no windows to try
    p = run_example("multi30k/run.py", "--dry-run", "--work-dir", tmp_path / "s",
                    "--tune-windows", "5", check=False)
    assert p.returncode == 1 and "averages no checkpoints" in p.stderr.splitlines()[-1]
    # a window larger than the run keeps is refused before anything runs
    for args, keep, asked in ((("--recipe", "literature", "--tune-windows", "10,50"), 12, 50),
                              (("--recipe", "converge", "--tune-windows", "7"), 6, 7),
                              (("--tiny", "--recipe", "converge", "--tune-windows", "4"), 3, 4)):
        p = run_example("multi30k/run.py", "--work-dir", tmp_path / "k", *args, check=False)
        assert p.returncode == 1 and f"--tune-windows: the run keeps its last {keep} " \
            f"checkpoints, fewer than {asked}" in p.stderr.splitlines()[-1], p.stderr
        assert not (tmp_path / "k").exists()
    # --keep-last K keeps more, for windows up to K; the training run is otherwise the same
    out = run_example("multi30k/run.py", "--recipe", "literature", "--dry-run", "--work-dir",
                      tmp_path / "l", "--keep-last", 40, "--tune-windows", "5,40").stdout
    train = next(c for c in commands(out) if "--max-update" in c)
    plain = run_example("multi30k/run.py", "--recipe", "literature", "--dry-run", "--work-dir",
                        tmp_path / "l").stdout
    assert train == next(c for c in commands(plain) if "--max-update" in c).replace(
        "--keep-last 12", "--keep-last 40")
    assert [re.search(r"checkpoint_avg(\d+)\.pt", c).group(1) for c in commands(out)
            if "raw/val.en" in c][::6] == ["5", "40"]
    # ... and is refused below the recipe's own average, or with --tiny, before anything runs
    for args, line in ((("--recipe", "literature", "--keep-last", "9"),
                        "--keep-last 9: the recipe averages its last 10 checkpoints"),
                       (("--keep-last", "0"), "--keep-last must be >= 1, got 0"),
                       (("--tiny", "--recipe", "literature", "--keep-last", "5"),
                        "--keep-last does not go with --tiny")):
        p = run_example("multi30k/run.py", "--work-dir", tmp_path / "k", *args, check=False)
        assert p.returncode == 1 and line in p.stderr.splitlines()[-1], p.stderr
        assert not (tmp_path / "k").exists()
    # one without a grid tunes the windows alone with its own pair
    out = run_example("multi30k/run.py", "--recipe", "converge", "--dry-run", "--work-dir",
                      tmp_path / "c", "--tune-windows", "3,5").stdout
    assert [re.search(r"checkpoint_avg(\d+)\.pt .*--beam 4 --lenpen 0.6", c).group(1)
            for c in commands(out) if "raw/val.en" in c] == ["3", "5"]
    # an ensemble's averages: each seed's, written by a step of its own
    out = run_example("multi30k/run.py", "--recipe", "literature", "--dry-run", "--seeds", 2,
                      "--work-dir", tmp_path / "e", "--tune-windows", "5,10").stdout
    assert "# [average-checkpoints-literature-seed2-5] average the last 5 " in out
    ens = [c for c in commands(out) if "raw/val.en" in c and "ensemble2" in c]
    assert len(ens) == 12 and all(c.count("checkpoint_avg") == 2 for c in ens)
    assert "checkpoints-literature/checkpoint_avg5.pt" in ens[0] and \
        "checkpoints-literature-seed2/checkpoint_avg5.pt" in ens[0]


@pytest.mark.slow        # ~15 s; CI runs it (.ci/run: -m slow)
def test_multi30k_stages_without_tune_decode_with_the_tuned_pair(tmp_path):
    """--stages generate,score after a full run: the beam and alpha the tune stage chose on
    val, not the recipe's defaults (the test decode is not redone with other settings)."""
    args = ("--tiny", "--recipe", "literature", "--work-dir", tmp_path)
    run_example("multi30k/run.py", *args)
    best = json.loads((tmp_path / "results-tiny" / "tuning.json").read_text())["best"]
    again = run_example("multi30k/run.py", *args, "--stages", "generate,score")
    assert f"beam {best['beam']}, alpha {best['alpha']:g}: chosen on val" in again.stderr
    assert "generate-tiny: already complete, skipping" in again.stderr
