"""nmt.batch.translate_file, the library entry point nmt-generate calls: the same output as
the command, a resumable output file, workers, a progress callback, and the run's options
checked once (plan_run) before anything is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager

import pytest

from nmt.batch import GenerateConfig, translate_file
from nmt.batch.run import plan_run
from nmt.errors import UsageError
from test_translator import checkpoint_and_input

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    return checkpoint_and_input(tmp_path_factory, "batch-api", 60, 11)


def _cli_output(f) -> bytes:
    out = f["dir"] / "cli.txt"
    if not out.exists():
        r = subprocess.run([sys.executable, "-m", "nmt.cli.generate", "-q", "--threads", "1",
                            "--buffer-size", "16", f["ckpt"], "-i", f["in"], "-o", str(out)],
                           capture_output=True, text=True, env=ENV, timeout=180)
        assert r.returncode == 0, r.stderr
    return out.read_bytes()


def test_translate_file_writes_what_nmt_generate_writes(f, tmp_path):
    out = tmp_path / "api.txt"
    cfg = GenerateConfig(input_path=f["in"], output_path=str(out), buffer_size=16)
    seen = []

    @contextmanager
    def progress(total, done_before):
        class Shown:
            tokens = 0

            def __call__(self, n):
                seen.append(n)

        yield Shown()
        seen.append(("total", total, done_before))

    summary = translate_file([f["ckpt"]], cfg, threads=1, progress=progress)
    assert out.read_bytes() == _cli_output(f)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert summary.sentences == len(lines) == 60 and summary.tokens > 0
    assert sum(n for n in seen if isinstance(n, int)) == 60
    assert seen[-1] == ("total", 60, 0)
    # The same call again finds its own finished output and does nothing.
    again = translate_file([f["ckpt"]], cfg, threads=1)
    assert again.already_complete and again.sentences == 0
    assert out.read_bytes() == _cli_output(f)


def test_translate_file_with_two_workers_keeps_the_order(f, tmp_path):
    out = tmp_path / "workers.txt"
    cfg = GenerateConfig(input_path=f["in"], output_path=str(out), buffer_size=7)
    summary = translate_file([f["ckpt"]], cfg, threads=2, workers=2)
    assert summary.sentences == 60
    assert out.read_bytes() == _cli_output(f)


def test_a_changed_rerun_is_refused_and_overwrite_starts_afresh(f, tmp_path):
    out = tmp_path / "changed.txt"
    out.write_text("not nmt's\n")
    cfg = GenerateConfig(input_path=f["in"], output_path=str(out), buffer_size=16)
    with pytest.raises(Exception, match="overwrite"):
        translate_file([f["ckpt"]], cfg, threads=1)
    assert out.read_text() == "not nmt's\n"
    translate_file([f["ckpt"]], cfg, threads=1, overwrite=True)
    assert out.read_bytes() == _cli_output(f)


def test_the_input_is_never_the_output(f):
    cfg = GenerateConfig(input_path=f["in"], output_path=f["in"])
    before = open(f["in"], "rb").read()
    with pytest.raises(Exception):
        translate_file([f["ckpt"]], cfg, threads=1, overwrite=True)
    assert open(f["in"], "rb").read() == before


@pytest.mark.parametrize("options, workers, message", [
    (dict(split="test", input_path="in.txt"), 1, "--split and --input exclude each other"),
    (dict(split="test", input_format="jsonl"), 1, "not a --split"),
    (dict(split="test"), 2, "--workers translates --input or stdin"),
    (dict(input_path="in.txt", score_reference=True, reference="ref.txt"), 2,
     "--workers translates --input or stdin"),
])
def test_options_that_exclude_each_other_are_refused_before_loading(options, workers,
                                                                     message):
    with pytest.raises(UsageError, match=message):
        plan_run(GenerateConfig(**options), workers)


def test_the_plan_says_when_the_output_resumes(f, tmp_path):
    to_file = plan_run(GenerateConfig(input_path=f["in"], output_path=str(tmp_path / "o")))
    assert to_file.resumable and to_file.workers == 1 and to_file.shard is None
    assert not plan_run(GenerateConfig(input_path=f["in"])).resumable          # stdout
    assert not plan_run(GenerateConfig(output_path=str(tmp_path / "o"))).resumable  # stdin
