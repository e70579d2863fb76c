"""Installs the nmt package and its console scripts."""

from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).parent
version = {}
exec((ROOT / "nmt" / "version.py").read_text(), version)

setup(
    name="nmt",
    version=version["__version__"],
    description="Neural machine translation with the Transformer of 'Attention Is All You Need'",
    long_description=(ROOT / "README.md").read_text(encoding="utf-8") if (ROOT / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["nmt", "nmt.*"]),
    package_data={"nmt": ["resources/*", "resources/**/*"]},
    include_package_data=True,
    install_requires=[
        # The README's commands pin torch==2.13.0 (the tested version); a bare requirement could
        # pull a multi-GB CUDA build. Users with GPUs install their own torch>=2.2 first; pip
        # then keeps it.
        "torch>=2.2,<2.14",
        "sentencepiece>=0.2,<0.3",
        "tokenizers>=0.19,<0.24",
        "sacrebleu>=2.4,<2.7",
        "sacremoses>=0.1,<0.3",
        "click>=8.1,<9",
        "rich>=13,<16",
        "numpy>=1.24,<3",
        # curves.png in every save directory: the first thing to look at after a run.
        "matplotlib>=3.7,<4",
    ],
    extras_require={
        # tensorboard: the tests read --tensorboard-logdir's event files back;
        # starlette + uvicorn: the tests run nmt-serve;
        # pytest-xdist: the suite runs on every core (pytest.ini: -n auto, at most 4)
        "test": ["pytest>=8,<10", "pytest-xdist>=3.6,<4", "hypothesis>=6.100,<7", "psutil>=5.9,<8",
                 "ctranslate2>=4,<5", "tensorboard>=2.14,<3", "starlette>=0.37,<2",
                 "uvicorn>=0.29,<1", "subword-nmt>=0.3.8,<0.4", "transformers>=4.40,<6", "safetensors>=0.4,<1"],
        "plot": ["matplotlib>=3.7,<4"],   # now a core dependency; kept so nmt[plot] still works
        "tensorboard": ["tensorboard>=2.14,<3"],   # nmt-train --tensorboard-logdir
        "export": ["ctranslate2>=4,<5"],           # nmt-export --format ctranslate2
        "serve": ["starlette>=0.37,<2", "uvicorn>=0.29,<1"],   # nmt-serve
        # nmt-import fairseq --bpe-codes: subword-nmt, the code fairseq itself runs, applies
        # the codes, so that imported models see exactly the subwords they were trained on.
        "fairseq": ["subword-nmt>=0.3.8,<0.4"],
        # nmt-import huggingface reads model.safetensors; nmt-export --format huggingface
        # writes it, and transformers runs the result (MarianMTModel, MarianTokenizer).
        "hf": ["transformers>=4.40,<6", "safetensors>=0.4,<1"],
    },
    entry_points={
        "console_scripts": [
            "nmt-preprocess=nmt.cli.preprocess:main",
            "nmt-train=nmt.cli.train:main",
            "nmt-generate=nmt.cli.generate:main",
            "nmt-score=nmt.cli.score:main",
            "nmt-export=nmt.cli.export:main",
            "nmt-serve=nmt.cli.serve:main",
            "nmt-import=nmt.cli.import_:main",
        ]
    },
)
