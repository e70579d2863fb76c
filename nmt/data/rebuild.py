"""Whether a data directory is already what nmt-preprocess was asked to build.

meta.json records ``built_from``: every input file (absolute path, size, modification time)
and every option that changes the output. A rerun of the same command on unchanged inputs
finds the same record in a complete data directory and has nothing to do, so a pipeline that
was interrupted or has finished can be run again and resume where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from nmt.errors import NmtError
from nmt.io import file_record

# Options that do not change the data directory's content (or are compared as files instead).
NOT_OUTPUT = ("workers", "chunk_size", "overwrite", "destdir", "trainpref", "validpref",
              "testpref", "reuse_vocab", "srcdict", "tgtdict")


def _stat(path: Path) -> dict[str, Any]:
    try:
        return file_record(path)
    except OSError:     # reported by the checks that read it; here it only means "no match"
        return {"path": str(path.absolute()), "missing": True}


def _recorded(data_meta: dict) -> Any:
    """meta.json's built_from in today's form: directories built before the file records
    were shared with nmt-generate's journal name a file's size "bytes"."""
    old = data_meta.get("built_from")
    if isinstance(old, dict) and isinstance(old.get("files"), dict):
        old = {**old, "files": {k: ({("size" if f == "bytes" else f): v for f, v in r.items()}
                                    if isinstance(r, dict) else r)
                                for k, r in old["files"].items()}}
    return old


def built_from(cfg, splits: list[tuple[str, str]]) -> dict[str, Any]:
    """The record of what ``cfg`` builds: its input files as they are now, and its options."""
    files: dict[str, Any] = {}
    for name, prefix in splits:
        for lang in (cfg.source_lang, cfg.target_lang):
            files[f"{name}.{lang}"] = _stat(Path(f"{prefix}.{lang}"))
    if cfg.reuse_vocab:
        reused = Path(cfg.reuse_vocab)
        files["reuse_vocab"] = _stat(reused if reused.is_file() else reused / "meta.json")
    for key in ("srcdict", "tgtdict"):
        if getattr(cfg, key):
            files[key] = _stat(Path(getattr(cfg, key)))
    options = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in NOT_OUTPUT}
    if options.get("task") == "auto":
        # the default: a directory built before --task existed is the same build
        del options["task"]
    if not options.get("bpe_dropout"):
        # likewise: without BPE-dropout, a directory built before the option is the same build
        options.pop("bpe_dropout", None)
        options.pop("bpe_dropout_copies", None)
    # JSON round trip, so that the record compares equal to the one read back from meta.json.
    return json.loads(json.dumps({"files": files, "options": options}))


def existing_build(dest: Path, record: dict[str, Any]):
    """The complete data directory at ``dest`` when it was built from ``record``, else None."""
    from nmt.data.datadir import DataDir

    if not (dest / "meta.json").is_file():
        return None
    try:
        data = DataDir.open(dest)
    except NmtError:
        return None
    if _recorded(data.meta) != record:
        return None
    for split in data.meta.get("splits", {}):
        try:
            data.load_split(split)
        except (NmtError, OSError, ValueError):
            return None
    return data


def difference(dest: Path, record: dict[str, Any]) -> str:
    """Why the data directory at ``dest`` is not this build, in a few words ('' if unknown)."""
    try:
        old = _recorded(json.loads((dest / "meta.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(old, dict):
        return "it records no inputs"
    files, old_files = record["files"], old.get("files", {})
    changed = [k for k in files if old_files.get(k) != files[k]]
    changed += [k for k in old_files if k not in files]
    old_options = old.get("options", {})
    if not isinstance(old_options, dict):
        old_options = {}
    # both ways: an option at its default is left out of the record (--bpe-dropout 0)
    options = [k for k in {**old_options, **record["options"]}
               if old_options.get(k) != record["options"].get(k)]
    parts = ([f"input {', '.join(changed[:3])} changed"] if changed else []) + \
            ([f"options {', '.join('--' + o.replace('_', '-') for o in options[:3])} differ"]
             if options else [])
    return "; ".join(parts)


__all__ = ["built_from", "existing_build", "difference"]
