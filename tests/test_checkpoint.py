import os
import pickle

import pytest
import torch

import nmt
from nmt.errors import NmtError
from nmt.training.average import average_checkpoints
from nmt.checkpoint import (load_checkpoint, load_model_from_checkpoint, make_checkpoint,
                            save_checkpoint)

from train_support import FakeData


def make_ckpt(seed: int, share: bool = True) -> dict:
    torch.manual_seed(seed)
    data = FakeData(n_train=4)
    cfg = nmt.get_arch("transformer_tiny")
    v = len(data.src_codec.dictionary)
    model = nmt.build_model(cfg, v, v, share_all_embeddings=share)
    return make_checkpoint(model_config=cfg, model_state=model.state_dict(),
                           share_all_embeddings=share, src_codec=data.src_codec,
                           tgt_codec=data.tgt_codec, src_lang="xx", tgt_lang="yy",
                           data_dir="fake",
                           training={"optimizer": {"state": {}, "param_groups": []},
                                     "progress": {"update": seed}})


def test_roundtrip_and_model_rebuild(tmp_path):
    ck = make_ckpt(1)
    path = save_checkpoint(ck, tmp_path / "c.pt")
    model, loaded = load_model_from_checkpoint(path)
    assert loaded["model_config"] == ck["model_config"]
    for k, v in model.state_dict().items():
        assert torch.equal(v, ck["model"][k])
    assert not model.training
    # also accepts an already loaded dict (what nmt-generate reuses)
    model2, _ = load_model_from_checkpoint(load_checkpoint(path))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    assert not list(tmp_path.glob("*.tmp"))


def mapped_files() -> set[str]:
    """Files this process has memory-mapped (Linux: /proc/self/maps)."""
    with open("/proc/self/maps", encoding="utf-8") as f:
        return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc (Linux)")
def test_mmap_maps_the_file_instead_of_reading_it_and_reads_legacy_files_whole(tmp_path):
    """Readers that need the weights alone map the checkpoint, so a training checkpoint's
    optimizer state (twice the weights) is never read; a legacy (non-zip) file is read whole."""
    ck = make_ckpt(1)
    ck["optimizer"] = {"state": {0: {"exp_avg": torch.randn(64, 64)}}, "param_groups": []}
    path = save_checkpoint(ck, tmp_path / "train.pt")
    mapped = load_checkpoint(path, mmap=True)
    assert str(path) in mapped_files()
    assert torch.equal(mapped["optimizer"]["state"][0]["exp_avg"],
                       ck["optimizer"]["state"][0]["exp_avg"])
    del mapped
    read = load_checkpoint(path)                         # training resumes read it whole
    assert all(torch.equal(read["model"][k], v) for k, v in ck["model"].items())
    model, loaded = load_model_from_checkpoint(path)     # what nmt-generate does: mapped
    assert str(path) in mapped_files()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in ck["model"].items())
    del loaded
    legacy = tmp_path / "legacy.pt"
    torch.save(ck, legacy, _use_new_zipfile_serialization=False)
    old = load_checkpoint(legacy, mmap=True)
    assert str(legacy) not in mapped_files()
    assert all(torch.equal(old["model"][k], v) for k, v in ck["model"].items())


def test_average_is_the_mean_of_the_inputs(tmp_path):
    paths = [save_checkpoint(make_ckpt(s), tmp_path / f"checkpoint_{s}.pt") for s in (1, 2, 3)]
    avg = average_checkpoints(paths)
    ins = [load_checkpoint(p)["model"] for p in paths]
    for k, v in avg["model"].items():
        expect = (ins[0][k].double() + ins[1][k].double() + ins[2][k].double()) / 3
        assert torch.allclose(v.double(), expect, rtol=0, atol=1e-7), k
        assert v.dtype == ins[0][k].dtype
    assert "optimizer" not in avg and "progress" not in avg
    out = save_checkpoint(avg, tmp_path / "avg.pt")
    model, _ = load_model_from_checkpoint(out)   # loadable like any checkpoint
    assert torch.equal(model.tgt_embed.weight, avg["model"]["tgt_embed.weight"])


def test_average_refuses_different_models(tmp_path):
    a = make_ckpt(1)
    b = make_ckpt(2)
    b["model_config"] = {**b["model_config"], "dropout": 0.3}
    pa = save_checkpoint(a, tmp_path / "a.pt")
    pb = save_checkpoint(b, tmp_path / "b.pt")
    with pytest.raises(NmtError, match="configuration differs"):
        average_checkpoints([pa, pb])


def test_average_refuses_mixed_embedding_sharing_and_names_what_differs(tmp_path):
    """Shared and separate embeddings have the same tensor names: the average was written and
    loaded, one table silently winning. The configuration error names the field, and an
    --output that is one of the inputs is refused (it replaced a training checkpoint)."""
    from nmt.training.average import average_to_file

    a, b = make_ckpt(1), make_ckpt(2, share=False)
    pa = save_checkpoint(a, tmp_path / "a.pt")
    pb = save_checkpoint(b, tmp_path / "b.pt")
    with pytest.raises(NmtError, match="share_all_embeddings is False, .* True"):
        average_checkpoints([pa, pb])
    c = make_ckpt(3)
    c["model_config"] = {**c["model_config"], "dropout": 0.3}
    pc = save_checkpoint(c, tmp_path / "c.pt")
    with pytest.raises(NmtError, match=r"differs from .*a.pt \(dropout 0.3 vs 0.1\)"):
        average_checkpoints([pa, pc])
    pd = save_checkpoint(make_ckpt(4), tmp_path / "d.pt")
    before = pa.read_bytes()
    with pytest.raises(NmtError, match="is one of the checkpoints to average"):
        average_to_file([pa, pd], pa)
    assert pa.read_bytes() == before


def test_average_refuses_the_same_file_twice(tmp_path):
    # checkpoint_last.pt is a hard link to the newest numbered checkpoint: a glob such as
    # checkpoint_*.pt would give it twice and weigh it double.
    paths = [save_checkpoint(make_ckpt(s), tmp_path / f"checkpoint_{s}.pt") for s in (1, 2)]
    last = tmp_path / "checkpoint_last.pt"
    try:
        os.link(paths[-1], last)
    except OSError:
        pytest.skip("no hard links on this file system")
    for bad in ([*paths, last], [paths[0], paths[0]]):
        with pytest.raises(NmtError, match="same file as .* averaged twice"):
            average_checkpoints(bad)
    from click.testing import CliRunner

    from nmt.cli.train import main as train_main
    r = CliRunner().invoke(train_main, ["--average", *map(str, paths), str(last),
                                        "--output", str(tmp_path / "avg.pt")])
    assert r.exit_code != 0 and "same file as" in r.output
    assert "Traceback" not in r.output and not (tmp_path / "avg.pt").exists()
    assert len(average_checkpoints(paths)["averaged_from"]) == 2


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > " + os.environ.get("EVIL_MARK", "/dev/null"),))


@pytest.mark.parametrize("protocol", [2, 4])
def test_crafted_pickle_is_refused(tmp_path, monkeypatch, protocol):
    mark = tmp_path / "pwned"
    monkeypatch.setenv("EVIL_MARK", str(mark))
    raw = tmp_path / "raw.pt"
    raw.write_bytes(pickle.dumps({"format_version": 1, "x": Evil()}, protocol=protocol))
    zipped = tmp_path / "zip.pt"
    torch.save({"format_version": 1, "model": {}, "x": Evil()}, zipped)
    for p in (raw, zipped):
        with pytest.raises(NmtError) as e:
            load_checkpoint(p)
        assert "\n" not in str(e.value) and str(p) in str(e.value)
    assert not mark.exists()


def test_bad_files(tmp_path):
    good = save_checkpoint(make_ckpt(1), tmp_path / "good.pt")
    data = good.read_bytes()
    cases = {
        "missing.pt": None,
        "empty.pt": b"",
        "truncated.pt": data[: len(data) // 2],
        "garbage.pt": b"not a checkpoint at all\n" * 10,
    }
    for name, content in cases.items():
        p = tmp_path / name
        if content is not None:
            p.write_bytes(content)
        with pytest.raises(NmtError) as e:
            load_checkpoint(p)
        assert "\n" not in str(e.value)
    future = make_ckpt(1)
    future["format_version"] = 99
    torch.save(future, tmp_path / "future.pt")
    with pytest.raises(NmtError, match="format_version 99"):
        load_checkpoint(tmp_path / "future.pt")
    torch.save({"format_version": 1}, tmp_path / "incomplete.pt")
    with pytest.raises(NmtError, match="missing"):
        load_checkpoint(tmp_path / "incomplete.pt")
    with pytest.raises(NmtError, match="directory"):
        load_checkpoint(tmp_path)


def test_weights_that_do_not_fit_the_config(tmp_path):
    ck = make_ckpt(1)
    ck["model_config"] = {**ck["model_config"], "d_model": 32}
    p = save_checkpoint(ck, tmp_path / "c.pt")
    with pytest.raises(NmtError, match="do not match"):
        load_model_from_checkpoint(p)


def test_a_version_1_checkpoint_is_upgraded_as_it_loads(tmp_path):
    """Files of format 1 written before the task, the vocabulary sizes and the checkpoint
    selection were recorded load as the current format, with each filled in as version 1
    meant it: the task inferred from the target vocabulary, the sizes from the codecs, the
    selection from 'best_loss'."""
    from nmt.checkpoint import FORMAT_VERSION

    ck = make_ckpt(3)
    old = {k: v for k, v in ck.items() if k not in ("task", "src_vocab_size", "tgt_vocab_size")}
    old["format_version"] = 1
    old["progress"] = {"update": 3, "best_loss": 4.25}
    save_checkpoint(old, tmp_path / "v1.pt")
    loaded = load_checkpoint(tmp_path / "v1.pt")
    assert loaded["format_version"] == FORMAT_VERSION == 2
    assert loaded["task"] == "translation"
    assert (loaded["src_vocab_size"], loaded["tgt_vocab_size"]) == (
        ck["src_vocab_size"], ck["tgt_vocab_size"])
    assert loaded["progress"]["selection"] == {"metric": "loss", "best": 4.25,
                                               "best_update": None, "bad_in_a_row": 0,
                                               "scores": []}
    from nmt.training.selection import Selection

    sel = Selection("loss")
    sel.load_state_dict(loaded["progress"]["selection"])
    assert sel.best == 4.25 and not sel.observe(5, 4.5) and sel.observe(6, 4.0)
    # the model it describes is the same
    model, _ = load_model_from_checkpoint(tmp_path / "v1.pt")
    assert all(torch.equal(v, ck["model"][k]) for k, v in model.state_dict().items())
    # a version this nmt does not know is refused in one line
    save_checkpoint({**ck, "format_version": 3}, tmp_path / "v3.pt")
    with pytest.raises(NmtError, match="format_version 3 .this nmt reads versions 1 to 2"):
        load_checkpoint(tmp_path / "v3.pt")
