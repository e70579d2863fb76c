"""What the importers and exporters share: reading foreign files safely, nmt dictionaries from
foreign vocabularies (nmt's specials at ids 0-3, the other symbols in the foreign order), rows
permuted to match, the checkpoint written atomically, and the one-line refusal that names
every setting the other side cannot hold (:func:`refuse`).

Nothing read here runs code from a file: JSON is JSON, weights come through ``safetensors`` or
``torch.load(weights_only=True)``, whose restricted unpickler refuses any global it does not
know (a crafted pickle gets a one-line NmtError, and nothing of it is executed).
"""

from __future__ import annotations

import fnmatch
import json
import os
import pickle
import stat
import warnings
import zipfile
from pathlib import Path
from typing import Mapping, Sequence

import torch

from nmt.data.dictionary import Dictionary
from nmt.errors import NmtError
from nmt.io import file_key
from nmt.specials import SPECIALS

# Logit bias of a special symbol nmt needs and the foreign model lacks (Marian has no <s>):
# exp(-100) ~ 4e-44 is no probability at all in float32 next to any real logit, so the softmax
# over the other symbols is the foreign model's own, and yet the value stays finite (a
# fine-tuning loss with label smoothing sums every log-probability).
ABSENT_LOGIT = -100.0


# What an import reads at most, checked before reading: a configuration or vocabulary file,
# a subword model; weights are bounded by their own formats (zip members, safetensors header).
MAX_TEXT_BYTES = 256 << 20


def regular_file(path: Path, what: str, limit: int | None = MAX_TEXT_BYTES) -> Path:
    """``path`` if it is a regular file (links followed) of at most ``limit`` bytes; else a
    one-line NmtError, before a byte is read: a FIFO would hang the import, a device
    (/dev/zero, /dev/urandom) would fill the memory."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise NmtError(f"{path}: no such file (the {what})") from None
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise NmtError(f"{path}: not a regular file (the {what}); a FIFO, device or directory "
                       f"is not read")
    if limit is not None and st.st_size > limit:
        raise NmtError(f"{path}: {st.st_size:,} bytes, more than a {what} has "
                       f"(at most {limit:,})")
    return path


def check_zip_sizes(path: Path, what: str) -> None:
    """A torch.save zip archive stores its members uncompressed: refuse one whose members
    would expand past its own size (a zip bomb), before torch reads them."""
    if not zipfile.is_zipfile(path):
        return
    with zipfile.ZipFile(path) as z:
        expanded = sum(i.file_size for i in z.infolist())
    if expanded > 2 * os.path.getsize(path) + (64 << 20):
        raise NmtError(f"{path}: its members expand to {expanded:,} bytes, far past the file's "
                       f"own size: not a {what} as torch writes one")


def check_float_weights(weights: Mapping[str, torch.Tensor], path: Path) -> None:
    """Refuse integer or boolean weights by name (they would be cast to float silently);
    position-id and version buffers are not weights."""
    bad = sorted(k for k, v in weights.items() if not v.is_floating_point()
                 and not k.endswith(("position_ids", "version")))
    if bad:
        shown = ", ".join(f"{k} ({weights[k].dtype})" for k in bad[:5])
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise NmtError(f"{path}: weights that are not floating point: {shown}{more}")


def refuse(what: str, problems: Sequence[str], sep: str = ": ") -> None:
    """One one-line NmtError, ``what: first; second; ...``, naming every problem found (as
    CTranslate2's converters do) rather than the first alone, so that one run tells all
    that stands in the way; nothing when ``problems`` is empty."""
    if problems:
        raise NmtError(f"{what}{sep}{'; '.join(problems)}")


def probability_problem(value, key: str) -> str | None:
    """Why ``value``, the ``key`` of a foreign configuration, is no dropout rate (a number in
    [0, 1]); None when it is one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        return f"{key} is {value!r}, not a probability between 0 and 1"
    return None


def probability(value, key: str, where: str) -> float:
    """A dropout rate from a foreign configuration: a number in [0, 1], else a one-line
    NmtError naming ``key`` in ``where`` (a rate of "lots" was an internal error)."""
    problem = probability_problem(value, key)
    if problem:
        raise NmtError(f"{where}: cannot import: {problem}")
    return float(value)


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``; one-line NmtError when missing or malformed."""
    regular_file(path, what)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: no such file (the {what})") from None
    except OSError as e:
        raise NmtError(f"{path}: cannot read ({e.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NmtError(f"{path}: not valid JSON ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise NmtError(f"{path}: expected a JSON object (the {what}), got "
                       f"{type(data).__name__}")
    return data


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a .safetensors file (a header and raw bytes: nothing to execute)."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise NmtError(f"{path}: reading .safetensors needs the safetensors package: "
                       f"pip install 'nmt[hf]'") from None
    regular_file(path, "weights file", None)
    try:
        weights = load_file(str(path))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError
        raise NmtError(f"{path}: not a readable safetensors file "
                       f"({' '.join(str(e).split())[:160]})") from None
    check_float_weights(weights, path)
    return weights


def load_torch_weights(path: Path) -> dict[str, torch.Tensor]:
    """A state dict saved with torch.save, read with ``weights_only=True``: tensors and plain
    containers only; anything else is refused with one line and never executed."""
    regular_file(path, "weights file", None)
    check_zip_sizes(path, "weights file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise NmtError(f"{path}: no such file") from None
    except pickle.UnpicklingError as e:
        if "global" in str(e).lower():
            raise NmtError(f"{path}: refused to load: the file asks to build objects other "
                           f"than tensors and plain data (a crafted or foreign pickle)") from None
        raise NmtError(f"{path}: not a readable weights file (the safe loader refused it)"
                       ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, KeyError, AttributeError,
            TypeError, IndexError, OSError) as e:
        msg = " ".join(str(e).split()).split(". ")[0][:160] or type(e).__name__
        raise NmtError(f"{path}: corrupt or truncated weights file ({msg})") from None
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise NmtError(f"{path}: not a state dict of tensors")
    check_float_weights(data, path)
    return data


def nmt_dictionary(symbols: Sequence[str], special_ids: Mapping[int, int]
                   ) -> tuple[Dictionary, list[int]]:
    """nmt's dictionary for a foreign vocabulary ``symbols`` (foreign id order) whose special
    roles sit at ``special_ids`` {nmt special id: foreign id}, and ``order``: for each nmt id,
    the foreign id whose row it takes (-1 for a special the foreign vocabulary lacks).

    The specials come first, as nmt wants them; every other symbol follows in foreign order.
    """
    taken = set(special_ids.values())
    rest = [i for i in range(len(symbols)) if i not in taken]
    for i in rest:
        if symbols[i] in SPECIALS:
            raise NmtError(f"the vocabulary has {symbols[i]!r} at id {i}, not in the role "
                           f"nmt gives that symbol")
    order = [special_ids.get(i, -1) for i in range(len(SPECIALS))] + rest
    return Dictionary([symbols[i] for i in rest]), order


def permute_rows(t: torch.Tensor, order: Sequence[int], fill: float = 0.0) -> torch.Tensor:
    """Rows of ``t`` [V_foreign, ...] in nmt order (``order`` from :func:`nmt_dictionary`);
    a row with no foreign source (-1) is ``fill``."""
    index = torch.tensor([max(i, 0) for i in order])
    out = t.index_select(0, index).clone()
    missing = torch.tensor([i < 0 for i in order])
    if bool(missing.any()):
        out[missing] = fill
    return out


def check_output(out: str | os.PathLike, inputs: Sequence[str | os.PathLike | None] = (),
                 reads: Mapping[str | os.PathLike, Sequence[str]] | None = None) -> Path:
    """The checkpoint path to write, checked before any work: not a directory, and not a file
    the import reads: one of ``inputs``, or a file of a directory in ``reads`` whose name
    matches one of its glob patterns (the fairseq ``dict.*.txt`` of the dictionary directory,
    the Marian directory's config.json, weights, vocabularies), whether or not it exists yet
    (a ``target_vocab.json`` written there would change the next import). Writing one would
    replace or change the model being imported; any other file in those directories (a
    ``model.pt`` an earlier import wrote there) may be replaced as any -o may. The entry
    written is compared, not the file a symlink points to (the Hugging Face cache's snapshot
    files are links into its blobs), and an existing file is also compared by identity
    (case-insensitive file systems)."""
    dest = Path(out)
    if dest.exists() and dest.is_dir():
        raise NmtError(f"{dest}: is a directory; give the checkpoint file to write (-o model.pt)")
    entry = _entry(dest)                # the directory entry atomic_write replaces
    key = file_key(dest)
    for given in filter(None, inputs):
        if entry == _entry(Path(given)) or (key is not None and key == file_key(given)):
            raise NmtError(f"{dest}: is {given}, an input of this import, which writing the "
                           f"checkpoint would replace; give another -o")
    for folder, patterns in (reads or {}).items():
        if Path(folder).is_dir() and _read_from(key, entry, Path(folder), patterns):
            raise NmtError(f"{dest}: is an input of this import (a file it reads from "
                           f"{folder}), which writing the checkpoint would replace; give "
                           f"another -o")
    return dest


def _entry(path: Path) -> Path:
    """``path``'s directory entry: its folder resolved, its own name kept (not followed)."""
    return Path(os.path.realpath(path.parent)) / path.name


def _read_from(key: tuple[int, int] | None, entry: Path, folder: Path,
               patterns: Sequence[str]) -> bool:
    """Whether writing the directory entry ``entry`` (an existing file's identity ``key``, or
    None) replaces or adds a file of ``folder`` that matches ``patterns``."""
    def read(name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, g) for g in patterns)

    if entry.parent == Path(os.path.realpath(folder)) and read(entry.name):
        return True
    return key is not None and any(file_key(f) == key for f in folder.iterdir() if read(f.name))


def named_errors(path: str | os.PathLike, build):
    """``build()``, with its one-line NmtError naming the file it was built from."""
    try:
        return build()
    except NmtError as e:
        raise NmtError(f"{path}: {e}") from None


__all__ = ["named_errors", "ABSENT_LOGIT", "read_json", "load_safetensors", "load_torch_weights",
           "nmt_dictionary", "permute_rows", "check_output", "refuse", "probability"]
