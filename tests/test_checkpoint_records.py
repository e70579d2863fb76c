"""A memory-mapped checkpoint is read as the full read would read it: a re-zipped (deflated)
checkpoint gives the same weights and translations, and an archive whose tensor record is
shorter than its tensor is refused in one line, where mapping it read neighbouring bytes."""

import subprocess
import zipfile

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.checkpoint_records import mmap_verdict
from nmt.errors import NmtError

from test_translator import make_checkpoint


def rezip(src, dest, compression=zipfile.ZIP_DEFLATED, change=None):
    with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dest, "w", compression) as zo:
        for info in zi.infolist():
            data = zi.read(info.filename)
            zo.writestr(info.filename, change(info.filename, data) if change else data)
    return dest


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("records") / "tiny.pt")


def test_a_checkpoint_torch_wrote_maps(ckpt):
    assert mmap_verdict(ckpt) is True


def test_a_deflated_checkpoint_is_read_whole_and_translates_the_same(ckpt, tmp_path):
    deflated = rezip(ckpt, tmp_path / "deflated.pt")
    assert mmap_verdict(deflated) is False
    a, b = load_checkpoint(ckpt, mmap=True), load_checkpoint(deflated, mmap=True)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    outs = [subprocess.run(["nmt-generate", "-q", "--threads", "1", str(c)],
                           input="w1 w2 w3\nw4\n", capture_output=True, text=True)
            for c in (ckpt, deflated)]
    assert outs[0].returncode == outs[1].returncode == 0
    assert outs[0].stdout == outs[1].stdout and outs[0].stdout.strip()


def test_a_short_record_is_refused(ckpt, tmp_path):
    with zipfile.ZipFile(ckpt) as z:
        victim = [i.filename for i in z.infolist() if "/data/" in i.filename][2]
    bad = rezip(ckpt, tmp_path / "short.pt", zipfile.ZIP_STORED,
                lambda name, data: data[:len(data) // 2] if name == victim else data)
    with pytest.raises(NmtError, match="corrupt checkpoint .tensor record"):
        load_checkpoint(bad, mmap=True)
    p = subprocess.run(["nmt-generate", "-q", str(bad)], input="w1\n", capture_output=True,
                       text=True)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert "corrupt checkpoint" in p.stderr.strip().splitlines()[-1]


def test_the_probe_runs_nothing(tmp_path):
    """A data.pkl asking for os.system: the probe records names, imports and calls nothing."""
    import os
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'PWNED'}",))

    path = tmp_path / "evil.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(Evil()))
        z.writestr("archive/version", "3\n")
        z.writestr("archive/byteorder", "little")
    assert mmap_verdict(path) is True           # no tensors to check
    assert not (tmp_path / "PWNED").exists()
    with pytest.raises(NmtError, match="refused"):
        load_checkpoint(path, mmap=True)
    assert not (tmp_path / "PWNED").exists()
