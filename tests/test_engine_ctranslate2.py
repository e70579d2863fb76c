"""--engine ctranslate2: nmt's text pipeline around CTranslate2. On a tiny model trained for a
few seconds, greedy output is nmt-generate's byte for byte; beam output is too once nmt
normalizes its probabilities as CTranslate2 does (without <pad> and <s>); the conversion is
cached beside the checkpoint, made once even by processes racing for it; nmt-generate's
guarantees (resume, --workers) hold; a cached model decodes without importing torch; what
CTranslate2 cannot decode as nmt does is a one-line refusal; nmt-serve serves with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt.cli.generate import main as generate_main
from nmt.search.config import BatchConfig, SearchConfig
from nmt.search.translator import Translator

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed "
                                                        "(pip install 'nmt[export]')")

from nmt.engines import ctranslate2 as engine  # noqa: E402
from test_export import normalize_as_ctranslate2, sample_lines, trained  # noqa: E402,F401

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def generate(*args, stdin: str | None = None):
    r = CliRunner().invoke(generate_main, ["-q", "--device", "cpu", *map(str, args)],
                           input=stdin)
    return r.exit_code, r.stdout, r.stderr


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


def copy_of(ckpt: Path, dest: Path) -> Path:
    """A checkpoint of its own, so that each test sees its own cache."""
    dest.mkdir(parents=True, exist_ok=True)
    (dest / ckpt.name).write_bytes(ckpt.read_bytes())
    return dest / ckpt.name


def entries(ckpt: Path) -> list[str]:
    root = ckpt.parent / engine.CACHE_NAME
    return sorted(p.name for p in root.iterdir() if p.name != ".lock") if root.exists() else []


# --- the translations -----------------------------------------------------------------------

def test_greedy_output_is_nmts_byte_for_byte(trained, tmp_path):
    src = write_lines(tmp_path / "in.en", sample_lines())
    outs = {}
    for eng in ("nmt", "ctranslate2"):
        code, out, err = generate(trained, "-i", src, "--beam", 1, "--engine", eng,
                                  "--threads", 1)
        assert code == 0, err
        outs[eng] = out
    assert outs["ctranslate2"] == outs["nmt"]
    assert len(outs["nmt"].split("\n")) == len(sample_lines()) + 1
    assert sum(bool(x) for x in outs["nmt"].split("\n")) > 80   # the model translates


@pytest.mark.parametrize("formula", ["gnmt", "fairseq"])
def test_beam_search_is_nmts_with_ctranslate2s_normalization(trained, monkeypatch, formula):
    """Beam 4, nbest 4: the same hypotheses in the same order, the same scores (CTranslate2
    normalizes each step without <pad> and <s>: so does nmt here; without that, a model
    trained for seconds differs on a few lines, a trained one on none)."""
    lines = sample_lines()
    search = SearchConfig(beam=4, nbest=4, lenpen=0.6 if formula == "gnmt" else 1.0,
                          lenpen_formula=formula)
    engine = Translator.from_checkpoint(trained, search=search, engine="ctranslate2", threads=1)
    got = engine.translate_results(lines)
    own = Translator.from_checkpoint(trained, search=search)
    # nmt's own engine takes larger default batches for a narrow decoder; CTranslate2 not
    assert (engine.max_tokens, own.max_tokens) == (2048, 8192)
    plain = own.translate_results(lines)
    same = sum(g.text == p.text for g, p in zip(got, plain))
    assert same >= 0.9 * len(lines), same

    normalize_as_ctranslate2(monkeypatch)
    translator = Translator.from_checkpoint(trained, search=search)
    ref = translator.translate_results(lines)
    cut = lists = 0
    for g, r, line in zip(got, ref, lines):
        # A hypothesis that reaches the length limit ends there in CTranslate2, with a forced
        # eos in nmt: a line that has one may differ, and its scores do.
        limit = int(1.0 * len(translator.src_codec.encode(line)) + 50)
        if any(len(h.ids) - 1 >= limit for h in g.hypotheses + r.hypotheses):
            cut += 1
            continue
        if not r.hypotheses:             # an empty line
            assert g.hypotheses == [] and g.text == ""
            continue
        assert g.hypotheses[0].ids == r.hypotheses[0].ids, line
        assert g.hypotheses[0].score == pytest.approx(r.hypotheses[0].score, abs=2e-3), line
        assert all(h.token_scores is None for h in g.hypotheses)
        # Below the best, CTranslate2 keeps the beam most probable when more than a beam
        # finish at once, where nmt ranks them all by its length penalty.
        lists += [h.ids for h in g.hypotheses] == [h.ids for h in r.hypotheses]
    assert cut < 0.1 * len(lines), cut
    assert lists >= 0.9 * (len(lines) - cut), lists


def test_int8_takes_nmts_larger_default_batch_for_a_narrow_decoder(trained):
    """CTranslate2's int8 gains from nmt's own engine's larger default batch for a narrow
    decoder; its float32 keeps 8192 // beam; an explicit budget is kept either way."""
    search = SearchConfig(beam=4)
    tokens = {p: Translator.from_checkpoint(trained, search=search, engine="ctranslate2",
                                            precision=p, threads=1).max_tokens
              for p in ("fp32", "int8")}
    own = Translator.from_checkpoint(trained, search=search).max_tokens
    assert tokens == {"fp32": 2048, "int8": own} and own == 8192
    given = Translator.from_checkpoint(trained, search=search, engine="ctranslate2",
                                       precision="int8", threads=1,
                                       batch=BatchConfig(max_tokens=1000))
    assert (given.batch_size, given.max_tokens) == (None, 1000)
    # two batches at once (2 threads): smaller batches, as CTranslate2's own tuning picked;
    # in int8 2048 // beam (as many decoder rows at every beam), from 256 up to 1024, or up
    # to 2048 for a decoder narrower than transformer_small's (as this test model's)
    two = {(p, b): Translator.from_checkpoint(
               trained, search=SearchConfig(beam=b), engine="ctranslate2", precision=p,
               threads=2) for p in ("fp32", "int8") for b in (1, 4, 12)}
    assert {k: (t.inter_threads, t.max_tokens) for k, t in two.items()} == {
        ("fp32", 1): (2, 2048), ("fp32", 4): (2, 2048), ("fp32", 12): (2, 2048),
        ("int8", 1): (2, 2048), ("int8", 4): (2, 512), ("int8", 12): (2, 256)}
    given = Translator.from_checkpoint(trained, search=search, engine="ctranslate2",
                                       threads=2, batch=BatchConfig(max_tokens=1000))
    assert (given.inter_threads, given.max_tokens) == (2, 1000)


def test_the_length_limit_and_min_len_are_nmts(trained):
    """Greedy: the same outputs whatever the limit (nmt's forced eos is where CTranslate2
    stops). Beam search where the limit does not bind (see the module doc of
    nmt.engines.ctranslate2 for where it does)."""
    lines = sample_lines()[:40]
    for search, share in ((SearchConfig(beam=1, max_len_a=0.5, max_len_b=2), 1.0),
                          (SearchConfig(beam=1, max_len_a=0.0, max_len_b=0), 1.0),
                          (SearchConfig(beam=1, min_len=15, max_len_b=20), 1.0),
                          (SearchConfig(beam=4, min_len=12, max_len_b=60), 0.9)):
        got = Translator.from_checkpoint(trained, search=search, engine="ctranslate2",
                                         threads=1).translate(lines)
        ref = Translator.from_checkpoint(trained, search=search).translate(lines)
        same = sum(g == r for g, r in zip(got, ref))
        assert same >= share * len(lines), (search, [(g, r) for g, r in zip(got, ref) if g != r])


def test_greedy_at_the_length_limit_scores_nmts_forced_eos(trained, monkeypatch):
    """Limits that differ within a batch, short enough that most lines reach theirs: each
    output is nmt's and so is its score, the forced eos's log-probability included (one
    scoring pass in CTranslate2, not a decoding call per limit)."""
    lines = [line for line in sample_lines() if line.strip()][:60]
    search = SearchConfig(beam=1, max_len_a=0.5, max_len_b=1)
    got = Translator.from_checkpoint(trained, search=search, engine="ctranslate2",
                                     threads=1).translate_results(lines)
    normalize_as_ctranslate2(monkeypatch)
    translator = Translator.from_checkpoint(trained, search=search)
    ref = translator.translate_results(lines)
    at_limit = 0
    for g, r, line in zip(got, ref, lines):
        limit = int(0.5 * len(translator.src_codec.encode(line)) + 1)
        at_limit += len(r.hypotheses[0].ids) - 1 == limit
        assert g.hypotheses[0].ids == r.hypotheses[0].ids, line
        # float32 sums in two libraries: about 1e-4 of the score apart
        assert g.hypotheses[0].score == pytest.approx(r.hypotheses[0].score, rel=1e-3), line
    assert at_limit >= len(lines) // 2, at_limit


def test_greedy_without_scores_translates_the_same(trained, monkeypatch):
    """translate() and text output ask for no scores: CTranslate2's greedy search then runs
    without its softmax over the vocabulary and without the forced eos's scoring pass, and
    the translations, those cut at their length limit included, are the same."""
    lines = [line for line in sample_lines() if line.strip()][:60]
    t = Translator.from_checkpoint(trained, search=SearchConfig(beam=1, max_len_a=0.5,
                                                                max_len_b=1),
                                   engine="ctranslate2", threads=1)
    scored = []
    end_at = t._end_at
    monkeypatch.setattr(t, "_end_at", lambda rows, *a: scored.append(rows) or end_at(rows, *a))
    with_scores = t.translate_results(lines)
    assert scored, "no line reached its limit: the test would not see the scoring pass"
    scored.clear()
    without = t.translate_results(lines, scores=False)
    assert scored == []
    assert [r.hypotheses[0].ids for r in without] == [r.hypotheses[0].ids for r in with_scores]
    assert [r.text for r in without] == [r.text for r in with_scores]
    assert all(r.hypotheses[0].score is None for r in without)
    assert all(r.hypotheses[0].score is not None for r in with_scores)
    assert t.translate(lines) == [r.text for r in with_scores] and scored == []


# --- the cache ------------------------------------------------------------------------------

def test_converted_once_cached_beside_and_renewed_when_the_checkpoint_changes(
        trained, tmp_path, monkeypatch):
    ckpt = copy_of(trained, tmp_path / "run")
    first = engine.converted_model(ckpt)
    assert first.parent == ckpt.parent / engine.CACHE_NAME and entries(ckpt) == [first.name]
    assert (first / "model.bin").is_file() and (first / engine.META).is_file()

    import nmt.interop.ct2_export

    def no_export(*a, **k):
        raise AssertionError("converted again")

    monkeypatch.setattr(nmt.interop.ct2_export, "export_model", no_export)
    assert engine.converted_model(ckpt) == first          # found, not converted
    monkeypatch.undo()

    from nmt.checkpoint import load_checkpoint, save_checkpoint

    before = ckpt.read_bytes()                              # another model under the same name
    ck = load_checkpoint(ckpt)
    name = next(k for k, v in ck["model"].items() if v.is_floating_point())
    ck["model"][name] = ck["model"][name] + 0.5
    save_checkpoint(ck, ckpt)
    assert ckpt.read_bytes() != before
    second = engine.converted_model(ckpt)
    assert second != first and entries(ckpt) == [second.name]   # the old entry is gone


def test_int8_decodes_a_conversion_quantized_once_beside_the_float32_one(trained, tmp_path):
    """--precision int8 loads an entry whose weights were quantized as nmt-export
    --quantization int8 quantizes them (CTranslate2 then holds no float32 copy while it
    loads); it decodes as CTranslate2 does with that export, and lives beside the float32
    entry until the checkpoint changes."""
    from nmt.interop.ct2_export import export_model

    ckpt = copy_of(trained, tmp_path / "run")
    fp32 = engine.converted_model(ckpt)
    lines = sample_lines()[:20]
    t = Translator.from_checkpoint(ckpt, engine="ctranslate2", precision="int8", threads=1,
                                   search=SearchConfig(beam=1))
    int8 = t.model_dir
    assert sorted([fp32.name, int8.name]) == entries(ckpt) and int8 != fp32
    meta = json.loads((int8 / engine.META).read_text(encoding="utf-8"))
    assert meta["quantization"] == "int8"
    assert (int8 / "model.bin").stat().st_size < 0.6 * (fp32 / "model.bin").stat().st_size
    assert engine.converted_model(ckpt, "int8") == int8
    # the same translations as CTranslate2 given nmt-export's int8 model directly
    export = export_model(ckpt, tmp_path / "int8-export", quantization="int8")
    assert (export / "model.bin").read_bytes() == (int8 / "model.bin").read_bytes()
    direct = ctranslate2.Translator(str(export), compute_type="int8", intra_threads=1)
    symbols = t.src_codec.dictionary.symbols
    want = []
    for i, line in enumerate(lines):
        a = t.src_codec.encode(line)
        limit = t._limit(len(a), i + 1)
        r = direct.translate_batch([[symbols[x] for x in a]], beam_size=1,
                                   min_decoding_length=min(t.search.minimum, limit),
                                   max_decoding_length=limit)[0]
        want.append([t.tgt_codec.dictionary.index(p) for p in r.hypotheses[0]])
    got = [list(r.hypotheses[0].ids[:-1]) for r in t.translate_results(lines, scores=False)]
    assert got == want
    # a new checkpoint under the same name: both entries of the old one go
    from nmt.checkpoint import load_checkpoint, save_checkpoint

    ck = load_checkpoint(ckpt)
    name = next(k for k, v in ck["model"].items() if v.is_floating_point())
    ck["model"][name] = ck["model"][name] + 0.5
    save_checkpoint(ck, ckpt)
    renewed = engine.converted_model(ckpt, "int8")
    assert entries(ckpt) == [renewed.name]


def test_processes_racing_to_convert_make_one_entry(trained, tmp_path):
    ckpt = copy_of(trained, tmp_path / "run")
    code = ("import sys; from nmt.engines.ctranslate2 import converted_model; "
            "print(converted_model(sys.argv[1]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(ckpt)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert len({o[0] for o in outs}) == 1
    assert entries(ckpt) == [Path(outs[0][0].strip()).name]      # no temporaries left


def test_an_unwritable_checkpoint_directory_caches_in_the_users_cache(trained, tmp_path,
                                                                      monkeypatch):
    ckpt = copy_of(trained, tmp_path / "readonly")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    real = os.access
    monkeypatch.setattr(engine.os, "access",
                        lambda p, mode: (mode != os.W_OK or Path(p).parent != ckpt.parent)
                        and real(p, mode))
    entry = engine.converted_model(ckpt)
    assert entry.parent == tmp_path / "cache" / "nmt" / "ctranslate2"


# --- nmt-generate's guarantees --------------------------------------------------------------

def test_workers_and_output_give_the_same_bytes_and_the_engine_is_part_of_the_run(
        trained, tmp_path):
    from nmt.batch.config import GenerateConfig
    from nmt.batch.resumable import run_identity

    ckpt = copy_of(trained, tmp_path / "run")
    src = write_lines(tmp_path / "in.en", sample_lines())
    code, ref, err = generate(ckpt, "-i", src, "--engine", "ctranslate2")
    assert code == 0, err
    out = tmp_path / "out.de"
    code, _, err = generate(ckpt, "-i", src, "--engine", "ctranslate2", "--workers", 2,
                            "--buffer-size", 7, "--output", out)
    assert code == 0, err
    assert out.read_text(encoding="utf-8") == ref
    # what an interrupted run of one engine left is not resumed by the other
    ids = [run_identity([str(ckpt)], GenerateConfig(input_path=str(src), output_path=str(out),
                                                    engine=e), "cpu", "fp32")
           for e in ("nmt", "ctranslate2")]
    assert ids[0] != ids[1] and ids[1]["options"]["engine"] == "ctranslate2"


def test_a_cached_model_decodes_without_torch(trained, tmp_path):
    ckpt = copy_of(trained, tmp_path / "run")
    engine.converted_model(ckpt)
    src = write_lines(tmp_path / "in.en", sample_lines()[:10])
    code = ("import sys\nfrom nmt.cli.generate import main\n"
            f"sys.argv = ['nmt-generate', {str(ckpt)!r}, '-i', {str(src)!r}, '-q', "
            "'--engine', 'ctranslate2', '--threads', '1']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('torch' in sys.modules, file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "False"
    assert len(r.stdout.split("\n")) == 11


@pytest.mark.parametrize("args, words", [
    (["--sampling"], "--sampling"),
    (["--replace-unk"], "--replace-unk"),
    (["--print-alignment", "--output-format", "jsonl"], "--print-alignment"),
    (["--diverse-beam-groups", "2"], "--diverse-beam-groups"),
    (["--lenpen-formula", "hf"], "hf length-penalty"),
    (["--unkpen", "2"], "finite --unkpen"),
    (["CKPT2"], "ensemble"),
])
def test_what_ctranslate2_cannot_decode_as_nmt_is_refused_in_one_line(trained, tmp_path, args,
                                                                      words):
    src = write_lines(tmp_path / "in.en", ["a dog ."])
    args = [str(trained) if a == "CKPT2" else a for a in args]
    code, out, err = generate(trained, "-i", src, "--engine", "ctranslate2", *args)
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "--engine nmt" in lines[0], err


def test_prefixes_and_constraints_are_refused_before_anything_is_written(trained, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"source": "a dog ."}) + "\n"
                   + json.dumps({"source": "a cat .", "prefix": "eine"}) + "\n",
                   encoding="utf-8")
    out = tmp_path / "out.de"
    code, _, err = generate(trained, "-i", src, "--input-format", "jsonl", "--engine",
                            "ctranslate2", "--output", out)
    assert code != 0 and not out.exists()
    assert "forced prefixes" in err and len(err.strip().splitlines()) == 1, err


# --- nmt-serve ------------------------------------------------------------------------------

def test_nmt_serve_with_ctranslate2_answers_as_nmt_generate(trained, tmp_path):
    from test_serve import Server, request, translate

    lines = sample_lines()[:20]
    code, ref, err = generate(trained, "-i", write_lines(tmp_path / "in.en", lines),
                              "--engine", "ctranslate2")
    assert code == 0, err
    s = Server(tmp_path, trained, "--engine", "ctranslate2").wait_ready()
    try:
        assert translate(s.url, text=lines) == ref.split("\n")[:-1]
        status, body = request(s.url + "/translate",
                               json.dumps({"text": ["a dog ."], "prefix": "ein"}).encode())
        assert status == 400 and "forced prefixes" in body["error"], body
        status, body = request(s.url + "/translate",
                               json.dumps({"text": ["a dog ."], "unkpen": 1.5}).encode())
        assert status == 400 and "--unkpen" in body["error"], body
        status, body = request(s.url + "/translate",
                               json.dumps({"text": ["a dog ."], "sampling": True}).encode())
        assert status == 400 and "does not sample" in body["error"], body
    finally:
        assert s.stop() == 0, s.stderr()
    assert "CTranslate2" in s.stderr()
