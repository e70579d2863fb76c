"""Can a checkpoint file be memory-mapped safely? Its zip records checked against its tensors.

``torch.load(mmap=True)`` maps each tensor's bytes straight from the zip archive, trusting the
archive: a record stored compressed is mapped as if it were raw (garbage weights, no error),
and a record shorter than its tensor makes the tensor read the bytes that follow it. The full
read checks both. :func:`mmap_verdict` makes the same checks without reading the weights: the
pickle of the archive is walked with an unpickler that imports nothing and builds nothing
(every global is a stand-in that records its name), which gives each storage's record key,
type and element count; the zip directory gives each record's size and compression.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

from nmt.errors import NmtError

# Bytes per element of each storage type torch.save writes (torch/storage.py's names).
ELEMENT_SIZES = {"DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2,
                 "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1,
                 "ByteStorage": 1, "BoolStorage": 1, "UntypedStorage": 1,
                 "ComplexDoubleStorage": 16, "ComplexFloatStorage": 8}


class _Global:
    """What the probe makes of any global: its name, callable and buildable, doing nothing."""

    def __init__(self, name: str = "") -> None:
        self.name = name

    def __call__(self, *args, **kwargs) -> "_Global":
        return _Global()

    def __setstate__(self, state) -> None:
        pass

    def __setitem__(self, key, value) -> None:
        pass

    def append(self, value) -> None:
        pass

    def extend(self, values) -> None:
        pass


class _Probe(pickle.Unpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: dict[str, tuple[str, int]] = {}

    def find_class(self, module: str, name: str) -> _Global:
        return _Global(name)

    def persistent_load(self, pid) -> _Global:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage":
            kind = pid[1].name if isinstance(pid[1], _Global) else str(pid[1])
            if isinstance(pid[2], str) and isinstance(pid[4], int):
                self.storages[pid[2]] = (kind, pid[4])
        return _Global()


def mmap_verdict(path: str | Path) -> bool:
    """True when ``path`` (a torch.save zip archive) can be memory-mapped: every tensor record
    is stored uncompressed and holds exactly its tensor's bytes. False when some record is
    compressed (the full read decodes it). NmtError when a record is missing or its size is
    not its tensor's (the full read would refuse it too, or read neighbouring bytes mapped)."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            pkl = next((i for i in infos if i.filename.endswith("/data.pkl")
                        or i.filename == "data.pkl"), None)
            if pkl is None:
                return False        # not torch's layout: let torch.load say what it is
            if pkl.compress_type != zipfile.ZIP_STORED:
                return False
            probe = _Probe(z.read(pkl))
            probe.load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, EOFError, ValueError, TypeError,
            AttributeError, IndexError, KeyError, RecursionError, OSError):
        return False                # the full read reports it
    prefix = pkl.filename[:-len("data.pkl")]
    records = {i.filename: i for i in infos}
    for key, (kind, numel) in probe.storages.items():
        info = records.get(f"{prefix}data/{key}")
        if info is None:
            raise NmtError(f"{path}: corrupt checkpoint (tensor record data/{key} is missing)")
        if info.compress_type != zipfile.ZIP_STORED:
            return False
        size = ELEMENT_SIZES.get(kind)
        if size is None:
            return False
        if info.file_size != numel * size or info.compress_size != info.file_size:
            raise NmtError(f"{path}: corrupt checkpoint (tensor record data/{key} holds "
                           f"{info.file_size} bytes, its tensor {numel * size})")
    return True


__all__ = ["mmap_verdict"]
