"""nmt-import huggingface and nmt-export --format huggingface, against transformers
itself: a small random MarianMTModel (swish, scaled embeddings, a non-zero final logits bias)
with sentencepiece models trained here, as OPUS-MT ships them; nothing is downloaded."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.nn.utils.rnn import pad_sequence

transformers = pytest.importorskip("transformers")   # the test extra: pip install 'nmt[test]'
from transformers import MarianConfig, MarianMTModel, MarianTokenizer  # noqa: E402

import nmt  # noqa: E402
from nmt.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint  # noqa: E402
from nmt.cli.import_ import main as import_main  # noqa: E402
from nmt.data.codec import TextCodec  # noqa: E402
from nmt.data.subword import train_sentencepiece, train_wordpiece  # noqa: E402
from nmt.search.config import SearchConfig  # noqa: E402
from nmt.search.forced import score_ids, score_pairs  # noqa: E402
from nmt.search.translator import Translator  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MAX_NEW = 20            # output pieces before the eos, both toolkits
SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du", "sha", "qu", "x", "zo"]


def cli(module: str, *args, ok: bool = True) -> subprocess.CompletedProcess:
    """A console script as a real process (python -m nmt.cli.X), this checkout first."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True,
                       text=True, env=env, timeout=300)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def one_line_error(r: subprocess.CompletedProcess, prog: str) -> str:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), r.stderr
    return lines[0]


def sentences(rng: random.Random, n: int) -> list[str]:
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(60)]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 10))).capitalize()
            + rng.choice([".", "?", "!", ""]) for _ in range(n)]


def train_spm(lines: list[str], size: int) -> bytes:
    """A unigram sentencepiece model with sentencepiece's own specials, as OPUS-MT's."""
    import sentencepiece as spm
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=out,
                                   vocab_size=size, model_type="unigram",
                                   character_coverage=1.0, minloglevel=2)
    return out.getvalue()


def marian_vocab(protos: list[bytes]) -> dict[str, int]:
    """vocab.json as OPUS-MT's: </s> 0, <unk> 1, the pieces of both models, <pad> last; the
    last two pieces of each model left out, so that the pipeline meets pieces the vocabulary
    lacks."""
    import sentencepiece as spm
    pieces: list[str] = []
    for proto in protos:
        sp = spm.SentencePieceProcessor(model_proto=proto)
        own = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
        pieces += [p for p in own[:-2] if p not in ("<unk>", "<s>", "</s>") and p not in pieces]
    vocab = {"</s>": 0, "<unk>": 1}
    for p in pieces:
        vocab[p] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def write_marian(d: Path, vocab, protos, seed=0, **overrides) -> MarianMTModel:
    v = len(vocab)
    cfg = MarianConfig(**{
        "vocab_size": v, "decoder_vocab_size": v, "d_model": 32, "encoder_layers": 2,
        "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
        "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "activation_function": "swish",
        "scale_embedding": True, "pad_token_id": v - 1, "eos_token_id": 0,
        "decoder_start_token_id": v - 1, "forced_eos_token_id": 0,
        "max_position_embeddings": 128, "init_std": 0.3, **overrides})
    torch.manual_seed(seed)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 1.0)
        model.final_logits_bias[0, 0] += 4.0        # some outputs end before the limit
    model.generation_config.num_beams = 4
    model.generation_config.max_length = 64
    model.generation_config.bad_words_ids = [[v - 1]]
    model.save_pretrained(d)
    (d / "source.spm").write_bytes(protos[0])
    (d / "target.spm").write_bytes(protos[1])
    (d / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"source_lang": "xx", "target_lang": "yy", "separate_vocabs": False}))
    return model


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """(model directory, the HF model, 50 source lines, 50 target lines)."""
    rng = random.Random(0)
    src, tgt = sentences(rng, 300), sentences(rng, 300)
    protos = [train_spm(src, 80), train_spm(tgt, 80)]
    d = tmp_path_factory.mktemp("opus-mt-xx-yy")
    model = write_marian(d, marian_vocab(protos), protos)
    return d, model, src[:50], tgt[:50]


@pytest.fixture(scope="module")
def imported(marian, tmp_path_factory):
    out = tmp_path_factory.mktemp("imported") / "model.pt"
    r = cli("nmt.cli.import_", "huggingface", marian[0], "-o", out)
    assert r.stdout == f"{out}\n"
    return out


def hf_translate(d: Path, model, lines, beams: int, **generate) -> list[str]:
    tok = MarianTokenizer.from_pretrained(d)
    out = model.generate(**tok(lines, return_tensors="pt", padding=True), num_beams=beams,
                         do_sample=False, max_new_tokens=MAX_NEW + 1, **generate)
    # the target side with target.spm (this transformers' default decodes with source.spm)
    return tok.batch_decode(out, skip_special_tokens=True, use_source_tokenizer=False)


def test_teacher_forced_log_probs_agree_with_transformers(marian, imported):
    d, model, src, tgt = marian
    tok = MarianTokenizer.from_pretrained(d)
    t = Translator.from_checkpoint(imported)
    # the text pipeline: the same pieces -> ids, unknown pieces included
    vocab = {i: p for p, i in tok.get_vocab().items()}
    symbols = t.src_codec.dictionary.symbols
    ids = tok(src).input_ids
    assert [[symbols[i] for i in x] for x in t.src_codec.encode_batch(src)] == \
        [[vocab[i] for i in x[:-1]] for x in ids]
    assert any("<unk>" in [vocab[i] for i in x] for x in ids)
    enc = tok(src, text_target=tgt, return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                       labels=enc.labels).logits
    want = logits.log_softmax(-1).gather(2, enc.labels.unsqueeze(2)).squeeze(2)
    got = score_pairs(t, src, tgt)
    for i, s in enumerate(got):
        n = int(enc.labels[i].ne(tok.pad_token_id).sum())
        assert s.n_tokens == n
        assert torch.allclose(torch.tensor(s.token_scores), want[i, :n], atol=1e-4, rtol=0)


def test_greedy_output_is_transformers_line_for_line(marian, imported, tmp_path):
    d, model, src, _ = marian
    (tmp_path / "in.txt").write_text("".join(f"{s}\n" for s in src), encoding="utf-8")
    r = cli("nmt.cli.generate", imported, "-i", tmp_path / "in.txt", "--beam", "1",
            "--max-len-a", "0", "--max-len-b", MAX_NEW, "-q")
    assert r.stdout.split("\n")[:-1] == hf_translate(d, model, src, 1)


def test_beam_search_is_transformers_line_for_line(marian, imported):
    """Beam 4 with the checkpoint's preset: transformers' length_penalty 1.0 and its rule for
    when a sentence is done (lenpen formula hf)."""
    d, model, src, _ = marian
    t = Translator.from_checkpoint(imported, search=SearchConfig(
        beam=4, max_len_a=0.0, max_len_b=MAX_NEW))
    assert (t.search.lenpen, t.search.lenpen_formula) == (1.0, "hf")
    assert t.translate(src) == hf_translate(d, model, src, 4)


def test_preset_is_transformers_generation_config(imported):
    cfg = nmt.config.ModelConfig.from_dict(load_checkpoint(imported)["model_config"])
    assert (cfg.beam, cfg.lenpen, cfg.lenpen_formula, cfg.max_len_a, cfg.max_len_b) == \
        (4, 1.0, "hf", 0.0, 62)
    assert (cfg.activation, cfg.scale_embedding, cfg.sinusoid_layout, cfg.decoder_start,
            cfg.output_bias, cfg.tie_output) == ("swish", True, "marian", "pad", True, True)


def nmt_model_checkpoint(path: Path, lines: list[str]) -> Path:
    """A model nmt could have trained: its own sentencepiece BPE, Marian's sinusoids, swish,
    an output bias and an untied output projection."""
    codec = TextCodec(train_sentencepiece(lines, 90))
    cfg = nmt.get_arch("transformer_tiny", {"sinusoid_layout": "marian", "activation": "swish",
                                            "output_bias": True, "tie_output": False})
    torch.manual_seed(1)
    model = nmt.build_model(cfg, len(codec.dictionary), len(codec.dictionary))
    with torch.no_grad():
        model.output_bias.normal_(0.0, 1.0)
        model.output_bias[2] += 3.0
    return save_checkpoint(make_checkpoint(
        model_config=cfg, model_state=model.state_dict(), share_all_embeddings=True,
        src_codec=codec, tgt_codec=codec, src_lang="xx", tgt_lang="yy"), path)


def test_round_trip_through_transformers_is_bit_for_bit(marian, tmp_path):
    src = marian[2]
    ckpt = nmt_model_checkpoint(tmp_path / "nmt.pt", sentences(random.Random(1), 300))
    r = cli("nmt.cli.export", ckpt, tmp_path / "hf", "--format", "huggingface")
    assert r.stdout == f"{tmp_path / 'hf'}\n"
    assert sorted(os.listdir(tmp_path / "hf")) == [
        "config.json", "generation_config.json", "model.safetensors", "source.spm",
        "special_tokens_map.json", "target.spm", "tokenizer_config.json", "vocab.json"]
    cli("nmt.cli.import_", "huggingface", tmp_path / "hf", "-o", tmp_path / "back.pt")
    a, b = load_checkpoint(ckpt), load_checkpoint(tmp_path / "back.pt")
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # the preset's alpha (0.6), which generation_config.json gives transformers too, with
    # transformers' formula
    search = SearchConfig(beam=4, lenpen_formula="hf", max_len_a=0.0, max_len_b=MAX_NEW)
    mine = Translator.from_checkpoint(ckpt, search=search).translate_results(src)
    back = Translator.from_checkpoint(tmp_path / "back.pt", search=search)
    got = back.translate_results(src)
    assert [r.hypotheses[0].ids for r in got] == [r.hypotheses[0].ids for r in mine]
    # and transformers translates the export as nmt does. (Texts: the imported checkpoint
    # decodes as MarianTokenizer, which drops <unk>; nmt's own sentencepiece codec writes it
    # as ' ⁇ ', hence the comparison of the imported one's.)
    hf = MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    assert hf_translate(tmp_path / "hf", hf, src, 4) == [r.text for r in got]


def hf_ids(model, src_ids: list[list[int]], **gen) -> list[list[int]]:
    """transformers' output ids (start symbol and eos dropped) for nmt's source ids."""
    x = pad_sequence([torch.tensor([*s, 2]) for s in src_ids], batch_first=True)
    out = model.generate(input_ids=x, attention_mask=x.ne(0), do_sample=False, **gen)
    return [[i for i in row[1:].tolist() if i > 2] for row in out]


# The default run keeps nmt's default positions; the slow run has the other kinds too.
@pytest.mark.parametrize("overrides", [
    {},                                                   # nmt's default: interleaved sinusoids
    pytest.param({"sinusoid_layout": "fairseq", "position_offset": 2}, marks=pytest.mark.slow),
    pytest.param({"positional": "learned"}, marks=pytest.mark.slow),
], ids=["interleaved", "fairseq-offset-2", "learned"])
def test_every_position_kind_exports_translates_and_comes_back(marian, tmp_path, overrides):
    """nmt's default model (and fairseq's sinusoids, and learned positions) through
    transformers: the weights file carries nmt's position table, transformers decodes with
    it as nmt does, and nmt-import recognises it and gives the model back bit for bit."""
    rng = random.Random(3)
    codec = TextCodec(train_sentencepiece(sentences(rng, 300), 90))
    cfg = nmt.get_arch("transformer_tiny", overrides)
    torch.manual_seed(4)
    model = nmt.build_model(cfg, len(codec.dictionary), len(codec.dictionary))
    ckpt = save_checkpoint(make_checkpoint(
        model_config=cfg, model_state=model.state_dict(), share_all_embeddings=True,
        src_codec=codec, tgt_codec=codec), tmp_path / "nmt.pt")
    cli("nmt.cli.export", ckpt, tmp_path / "hf", "--format", "huggingface")
    cli("nmt.cli.import_", "huggingface", tmp_path / "hf", "-o", tmp_path / "back.pt")
    a, b = load_checkpoint(ckpt), load_checkpoint(tmp_path / "back.pt")
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    fields = ("positional", "max_positions", "position_offset") + (
        ("sinusoid_layout",) if cfg.positional == "sinusoidal" else ())
    assert [b["model_config"][f] for f in fields] == [getattr(cfg, f) for f in fields]

    src, tgt = sentences(rng, 40), sentences(rng, 40)
    hf = MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    t = Translator.from_checkpoint(ckpt, search=SearchConfig(beam=1, max_len_a=0.0,
                                                             max_len_b=MAX_NEW))
    src_ids = [x.tolist() for x in codec.encode_batch(src)]
    mine = [r.hypotheses[0].ids for r in t.translate_results(src)]
    with torch.no_grad():
        assert hf_ids(hf, src_ids, num_beams=1, max_new_tokens=MAX_NEW + 1) == \
            [[i for i in ids if i > 2] for ids in mine]
        tgt_ids = [x.tolist() for x in codec.encode_batch(tgt)]
        x = pad_sequence([torch.tensor([*s, 2]) for s in src_ids], batch_first=True)
        y = pad_sequence([torch.tensor([*s, 2]) for s in tgt_ids], batch_first=True)
        logits = hf(input_ids=x, attention_mask=x.ne(0), labels=y).logits
    want = logits.log_softmax(-1).gather(2, y.unsqueeze(2)).squeeze(2)
    for i, s in enumerate(score_ids(t, src_ids, tgt_ids)):
        n = len(tgt_ids[i]) + 1
        assert torch.allclose(torch.tensor(s.token_scores), want[i, :n], atol=1e-4, rtol=0)

    # transformers' save_pretrained leaves the tables out (it would run Marian's after): the
    # import of what it saved says so rather than import another model
    hf.save_pretrained(tmp_path / "resaved")
    for f in ("source.spm", "target.spm", "vocab.json"):
        (tmp_path / "resaved" / f).write_bytes((tmp_path / "hf" / f).read_bytes())
    r = CliRunner().invoke(import_main, ["huggingface", str(tmp_path / "resaved"), "-o",
                                         str(tmp_path / "x.pt")])
    assert r.exit_code == 1 and "weights have no position tables" in r.stderr, r.stderr


def test_a_position_table_of_no_known_kind_is_refused(marian, tmp_path):
    from click.testing import CliRunner
    from safetensors.torch import load_file, save_file

    from nmt.cli.import_ import main
    from nmt.models.layers import sinusoid_table

    d = tmp_path / "odd"
    d.mkdir()
    for f in os.listdir(marian[0]):
        (d / f).write_bytes((marian[0] / f).read_bytes())
    w = load_file(str(d / "model.safetensors"))
    key = "model.decoder.embed_positions.weight"
    table = sinusoid_table(128, 32, 0, "marian")
    w["model.encoder.embed_positions.weight"] = table
    w[key] = table.roll(1, dims=1)                      # a layout no toolkit uses
    save_file(w, str(d / "model.safetensors"))
    r = CliRunner().invoke(main, ["huggingface", str(d), "-o", str(tmp_path / "x.pt")])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1, r.stderr
    assert f"{key} is none of the sinusoid tables" in lines[0]
    assert not (tmp_path / "x.pt").exists()


class RunsCode:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_pickle_is_refused_and_never_run(marian, tmp_path):
    d = tmp_path / "crafted"
    d.mkdir()
    for f in ("config.json", "vocab.json", "source.spm", "target.spm"):
        (d / f).write_bytes((marian[0] / f).read_bytes())
    payload = RunsCode()
    payload.marker = tmp_path / "ran"
    torch.save(payload, d / "pytorch_model.bin")     # torch.save pickles it: os.system
    r = cli("nmt.cli.import_", "huggingface", d, "-o", tmp_path / "x.pt", ok=False)
    assert "refused to load" in one_line_error(r, "nmt-import")
    assert not payload.marker.exists() and not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("change,named", [
    ({"model_type": "bart"}, "model_type 'bart'"),
    ({"activation_function": "gelu_new"}, "activation_function 'gelu_new'"),
    ({"normalize_before": True}, "normalize_before=True"),
    ({"decoder_ffn_dim": 128}, "encoder_ffn_dim=64 differs from decoder_ffn_dim=128"),
    ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings"),
    ({"decoder_start_token_id": 5}, "decoder_start_token_id 5"),
    # all of it at once, as CTranslate2's converters name it, not the first alone
    ({"activation_function": "gelu_new", "decoder_ffn_dim": 128, "dropout": "lots"},
     ("encoder_ffn_dim=64 differs from decoder_ffn_dim=128", "; activation_function 'gelu_new'",
      "; dropout is 'lots', not a probability")),
])
def test_what_nmt_cannot_represent_is_refused_in_one_line(marian, tmp_path, change, named):
    from click.testing import CliRunner

    from nmt.cli.import_ import main

    d = tmp_path / "changed"
    d.mkdir()
    for f in os.listdir(marian[0]):
        (d / f).write_bytes((marian[0] / f).read_bytes())
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, **change}))
    r = CliRunner().invoke(main, ["huggingface", str(d), "-o", str(tmp_path / "x.pt")])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith("nmt-import: error: ") and lines[0].count("cannot import") == 1
    for part in [named] if isinstance(named, str) else named:
        assert part in lines[0], lines[0]
    assert not (tmp_path / "x.pt").exists()


def test_the_export_names_everything_marian_cannot_express_at_once(tmp_path):
    from nmt.interop.ct2_export import export_model

    lines = sentences(random.Random(2), 200)
    codec = TextCodec(train_wordpiece(lines, 60))
    cfg = nmt.get_arch("transformer_tiny", {"pre_norm": True, "layer_norm_eps": "1e-6"})
    model = nmt.build_model(cfg, len(codec.dictionary), len(codec.dictionary))
    ckpt = make_checkpoint(model_config=cfg, model_state=model.state_dict(),
                           share_all_embeddings=True, src_codec=codec, tgt_codec=codec)
    with pytest.raises(nmt.NmtError) as e:
        export_model(ckpt, tmp_path / "hf", format="huggingface")
    message = str(e.value)
    assert message.count("cannot export to huggingface (Marian)") == 1
    for named in ("pre-norm layers", "LayerNorm epsilon 1e-06", "the source side's wordpiece",
                  "the target side's wordpiece"):
        assert named in message, message
    assert not (tmp_path / "hf").exists()


def test_export_refuses_what_marian_cannot_express(tmp_path):
    lines = sentences(random.Random(2), 200)
    for overrides, codec, named in (
            ({"pre_norm": True},
             TextCodec(train_sentencepiece(lines, 60)), "pre-norm"),
            ({}, TextCodec(train_wordpiece(lines, 60)), "wordpiece")):
        cfg = nmt.get_arch("transformer_tiny", overrides)
        model = nmt.build_model(cfg, len(codec.dictionary), len(codec.dictionary))
        ckpt = save_checkpoint(make_checkpoint(
            model_config=cfg, model_state=model.state_dict(), share_all_embeddings=True,
            src_codec=codec, tgt_codec=codec), tmp_path / "m.pt")
        r = cli("nmt.cli.export", ckpt, tmp_path / "hf", "--format", "huggingface", ok=False)
        assert named in one_line_error(r, "nmt-export")
        assert not (tmp_path / "hf").exists()


def test_hf_extra_test_dependency_and_console_script_in_setup(monkeypatch):
    import runpy

    import setuptools

    seen = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    extras = seen["extras_require"]
    assert any(r.startswith("transformers") for r in extras["hf"])
    assert any(r.startswith("transformers") for r in extras["test"])
    assert "nmt-import=nmt.cli.import_:main" in seen["entry_points"]["console_scripts"]


@pytest.mark.parametrize("layout,offset", [("marian", 0), ("interleaved", 0), ("fairseq", 2)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_sinusoid_table_is_recognised(layout, offset, dtype):
    """Tables saved in float16/bfloat16 (a model saved in half precision) are the computed
    ones rounded: recognised as the same layout and offset as in float32."""
    from nmt.interop.hf_positions import recognise_sinusoid
    from nmt.models.layers import sinusoid_table

    table = sinusoid_table(128, 32, offset, layout)
    assert recognise_sinusoid(table) == (layout, offset)
    assert recognise_sinusoid(table.to(dtype)) == (layout, offset)
    assert recognise_sinusoid(table.roll(1, dims=1).to(dtype)) is None


def copy_marian(marian, d: Path) -> Path:
    d.mkdir()
    for f in os.listdir(marian[0]):
        (d / f).write_bytes((marian[0] / f).read_bytes())
    return d


def test_half_precision_weights_import_as_the_float32_ones(marian, imported, tmp_path):
    """The same model saved in float16, position tables included: the import is the float32
    one's, up to float16's rounding of the weights."""
    from safetensors.torch import load_file, save_file

    from nmt.models.layers import sinusoid_table

    d = copy_marian(marian, tmp_path / "half")
    w = load_file(str(d / "model.safetensors"))
    config = json.loads((d / "config.json").read_text())
    table = sinusoid_table(config["max_position_embeddings"], config["d_model"], 0, "marian")
    w = {k: v.half() for k, v in w.items()}
    for side in ("encoder", "decoder"):
        w[f"model.{side}.embed_positions.weight"] = table.half()
    save_file(w, str(d / "model.safetensors"))
    cli("nmt.cli.import_", "huggingface", d, "-o", tmp_path / "half.pt")
    a, b = load_checkpoint(imported), load_checkpoint(tmp_path / "half.pt")
    assert a["model_config"] == b["model_config"]
    assert all(torch.equal(a["model"][k].half().float(), b["model"][k]) for k in a["model"])


def test_the_output_never_replaces_a_file_the_import_reads(marian, imported, tmp_path):
    """-o naming the Marian directory's weights, vocabulary or configuration is refused before
    any work; a checkpoint written into the directory is replaced by re-running the import."""
    from nmt.cli.import_ import main

    d = copy_marian(marian, tmp_path / "opus")
    before = {f: (d / f).read_bytes() for f in os.listdir(d)}
    # target_vocab.json and pytorch_model.bin are not there: written, they would change the
    # next import (separate vocabularies; weights read in another order)
    assert not (d / "target_vocab.json").exists() and not (d / "pytorch_model.bin").exists()
    for name in ("model.safetensors", "vocab.json", "config.json", "source.spm",
                 "target_vocab.json", "pytorch_model.bin"):
        r = CliRunner().invoke(main, ["huggingface", str(d), "-o", str(d / name)])
        assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
        assert "an input of this import" in r.stderr and "give another -o" in r.stderr
    # the Hugging Face cache: a snapshot's files are links into blobs/; -o names the link
    snap, blobs = tmp_path / "cache" / "snapshots" / "rev", tmp_path / "cache" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in os.listdir(d):
        (blobs / f"sha-{f}").write_bytes((d / f).read_bytes())
        (snap / f).symlink_to(blobs / f"sha-{f}")
    r = CliRunner().invoke(main, ["huggingface", str(snap), "-o", str(snap / "model.safetensors")])
    assert r.exit_code == 1 and "an input of this import" in r.stderr, r.stderr
    assert (snap / "model.safetensors").is_symlink()
    for _ in range(2):
        r = CliRunner().invoke(main, ["huggingface", str(d), "-o", str(d / "model.pt")])
        assert r.exit_code == 0 and r.stdout == f"{d / 'model.pt'}\n", r.output
    assert all((d / f).read_bytes() == b for f, b in before.items())
    a, b = load_checkpoint(imported)["model"], load_checkpoint(d / "model.pt")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_vocabulary_sizes_that_disagree_are_refused_in_one_line(marian, tmp_path):
    """vocab.json naming an id past the embedding's rows (it would index outside it) and
    config.json's vocab_size differing from the weights' rows are refused by number."""
    from click.testing import CliRunner

    from nmt.cli.import_ import main

    d = copy_marian(marian, tmp_path / "extra")
    vocab = json.loads((d / "vocab.json").read_text())
    rows = len(vocab)
    (d / "vocab.json").write_text(json.dumps({**vocab, "extra_piece": rows}))
    r = CliRunner().invoke(main, ["huggingface", str(d), "-o", str(tmp_path / "x.pt")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"vocab.json has {rows + 1} pieces, but the model has {rows} vocabulary rows" \
        in r.stderr

    d = copy_marian(marian, tmp_path / "declared")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "vocab_size": rows + 3,
                                               "decoder_vocab_size": rows + 3}))
    r = CliRunner().invoke(main, ["huggingface", str(d), "-o", str(tmp_path / "x.pt")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "vocabulary sizes disagree" in r.stderr and f"vocab_size {rows + 3}" in r.stderr
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("gen,named", [({"num_beams": "four"}, "num_beams='four'"),
                                       ({"length_penalty": [1]}, "length_penalty=[1]"),
                                       ({"max_length": 12.5}, "max_length=12.5")])
def test_badly_typed_generation_settings_are_refused_in_one_line(marian, tmp_path, gen, named):
    from click.testing import CliRunner

    from nmt.cli.import_ import main

    d = copy_marian(marian, tmp_path / "gen")
    (d / "generation_config.json").write_text(json.dumps(gen))
    r = CliRunner().invoke(main, ["huggingface", str(d), "-o", str(tmp_path / "x.pt")])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.stderr
    assert named in r.stderr and "cannot import" in r.stderr


def test_min_length_is_followed_as_transformers_follows_it(marian, tmp_path):
    """generation_config.json's min_length counts the decoder's start symbol: min_length 8 is
    no eos before 7 pieces (nmt's min_len), and beam search then gives transformers' output.
    Generation settings nmt cannot follow are named in a warning, and config.json's are not
    read when generation_config.json is there (as transformers does)."""
    d0, model, src, _ = marian
    d = copy_marian(marian, tmp_path / "minlen")
    gen = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps(
        {**gen, "min_length": 8, "suppress_tokens": [5]}))
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "num_beams": 2}))
    r = cli("nmt.cli.import_", "huggingface", d, "-o", tmp_path / "m.pt")
    assert "suppress_tokens=[5]" in r.stderr, r.stderr
    cfg = load_checkpoint(tmp_path / "m.pt")["model_config"]
    assert (cfg["min_len"], cfg["beam"]) == (7, 4)
    t = Translator.from_checkpoint(tmp_path / "m.pt", search=SearchConfig(
        beam=4, max_len_a=0.0, max_len_b=MAX_NEW))
    got = t.translate(src)
    assert got == hf_translate(d0, model, src, 4, min_length=8)
    assert got != hf_translate(d0, model, src, 4)         # it decides some lines


def test_rows_vocab_json_does_not_name_keep_their_share_of_probability(marian, tmp_path):
    """A model with 4 vocabulary rows more than vocab.json names: transformers' softmax runs
    over every row, so nmt keeps them (under placeholder names) and its log-probabilities
    stay transformers'; dropping them shifted every one."""
    d0, _, src, tgt = marian
    d = tmp_path / "extra-rows"
    d.mkdir()
    vocab = json.loads((d0 / "vocab.json").read_text())
    protos = [(d0 / f"{side}.spm").read_bytes() for side in ("source", "target")]
    model = write_marian(d, vocab, protos, seed=3, vocab_size=len(vocab) + 4,
                         decoder_vocab_size=len(vocab) + 4)
    r = cli("nmt.cli.import_", "huggingface", d, "-o", tmp_path / "m.pt")
    assert "the other 4 are kept under placeholder names" in r.stderr, r.stderr
    t = Translator.from_checkpoint(tmp_path / "m.pt")
    assert [x for x in t.tgt_codec.dictionary.symbols if x.startswith("<unnamed-")] == \
        [f"<unnamed-{i}>" for i in range(len(vocab), len(vocab) + 4)]
    tok = MarianTokenizer.from_pretrained(d)
    enc = tok(src[:8], text_target=tgt[:8], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(input_ids=enc.input_ids, attention_mask=enc.attention_mask,
                       labels=enc.labels).logits
    want = logits.log_softmax(-1).gather(2, enc.labels.unsqueeze(2)).squeeze(2)
    for i, s in enumerate(score_pairs(t, src[:8], tgt[:8])):
        n = int(enc.labels[i].ne(tok.pad_token_id).sum())
        assert torch.allclose(torch.tensor(s.token_scores), want[i, :n], atol=1e-4, rtol=0)


def test_min_len_goes_to_transformers_and_back():
    """An nmt preset's min_len is exported as transformers' min_length (start symbol
    counted) and imported back; min_new_tokens counts no start symbol."""
    from nmt.interop.hf_export import generation_config
    from nmt.interop.hf_import import generation_preset
    from nmt.specials import EOS, PAD

    specials = {PAD: PAD, EOS: EOS}
    assert generation_config(nmt.config.ModelConfig(min_len=3), "x")["min_length"] == 4
    assert "min_length" not in generation_config(nmt.config.ModelConfig(), "x")
    for gen, want in (({"min_length": 4}, 3), ({"min_new_tokens": 5}, 5),
                      ({"min_length": 4, "min_new_tokens": 2}, 3), ({}, 0),
                      ({"min_length": 1}, 0)):
        assert generation_preset(gen, specials, "x")["min_len"] == want, gen


def test_null_generation_settings_are_transformers_defaults(marian, tmp_path):
    """{"max_length": null, "num_beams": null}: transformers' defaults, as absent: greedy, and
    20 new tokens, the forced eos among them (nmt took max_length 20 with the start symbol
    counted: one token fewer than transformers generates)."""
    d = copy_marian(marian, tmp_path / "nulls")
    (d / "generation_config.json").write_text(json.dumps({"max_length": None,
                                                          "num_beams": None}))
    cli("nmt.cli.import_", "huggingface", d, "-o", tmp_path / "m.pt")
    cfg = load_checkpoint(tmp_path / "m.pt")["model_config"]
    assert (cfg["beam"], cfg["max_len_a"], cfg["max_len_b"]) == (1, 0.0, 19)
    # what transformers itself generates with these settings: 19 tokens, then the eos
    model = MarianMTModel.from_pretrained(d).eval()
    x = torch.randint(2, 60, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        y = model.generate(input_ids=x, do_sample=False,
                           decoder_start_token_id=model.config.decoder_start_token_id,
                           eos_token_id=model.config.eos_token_id,
                           pad_token_id=model.config.pad_token_id,
                           forced_eos_token_id=model.config.eos_token_id)
    assert y.size(1) - 1 == cfg["max_len_b"] + 1    # the longest: its tokens and the eos


def test_an_imported_marian_models_ctranslate2_export_tokenizes_as_nmt(marian, imported,
                                                                        tmp_path):
    """translate.py of the CTranslate2 export keeps a leading >>xx<< code as one piece and
    drops <unk> when detokenizing, as nmt's codec (and MarianTokenizer) do."""
    pytest.importorskip("ctranslate2")
    import importlib.util

    from nmt.checkpoint import codecs_from_checkpoint
    from nmt.interop.ct2_export import export_model

    out = export_model(str(imported), tmp_path / "ct2")
    spec = importlib.util.spec_from_file_location("exported", out / "translate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    src, tgt = codecs_from_checkpoint(load_checkpoint(imported), "imported")
    known = set(src.dictionary.symbols)
    for line in [">>yy<< " + marian[2][0], marian[2][1], ">>yy<<" + marian[2][2]]:
        pieces = module.to_pieces(line)                  # CTranslate2 reads an unknown as <unk>
        assert [p if p in known else "<unk>" for p in pieces] == \
            [src.dictionary[i] for i in src.encode(line)]
        assert pieces[0] == ">>yy<<" or not line.startswith(">>")
    ids = tgt.encode(marian[3][0])
    with_unk = [*ids[:2], 3, *ids[2:]]                  # 3: <unk>
    assert module.from_pieces([tgt.dictionary[i] for i in with_unk]) == tgt.decode(with_unk)


@pytest.mark.parametrize("name, target", [("vocab.json", "/dev/zero"),
                                          ("source.spm", "/dev/urandom"),
                                          ("config.json", "fifo")])
def test_devices_and_fifos_are_refused_before_reading(marian, tmp_path, name, target):
    """A symlink to /dev/zero or /dev/urandom grew the import to gigabytes before an error;
    a FIFO hung it forever. Regular files only, checked before a byte is read."""
    d = copy_marian(marian, tmp_path / "m")
    (d / name).unlink()
    if target == "fifo":
        os.mkfifo(d / name)
    else:
        (d / name).symlink_to(target)
    r = cli("nmt.cli.import_", "huggingface", d, "-o", tmp_path / "x.pt", ok=False)
    assert "not a regular file" in one_line_error(r, "nmt-import")
    assert not (tmp_path / "x.pt").exists()


def test_integer_weights_are_refused_by_name(marian, tmp_path):
    """A weight stored as I32 was cast to float silently (values up to 1.2e9, exit 0)."""
    from safetensors.torch import load_file, save_file

    d = copy_marian(marian, tmp_path / "m")
    path = d / "model.safetensors"
    if not path.exists():
        pytest.skip("the fixture saved pytorch_model.bin")
    weights = load_file(str(path))
    key = next(k for k in sorted(weights) if k.endswith("fc1.weight"))
    weights[key] = (weights[key] * 1e9).to(torch.int32)
    save_file(weights, str(path))
    r = cli("nmt.cli.import_", "huggingface", d, "-o", tmp_path / "x.pt", ok=False)
    line = one_line_error(r, "nmt-import")
    assert "not floating point" in line and key in line and "torch.int32" in line


# The default run keeps one bad value; the slow run has them all.
@pytest.mark.parametrize("value", ["lots", *(pytest.param(v, marks=pytest.mark.slow)
                                             for v in (True, 1.5, None))])
def test_a_dropout_that_is_not_a_probability_is_one_line(marian, tmp_path, value):
    """config.json's dropout "lots" was an internal error."""
    d = copy_marian(marian, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["dropout"] = value
    (d / "config.json").write_text(json.dumps(cfg))
    r = cli("nmt.cli.import_", "huggingface", d, "-o", tmp_path / "x.pt", ok=False)
    line = one_line_error(r, "nmt-import")
    assert "dropout is" in line and "not a probability" in line


def hf_loss(d: Path, model, sources: list[str], targets: list[str]) -> tuple[float, int]:
    """transformers' mean cross-entropy of the pairs (per target token, the eos included)."""
    tok = MarianTokenizer.from_pretrained(d)
    total, n = 0.0, 0
    with torch.no_grad():
        for s, t in zip(sources, targets):
            batch = tok([s], text_target=[t], return_tensors="pt")
            k = batch["labels"].numel()
            total += model(**batch).loss.item() * k
            n += k
    return total / n, n


def test_an_imported_model_fine_tunes_on_data_encoded_with_its_own_pipeline(marian, imported,
                                                                             tmp_path):
    """nmt-preprocess --reuse-vocab CKPT encodes new pairs as the imported model does (source
    pieces from source.spm, target pieces from target.spm, ids through vocab.json), and
    nmt-train --init-from starts from its weights: with dropout and label smoothing off and a
    learning rate of 1e-9, the first validation loss is transformers' own loss of the pairs."""
    from nmt.data.datadir import DataDir

    d, model, src, tgt = marian
    for name, rows in (("train", slice(0, 40)), ("valid", slice(40, 50))):
        (tmp_path / f"{name}.xx").write_text("\n".join(src[rows]) + "\n", encoding="utf-8")
        (tmp_path / f"{name}.yy").write_text("\n".join(tgt[rows]) + "\n", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    cli("nmt.cli.preprocess", "-s", "xx", "-t", "yy", "--trainpref", tmp_path / "train",
        "--validpref", tmp_path / "valid", "--reuse-vocab", imported, "--destdir", bin_dir,
        "--workers", 1)
    data = DataDir.open(bin_dir)
    assert data.joined                      # one vocab.json: the embeddings stay shared
    valid = data.load_split("valid")
    tok = MarianTokenizer.from_pretrained(d)
    for i, (s, t) in enumerate(zip(src[40:], tgt[40:])):
        theirs = tok([s], text_target=[t])
        for side, ids, codec in (("input_ids", valid.src(i), data.src_codec),
                                 ("labels", valid.tgt(i), data.tgt_codec)):
            pieces = [codec.dictionary.symbols[j] for j in ids]
            assert pieces == tok.convert_ids_to_tokens(theirs[side][0])[:-1], (side, s, t)

    save = tmp_path / "ft"
    cli("nmt.cli.train", bin_dir, "--init-from", imported, "--max-update", 1, "--max-tokens",
        500, "--warmup", 1, "--lr", 1e-9, "--save-dir", save, "--threads", 1,
        *[x for k in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing")
          for x in ("--override", f"{k}=0")])
    logged = [json.loads(line) for line in (save / "train_log.jsonl").read_text().splitlines()]
    first = next(r for r in logged if r["kind"] == "valid")
    loss, n = hf_loss(d, model, src[40:], tgt[40:])
    assert first["ntokens"] == n
    assert first["nll_loss"] == pytest.approx(loss, rel=1e-5)
