"""Files from outside: a data directory's meta.json, its shards and subword models, and a
checkpoint are checked before they are trusted.

Every test writes the crafted file for real (meta.json, a .bin shard, a checkpoint saved with
torch.save, a garbage sentencepiece model) and runs the real console script on it: a one-line
error naming the file and the field, a non-zero exit, no traceback, and nothing read from
outside (the first line of a file planted beside the data directory never shows). The crafted
checkpoints run under an address-space limit of a few GB, so that a model built before its
configuration is checked fails loudly instead of quietly allocating 50 GB.
"""

import base64
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import skip_unless_ci

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
SECRET = "secret-first-line-of-an-outside-file"
MEMORY_LIMIT = 4 << 30          # bytes of address space for the crafted-checkpoint runs


def run(args, limit=None):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=ENV,
                          timeout=300, stdin=subprocess.DEVNULL,
                          preexec_fn=set_limit if limit else None)


def one_line_error(prog, r, *words):
    """The single error line of ``prog`` (asserted to be the last thing said)."""
    assert r.returncode not in (0, None), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith(f"{prog}: error: ")]
    assert len(errors) == 1 and r.stderr.rstrip().endswith(errors[0]), r.stderr
    for w in words:
        assert w in errors[0], (w, errors[0])
    assert SECRET not in r.stderr and SECRET not in r.stdout and r.stdout == ""
    return errors[0]


def preprocess(env, dest, *extra):
    return ["nmt-preprocess", "-s", "xx", "-t", "yy", "--trainpref", env["root"] / "train",
            "--destdir", dest, "--workers", "1", "-q", *extra]


def checkpoint_of(data_dir, share: bool) -> dict:
    """A tiny untrained checkpoint in the real format, with the codecs of ``data_dir``."""
    import nmt
    from nmt.checkpoint import make_checkpoint
    from nmt.data.datadir import DataDir

    dd = DataDir.open(data_dir)
    cfg = nmt.get_arch("transformer_tiny")
    model = nmt.build_model(cfg, len(dd.src_codec), len(dd.tgt_codec), share_all_embeddings=share)
    return make_checkpoint(model_config=cfg, model_state=model.state_dict(),
                           share_all_embeddings=share, src_codec=dd.src_codec,
                           tgt_codec=dd.tgt_codec, src_lang="xx", tgt_lang="yy")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Two data directories (whitespace, joined; BPE, separate), a checkpoint of each, and a
    file outside them whose first line must never be shown."""
    root = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(20)]
    src = [" ".join(rng.choice(words, size=rng.integers(2, 7))) for _ in range(40)]
    (root / "train.xx").write_text("\n".join(src) + "\n")
    (root / "train.yy").write_text("\n".join(s[::-1] for s in src) + "\n")
    (root / "secret.txt").write_text(f"{SECRET}\nmore of it 1\n")
    (root / "in.txt").write_text("w1 w2 w3\nw4\n")
    e = {"root": root, "secret": root / "secret.txt"}
    for name, extra in (("none", ["--subword", "none", "--joined-dictionary"]),
                        ("bpe", ["--subword", "bpe", "--vocab-size", "40"])):
        r = run(preprocess(e, root / name, *extra))
        assert r.returncode == 0, r.stderr
        e[name] = root / name
    torch.manual_seed(0)
    e["ckpt"] = checkpoint_of(e["none"], share=True)
    e["bpe_ckpt"] = checkpoint_of(e["bpe"], share=False)
    torch.save(e["ckpt"], root / "good.pt")
    e["good.pt"] = root / "good.pt"
    return e


def crafted_dir(env, tmp_path, base="none", edit=None) -> Path:
    """A copy of data directory ``base`` with ``edit(meta)`` applied to its meta.json."""
    d = tmp_path / f"crafted-{base}"
    shutil.copytree(env[base], d)
    if edit is not None:
        meta = json.loads((d / "meta.json").read_text())
        edit(meta)
        (d / "meta.json").write_text(json.dumps(meta))
    return d


# --- item 6: files named in meta.json stay inside the data directory -----------------------

def _set(path, value):
    """An edit of meta.json: the field at dotted ``path`` becomes ``value`` (None deletes)."""
    def edit(meta):
        *parents, last = path.split(".")
        for p in parents:
            meta = meta[p]
        if value is None:
            del meta[last]
        else:
            meta[last] = value(meta[last]) if callable(value) else value
    return edit


def _symlink_out(name):
    def make(d, env):
        (d / name).unlink()
        (d / name).symlink_to(env["secret"])
    return make


OUTSIDE = {
    # case: (data directory, meta.json edit or file change, words of the error)
    "dict-absolute": ("none", lambda d, env: _set("vocab.xx.dict", str(env["secret"])),
                      ["meta.json", "'vocab.xx.dict'"]),
    "dict-dotdot": ("none", lambda d, env: _set("vocab.xx.dict",
                                                os.path.relpath(env["secret"], d)),
                    ["meta.json", "'vocab.xx.dict'"]),
    "model-dotdot": ("bpe", lambda d, env: _set("vocab.yy.model",
                                                os.path.relpath(env["secret"], d)),
                     ["meta.json", "'vocab.yy.model'"]),
    "dict-symlink": ("none", _symlink_out("dict.xx.txt"),
                     ["meta.json", "dict.xx.txt", "outside the data directory"]),
    "model-symlink": ("bpe", _symlink_out("subword.xx.model"),
                      ["meta.json", "subword.xx.model", "outside the data directory"]),
}


@pytest.mark.parametrize("case", sorted(OUTSIDE))
def test_meta_json_cannot_name_a_file_outside_the_directory(env, tmp_path, case):
    base, change, words = OUTSIDE[case]
    d = crafted_dir(env, tmp_path, base)
    edit = change(d, env)
    if edit is not None:
        meta = json.loads((d / "meta.json").read_text())
        edit(meta)
        (d / "meta.json").write_text(json.dumps(meta))
    r = run(preprocess(env, tmp_path / "out", "--reuse-vocab", d))
    one_line_error("nmt-preprocess", r, *words)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow       # DataDir.open, as nmt-preprocess --reuse-vocab runs it above
def test_nmt_train_refuses_a_dictionary_outside_the_directory(env, tmp_path):
    d = crafted_dir(env, tmp_path, "none", _set("vocab.xx.dict", str(env["secret"])))
    r = run(["nmt-train", d, "--arch", "transformer_tiny", "--max-update", "1", "--threads",
             "1", "--save-dir", tmp_path / "ckpt", "-q"])
    one_line_error("nmt-train", r, str(d / "meta.json"), "'vocab.xx.dict'")
    assert not list((tmp_path / "ckpt").glob("checkpoint*"))


def test_a_symlink_inside_the_directory_is_accepted(env, tmp_path):
    # Confinement refuses what leaves the directory, not links within it.
    d = crafted_dir(env, tmp_path, "none")
    (d / "dict.yy.txt").unlink()
    (d / "dict.yy.txt").symlink_to("dict.xx.txt")
    r = run(preprocess(env, tmp_path / "out", "--reuse-vocab", d))
    assert r.returncode == 0, r.stderr
    for lang in ("xx", "yy"):
        assert (tmp_path / "out" / f"dict.{lang}.txt").read_bytes() == \
            (env["none"] / f"dict.{lang}.txt").read_bytes()


MALFORMED = {
    # case: (meta.json edit, the field the error names)
    "vocab-list": (_set("vocab", [1]), "'vocab'"),
    "vocab-missing-lang": (_set("vocab.yy", None), "'vocab'"),
    "dict-number": (_set("vocab.xx.dict", 5), "'vocab.xx.dict'"),
    "size-string": (_set("vocab.xx.size", "44"), "'vocab.xx.size'"),
    "joined-string": (_set("joined", "yes"), "'joined'"),
    "dtype-unknown": (_set("dtype", "bogus"), "'dtype'"),
    "subword-unknown": (_set("subword", "bpe2"), "'subword'"),
    "lang-path": (_set("src_lang", "../xx"), "'src_lang'"),
    "split-path": (_set("splits", lambda s: {"../../train": s["train"]}), "'splits'"),
    "shards-string": (_set("splits.train.shards", "1"), "'splits.train.shards'"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_meta_json_names_the_field(env, tmp_path, case):
    edit, field = MALFORMED[case]
    d = crafted_dir(env, tmp_path, "none", edit)
    r = run(preprocess(env, tmp_path / "out", "--reuse-vocab", d))
    one_line_error("nmt-preprocess", r, str(d / "meta.json"), field)


# --- item 7: token ids of a shard are checked against the vocabulary -------------------------

def _id_too_large(d):
    ids = np.fromfile(d / "train.yy.0.bin", dtype="<u2")
    ids[3] = 60000
    ids.tofile(d / "train.yy.0.bin")


def _id_negative(d):
    # An int32 data directory (vocabularies over 65536 symbols) can hold a negative id.
    meta = json.loads((d / "meta.json").read_text())
    meta["dtype"] = "int32"
    (d / "meta.json").write_text(json.dumps(meta))
    for lang in ("xx", "yy"):
        ids = np.fromfile(d / f"train.{lang}.0.bin", dtype="<u2").astype("<i4")
        if lang == "xx":
            ids[5] = -7
        ids.tofile(d / f"train.{lang}.0.bin")


def _offset_outside(d):
    idx = np.fromfile(d / "train.xx.0.idx", dtype="<i8")
    idx[4] = 10 ** 9
    idx.tofile(d / "train.xx.0.idx")


SHARDS = {"id-too-large": (_id_too_large, ["train.yy.0.bin", "token id 60000", "44 symbols"]),
          "id-negative": (_id_negative, ["train.xx.0.bin", "token id -7"]),
          "offset-outside": (_offset_outside, ["train.xx.0", "corrupt shard"])}


# Offsets were checked before; their case is a guard, in the slow run.
@pytest.mark.parametrize("case", [
    pytest.param(c, marks=[pytest.mark.slow] * (c == "offset-outside")) for c in sorted(SHARDS)])
def test_corrupt_shard_is_named_when_it_is_opened(env, tmp_path, case):
    change, words = SHARDS[case]
    d = crafted_dir(env, tmp_path, "none")
    change(d)
    r = run(["nmt-train", d, "--arch", "transformer_tiny", "--max-update", "1", "--threads",
             "1", "--save-dir", tmp_path / "ckpt", "-q"])
    one_line_error("nmt-train", r, *words)
    assert not list((tmp_path / "ckpt").glob("checkpoint*"))


# --- item 8: a checkpoint's configuration is checked against its tensors ---------------------

def _config(**changes):
    def craft(ck):
        ck["model_config"] = {**ck["model_config"], **changes}
    return craft


def _vocab(n):
    def craft(ck):
        ck["src_vocab_size"] = ck["tgt_vocab_size"] = n
    return craft


def _as_views(shared: bool):
    """Tensors of the right shapes backed by a few MB (torch.save keeps views): with stride 0
    (d_model 65536), or as windows of one storage that all share (80 layers of d_model 1024:
    each tensor fits in the storage, together they need 4.7 GB)."""
    def craft(ck):
        from nmt.config import ModelConfig
        from nmt.models.transformer import meta_model

        big = ({"d_model": 1024, "d_ff": 4096, "heads": 4, "encoder_layers": 40,
                "decoder_layers": 40} if shared else {"d_model": 65536})
        cfg = ModelConfig.from_dict({**ck["model_config"], **big})
        shapes = {k: v.shape for k, v in meta_model(cfg, 44, 44, True).state_dict().items()}
        if shared:
            base = torch.zeros(max(s.numel() for s in shapes.values()), dtype=torch.float16)
            ck["model"] = {k: base[:s.numel()].view(s) for k, s in shapes.items()}
        else:
            ck["model"] = {k: torch.zeros(1).expand(*s) for k, s in shapes.items()}
        ck["model_config"] = cfg.to_dict()
    return craft


CRAFTED = {
    "d_model": (_config(d_model=65536), ["weights do not match", "'tgt_embed.weight'",
                                         "(44, 65536)"]),
    "vocab": (_vocab(10 ** 9), ["src_vocab_size is 1000000000", "44 symbols"]),
    "layers": (_config(encoder_layers=100000), ["encoder_layers 100000", "limit"]),
    "layer-count": (_config(encoder_layers=1000), ["encoder_layers is 1000, the tensors hold"]),
    "max_positions": (_config(max_positions=10 ** 9), ["max_positions", "limit"]),
    "stride-0-views": (_as_views(shared=False), ["'tgt_embed.weight'", "view of a smaller"]),
    "shared-storage": (_as_views(shared=True), ["views sharing a storage"]),
}


SLOW = ("layers", "layer-count")


@pytest.fixture(scope="module")
def generate_fits_the_limit(env):
    """A good checkpoint translates under MEMORY_LIMIT (else this torch build needs more
    address space than the limit allows, and the crafted runs would prove nothing)."""
    r = run(["nmt-generate", env["good.pt"], "-i", env["root"] / "in.txt", "--device", "cpu",
             "--threads", "1", "-q"], limit=MEMORY_LIMIT)
    if r.returncode != 0:
        skip_unless_ci(f"nmt-generate needs more than {MEMORY_LIMIT >> 30} GB of address space "
                    f"here: {r.stderr.strip()[-200:]}")
    from nmt.search.translator import Translator

    want = Translator.from_checkpoint(str(env["good.pt"]), device="cpu").translate(
        ["w1 w2 w3", "w4"])
    assert r.stdout.splitlines() == want


# The default run keeps one case of each check; the slow run has them all.
@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] * (c in SLOW))
                                  for c in sorted(CRAFTED)])
def test_crafted_checkpoint_is_refused_before_allocating(env, tmp_path, generate_fits_the_limit,
                                                         case):
    craft, words = CRAFTED[case]
    ck = {**env["ckpt"], "model": dict(env["ckpt"]["model"])}
    craft(ck)
    path = tmp_path / f"{case}.pt"
    torch.save(ck, path)
    assert path.stat().st_size < 16 << 20          # the file is small; only its claims are big
    r = run(["nmt-generate", path, "-i", env["root"] / "in.txt", "--device", "cpu",
             "--threads", "1"], limit=MEMORY_LIMIT)
    one_line_error("nmt-generate", r, str(path), *words)


def _commands(env, bad, tmp_path):
    return {
        "average": ["nmt-train", "--average", env["good.pt"], bad, "--output",
                    tmp_path / "avg.pt"],
        "init-from": ["nmt-train", env["none"], "--init-from", bad, "--max-update", "1",
                      "--threads", "1", "--save-dir", tmp_path / "run", "-q"],
        "export": ["nmt-export", bad, tmp_path / "exported"],
        "ensemble": ["nmt-generate", env["good.pt"], bad, "-i", env["root"] / "in.txt",
                     "--device", "cpu", "--threads", "1"],
    }


@pytest.mark.parametrize("command", ["average", "export",
                                     *(pytest.param(c, marks=pytest.mark.slow)
                                       for c in ("init-from", "ensemble"))])
def test_every_command_checks_a_checkpoint_before_building_its_model(
        env, tmp_path, generate_fits_the_limit, command):
    if command == "export":
        pytest.importorskip("ctranslate2")
    ck = {**env["ckpt"], "model": dict(env["ckpt"]["model"])}
    _config(d_model=65536)(ck)
    bad = tmp_path / "bad.pt"
    torch.save(ck, bad)
    args = _commands(env, bad, tmp_path)[command]
    r = run(args, limit=MEMORY_LIMIT)
    one_line_error(Path(str(args[0])).name, r, str(bad), "weights do not match")
    assert not (tmp_path / "avg.pt").exists() and not (tmp_path / "exported").exists()
    assert not list((tmp_path / "run").glob("checkpoint*"))


# --- item 10: a garbage sentencepiece model is named ----------------------------------------

GARBAGE = b"\x00\x17 not a sentencepiece model \xff\n" * 8


def test_garbage_sentencepiece_model_in_a_data_directory_is_named(env, tmp_path):
    d = crafted_dir(env, tmp_path, "bpe")
    (d / "subword.yy.model").write_bytes(GARBAGE)
    r = run(preprocess(env, tmp_path / "out", "--reuse-vocab", d))
    one_line_error("nmt-preprocess", r, str(d / "subword.yy.model"),
                   "not a valid sentencepiece model")


def test_garbage_sentencepiece_model_in_a_checkpoint_is_named(env, tmp_path):
    ck = dict(env["bpe_ckpt"])
    codec = json.loads(json.dumps(ck["tgt_codec"]))
    codec["subword"]["model"] = base64.b64encode(GARBAGE).decode("ascii")
    ck["tgt_codec"] = codec
    path = tmp_path / "garbage-spm.pt"
    torch.save(ck, path)
    r = run(["nmt-generate", path, "-i", env["root"] / "in.txt", "--device", "cpu",
             "--threads", "1"])
    one_line_error("nmt-generate", r, str(path), "tgt_codec", "not a valid sentencepiece model")


def test_training_cannot_write_a_configuration_that_loading_refuses():
    # The limits live in ModelConfig.validate, so -o cannot make an unloadable checkpoint.
    import nmt
    from nmt.config import apply_overrides
    from nmt.errors import UsageError

    with pytest.raises(UsageError, match="max_positions 100000 is beyond the limit"):
        apply_overrides(nmt.get_arch("transformer_tiny"), {"max_positions": "100000"})


@pytest.mark.parametrize("variant", [{}, {"positional": "learned", "pre_norm": True}])
@pytest.mark.parametrize("share", [True, False])
def test_meta_model_has_the_shapes_of_the_real_one(variant, share):
    import nmt
    from nmt.config import apply_overrides
    from nmt.models.transformer import Transformer, meta_model

    cfg = apply_overrides(nmt.get_arch("transformer_tiny"), variant)
    real = Transformer(cfg, 50, 50 if share else 60, share).state_dict()
    meta = meta_model(cfg, 50, 50 if share else 60, share).state_dict()
    assert {k: v.shape for k, v in meta.items()} == {k: v.shape for k, v in real.items()}
    assert all(v.is_meta for v in meta.values())


def test_checking_a_checkpoint_stays_cheap():
    # On the meta device torch runs random initialization and arange through python
    # decompositions that import torch._dynamo (seconds); meta_model avoids them, so that
    # every checkpoint load does not pay for it.
    code = ("import sys, nmt; from nmt.models.transformer import meta_model; "
            "meta_model(nmt.get_arch('transformer_base'), 37000, 37000); "
            "print('torch._dynamo' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.stdout.strip() == "False", r.stderr
