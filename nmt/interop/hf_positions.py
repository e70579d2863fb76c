"""Position tables in a Marian directory, both ways (``nmt-export --format huggingface`` and
``nmt-import huggingface``).

transformers' MarianMTModel loads ``model.{encoder,decoder}.embed_positions.weight`` from the
weights file when the file has them and keeps them (its ``_init_weights`` computes Marian's
own table only for a weight the file lacks: transformers.initialization.copy_ skips tensors
marked loaded), and position p reads row p. So any nmt position table travels as those rows:

- sinusoidal positions: nmt's table of positions offset .. offset + max_positions - 1 in the
  model's layout (interleaved, fairseq or marian); the import recognises the layout and the
  offset by comparing the stored table with each layout's computed one;
- learned positions: the rows that positions 0 .. max_positions - 1 read (a fairseq model's
  unused first rows are left out);

and ``config.json`` names the table (``"nmt_positions"``: ``"learned"``, or the layout with
``+offset`` when there is one), so that the import keeps learned positions learned.

transformers' own ``save_pretrained`` does not write the tables (MarianMTModel's
``_keys_to_ignore_on_save``): a directory it re-saved runs with Marian's computed table. The
import refuses such a directory when config.json names another table, and a stored table that
is none of the sinusoid layouts in a directory that does not say "learned": nmt would not know
what the model was trained with.
"""

from __future__ import annotations

import torch

from nmt.errors import NmtError
from nmt.models.layers import SINUSOID_LAYOUTS, sinusoid_table

KEYS = {"src_pos": "model.encoder.embed_positions.weight",
        "tgt_pos": "model.decoder.embed_positions.weight"}
MARK = "nmt_positions"          # config.json's name of the table
# Offsets the import recognises (fairseq's is padding index + 1 = 2); the export refuses a
# sinusoid table it would not recognise, so that every export comes back as it left.
MAX_OFFSET = 64
# Stored tables may have been computed elsewhere (float32 instead of float64, another libm).
ATOL = 1e-6


def positions_mark(cfg) -> str:
    """config.json's ``nmt_positions``: "learned", or "LAYOUT" / "LAYOUT+OFFSET"."""
    if cfg.positional == "learned":
        return "learned"
    return cfg.sinusoid_layout + (f"+{cfg.position_offset}" if cfg.position_offset else "")


def export_positions(model) -> dict[str, torch.Tensor]:
    """{Marian weight name: [max_positions, d_model]} of an nmt model's positions."""
    cfg = model.cfg
    if cfg.positional == "learned":
        return {key: getattr(model, mod).weight[cfg.position_offset:
                                                cfg.position_offset + cfg.max_positions]
                for mod, key in KEYS.items()}
    table = sinusoid_table(cfg.max_positions, cfg.d_model, cfg.position_offset,
                           cfg.sinusoid_layout)
    return {key: table for key in KEYS.values()}


def recognise_sinusoid(table: torch.Tensor) -> tuple[str, int] | None:
    """(layout, offset) whose computed table is ``table`` [rows, dim] within ATOL, else None.
    A table stored in half precision (float16, bfloat16) is compared with the computed one
    rounded to that precision, within one step of it."""
    rows, dim = table.shape
    stored = table.dtype
    low = stored in (torch.float16, torch.bfloat16)
    atol = max(ATOL, torch.finfo(stored).eps) if low else ATOL
    table = table.float()
    for layout in SINUSOID_LAYOUTS:
        # Row k of the table from position 0 is bit for bit the first row of the table from
        # offset k (the same positions through the same operations).
        full = sinusoid_table(rows + MAX_OFFSET, dim, 0, layout)
        if low:
            full = full.to(stored).float()
        first = (full[:MAX_OFFSET + 1] - table[0]).abs().amax(dim=1)
        for offset in torch.nonzero(first <= atol).flatten().tolist():
            if torch.allclose(full[offset:offset + rows], table, rtol=0, atol=atol):
                return layout, offset
    return None


def import_positions(w: dict[str, torch.Tensor], d_model: int, max_positions: int,
                     config: dict, name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    """(ModelConfig changes, nmt state entries) for the position tables in ``w``, which are
    taken out of it. No table: Marian's own sinusoids, which transformers computes."""
    tables = {mod: w.pop(key) for mod, key in KEYS.items() if key in w}
    mark = config.get(MARK, "marian")
    if not tables:
        if mark != "marian":
            raise NmtError(f"{name}: cannot import: config.json says {MARK}={mark!r}, but the "
                           f"weights have no position tables (transformers' save_pretrained "
                           f"leaves them out, and then runs Marian's own: export from nmt again)")
        return {"positional": "sinusoidal", "sinusoid_layout": "marian"}, {}
    for mod, t in tables.items():
        if tuple(t.shape) != (max_positions, d_model):
            raise NmtError(f"{name}: cannot import: {KEYS[mod]} has shape {tuple(t.shape)}, "
                           f"not [max_position_embeddings, d_model] = "
                           f"[{max_positions}, {d_model}]")
    if mark == "learned":
        if len(tables) != 2:
            raise NmtError(f"{name}: cannot import: learned positions need both "
                           f"{KEYS['src_pos']} and {KEYS['tgt_pos']}")
        return ({"positional": "learned", "position_offset": 0},
                {f"{mod}.weight": t.float().contiguous() for mod, t in tables.items()})
    found = set()
    for mod, t in tables.items():
        layout = recognise_sinusoid(t)
        if layout is None:
            raise NmtError(f"{name}: cannot import: {KEYS[mod]} is none of the sinusoid tables "
                           f"nmt knows ({', '.join(SINUSOID_LAYOUTS)}; offsets 0-{MAX_OFFSET}), "
                           f"and config.json does not say {MARK}: learned")
        found.add(layout)
    if len(tables) == 1:                  # the other side is Marian's computed table
        found.add(("marian", 0))
    if len(found) != 1:
        raise NmtError(f"{name}: cannot import: the encoder's and the decoder's sinusoid "
                       f"tables differ ({' vs '.join(f'{a} offset {b}' for a, b in found)})")
    layout, offset = found.pop()
    return {"positional": "sinusoidal", "sinusoid_layout": layout,
            "position_offset": offset}, {}


__all__ = ["KEYS", "MARK", "MAX_OFFSET", "positions_mark", "export_positions",
           "recognise_sinusoid", "import_positions"]
