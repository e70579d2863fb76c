"""benchmarks/joeynmt_compare.py: its pure parts (configuration, log reading, data checks).

Nothing here installs JoeyNMT or runs it; the harness itself is run by hand (see its docstring).
"""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import joeynmt_compare as jc  # noqa: E402


def small_config(tmp_path, **kw):
    splits = {s: tmp_path / name for s, name in jc.SPLITS.items()}
    return jc.joey_config(splits, "en", "de", tmp_path / "spm.model", tmp_path / "vocab.txt",
                          tmp_path / "model", jc.arch_fields("transformer_small"), 4096, 40, **kw)


def test_config_mirrors_transformer_small(tmp_path):
    cfg = small_config(tmp_path)
    json.loads(json.dumps(cfg))                         # written as JSON, read as YAML
    for side in ("encoder", "decoder"):
        s = cfg["model"][side]
        assert (s["num_layers"], s["hidden_size"], s["ff_size"], s["num_heads"]) == (
            3, 256, 1024, 4)
        assert s["dropout"] == 0.1 and s["layer_norm"] == "post" and s["activation"] == "relu"
        assert s["embeddings"] == {"embedding_dim": 256, "scale": True, "dropout": 0.1}
    assert cfg["model"]["tied_embeddings"] and cfg["model"]["tied_softmax"]
    t = cfg["training"]
    assert (t["batch_type"], t["batch_size"], t["updates"]) == ("token", 4096, 40)
    assert (t["scheduling"], t["learning_rate_warmup"], t["label_smoothing"]) == ("noam", 4000, 0.1)
    # eq. 5 at step 1 for d_model 256, warm-up 4000; JoeyNMT must not stop on its minimum rate
    assert t["learning_rate"] == pytest.approx(256 ** -0.5 * 4000 ** -1.5)
    assert t["learning_rate_min"] == 0.0
    assert t["logging_freq"] == 1 and t["validation_freq"] > t["updates"]
    d = cfg["data"]
    assert d["train"] == str(tmp_path / "train") and d["dev"] == str(tmp_path / "val")
    assert d["test"] == str(tmp_path / "test_2016_flickr")
    assert d["src"]["voc_file"] == d["trg"]["voc_file"] == str(tmp_path / "vocab.txt")
    assert d["trg"]["tokenizer_cfg"] == {"model_file": str(tmp_path / "spm.model")}
    assert (cfg["testing"]["beam_size"], cfg["testing"]["beam_alpha"]) == (4, 0.6)
    assert small_config(tmp_path, warmup=1000)["training"]["learning_rate_warmup"] == 1000


def mark(kind, **fields):
    return jc.MARK + json.dumps({"kind": kind, **fields})


def test_train_figures_sum_tokens_and_seconds_after_warm_up():
    text = "\n".join([
        "INFO - joeynmt.model - Total params: 7577600",
        mark("update", step=1, tokens=100000, seconds=1.0),      # warm-up: ignored
        mark("update", step=2, tokens=2000, seconds=1.0),
        "Epoch 1, Step: 2, Tokens per Sec: 2000",
        mark("update", step=3, tokens=1000, seconds=2.0),
        mark("predict", sentences=1, tokens=5)])
    f = jc.train_figures(text, warm_updates=1)
    assert f["updates"] == 2 and f["tgt_tokens"] == 3000 and f["seconds"] == 3.0
    assert f["tgt_tokens_per_s"] == 1000.0            # sum / sum, not the mean of 2000 and 500
    assert f["updates_per_s"] == pytest.approx(2 / 3) and f["params"] == 7577600
    with pytest.raises(jc.Skip, match="no update after the 3 warm-up"):
        jc.train_figures(text, warm_updates=3)


def test_generate_figures_use_joeynmt_decoding_time():
    text = "\n".join(["Generation took 4.0000[sec].", mark("predict", sentences=10, tokens=200),
                      "Evaluation result (beam search): bleu:   1.25, 0.0132[sec]"])
    g = jc.generate_figures(text)
    assert (g["sentences_per_s"], g["target_tokens_per_s"], g["bleu"]) == (2.5, 50.0, 1.25)
    with pytest.raises(jc.Skip, match="expected one decoded set"):
        jc.generate_figures(text + "\nGeneration took 1.0[sec].\n" + mark("predict", sentences=1,
                                                                          tokens=1))


def test_find_splits_names_the_missing_file(tmp_path):
    for name in ("train", "val", "test_2016_flickr"):
        (tmp_path / f"{name}.en").write_text("a\n")
        if name != "val":
            (tmp_path / f"{name}.de").write_text("b\n")
    with pytest.raises(jc.Skip, match=r"no val\.de"):
        jc.find_splits(tmp_path, "en", "de")
    (tmp_path / "val.de").write_text("b\n")
    assert jc.find_splits(tmp_path, "en", "de")["dev"] == tmp_path / "val"


def test_learn_bpe_writes_pieces_without_specials(tmp_path):
    pytest.importorskip("sentencepiece")
    words = ["a dog runs", "two men sit on a bench", "a girl in a red coat", "the cat sleeps"]
    (tmp_path / "train.en").write_text("\n".join(words * 20) + "\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("\n".join(w.upper() for w in words * 20) + "\n",
                                       encoding="utf-8")
    model, vocab = jc.learn_bpe(tmp_path / "train", "en", "de", 60, tmp_path / "bpe", 1)
    pieces = vocab.read_text(encoding="utf-8").splitlines()
    assert model.stat().st_size > 0 and len(pieces) == len(set(pieces)) > 20
    assert not {"<pad>", "<s>", "</s>", "<unk>"} & set(pieces)
    assert {"▁a", "▁A"} <= set(pieces)                       # learned on both languages
    before = model.stat().st_mtime_ns
    jc.learn_bpe(tmp_path / "train", "en", "de", 60, tmp_path / "bpe", 1)   # reused
    assert model.stat().st_mtime_ns == before


def test_runner_is_valid_python_with_the_same_mark():
    compile(jc.RUNNER, "joey_runner.py", "exec")
    assert f"MARK = {jc.MARK!r}" in jc.RUNNER
