"""nmt-import fairseq on checkpoints trained by fairseq 0.12.2 itself (tests/fixtures/fairseq,
made by its make_fixtures.py; fairseq is not needed here): nmt-generate reproduces fairseq's
own translations of 50 sentences, greedy and beam 4 --lenpen 1.0, line for line, and their
scores; crafted and unsupported checkpoints are refused in one line, nothing of them run."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from nmt.cli.generate import main as generate_main
from nmt.cli.import_ import main as import_main
from nmt.cli.preprocess import main as preprocess_main
from nmt.cli.train import main as train_main
from nmt.errors import NmtError

FIXTURES = Path(__file__).parent / "fixtures" / "fairseq"
NAMES = ("postnorm_shared", "prenorm_tied", "learned_untied")
IMPORT = ([shutil.which("nmt-import")] if shutil.which("nmt-import")
          else [sys.executable, "-m", "nmt.cli.import_"])


def import_args(fix: Path, ckpt: Path | None = None, data: Path | None = None) -> list[str]:
    return ["fairseq", str(ckpt or fix / "checkpoint_last.pt"), "--data", str(data or fix),
            "--bpe-codes", str(fix / "bpecodes"), "--moses", "en-de"]


def invoke(main, args: list) -> str:
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> the nmt checkpoint of that fixture, imported (in-process) once."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            dest = tmp_path_factory.mktemp(name) / "model.pt"
            printed = invoke(import_main, import_args(FIXTURES / name) + ["-o", dest])
            assert printed == f"{dest}\n"
            cache[name] = dest
        return cache[name]
    return get


def fairseq_hyps(name: str, beam: int) -> list[dict]:
    with open(FIXTURES / name / f"fairseq.beam{beam}.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def nmt_hyps(model: Path, name: str, options: list) -> list[dict]:
    out = invoke(generate_main, [model, "-i", FIXTURES / name / "test.en", "--output-format",
                                 "jsonl", "--threads", "1", "-q", *options])
    return [json.loads(line) for line in out.splitlines()]


def compare(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs) == 50
    for i, (o, t) in enumerate(zip(ours, theirs)):
        assert o["translation"] == t["translation"], (i, o["translation"], t["translation"])
        assert abs(o["score"] - t["score"]) < 1e-4, (i, o["score"], t["score"])
        assert len(o["token_scores"]) == len(t["token_scores"]), i
        diff = max(abs(a - b) for a, b in zip(o["token_scores"], t["token_scores"]))
        assert diff < 1e-4, (i, diff)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_reproduces_fairseq(imported, name):
    # The imported preset (beam 5, fairseq's lenpen 1.0) with only the beam changed.
    compare(nmt_hyps(imported(name), name, ["--beam", "1"]), fairseq_hyps(name, 1))


@pytest.mark.parametrize("name", NAMES)
def test_beam4_reproduces_fairseq(imported, name):
    # Only the beam is given: the import's own preset (fairseq's length penalty 1.0 dividing
    # by the length, at most 200 tokens, min_len 1) must give fairseq-interactive's output.
    compare(nmt_hyps(imported(name), name, ["--beam", "4"]), fairseq_hyps(name, 4))


def test_console_script_prints_the_checkpoint(tmp_path):
    """nmt-import as a real process: one stdout line, the checkpoint's path, which
    nmt-generate then translates as fairseq did."""
    fix = FIXTURES / "postnorm_shared"
    r = subprocess.run(IMPORT + import_args(fix) + ["-o", str(tmp_path / "m.pt")],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{tmp_path / 'm.pt'}\n"
    ours = nmt_hyps(Path(r.stdout.strip()), "postnorm_shared", ["--beam", "1"])
    assert [h["translation"] for h in ours] == [
        h["translation"] for h in fairseq_hyps("postnorm_shared", 1)]


class Evil:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_crafted_pickle_is_refused_not_run(tmp_path, zipped):
    marker = tmp_path / "ran"
    bad = tmp_path / "checkpoint.pt"
    torch.save({"args": Evil(marker), "model": {}}, bad,
               _use_new_zipfile_serialization=zipped)
    # In-process: had the loader run the pickle, it would have run in this very process.
    r = CliRunner().invoke(import_main, import_args(FIXTURES / "postnorm_shared", ckpt=bad)
                           + ["-o", str(tmp_path / "m.pt")])
    assert not marker.exists(), "the crafted pickle ran"
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "refused to load" in r.stderr, r.stderr
    assert "system" in r.stderr          # names what it asked for
    assert not (tmp_path / "m.pt").exists()


def edited_checkpoint(tmp_path: Path, **changes) -> Path:
    """A copy of a fixture checkpoint with its model args changed (saved the way fairseq
    saves them, as an argparse.Namespace)."""
    from nmt.interop.safe_pickle import load_foreign, plain

    ckpt = plain(load_foreign(FIXTURES / "postnorm_shared" / "checkpoint_last.pt", "fixture"))
    args = ckpt["cfg"]["model"]
    args.update(changes)
    ckpt["cfg"]["model"] = argparse.Namespace(**args)
    dest = tmp_path / "edited.pt"
    torch.save(ckpt, dest)
    return dest


@pytest.mark.parametrize("changes, named", [
    ({"arch": "lightconv_iwslt_de_en", "_name": "lightconv"}, "lightconv_iwslt_de_en"),
    ({"adaptive_softmax_cutoff": "50,100"}, "adaptive softmax"),
    ({"cross_self_attention": True}, "cross_self_attention"),
    ({"activation_fn": "gelu_accurate"}, "gelu_accurate"),
    ({"decoder_normalize_before": True}, "decoder_normalize_before"),
])
def test_unsupported_model_is_refused(tmp_path, changes, named):
    ckpt = edited_checkpoint(tmp_path, **changes)
    r = CliRunner().invoke(import_main, import_args(FIXTURES / "postnorm_shared", ckpt=ckpt)
                           + ["-o", str(tmp_path / "m.pt")])
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and named in r.stderr, r.stderr
    assert not (tmp_path / "m.pt").exists()


def test_every_unsupported_option_is_named_in_the_one_line(tmp_path):
    ckpt = edited_checkpoint(tmp_path, adaptive_softmax_cutoff="50,100",
                             cross_self_attention=True, activation_fn="gelu_accurate")
    r = CliRunner().invoke(import_main, import_args(FIXTURES / "postnorm_shared", ckpt=ckpt)
                           + ["-o", str(tmp_path / "m.pt")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.count("cannot import this fairseq model") == 1
    for named in ("adaptive softmax (adaptive_softmax_cutoff)",
                  "cross+self attention (cross_self_attention)",
                  "the gelu_accurate activation (activation_fn=gelu_accurate)"):
        assert named in r.stderr, r.stderr
    assert not (tmp_path / "m.pt").exists()


def test_edited_but_supported_args_still_import(tmp_path):
    """The edit itself is not what gets refused: harmless training-only options import."""
    ckpt = edited_checkpoint(tmp_path, encoder_layerdrop=0.1, quant_noise_pq=0.1)
    invoke(import_main, import_args(FIXTURES / "postnorm_shared", ckpt=ckpt)
           + ["-o", tmp_path / "m.pt"])


def old_style(state: dict) -> dict:
    """The same weights under the old names that fairseq's upgrade_state_dict code renames
    (one in_proj per attention, numbered norms: the encoder's layer_norms.0/1, the decoder's
    layer_norms.0/1/2; the sinusoid table cached as embed_positions.weights), written by this
    test from the 0.12 fixture: no old fairseq made it (fairseq 0.6 does not install beside
    the torch versions nmt supports), so it checks nmt's renaming against that code's rules,
    not against a checkpoint an old fairseq wrote."""
    norms = {"encoder": ("self_attn_layer_norm", "final_layer_norm"),
             "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")}
    out = {f"{side}.embed_positions.weights": torch.randn(16, 8) for side in norms}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "encoder" and len(parts) == 4 and parts[1] == "layers":
            continue                                      # 0.12's fast-path copies
        if parts[-2] in ("k_proj", "v_proj"):
            continue
        if parts[-2] == "q_proj":
            stem = ".".join(parts[:-2])
            out[f"{stem}.in_proj_{parts[-1]}"] = torch.cat(
                [state[f"{stem}.{c}_proj.{parts[-1]}"] for c in "qkv"])
            continue
        if parts[1] == "layers" and parts[-2] in norms[parts[0]]:
            n = norms[parts[0]].index(parts[-2])
            key = ".".join(parts[:-2] + [f"layer_norms.{n}", parts[-1]])
        out[key] = value
    return out


def test_old_checkpoint_layout_imports_the_same_weights(tmp_path, imported):
    """A checkpoint in the old layout (legacy torch format, only an argparse 'args', fused
    attention projections; see old_style: written by this test): the same nmt weights as the
    0.12 layout of the same model."""
    from nmt.checkpoint import load_checkpoint
    from nmt.interop.safe_pickle import load_foreign, plain

    fix = FIXTURES / "postnorm_shared"
    new = plain(load_foreign(fix / "checkpoint_last.pt", "fixture"))
    old = tmp_path / "old.pt"
    torch.save({"args": argparse.Namespace(**new["cfg"]["model"]),
                "model": old_style(new["model"])}, old, _use_new_zipfile_serialization=False)
    invoke(import_main, import_args(fix, ckpt=old) + ["-o", tmp_path / "m.pt"])
    ours = load_checkpoint(tmp_path / "m.pt")["model"]
    ref = load_checkpoint(imported("postnorm_shared"))["model"]
    assert ours.keys() == ref.keys()
    assert all(torch.equal(ours[k], ref[k]) for k in ref)


def test_wrong_dictionary_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    fix = FIXTURES / "postnorm_shared"
    for lang in ("en", "de"):
        lines = (fix / f"dict.{lang}.txt").read_text(encoding="utf-8").splitlines()
        (data / f"dict.{lang}.txt").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    r = CliRunner().invoke(import_main, import_args(fix, data=data) + ["-o", tmp_path / "m.pt"])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert "rows" in r.stderr and "dictionar" in r.stderr, r.stderr


def test_sentencepiece_pipeline(tmp_path):
    """--sentencepiece: pieces looked up in fairseq's dictionary, decoded as fairseq's
    SentencepieceBPE ('▁' -> space); the checkpoint carries the model and translates one line
    per input line."""
    import sentencepiece as spm

    from nmt.checkpoint import codecs_from_checkpoint, load_checkpoint

    fix = FIXTURES / "postnorm_shared"
    lines = (fix / "test.en").read_text(encoding="utf-8").splitlines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines * 4), model_prefix=str(
        tmp_path / "sp"), vocab_size=60, model_type="bpe", minloglevel=2)
    args = ["fairseq", fix / "checkpoint_last.pt", "--data", fix, "--sentencepiece",
            tmp_path / "sp.model", "-s", "en", "-t", "de", "-o", tmp_path / "m.pt"]
    invoke(import_main, args)
    src, tgt = codecs_from_checkpoint(load_checkpoint(tmp_path / "m.pt"))
    assert src.kind == tgt.kind == "fairseq_sentencepiece"
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    pieces = sp.encode(lines[7], out_type=str)
    assert src.pieces(lines[7]) == pieces
    assert src.encode(lines[7]) == [src.dictionary.index(p) for p in pieces]
    # fairseq's decoding: symbols joined, '▁' starts a word (these BPE symbols have none).
    ids = [tgt.dictionary.index(w) for w in ("the", "garden")]
    assert tgt.decode(ids) == "thegarden"
    out = invoke(generate_main, [tmp_path / "m.pt", "-i", fix / "test.en", "--beam", "1", "-q"])
    assert len(out.splitlines()) == len(lines)


def test_bpe_words_for_alignments():
    """Word-level alignments (--print-alignment) group '@@' pieces into their words."""
    from nmt.search.forced import word_indices

    pieces = ["Der", "ka@@", "t@@", "ze", "wo@@", "hl", "@-@", "b@@", "e@@", "kannt", "."]
    assert word_indices(pieces, "subword_nmt") == [0, 1, 1, 1, 2, 2, 3, 4, 4, 4, 5]


def test_ctranslate2_export_refuses_what_it_cannot_describe(tmp_path, imported):
    """nmt-export writes tokenization instructions for nmt's own pipelines only: an imported
    fairseq model is refused in one line rather than exported with wrong instructions."""
    pytest.importorskip("ctranslate2")
    from nmt.cli.export import main as export_main

    r = CliRunner().invoke(export_main, [str(imported("postnorm_shared")), str(tmp_path / "ct2")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "subword_nmt" in r.stderr and not (tmp_path / "ct2").exists()


def test_omegaconf_configuration_reads_as_plain_data():
    """A cfg saved as an omegaconf DictConfig (made by omegaconf 2.0 in make_fixtures.py)
    reads, through inert stand-ins, as the same plain arguments as the Namespace it came
    from."""
    from nmt.interop.fairseq import read_checkpoint

    args, state = read_checkpoint(FIXTURES / "omegaconf_cfg.pt")
    ref, _ = read_checkpoint(FIXTURES / "postnorm_shared" / "checkpoint_last.pt")
    assert args == ref and list(state) == ["encoder.version"]


def test_arguments_without_sizes_are_refused(tmp_path):
    ckpt = edited_checkpoint(tmp_path, encoder_layers=None)
    r = CliRunner().invoke(import_main, import_args(FIXTURES / "postnorm_shared", ckpt=ckpt)
                           + ["-o", str(tmp_path / "m.pt")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1 and "encoder_layers" in r.stderr


def test_one_language_given_overrides_only_that_side(tmp_path):
    """-s alone (or -t alone) replaces that side of the pair the checkpoint or the data
    folder names; the other side still comes from there."""
    from nmt.interop.fairseq import language_pair

    ckpt_args = {"source_lang": "en", "target_lang": "de"}
    assert language_pair(ckpt_args, tmp_path, "fr", None, None) == ("fr", "de")
    assert language_pair(ckpt_args, tmp_path, None, "cs", None) == ("en", "cs")
    (tmp_path / "train.ro-en.ro.bin").write_bytes(b"")
    assert language_pair({}, tmp_path, None, "xx", None) == ("ro", "xx")
    assert language_pair({}, tmp_path / "none", "en", None, "en-fr") == ("en", "fr")
    with pytest.raises(NmtError, match="give --source-lang and --target-lang"):
        language_pair({}, tmp_path / "none", "en", None, None)


def test_overwrite_lines_that_repeat_a_symbol_are_refused_by_name(tmp_path):
    """fairseq's '#fairseq:overwrite' gives a word a second row; nmt says that is why."""
    from nmt.interop.fairseq import load_dictionary

    path = tmp_path / "dict.en.txt"
    path.write_text("hello 5\nworld 3\nhello 1 #fairseq:overwrite\n", encoding="utf-8")
    with pytest.raises(NmtError, match="1 '#fairseq:overwrite' lines"):
        load_dictionary(path)
    path.write_text("hello 5\nworld 3 #fairseq:overwrite\n", encoding="utf-8")
    assert len(load_dictionary(path)) == 6      # an overwrite of nothing is an ordinary row


def test_an_import_never_ends_before_its_first_token(imported, tmp_path):
    """fairseq's SequenceGenerator forbids eos at the first step (its min_len is 1), so it
    never translates a source to nothing; the import's preset says so (min_len 1), and without
    it these three short lines come out empty. (No fairseq output for these lines is behind
    this test; the fixtures' fairseq translations, which the tests above match, hold no empty
    one.)"""
    from nmt.checkpoint import load_checkpoint, model_config

    model = imported("postnorm_shared")
    assert model_config(load_checkpoint(model)).min_len == 1
    src = tmp_path / "short.en"
    src.write_text("wagen\nel\n.\n", encoding="utf-8")
    run = [model, "-i", src, "--output-format", "jsonl", "--threads", "1", "-q"]
    preset = [json.loads(x) for x in invoke(generate_main, run).splitlines()]
    assert len(preset) == 3 and all(h["translation"] and h["tokens"][0] != "</s>"
                                    for h in preset), preset
    free = [json.loads(x) for x in invoke(generate_main, [*run, "--min-len", "0"]).splitlines()]
    assert [h["translation"] for h in free] == ["", "", ""]


def test_the_output_never_replaces_an_input_and_bad_subword_files_are_named(tmp_path):
    """-o naming the fairseq checkpoint, its codes or a dict.LANG.txt would replace the model
    being imported: refused before any work; another file of the dictionary directory (the
    checkpoint an earlier import wrote there) is an ordinary -o. A codes file or sentencepiece model
    that cannot be read is named in the one-line error."""
    fix = tmp_path / "fix"
    shutil.copytree(FIXTURES / "postnorm_shared", fix)
    before = (fix / "checkpoint_last.pt").read_bytes()
    # dict.fr.txt and train.de-en.pt do not exist: written, the next import would read
    # them (a dictionary; a language pair guessed from train.SRC-TGT.* names)
    for out in (fix / "checkpoint_last.pt", fix / "dict.en.txt", fix / "bpecodes",
                fix / "dict.fr.txt", fix / "train.de-en.pt"):
        r = CliRunner().invoke(import_main, [*import_args(fix), "-o", str(out)])
        assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "an input of this import" in r.stderr and "give another -o" in r.stderr
    assert (fix / "checkpoint_last.pt").read_bytes() == before
    for _ in range(2):     # re-running an import into the data directory replaces only its -o
        r = CliRunner().invoke(import_main, [*import_args(fix), "-o", str(fix / "model.pt")])
        assert r.exit_code == 0 and r.stdout == f"{fix / 'model.pt'}\n", r.output
    assert (fix / "checkpoint_last.pt").read_bytes() == before
    bad = tmp_path / "codes.txt"
    bad.write_text("a b c\n", encoding="utf-8")
    r = CliRunner().invoke(import_main, ["fairseq", str(fix / "checkpoint_last.pt"), "--data",
                                         str(fix), "--bpe-codes", str(bad), "--moses", "en-de",
                                         "-o", str(tmp_path / "m.pt")])
    assert r.exit_code == 1 and r.stderr.startswith(f"nmt-import: error: {bad}: "), r.stderr
    spm = tmp_path / "bad.model"
    spm.write_bytes(b"not a model")
    r = CliRunner().invoke(import_main, ["fairseq", str(fix / "checkpoint_last.pt"), "--data",
                                         str(fix), "--sentencepiece", str(spm), "-s", "en",
                                         "-t", "de", "-o", str(tmp_path / "m.pt")])
    assert r.exit_code == 1 and r.stderr.startswith(f"nmt-import: error: {spm}: "), r.stderr
    assert not (tmp_path / "m.pt").exists()


def recorded_checkpoint(tmp_path: Path, **sections) -> Path:
    """A fixture checkpoint whose cfg records a text pipeline (cfg.tokenizer, cfg.bpe), as
    fairseq-train --tokenizer moses --bpe subword_nmt ... saves it."""
    from nmt.interop.safe_pickle import load_foreign, plain

    ckpt = plain(load_foreign(FIXTURES / "postnorm_shared" / "checkpoint_last.pt", "fixture"))
    ckpt["cfg"]["model"] = argparse.Namespace(**ckpt["cfg"]["model"])
    ckpt["cfg"].update(sections)
    dest = tmp_path / "recorded.pt"
    torch.save(ckpt, dest)
    return dest


@pytest.mark.parametrize("sections, extra, named", [
    ({"bpe": {"_name": "sentencepiece", "sentencepiece_model": "spm.model"}}, [],
     "records bpe=sentencepiece: give its model with --sentencepiece"),
    ({"bpe": {"_name": "fastbpe", "bpe_codes": "codes"}}, [], "bpe=fastbpe, which nmt cannot"),
    ({"bpe": {"_name": "subword_nmt", "bpe_separator": "++"}}, [], "bpe_separator='++'"),
    ({"tokenizer": {"_name": "moses", "moses_no_escape": True}}, [],
     "moses_no_escape=True: add --moses-no-escape"),
    ({"tokenizer": {"_name": "moses"}}, ["--moses-no-dash-splits"],
     "moses_no_dash_splits=False: leave out --moses-no-dash-splits"),
])
def test_a_recorded_text_pipeline_must_be_the_one_given(tmp_path, sections, extra, named):
    """fairseq's hub interface applies the tokenizer and BPE a checkpoint records; an import
    given another pipeline would read text differently from the model's training. Refused
    in one line naming the option; the same pipeline given imports."""
    ckpt = recorded_checkpoint(tmp_path, **sections)
    r = CliRunner().invoke(import_main, import_args(FIXTURES / "postnorm_shared", ckpt=ckpt)
                           + [*extra, "-o", str(tmp_path / "m.pt")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert named in r.stderr and not (tmp_path / "m.pt").exists()


def test_every_option_a_recorded_pipeline_needs_is_named_at_once(tmp_path):
    ckpt = recorded_checkpoint(tmp_path, bpe={"_name": "sentencepiece"},
                               tokenizer={"_name": "moses", "moses_no_escape": True})
    r = CliRunner().invoke(import_main, import_args(FIXTURES / "postnorm_shared", ckpt=ckpt)
                           + ["-o", str(tmp_path / "m.pt")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert ("records bpe=sentencepiece: give its model with --sentencepiece; "
            "moses_no_escape=True: add --moses-no-escape") in r.stderr, r.stderr


def test_the_recorded_pipeline_given_imports(tmp_path):
    ckpt = recorded_checkpoint(tmp_path, bpe={"_name": "subword_nmt", "bpe_separator": "@@"},
                               tokenizer={"_name": "moses", "moses_no_escape": False})
    invoke(import_main, import_args(FIXTURES / "postnorm_shared", ckpt=ckpt)
           + ["-o", tmp_path / "m.pt"])
    assert (tmp_path / "m.pt").is_file()


def test_a_zip_bomb_is_refused_before_it_is_expanded(tmp_path):
    """A 7 MB fairseq 'checkpoint' whose deflated members expand to gigabytes passed 3.3 GB
    of memory before an error; torch.save stores members uncompressed, so such a file is
    refused by its zip directory alone."""
    import zipfile

    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\0" * (200 << 20))
        z.writestr("archive/version", b"3\n")
    assert bomb.stat().st_size < 2 << 20
    r = subprocess.run([sys.executable, "-m", "nmt.cli.import_", "fairseq", str(bomb),
                        "--data", str(tmp_path), "-o", str(tmp_path / "x.pt")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "expand to" in r.stderr.strip().splitlines()[-1], r.stderr


def test_an_imported_model_fine_tunes_on_data_encoded_with_its_own_pipeline(imported,
                                                                             tmp_path):
    """nmt-preprocess --reuse-vocab CKPT keeps the import's text pipeline whole (Moses and
    subword-nmt's BPE codes, a kind nmt does not learn) in the data directory, and
    nmt-train --init-from starts from the weights: with dropout and label smoothing off and a
    learning rate of 1e-9, the first validation loss is the import's teacher-forced loss of
    the same pairs as nmt-generate's scorer computes it."""
    from nmt.data.datadir import DataDir
    from nmt.search.forced import score_pairs
    from nmt.search.translator import Translator

    name = "postnorm_shared"
    model = imported(name)
    src = (FIXTURES / name / "test.en").read_text(encoding="utf-8").splitlines()
    tgt = [h["translation"] for h in fairseq_hyps(name, 1)]
    for split, rows in (("train", slice(0, 40)), ("valid", slice(40, 50))):
        (tmp_path / f"{split}.en").write_text("\n".join(src[rows]) + "\n", encoding="utf-8")
        (tmp_path / f"{split}.de").write_text("\n".join(tgt[rows]) + "\n", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    invoke(preprocess_main, ["-s", "en", "-t", "de", "--trainpref", tmp_path / "train",
                             "--validpref", tmp_path / "valid", "--reuse-vocab", model,
                             "--destdir", bin_dir, "--workers", 1])
    data = DataDir.open(bin_dir)
    assert data.subword == "subword_nmt" and data.joined
    translator = Translator.from_checkpoint(model, threads=1)
    valid = data.load_split("valid")
    for i, (s, t) in enumerate(zip(src[40:], tgt[40:])):
        assert list(valid.src(i)) == list(translator.src_codec.encode(s)), s
        assert list(valid.tgt(i)) == list(translator.tgt_codec.encode(t)), t

    save = tmp_path / "ft"
    invoke(train_main, [bin_dir, "--init-from", model, "--max-update", 1, "--max-tokens", 500,
                        "--warmup", 1, "--lr", 1e-9, "--save-dir", save, "--threads", 1,
                        *[x for k in ("dropout", "attention_dropout", "activation_dropout",
                                      "label_smoothing") for x in ("--override", f"{k}=0")]])
    logged = [json.loads(line) for line in (save / "train_log.jsonl").read_text().splitlines()]
    first = next(r for r in logged if r["kind"] == "valid")
    scores = score_pairs(translator, src[40:], tgt[40:])
    n = sum(p.n_tokens for p in scores)
    assert first["ntokens"] == n
    assert first["nll_loss"] == pytest.approx(-sum(p.log_prob for p in scores) / n, rel=1e-5)
    # A damaged pipeline file is one error naming it, not a traceback at training time.
    (bin_dir / "codec.de.json").write_text('{"version": ', encoding="utf-8")
    with pytest.raises(NmtError, match=r"codec\.de\.json: unreadable"):
        DataDir.open(bin_dir)
    (bin_dir / "codec.de.json").write_text('{"version": 99}', encoding="utf-8")
    with pytest.raises(NmtError, match=r"codec\.de\.json: unsupported text codec state"):
        DataDir.open(bin_dir)
