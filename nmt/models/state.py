"""Explicit, typed state of incremental decoding (the KV cache).

Nothing is hidden on the modules: ``model.decode`` takes a state and returns a new one.
Rows are sentence-major: with ``group`` = beam size, decoder row ``b * group + k`` is beam ``k``
of sentence ``b``. Encoder-decoder keys/values are stored once per sentence and shared by its
``group`` rows; self-attention keys/values are stored per row and grow by one step per call.

The self-attention keys and values live in one preallocated, time-major buffer
(:class:`SelfAttentionCache`): a step writes its new position in place instead of
concatenating (a copy of the whole cache per layer per step), and a beam reordering is an
``index_select`` of the filled prefix (keys, then values), for every layer at once, into a
second buffer. A state
is therefore *consumed* by ``decode``, ``reorder``, ``select_sentences`` and ``expand``: they
reuse its buffers, and using the old state afterwards raises an error instead of reading
overwritten keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class EncoderOut:
    out: Tensor        # [B, S, D] encoder output
    pad_mask: Tensor   # [B, S] bool, True at padding

    def attn_mask(self) -> Tensor | None:
        """[B, 1, 1, S] bool mask for SDPA (True = attend), or None when nothing is padded."""
        if not bool(self.pad_mask.any()):
            return None
        return ~self.pad_mask[:, None, None, :]

    def select(self, index: Tensor) -> "EncoderOut":
        return EncoderOut(self.out.index_select(0, index), self.pad_mask.index_select(0, index))


class SelfAttentionCache:
    """Keys and values of every decoder layer's self-attention for the positions decoded so far.

    One flat storage, time-major: position p of layer l holds the keys of every row, then their
    values (``rows * width_k`` then ``rows * width_v`` numbers). So the filled positions are
    one contiguous block (a reordering writes it with one ``index_select`` per part into the
    spare buffer; a new position is written in place), and a layer's keys [positions, rows,
    heads * dk] have rows and heads in one uniform stride: attention reads them as a batch of
    [positions, dk] matrices without copying them. Both buffers are flat storages viewed with
    the current number of rows, so dropping rows leaves room for more positions; the capacity
    doubles when a step needs more.
    """

    INITIAL_CAPACITY = 16

    def __init__(self, layers: int, rows: int, width_k: int, width_v: int):
        self.layers, self.rows, self.width_k, self.width = layers, rows, width_k, width_k + width_v
        self.length = 0
        self.version = 0
        self._store: Tensor | None = None      # flat; allocated at the first write
        self._spare: Tensor | None = None
        self._layer_views: list[tuple[Tensor, Tensor]] = []   # views of _store, per layer

    def _parts(self, store: Tensor, rows: int) -> tuple[Tensor, Tensor]:
        """Views of ``store`` with ``rows`` rows: keys [capacity, layers, rows, width_k] and
        values [capacity, layers, rows, width_v]."""
        per_position = self.layers * rows * self.width
        cap = store.numel() // per_position
        block = store[:cap * per_position].view(cap, self.layers, rows * self.width)
        split = rows * self.width_k
        return (block[..., :split].unflatten(-1, (rows, self.width_k)),
                block[..., split:].unflatten(-1, (rows, self.width - self.width_k)))

    def _use(self, store: Tensor, rows: int) -> None:
        """Make ``store`` the cache's storage, with ``rows`` rows; its views are made once
        here, not at every write."""
        self._store, self.rows = store, rows
        keys, values = self._parts(store, rows)
        self._layer_views = [(keys[:, i], values[:, i]) for i in range(self.layers)]

    @property
    def capacity(self) -> int:
        if self._store is None:
            return 0
        return self._store.numel() // (self.layers * self.rows * self.width)

    def reserve(self, t: int, like: Tensor) -> None:
        """Room for ``t`` more positions (dtype and device of ``like`` at the first call)."""
        need = self.length + t
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity, self.INITIAL_CAPACITY)
        store = like.new_empty(cap * self.layers * self.rows * self.width)
        if self._store is not None and self.length:
            for new, old in zip(self._parts(store, self.rows), self.parts):
                new[:self.length].copy_(old[:self.length])
        self._use(store, self.rows)

    @property
    def device(self) -> torch.device | None:
        """Where the buffers are (None before the first write)."""
        return None if self._store is None else self._store.device

    @property
    def parts(self) -> tuple[Tensor, Tensor]:
        """Keys [capacity, layers, rows, width_k] and values [capacity, layers, rows, width_v]."""
        assert self._store is not None, "empty cache"
        return self._parts(self._store, self.rows)

    def write(self, layer: int, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Store the keys|values ``kv`` [rows, t, width_k + width_v] of ``t`` new positions of
        ``layer``; return the keys [length + t, rows, width_k] and values [length + t, rows,
        width_v] of all positions, time-major views of the cache. Layer 0 writes first: it
        makes room (in the dtype of ``kv`` at the first call)."""
        t = kv.size(1)
        if layer == 0:
            self.reserve(t, like=kv)
        keys, values = self._layer_views[layer]
        end = self.length + t
        keys[self.length:end].copy_(kv[..., :self.width_k].transpose(0, 1))
        values[self.length:end].copy_(kv[..., self.width_k:].transpose(0, 1))
        return keys[:end], values[:end]

    def write_one(self, layer: int, kv: Tensor) -> tuple[Tensor, Tensor]:
        """``write`` of one new position: ``kv`` [rows, width_k + width_v]."""
        if layer == 0:
            self.reserve(1, like=kv)
        keys, values = self._layer_views[layer]
        at = self.length
        keys[at].copy_(kv[:, :self.width_k])
        values[at].copy_(kv[:, self.width_k:])
        return keys[:at + 1], values[:at + 1]

    def advance(self, t: int) -> None:
        self.length += t

    def select_rows(self, index: Tensor) -> None:
        """Keep rows ``index`` [rows'] (any order, repeats allowed), in place."""
        rows = index.numel()
        per_position = self.layers * rows * self.width
        if self._store is None:
            self.rows = rows
            return
        need = max(self.length, 1) * per_position
        if self._spare is None or self._spare.numel() < need:
            # as large as the store (or larger): the buffers then swap at every reordering
            # with room to grow, instead of a new buffer and a copy into it at every step
            self._spare = self._store.new_empty(max(need, self._store.numel()))
        for out, src in zip(self._parts(self._spare, rows), self.parts):
            out, src = out[:self.length], src[:self.length]
            if src.requires_grad:       # decoding under autograd: out= is not differentiable
                out.copy_(src.index_select(2, index))
            else:
                torch.index_select(src, 2, index, out=out)
        old = self._store
        self._use(self._spare, rows)
        self._spare = old


@dataclass
class DecoderState:
    cache: SelfAttentionCache   # self-attention keys/values of the steps decoded so far
    cross_k: list[Tensor]       # per layer [B, H, S, dk]: computed once from the encoder output
    cross_v: list[Tensor]       # per layer [B, H, S, dv]
    memory_mask: Tensor | None  # [B, 1, 1, S] bool, True = attend; None when nothing is padded
    group: int                  # decoder rows per sentence (beam size)
    version: int = 0            # the cache's version when this state was made
    memory_blocked: Tensor | None = None    # ~memory_mask, derived once (True = masked)

    def __post_init__(self) -> None:
        if self.memory_blocked is None and self.memory_mask is not None:
            self.memory_blocked = ~self.memory_mask

    @property
    def num_rows(self) -> int:
        return self.cache.rows

    @property
    def step(self) -> int:
        """Number of target positions already in the cache."""
        return self.cache.length

    def take(self) -> SelfAttentionCache:
        """The cache, for an operation that changes it: this state becomes stale."""
        if self.cache.version != self.version:
            raise RuntimeError("this DecoderState was already passed to decode, reorder, "
                               "select_sentences or expand, which reuse its buffers: use the "
                               "state they returned")
        self.cache.version += 1
        return self.cache

    def _with(self, cache: SelfAttentionCache, **changes) -> "DecoderState":
        fields = dict(cross_k=self.cross_k, cross_v=self.cross_v, memory_mask=self.memory_mask,
                      group=self.group, memory_blocked=self.memory_blocked)
        fields.update(changes)
        if "memory_mask" in changes:            # derived again from the new mask
            fields["memory_blocked"] = None
        return DecoderState(cache=cache, version=cache.version, **fields)

    def advanced(self, cache: SelfAttentionCache, t: int) -> "DecoderState":
        """The state after ``decode`` wrote ``t`` new positions into ``cache``."""
        cache.advance(t)
        return self._with(cache)

    def reorder(self, index: Tensor) -> "DecoderState":
        """Select decoder rows (beam reordering). ``index`` [B*group] must map each sentence's
        rows to rows of the same sentence, since encoder keys/values are shared per sentence."""
        cache = self.take()
        cache.select_rows(index)
        return self._with(cache)

    def select_sentences(self, keep: Tensor, rows: Tensor | None = None) -> "DecoderState":
        """Keep only sentences ``keep`` [B'] (e.g. drop finished ones), with all their rows;
        or, given ``rows`` [B'*group], the old rows that become the new ones in order (each a
        row of its kept sentence): dropping and a beam reordering in one copy of the cache."""
        g = self.group
        if rows is None:
            rows = (keep.unsqueeze(1) * g + torch.arange(g, device=keep.device)).reshape(-1)
        mask = None if self.memory_mask is None else self.memory_mask.index_select(0, keep)
        cache = self.take()
        cache.select_rows(rows)
        return self._with(cache, cross_k=[k.index_select(0, keep) for k in self.cross_k],
                          cross_v=[v.index_select(0, keep) for v in self.cross_v],
                          memory_mask=mask)

    def expand(self, group: int) -> "DecoderState":
        """From one row per sentence to ``group`` copies of it (beam search decodes its first
        step once per sentence: every beam starts from the same bos)."""
        if self.group != 1:
            raise ValueError(f"expand needs one row per sentence, not {self.group}")
        cache = self.take()
        cache.select_rows(torch.arange(cache.rows, device=cache.device).repeat_interleave(group))
        return self._with(cache, group=group)
