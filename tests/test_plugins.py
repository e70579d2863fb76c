"""--user-dir: an architecture registered by the user's own package trains with
nmt-train --arch, and the checkpoint it writes decodes without the plugin."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nmt.checkpoint import load_checkpoint
from test_resume_checks import corpus

PLUGIN = '''
from nmt import ModelConfig, register_arch

from .sizes import LAYERS


@register_arch("transformer_plugin_test", "one layer each side, d_model 32")
def transformer_plugin_test() -> ModelConfig:
    return ModelConfig(encoder_layers=LAYERS, decoder_layers=LAYERS, d_model=32, d_ff=48,
                       heads=2, dropout=0.0, max_positions=64)
'''


def run(args):
    return subprocess.run(args, capture_output=True, text=True)


@pytest.fixture()
def plugin(tmp_path):
    pkg = tmp_path / "my_archs"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(PLUGIN)
    (pkg / "sizes.py").write_text("LAYERS = 1\n")       # a relative import inside the package
    return pkg


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_plugin_arch_trains_and_its_checkpoint_decodes_without_it(plugin, tmp_path):
    data = corpus(tmp_path / "data", [f"w{i}" for i in range(12)])
    listing = run(["nmt-train", "--user-dir", str(plugin), "--list-archs"])
    assert listing.returncode == 0, listing.stderr
    assert "transformer_plugin_test" in listing.stdout
    # without the plugin the name is unknown, with the usual one-line error
    r = run(["nmt-train", data, "--arch", "transformer_plugin_test", "--max-update", "2",
             "--save-dir", str(tmp_path / "x")])
    assert r.returncode == 2 and "unknown architecture 'transformer_plugin_test'" in r.stderr
    save = tmp_path / "ck"
    r = run(["nmt-train", data, "--user-dir", str(plugin), "--arch", "transformer_plugin_test",
             "--max-tokens", "100", "--warmup", "2", "--max-update", "3", "--threads", "1",
             "--save-dir", str(save)])
    assert r.returncode == 0, r.stderr
    ck = load_checkpoint(r.stdout.strip())
    assert ck["model_config"]["arch"] == "transformer_plugin_test"
    assert ck["model_config"]["encoder_layers"] == 1 and ck["model_config"]["d_model"] == 32
    assert ck["model"]["encoder_layers.0.ffn.fc1.weight"].shape[0] == 48
    src = tmp_path / "in.txt"
    src.write_text("w1 w2 w3\nw4 w5\n")
    r = run(["nmt-generate", str(save / "checkpoint_last.pt"), "-i", str(src), "--threads", "1"])
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2


@pytest.mark.parametrize("kind", ["missing", "no_init", "broken"])
def test_bad_user_dir_is_one_line(tmp_path, kind):
    target = tmp_path / "p"
    if kind != "missing":
        target.mkdir()
    if kind == "broken":
        (target / "__init__.py").write_text("raise ValueError('half-written plugin')\n")
    r = run([sys.executable, "-m", "nmt.cli.train", "--user-dir", str(target), "--list-archs"])
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--user-dir {target}" in lines[0]
    expected = {"missing": "no such folder", "no_init": "needs an __init__.py",
                "broken": "ValueError: half-written plugin"}[kind]
    assert expected in lines[0]
