"""Architectures (and later tasks) from outside nmt: ``--user-dir DIR`` and installed plugins.

A plugin is ordinary Python that registers with :func:`nmt.registry.register_arch`::

    # my_archs/__init__.py          nmt-train DATA --user-dir my_archs --arch transformer_wide
    from nmt import ModelConfig, register_arch

    @register_arch("transformer_wide", "6+6 layers, d_model 768")
    def transformer_wide() -> ModelConfig:
        return ModelConfig(d_model=768, d_ff=3072, heads=12)

``--user-dir`` imports a folder with an ``__init__.py`` (a package: its modules may import each
other relatively) or one ``.py`` file, once per process. An installed package can instead name
a module in the ``nmt.plugins`` entry-point group (``[project.entry-points."nmt.plugins"]
my_archs = "my_archs"``); those are imported the first time an architecture is looked up.
Checkpoints hold the resolved configuration, so a model trained with a plugin's architecture
decodes, exports and averages without the plugin; resuming its training needs it again.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from importlib.metadata import entry_points
from pathlib import Path

from nmt.errors import UsageError

ENTRY_POINT_GROUP = "nmt.plugins"
log = logging.getLogger("nmt.plugins")
_loaded: dict[Path, str] = {}          # resolved --user-dir -> the module name it got
_entry_points_loaded = False


def load_user_dir(path: str | Path) -> str:
    """Import ``path`` (a package folder or a .py file) and return its module name."""
    p = Path(path).expanduser().resolve()
    if p in _loaded:
        return _loaded[p]
    if p.is_dir():
        init = p / "__init__.py"
        if not init.is_file():
            raise UsageError(f"--user-dir {path}: a folder needs an __init__.py (it is "
                             f"imported as a package)")
        name = f"nmt_user_{p.name}"
        spec = importlib.util.spec_from_file_location(name, init,
                                                      submodule_search_locations=[str(p)])
    elif p.is_file() and p.suffix == ".py":
        name = f"nmt_user_{p.stem}"
        spec = importlib.util.spec_from_file_location(name, p)
    else:
        raise UsageError(f"--user-dir {path}: no such folder or .py file")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module            # before running it: relative imports find it
    try:
        spec.loader.exec_module(module)
    except Exception as e:                # the user's code: say where, in one line
        sys.modules.pop(name, None)
        raise UsageError(f"--user-dir {path}: importing it failed: {type(e).__name__}: "
                         f"{e}") from None
    _loaded[p] = name
    log.debug("imported %s from %s", name, p)
    return name


def load_entry_points() -> None:
    """Import every installed module named in the ``nmt.plugins`` entry-point group, once."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as e:
            raise UsageError(f"plugin {ep.name} ({ep.value}, entry point group "
                             f"{ENTRY_POINT_GROUP}) failed to import: {type(e).__name__}: "
                             f"{e}") from None


__all__ = ["load_user_dir", "load_entry_points", "ENTRY_POINT_GROUP"]
