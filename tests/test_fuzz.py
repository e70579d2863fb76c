"""Random text at nmt-generate and nmt-score: one output line per input line, in order, and
never a crash (empty lines, whitespace, control characters, any unicode, very long lines)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.cli.generate import main as generate_main
from nmt.cli.preprocess import main as preprocess_main
from nmt.cli.score import main as score_main
from nmt.cli.train import main as train_main
from nmt.search.translator import BatchConfig, SearchConfig, Translator

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

ODD = ["", " ", "  \t ", "\r", "a\rb", "\x00", "\x1b[31m", "\u2028", "\x85", "\ufeff",
       "\u200b", "w1 w2", "w1\tw2", "😀 é ß", "\U0010ffff", "<s> </s> <pad> <unk>", "##"]
# Any character but the line break (what separates lines) and lone surrogates (not UTF-8).
ANY = st.characters(blacklist_characters="\n", blacklist_categories=("Cs",))
LINE = st.one_of(
    st.text(ANY, max_size=40),
    st.sampled_from(ODD),
    st.builds(lambda c, n: c * n, st.sampled_from(["w1 ", "a", "é", "😀", " "]),
              st.integers(500, 20000)),
)
LINES = st.lists(LINE, min_size=1, max_size=12)


def as_read(line: str) -> str:
    """What nmt reads back from the file: only '\\n' (and '\\r' before it) ends a line."""
    return line[:-1] if line.endswith("\r") else line


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    rng = np.random.default_rng(0)
    words = ["haus", "katze", "hund", "der", "die", "das", "ist", "groß", "klein", "und"]
    src = [" ".join(rng.choice(words, size=rng.integers(2, 8))) for _ in range(80)]
    (d / "train.de").write_text("\n".join(src) + "\n")
    (d / "train.en").write_text("\n".join(s.upper() for s in src) + "\n")
    runner = CliRunner()
    r = runner.invoke(preprocess_main, ["-s", "de", "-t", "en", "--trainpref", str(d / "train"),
                                        "--destdir", str(d / "bin"), "--subword", "bpe",
                                        "--vocab-size", "60", "--joined-dictionary",
                                        "--workers", "1", "-q"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(train_main, [r.stdout.strip(), "--arch", "transformer_tiny",
                                   "--max-update", "3", "--max-tokens", "200", "--threads", "1",
                                   "--save-dir", str(d / "ckpt"), "-q"])
    assert r.exit_code == 0, r.output
    return r.stdout.strip()


@pytest.fixture(scope="module")
def translator(ckpt):
    # Short outputs and sources keep the examples fast; truncation itself is exercised.
    return Translator.from_checkpoint(ckpt, device="cpu",
                                      search=SearchConfig(beam=2, max_len_a=0, max_len_b=8),
                                      batch=BatchConfig(max_source_len=64))


@SETTINGS
@given(lines=LINES)
def test_translator_keeps_one_result_per_line_in_order(translator, lines):
    results = translator.translate_results(lines)
    assert [r.index for r in results] == list(range(len(lines)))
    assert [r.source for r in results] == lines
    for r in results:
        assert "\n" not in r.text


@SETTINGS
@given(lines=LINES, fmt=st.sampled_from(["text", "jsonl"]))
def test_generate_cli_one_line_per_input_line(ckpt, tmp_path, lines, fmt):
    inp = tmp_path / "in.txt"
    inp.write_bytes("".join(l + "\n" for l in lines).encode("utf-8"))
    r = CliRunner().invoke(generate_main, [ckpt, "-i", str(inp), "--beam", "2", "--max-len-a",
                                           "0", "--max-len-b", "8", "--max-source-len", "64",
                                           "--output-format", fmt, "--threads", "1", "-q"])
    assert r.exit_code == 0, r.stderr
    out = r.stdout_bytes.decode("utf-8")
    assert out.count("\n") == len(lines) and out.endswith("\n")
    if fmt == "jsonl":
        objs = [json.loads(l) for l in out.split("\n")[:-1]]
        assert [o["id"] for o in objs] == list(range(len(lines)))
        assert [o["source"] for o in objs] == [as_read(l) for l in lines]


@SETTINGS
@given(pairs=st.lists(st.tuples(LINE, st.booleans()), min_size=1, max_size=12))
def test_score_sentence_mode_one_line_per_hypothesis(tmp_path, pairs):
    if pairs and pairs[0][0].startswith("\ufeff"):
        # a byte-order mark opening a file is dropped on reading (nmt.io)
        pairs = [(pairs[0][0][1:], pairs[0][1]), *pairs[1:]]
    hyps = [as_read(h) for h, _ in pairs]
    # Every other reference differs: the per-line scores must come back in the right place.
    refs = [h if same else "zq xv " + h for h, same in pairs]
    (tmp_path / "hyp").write_bytes("".join(h + "\n" for h in hyps).encode("utf-8"))
    (tmp_path / "ref").write_bytes("".join(r + "\n" for r in refs).encode("utf-8"))
    r = CliRunner().invoke(score_main, ["--ref", str(tmp_path / "ref"), "--hyp",
                                        str(tmp_path / "hyp"), "--sentence", "--metric",
                                        "bleu,chrf", "--quiet"])
    assert r.exit_code == 0, r.stderr
    out = r.stdout_bytes.decode("utf-8")
    assert out.count("\n") == len(pairs) and out.endswith("\n")
    rows = [line.split("\t") for line in out.split("\n")[:-1]]
    assert all(len(row) == 2 for row in rows)
    for (h, same), (bleu, chrf) in zip(pairs, rows):
        if same and h.split():
            assert float(chrf) == 100.0, (h, chrf)
        elif not same and not h.strip():
            assert float(bleu) == 0.0
