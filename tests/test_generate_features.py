"""nmt-generate's issue-15 features through the real command: sampling, forced prefixes
(jsonl input), scoring given pairs, alignments; and their bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from nmt.checkpoint import codecs_from_checkpoint, load_checkpoint, load_model_from_checkpoint
from nmt.cli.generate import main
from nmt.search.forced import score_pairs
from nmt.search.translator import Translator
from nmt.specials import BOS, EOS
from test_translator import make_checkpoint, mixed_lines


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("features") / "tiny.pt")


def gen(*args, stdin=None, ok=True):
    r = CliRunner().invoke(main, ["-q", "--device", "cpu", *map(str, args)], input=stdin)
    if ok:
        assert r.exit_code == 0, (r.stdout, r.stderr)
    return r


def write(path, lines):
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


def one_line_error(r, *needles):
    assert r.exit_code != 0 and r.stdout == ""
    err = r.stderr.strip()
    assert "\n" not in err and err.startswith("nmt-generate: error: "), err
    for n in needles:
        assert n in err, err


def test_sampling_is_reproducible_and_independent_of_batching_and_other_lines(ckpt, tmp_path):
    lines = [x for x in mixed_lines(20, seed=5) if x.strip()]
    src = write(tmp_path / "in.txt", lines)
    a = gen(ckpt, "-i", src, "--sampling", "--seed", 7, "--nbest", 3).stdout
    assert a == gen(ckpt, "-i", src, "--sampling", "--seed", 7, "--nbest", 3,
                    "--batch-size", 2).stdout
    assert a != gen(ckpt, "-i", src, "--sampling", "--seed", 8, "--nbest", 3).stdout
    beam = gen(ckpt, "-i", src).stdout.splitlines()
    samples = a.splitlines()
    assert len(samples) == 3 * len(lines) and samples[0::3] != beam
    # line 4's samples depend on (seed, line 4, its source) only, not on the other lines
    other = list(lines)
    other[0], other[2] = "w9 w9 w9", "w1"
    b = gen(ckpt, "-i", write(tmp_path / "o.txt", other), "--sampling", "--seed", 7,
            "--nbest", 3).stdout.splitlines()
    assert b[9:12] == samples[9:12]
    # top-k 1 is greedy decoding
    greedy = gen(ckpt, "-i", src, "--beam", 1).stdout
    assert gen(ckpt, "-i", src, "--sampling", "--topk", 1).stdout == greedy


def test_forced_prefixes_from_jsonl(ckpt, tmp_path):
    reqs = [{"source": "w1 w2 w3", "prefix": "w7 w8"}, {"source": "w4 w5"}, {"source": ""},
            {"source": "w6", "prefix": ""}]
    src = write(tmp_path / "in.jsonl", [json.dumps(r) for r in reqs])
    out = gen(ckpt, "-i", src, "--input-format", "jsonl").stdout.split("\n")[:-1]
    t = Translator.from_checkpoint(ckpt)
    assert len(out) == 4 and out[0].split()[:2] == ["w7", "w8"]
    assert out[1:] == t.translate(["w4 w5", "", "w6"])
    rich = gen(ckpt, "-i", src, "--input-format", "jsonl", "--output-format", "jsonl").stdout
    first = json.loads(rich.splitlines()[0])
    assert first["prefix"] == "w7 w8" and first["tokens"][:2] == ["w7", "w8"]
    # the prefix's log-probabilities count: scoring the output as a pair gives its score
    forced = score_pairs(t, ["w1 w2 w3"], [first["translation"]])[0]
    assert forced.score == pytest.approx(first["score"], abs=1e-4)
    # text input keeps working as before
    assert gen(ckpt, stdin="w4 w5\n").stdout.splitlines() == [out[1]]


def test_a_prefix_that_cannot_be_forced_is_refused_as_a_constraint_is(ckpt, tmp_path):
    """One rule for prefixes and constraints: a prefix the target vocabulary cannot spell, or
    longer than its line's length limit, stops the run with one line naming the line (it was
    forced as <unk>, or cut at the limit, with exit 0); a prefix that fits is translated."""
    for line, needle in ((json.dumps({"source": "w1 w2", "prefix": "w7 zebra"}),
                          "in.jsonl: line 2: prefix 'w7 zebra' cannot be spelled with the "
                          "target vocabulary (encoded: w7 <unk>)"),
                         (json.dumps({"source": "w1 w2", "prefix": " ".join(["w5"] * 9)}),
                          "in.jsonl: line 2: its prefix needs 9 target tokens, more than the "
                          "6 the length limit allows for its source")):
        src = write(tmp_path / "in.jsonl", [json.dumps({"source": "w1", "prefix": "w2"}), line])
        r = CliRunner().invoke(main, [str(ckpt), "--device", "cpu", "-i", str(src),
                                      "--input-format", "jsonl", "--max-len-a", "2",
                                      "--max-len-b", "2"])
        one_line_error(r, needle)
    src = write(tmp_path / "in.jsonl", [json.dumps({"source": "w1 w2", "prefix": "w5 w6"})])
    r = CliRunner().invoke(main, [str(ckpt), "--device", "cpu", "-i", str(src),
                                  "--input-format", "jsonl"])
    assert r.exit_code == 0 and r.stdout.startswith("w5 w6"), r.stderr


def test_sampling_keeps_forced_prefixes(ckpt, tmp_path):
    src = write(tmp_path / "in.jsonl", [json.dumps({"source": "w1 w2 w3", "prefix": "w7 w8"}),
                                        json.dumps({"source": "w4"})])
    out = gen(ckpt, "-i", src, "--input-format", "jsonl", "--sampling", "--nbest", 3,
              "--seed", 2).stdout.splitlines()
    assert len(out) == 6
    for sample in out[:3]:
        assert sample.split()[:2] == ["w7", "w8"], out


@pytest.mark.parametrize("line,needle", [
    ('{"source": 3}', '"source" must be a string, got a number'),
    ('{"source": "w1", "prefix": ["w2"]}', '"prefix" must be a string, got a list'),
    ('["w1"]', "expected a JSON object"),
    ('{"src": "w1"}', 'no "source"'),
    ('w1 w2', "not JSON"),
    # a misspelt field dropped what the line asked for, with exit 0
    ('{"source": "w1", "constraint": ["w7"]}',
     "unknown field 'constraint' (did you mean 'constraints'?)"),
    ('{"source": "w1", "prefx": "w9"}', "unknown field 'prefx' (did you mean 'prefix'?)"),
    ('{"source": null}', '"source" must be a string, got null'),
])
def test_bad_jsonl_requests(ckpt, tmp_path, line, needle):
    src = write(tmp_path / "in.jsonl", ['{"source": "w1"}', line])
    one_line_error(gen(ckpt, "-i", src, "--input-format", "jsonl", ok=False), "line 2", needle)


def test_score_reference_text_and_jsonl(ckpt, tmp_path):
    t = Translator.from_checkpoint(ckpt)
    sources = ["w1 w2 w3", "w4", "", "w5 w6"]
    best = t.translate_results(sources)
    targets = [r.text for r in best]
    src, ref = write(tmp_path / "s", sources), write(tmp_path / "t", targets)
    out = gen(ckpt, "-i", src, "--score-reference", "--reference", ref).stdout.splitlines()
    assert len(out) == 4
    total, per_token, norm = map(float, out[0].split("\t"))
    assert norm == pytest.approx(best[0].hypotheses[0].score, abs=1e-4)
    assert per_token == pytest.approx(total / len(best[0].hypotheses[0].ids), abs=1e-5)
    jl = write(tmp_path / "p.jsonl", [json.dumps({"source": s, "target": x})
                                      for s, x in zip(sources, targets)])
    rows = [json.loads(x) for x in gen(ckpt, "-i", jl, "--input-format", "jsonl",
                                       "--score-reference", "--output-format",
                                       "jsonl").stdout.splitlines()]
    assert [r["id"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["score"] == pytest.approx(norm, abs=1e-5)
    # a blank jsonl line is an empty pair, as an empty line of text with --reference (it was
    # "no target to score")
    blank = write(tmp_path / "b.jsonl", [json.dumps({"source": "w4", "target": targets[1]}),
                                         ""])
    pair = gen(ckpt, "-i", blank, "--input-format", "jsonl", "--score-reference").stdout
    text = gen(ckpt, "-i", write(tmp_path / "s2", ["w4", ""]), "--score-reference",
               "--reference", write(tmp_path / "t2", [targets[1], ""])).stdout
    assert pair == text and len(pair.splitlines()) == 2
    short = write(tmp_path / "short", targets[:3])
    one_line_error(gen(ckpt, "-i", src, "--score-reference", "--reference", short, ok=False),
                   "has 3 lines but", "has 4")
    one_line_error(gen(ckpt, "-i", src, "--score-reference", ok=False), "--reference")


def attention_argmax(ckpt, source: str, target: str, layer: int) -> str:
    """Pharaoh links of each target token to the source token (eos left out) that decoder
    layer ``layer``'s cross-attention, head-averaged, weighs most, in the model's own forward
    over the pair: softmax(q k^T / sqrt(dk)) of the queries and keys that layer attends with."""
    model, _ = load_model_from_checkpoint(ckpt)
    src_codec, tgt_codec = codecs_from_checkpoint(load_checkpoint(ckpt))
    src_ids, tgt_ids = list(src_codec.encode(source)), list(tgt_codec.encode(target))
    attn = model.decoder_layers[layer].cross_attn
    seen = []

    def attend(q, k, v, mask=None, **kw):
        seen.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.size(-1)), dim=-1))
        return type(attn).attend(attn, q, k, v, mask, **kw)

    attn.attend = attend
    with torch.no_grad():
        model(torch.tensor([src_ids + [EOS]]), torch.tensor([[BOS] + tgt_ids]))
    (weights,) = seen
    # [H, T+1, S+1]: row t predicts target token t (the last row the eos, left out)
    best = weights[0].mean(dim=0)[:len(tgt_ids), :len(src_ids)].argmax(dim=-1)
    return " ".join(f"{int(s)}-{t}" for t, s in enumerate(best.tolist()))


def test_print_alignment(ckpt, tmp_path):
    # Forced prefixes vary the untrained model's output (else mostly one repeated word), so
    # that the links vary too; the source's w30 is unknown (<unk>); the last line translates
    # to nothing.
    requests = [{"source": "w1 w2 w3 w4 w5", "prefix": "w5 w3 w1 w2 w4 w9"},
                {"source": "w7 w7 w1 w30 w11 w3", "prefix": "w3 w1 w11 w7 w2"},
                {"source": "w4"}]
    src = write(tmp_path / "s.jsonl", [json.dumps(r) for r in requests])
    found = {}
    # Default: the penultimate decoder layer (the first of the tiny model's two); then the last.
    for args, layer in (([], -2), (["--align-layer", -1], -1)):
        rows = [json.loads(x) for x in gen(ckpt, "-i", src, "--input-format", "jsonl",
                                           "--output-format", "jsonl", "--print-alignment",
                                           *args).stdout.splitlines()]
        assert [r["source"] for r in rows] == [r["source"] for r in requests]
        for row in rows:
            want = attention_argmax(ckpt, row["source"], row["translation"], layer)
            # One subword per word (whitespace codec): the two alignments are the same.
            assert row["alignment_subwords"] == row["alignment"] == want, (layer, row)
        found[layer] = [r["alignment"] for r in rows]
        assert len(set(found[layer][0].split())) > 2 and found[layer][2] == ""
    assert found[-1] != found[-2]
    one_line_error(gen(ckpt, "-i", write(tmp_path / "s", ["w1"]), "--print-alignment", ok=False),
                   "--output-format jsonl")


@pytest.mark.parametrize("args,needle", [
    (["--topk", "3"], "--topk goes with --sampling"),
    (["--sampling", "--topp", "0"], "--topp must be in (0, 1]"),
    (["--sampling", "--topp", "1.5"], "--topp must be in (0, 1]"),
    (["--sampling", "--temperature", "0"], "--temperature must be > 0"),
    (["--reference", "x"], "--reference goes with --score-reference"),
    (["--align-layer", "1"], "--align-layer goes with --print-alignment"),
    (["--split", "test", "--print-alignment", "--output-format", "jsonl"],
     "--print-alignment translates an --input: it does not go with --split"),
    (["--score-reference", "--input-format", "jsonl", "--reference", "x"],
     "the targets are the jsonl lines' \"target\"; leave --reference out"),
    # values past which the search's arithmetic overflows: refused, not an internal error
    (["--lenpen", "400"], "lenpen must be between 0 and 10, got 400.0"),
    (["--lenpen", "nan"], "lenpen must be between 0 and 10, got nan"),
    (["--unkpen", "-1000"], "unkpen must be >= -50"),
    (["--max-len-b", "9" * 30], "max-len-b between 0 and 2147483647"),
    (["--max-len-a", "inf"], "max-len-a must be a finite number >= 0"),
])
def test_bad_options(ckpt, args, needle):
    one_line_error(gen(ckpt, *args, stdin="w1\n", ok=False), needle)


def test_a_huge_length_limit_is_the_decoders_own_limit(ckpt):
    """max_len_a * length + b past int64 is clamped as a float, not cast into garbage (it
    had become a limit of 0: empty translations)."""
    import torch

    from nmt.search.config import SearchConfig
    from nmt.search.generator import max_lengths

    cfg = SearchConfig(beam=1, lenpen=0.0, max_len_a=1e300, max_len_b=5)
    assert max_lengths(torch.tensor([3, 0]), cfg, 64).tolist() == [63, 5]
    assert max_lengths(torch.tensor([2]), SearchConfig(beam=1, lenpen=0.0, max_len_a=1.5,
                                                       max_len_b=2), None).tolist() == [5]


def test_output_that_cannot_be_written_is_refused_before_loading(ckpt, tmp_path):
    (tmp_path / "d").mkdir()
    r = gen(ckpt, "-o", tmp_path / "d", stdin="w1\n", ok=False)
    one_line_error(r, "is a directory")
    assert r.exit_code == 2 and list((tmp_path).iterdir()) == [tmp_path / "d"]
    one_line_error(gen(ckpt, "-o", tmp_path / "no" / "out", stdin="w1\n", ok=False),
                   "the folder", "does not exist")


def test_output_through_a_link_or_into_a_fifo(ckpt, tmp_path):
    """A symbolic link: the file it names is written, the link kept. A FIFO (or a device):
    written through, never replaced by a regular file."""
    import os
    import threading

    src = write(tmp_path / "in.txt", ["w1 w2", "w3"])
    want = gen(ckpt, "-i", src).stdout
    (tmp_path / "real.txt").write_text("old\n")
    os.symlink(tmp_path / "real.txt", tmp_path / "link.txt")
    gen(ckpt, "-i", src, "-o", tmp_path / "link.txt", "--overwrite")   # "old" is not nmt's
    assert os.path.islink(tmp_path / "link.txt")
    assert (tmp_path / "real.txt").read_text() == want

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    gen(ckpt, "-i", src, "-o", fifo)
    reader.join(30)
    assert got == [want] and not os.path.isfile(fifo)


def test_a_closed_stdout_or_stdin_is_a_one_line_error(ckpt, tmp_path):
    import subprocess
    import sys

    src = write(tmp_path / "in.txt", ["w1"])
    cmd = [sys.executable, "-m", "nmt.cli.generate", str(ckpt), "-q"]
    r = subprocess.run(" ".join([*cmd, "-i", str(src), ">&-"]), shell=True,
                       capture_output=False, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 2 and r.stderr.strip() == ("nmt-generate: error: stdout is closed: "
                                                      "give --output FILE")
    r = subprocess.run(" ".join([*cmd, "<&-"]), shell=True, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == ("nmt-generate: error: stdin is closed: "
                                                      "give --input FILE")


def test_jsonl_lines_stay_one_line_and_lone_surrogates_are_refused(ckpt, tmp_path):
    src = write(tmp_path / "in.jsonl", [json.dumps({"source": "w1", "prefix": "w2\u2028"})])
    out = gen(ckpt, "-i", src, "--input-format", "jsonl", "--output-format", "jsonl").stdout
    assert len(out.splitlines()) == 1 and "\\u2028" in out
    bad = write(tmp_path / "bad.jsonl", ['{"source": "w1"}', '{"source": "w2 \\ud800"}'])
    one_line_error(gen(ckpt, "-i", bad, "--input-format", "jsonl", ok=False),
                   "bad.jsonl: line 2", "lone surrogate (\\ud800)")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_constraint_that_cannot_be_spelled_stops_the_run_before_any_output(ckpt, tmp_path,
                                                                             workers):
    """Checked for the whole jsonl file once the model is loaded, not chunk by chunk: the
    error names the file and line, and nothing is written (no journal for a rerun that could
    never get past it). With --workers the check was skipped: the run stopped midway, and
    every rerun stopped on the same line."""
    src = write(tmp_path / "in.jsonl", [json.dumps({"source": "w2"}),
                                        json.dumps({"source": "w1", "constraints": ["zzz"]})])
    out = tmp_path / "out.txt"
    r = gen(ckpt, "-i", src, "--input-format", "jsonl", "--buffer-size", 1, "-o", out,
            "--workers", workers, ok=False)
    one_line_error(r, "in.jsonl: line 2: constraint 1 ('zzz') cannot be spelled")
    assert list(tmp_path.iterdir()) == [src]


def test_the_forced_target_check_loads_the_model_only_for_lines_that_need_it(ckpt, tmp_path):
    """--workers checks a jsonl file's prefixes and constraints in the parent before any
    worker starts; the model it needs for that is built only when a line has either, and
    once."""
    from nmt.batch.input import check_forced_targets

    built = []

    def translator():
        built.append(1)
        return Translator.from_checkpoint(ckpt)

    plain = write(tmp_path / "plain.jsonl", [json.dumps({"source": "w1"})] * 5)
    check_forced_targets(str(plain), translator, 2)
    assert built == []
    some = write(tmp_path / "some.jsonl", [json.dumps({"source": "w1"}),
                                           json.dumps({"source": "w1", "prefix": "w2"}),
                                           *[json.dumps({"source": "w2", "constraints": ["w3"]})]
                                           * 3])
    check_forced_targets(str(some), translator, 2)
    assert built == [1]


def test_an_ensemble_says_whose_preset_it_decodes_with(tmp_path):
    """Members' presets may differ; the first's is used, so the order of the checkpoints
    changes the output: a warning names the fields (not those the command line sets)."""
    a = make_checkpoint(tmp_path / "a.pt", seed=0)
    b = make_checkpoint(tmp_path / "b.pt", seed=1, beam=2, lenpen=1.5)
    r = gen(a, b, stdin="w1 w2\n")
    assert "b.pt decodes with the preset of" in r.stderr and "beam 2 (uses 4)" in r.stderr
    assert "lenpen 1.5 (uses 0.6)" in r.stderr
    r = gen(a, b, "--beam", 3, "--lenpen", 1.0, stdin="w1 w2\n")
    assert "decodes with the preset" not in r.stderr


def test_jsonl_output_reads_back_as_input(ckpt, tmp_path):
    """The fields nmt-generate writes ("id", "translation", scores, ...) were refused as
    unknown when its output was fed back; they are ignored, and the line translates again."""
    src = tmp_path / "in.jsonl"
    src.write_text('{"source": "w1 w2"}\n{"source": "w3", "prefix": "w4"}\n')
    first = gen(ckpt, "-i", src, "--input-format", "jsonl", "--output-format", "jsonl").stdout
    again = tmp_path / "again.jsonl"
    again.write_text(first)
    assert gen(ckpt, "-i", again, "--input-format", "jsonl",
               "--output-format", "jsonl").stdout == first


def test_output_dev_stdout_into_a_pipe(ckpt, tmp_path):
    """--output /dev/stdout with stdout a pipe: written through (its link's target, pipe:[N],
    was taken for a path)."""
    import subprocess

    src = write(tmp_path / "in.txt", ["w1 w2", "w3"])
    p = subprocess.run(f"nmt-generate -q {ckpt} -i {src} --output /dev/stdout | cat",
                       shell=True, capture_output=True, text=True)
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout == gen(ckpt, "-i", src).stdout


def test_a_json_error_reads_well(ckpt):
    r = gen(ckpt, "--input-format", "jsonl", stdin='{"source": "a\tb"}\n', ok=False)
    one_line_error(r, "Invalid control character at character")
    assert "at at" not in r.stderr


def test_progress_lines_are_logged_when_stderr_is_not_a_terminal(ckpt, tmp_path, monkeypatch):
    """Off a terminal (here: CliRunner's captured stderr) no bar is drawn; a progress line is
    logged every PROGRESS_LOG_SECONDS instead (here: at every batch), with the count, the
    total of an --input file, the rate and the time; -q logs none."""
    import nmt.cli.console as common

    monkeypatch.setattr(common, "PROGRESS_LOG_SECONDS", 1e-9)
    src = write(tmp_path / "in.txt", [x for x in mixed_lines(30, seed=2)])
    r = CliRunner().invoke(main, ["--device", "cpu", str(ckpt), "-i", str(src),
                                  "--batch-size", "8"])
    assert r.exit_code == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if "nmt.progress" in x]
    assert len(lines) >= 3, r.stderr
    assert "translating: 30 / 30 (100%)" in lines[-1] and "lines/s" in lines[-1], lines
    assert "elapsed" in lines[0]
    quiet = CliRunner().invoke(main, ["-q", "--device", "cpu", str(ckpt), "-i", str(src)])
    assert "nmt.progress" not in quiet.stderr
