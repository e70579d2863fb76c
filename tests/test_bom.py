"""A UTF-8 byte-order mark opening an input file (Windows editors write one) is dropped, as
Python's utf-8-sig drops it, by every reader of text: nmt-preprocess, nmt-generate (a file
read whole, a file read in resumable chunks, stdin, a stream) and nmt-score. Left in, it glued
itself to the first word: an unknown source token, a vocabulary entry of its own, a reference
n-gram that never matches. A U+FEFF anywhere else is text and stays."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from nmt.cli.generate import main as generate_main
from nmt.cli.preprocess import main as preprocess_main
from nmt.cli.score import main as score_main
from nmt.data.encode_pool import decode_all
from nmt.io import iter_line_chunks, iter_lines, read_lines, stream_batches
from test_translator import make_checkpoint, mixed_lines

BOM = "\ufeff"


def invoke(main, args, stdin=None):
    r = CliRunner().invoke(main, [str(a) for a in args], input=stdin)
    assert r.exit_code == 0, r.output
    return r.stdout


def test_every_reader_drops_a_bom_on_the_first_line_only(tmp_path):
    text = f"{BOM}a b\nc {BOM}d\n{BOM}e\n"
    p = tmp_path / "in.txt"
    p.write_bytes(text.encode("utf-8"))
    want = ["a b", f"c {BOM}d", f"{BOM}e"]
    assert list(iter_lines(p)) == want and read_lines(p) == want
    assert [line for chunk, _ in iter_line_chunks(p, 2) for line in chunk] == want
    # Resuming from a later line keeps what that line holds.
    second = len(f"{BOM}a b\n".encode("utf-8"))
    assert next(iter_line_chunks(p, 5, start=second, first_line=2))[0] == want[1:]
    r, w = os.pipe()
    os.write(w, text.encode("utf-8"))
    os.close(w)
    try:
        assert [line for batch in stream_batches(r, 8) for line in batch] == want
    finally:
        os.close(r)
    raw = text.encode("utf-8").splitlines(keepends=True)
    assert decode_all(raw, "in.txt", 1) == want            # nmt-preprocess's workers


def test_nmt_score_matches_a_reference_saved_with_a_bom(tmp_path):
    hyp, ref = tmp_path / "hyp", tmp_path / "ref"
    lines = "a man rides a bike down the hill\ntwo dogs play in the snow\n"
    hyp.write_text(lines, encoding="utf-8")
    ref.write_text(lines, encoding="utf-8-sig")
    assert ref.read_bytes().startswith(b"\xef\xbb\xbf")
    out = json.loads(invoke(score_main, ["-r", ref, "-i", hyp, "-m", "bleu", "--json"]))
    assert out["score"] == 100.0


def test_nmt_generate_translates_a_bom_file_as_the_same_file_without_it(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c.pt")
    lines = [x for x in mixed_lines(12, seed=3) if x.strip()]
    plain, marked = tmp_path / "plain.xx", tmp_path / "marked.xx"
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
    marked.write_text("\n".join(lines) + "\n", encoding="utf-8-sig")
    common = ["--threads", "1", "--beam", "2", "-q", "--output-format", "jsonl"]
    want = invoke(generate_main, [ckpt, "-i", plain, *common])
    assert json.loads(want.splitlines()[0])["source"] == lines[0]
    assert invoke(generate_main, [ckpt, "-i", marked, *common]) == want
    # --output reads the file in resumable chunks (of 4 lines: batched apart from the above).
    for name in ("plain", "marked"):
        invoke(generate_main, [ckpt, "-i", tmp_path / f"{name}.xx", "--output",
                               tmp_path / f"{name}.jsonl", "--buffer-size", "4", *common])
    chunked = (tmp_path / "marked.jsonl").read_text(encoding="utf-8")
    assert chunked == (tmp_path / "plain.jsonl").read_text(encoding="utf-8")
    assert json.loads(chunked.splitlines()[0])["source"] == lines[0]
    assert invoke(generate_main, [ckpt, *common], stdin=marked.read_bytes()) == want


def test_nmt_preprocess_learns_no_vocabulary_entry_for_the_bom(tmp_path):
    words = "w1 w2 w3"
    for lang in ("xx", "yy"):
        (tmp_path / f"train.{lang}").write_text(f"{words}\n{words}\nw2 w1\n",
                                               encoding="utf-8-sig")
    dest = invoke(preprocess_main, ["-s", "xx", "-t", "yy", "--trainpref", tmp_path / "train",
                                    "--destdir", tmp_path / "bin", "--subword", "none",
                                    "--joined-dictionary", "--workers", "1", "-q"]).strip()
    vocab = (tmp_path / "bin" / "dict.xx.txt").read_text(encoding="utf-8")
    assert dest and "w1" in vocab and BOM not in vocab


def test_a_crlf_files_last_line_without_its_lf_loses_its_cr(tmp_path):
    """"a\\r\\nb\\r" (a CRLF file whose last line lacks the LF) kept the CR in "b\\r": a
    source word of its own, echoed in nmt-generate's jsonl "source"."""
    p = tmp_path / "crlf.txt"
    p.write_bytes(b"a b\r\nc\r")
    assert list(iter_lines(p)) == ["a b", "c"]
    assert [line for chunk, _ in iter_line_chunks(p, 1) for line in chunk] == ["a b", "c"]
