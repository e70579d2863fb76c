"""Read other toolkits' torch checkpoints without running code from them.

A fairseq checkpoint is a pickle that names, besides tensors, a few classes of configuration
objects: ``argparse.Namespace`` (its ``args``, and ``cfg.model`` in 0.10-0.12), omegaconf
containers (``cfg`` in some versions), fairseq enums and dataclasses, numpy scalars. Loading it
with plain ``pickle`` would import and call whatever the file names (a crafted file can run
``os.system``). Instead the file goes through ``torch.load(weights_only=True)``, whose
restricted unpickler builds only tensors and plain containers, and each configuration class the
file names is *stood in for* by an inert class of ours (:class:`StandIn`) that merely records
the arguments and state the pickle gives it: the real class is never imported or called.
:func:`plain` then turns the stand-ins into dicts, lists and values. A global outside those
families (``os.system``, ``builtins.eval``, ...) is not stood in for, so torch refuses the file
and nothing of it runs.
"""

from __future__ import annotations

import _compat_pickle
import io
import os
import pickle
import pickletools
import warnings
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from nmt.errors import NmtError
from nmt.interop.foreign import check_zip_sizes, regular_file
from nmt.io import check_readable

# Globals replaced by stand-ins: exact names, and module prefixes (configuration classes only).
STAND_IN_NAMES = frozenset({
    "argparse.Namespace", "collections.defaultdict", "numpy.dtype", "numpy.ndarray"} | {
    # numpy scalars and arrays in training state (best loss, meters) of some versions.
    f"numpy.{core}.multiarray.{f}" for core in ("core", "_core")
    for f in ("scalar", "_reconstruct")} | {
    # Types that omegaconf's metadata names (a node's declared type), never called here.
    f"{module}.{t}" for module in ("builtins", "__builtin__")
    for t in ("dict", "list", "tuple", "str", "int", "long", "float", "bool", "bytes",
              "object", "type", "NoneType")})
STAND_IN_PREFIXES = ("omegaconf.", "fairseq.", "typing.", "numpy.dtypes.")


class StandIn:
    """An inert object in place of a configuration class: keeps what the pickle hands it."""

    stands_for = "?"

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args, obj.state, obj.items = args, None, {}
        return obj

    def __init__(self, *args, **kwargs):    # pickle's REDUCE calls the class: nothing to do
        pass

    def __setstate__(self, state):
        self.state = state

    def __setitem__(self, key, value):      # SETITEMS on a dict-like (defaultdict)
        self.items[key] = value

    def __repr__(self) -> str:
        return f"<stand-in for {self.stands_for}>"


def _stand_in(full_name: str) -> type:
    module, _, name = full_name.rpartition(".")
    # Python 2 names (protocol 2 pickles: __builtin__.long) as torch reads them (builtins.int).
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    # torch keys allowed classes by f"{__module__}.{__qualname__}": these make it find ours.
    return type(name, (StandIn,), {"__module__": module, "__qualname__": name,
                                   "stands_for": full_name})


def pickle_globals(path: Path) -> set[str]:
    """The ``module.name`` globals a torch checkpoint's pickle names, read with pickletools
    (which parses opcodes and runs nothing). Zip checkpoints: data.pkl; legacy ones: the
    pickles before the raw storage bytes."""
    found: set[str] = set()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if name.endswith("data.pkl"):
                    _scan(io.BytesIO(z.read(name)), found)
        return found
    with open(path, "rb") as f:
        for _ in range(5):      # magic, protocol, sys info, the object, storage keys
            try:
                _scan(f, found)
            except ValueError:  # past the pickles (raw data) or a truncated file
                break
    return found


def _scan(f, found: set[str]) -> None:
    strings: list = []
    memo: dict = {}
    for op, arg, _ in pickletools.genops(f):
        if op.name == "GLOBAL":
            found.add(arg.replace(" ", "."))
        elif isinstance(arg, str) and "UNICODE" in op.name:
            strings.append(arg)
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT") and strings:
            memo[arg] = strings[-1]
        elif op.name == "MEMOIZE" and strings:
            memo[len(memo)] = strings[-1]
        elif op.name in ("BINGET", "LONG_BINGET", "GET") and arg in memo:
            strings.append(memo[arg])
        elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
            found.add(f"{strings[-2]}.{strings[-1]}")


def _wanted(full_name: str) -> bool:
    return full_name in STAND_IN_NAMES or full_name.startswith(STAND_IN_PREFIXES)


@contextmanager
def _allowed(classes: list[type]) -> Iterator[None]:
    """torch's allow-list of safe globals with ``classes`` added, restored afterwards."""
    ser = torch.serialization
    if not hasattr(ser, "add_safe_globals"):
        raise NmtError(f"reading foreign checkpoints needs torch >= 2.4 (this is "
                       f"{torch.__version__})")
    before = ser.get_safe_globals()
    ser.add_safe_globals(classes)
    try:
        yield
    finally:
        ser.clear_safe_globals()
        ser.add_safe_globals(before)


def load_foreign(path: str | os.PathLike, what: str) -> Any:
    """The object a foreign torch checkpoint holds, stand-ins in place of configuration
    classes (turn them into plain data with :func:`plain`). Every failure is a one-line
    NmtError; a file naming any other global is refused and nothing of it is executed."""
    p = regular_file(check_readable(path, what, expected=f"a {what}"), what, None)
    check_zip_sizes(p, what)
    if p.stat().st_size == 0:
        raise NmtError(f"{p}: empty file, not a {what}")
    with open(p, "rb") as f:
        head = f.read(4)
    if not head.startswith(b"PK\x03\x04") and head[:1] != b"\x80":
        raise NmtError(f"{p}: not a {what} (not a file torch.save writes)")
    try:
        names = pickle_globals(p)
    except (OSError, zipfile.BadZipFile, ValueError, KeyError) as e:
        raise NmtError(f"{p}: not a readable {what} ({' '.join(str(e).split())[:120]})"
                       ) from None
    classes = [_stand_in(n) for n in sorted(names) if _wanted(n)]
    try:
        with _allowed(classes), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "global" not in str(e).lower():
            raise NmtError(f"{p}: not a readable {what} (the safe loader refused it)") from None
        bad = sorted(n for n in names if not _wanted(n) and not _torch_allows(n))
        asks = f" (it asks for {', '.join(bad[:3])})" if bad else ""
        raise NmtError(f"{p}: refused to load{asks}: a {what} holds tensors and configuration "
                       f"data only; this one is not one, or a crafted file") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, KeyError, AttributeError,
            TypeError, IndexError, OSError) as e:
        msg = " ".join(str(e).split()).split(". ")[0][:160] or type(e).__name__
        raise NmtError(f"{p}: corrupt or truncated {what} ({msg})") from None


def _torch_allows(full_name: str) -> bool:
    """Whether torch's restricted unpickler allows this global by itself (tensor rebuilding,
    storages, OrderedDict ...): only to name the culprits in an error message."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals
        return full_name in _get_allowed_globals()
    except ImportError:
        return full_name.startswith(("torch.", "collections.OrderedDict"))


def plain(obj: Any) -> Any:
    """``obj`` with every stand-in replaced by plain data: a Namespace by the dict of its
    attributes, an omegaconf container by a dict or list of its values, a value node or enum
    member by its value, anything else (type annotations, numpy scalars) by None."""
    if isinstance(obj, StandIn):
        return _plain_stand_in(obj)
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj) if isinstance(obj, list) else tuple(
            plain(v) for v in obj)
    return obj


def _plain_stand_in(obj: StandIn) -> Any:
    state = obj.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        state = state[0]                  # (dict state, slot state)
    if obj.stands_for == "argparse.Namespace":
        return plain(dict(state or {}))
    if obj.stands_for.startswith("omegaconf.") and isinstance(state, dict):
        if "_content" in state:           # DictConfig / ListConfig
            return plain(state["_content"])
        if "_val" in state:               # a value node
            return plain(state["_val"])
    if obj.stands_for.startswith("fairseq.") and len(obj.args) == 1:
        return plain(obj.args[0])         # an enum member, pickled as Enum(value)
    if obj.stands_for == "collections.defaultdict":
        return plain(obj.items)
    return None


__all__ = ["load_foreign", "plain", "pickle_globals", "StandIn"]
