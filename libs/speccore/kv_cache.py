"""Position-indexed key/value cache with per-row lengths.

Slot s of row b holds the key/value of that row's token at position s, so
rolling back a rejected speculation only means not advancing ``lengths``: the
stale slots are written over by the next block and masked until then. An accepted
tree path is compacted by copying its slots down to consecutive positions.

The object implements the one method Hugging Face attention layers call
(``update``), so any HF causal LM runs on it unchanged.

Continuous batching moves rows in and out between steps. The buffers hold spare
row slots beyond ``batch`` (attention sees only the first ``batch``), so rows that
join are copied into the spare slots and rows that leave are overwritten by the
rows moved into their places: only the rows that move are copied (their committed
slots: what lies beyond a row's length is never read unmasked), and the buffers
are reallocated (rows and positions grown geometrically) only when they run out.
At 32 rows of smollm2 a whole-cache copy is ~750 MB, several per joining wave.
"""

from __future__ import annotations

import torch

# Attention reads keys over a width rounded up to whole blocks, and the
# row-invariant CPU attention (cpu_kernels.py) sums values one block at a time, so
# a query gives the same bits whether a draft block made the cache a block wider
# or not: masked columns add exact zeros.
KV_BLOCK = 64


class StaticKVCache:
    def __init__(self, batch: int, capacity: int, device: torch.device, dtype: torch.dtype) -> None:
        self.batch = batch
        self.capacity = -(-capacity // KV_BLOCK) * KV_BLOCK
        self.device = device
        self.dtype = dtype
        self.lengths = torch.zeros(batch, dtype=torch.long)  # committed tokens per row (host tensor)
        self.slots = batch  # rows the buffers hold: batch, then spare ones for rows that join
        self._keys: list[torch.Tensor] = []  # per layer [slots, kv_heads, capacity, head_dim]
        self._values: list[torch.Tensor] = []
        # one row: its slots; else ([batch, q] row ids, [batch, q] slots)
        self._write: slice | tuple[torch.Tensor, torch.Tensor] | None = None
        self._width = 0

    def begin_block(self, q: int) -> int:
        """Prepare to write a block of q tokens after each row's committed length.

        Returns the key/value width the attention will see: max length + q rounded
        up to whole KV_BLOCKs (the capacity is rounded up alike). A block that does not
        fit grows the cache (geometrically): rows of a padded block write past their own
        need when a long one shares it, e.g. a joining row's whole prompt in a draft's
        cache beside rows far into their output (continuous batching).
        """
        needed = int(self.lengths.max()) + q
        if needed > self.capacity:
            self._grow(self.slots, -(-max(needed, 2 * self.capacity) // KV_BLOCK) * KV_BLOCK)
        self._width = -(-needed // KV_BLOCK) * KV_BLOCK
        if self.batch == 1:
            start = int(self.lengths[0])
            self._write = slice(start, start + q)
        else:
            slots = (self.lengths[:, None] + torch.arange(q)[None, :]).to(self.device)
            rows = torch.arange(self.batch, device=self.device)[:, None].expand_as(slots)
            self._write = (rows, slots)
        return self._width

    def buffers(
        self, layer_idx: int, kv_heads: int, head_dim: int, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_idx``'s whole key and value buffers [slots, kv_heads, capacity,
        head_dim], allocated at its first pass (in layer order; ``dtype``, else the cache's),
        for kernels that write the block themselves at each row's committed length
        (speccore.decoder), and for ``update``."""
        if self._write is None:
            raise RuntimeError("begin_block() must precede a forward pass")
        if layer_idx == len(self._keys):
            shape = (self.slots, kv_heads, self.capacity, head_dim)
            self._keys.append(torch.zeros(shape, device=self.device, dtype=dtype or self.dtype))
            self._values.append(torch.zeros(shape, device=self.device, dtype=dtype or self.dtype))
        return self._keys[layer_idx], self._values[layer_idx]

    # Called by every attention layer of the model, in layer order.
    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.buffers(layer_idx, key.shape[1], key.shape[3], key.dtype)
        k_buf, v_buf = keys[: self.batch], values[: self.batch]
        write = self._write
        assert write is not None  # buffers() refuses a pass before begin_block()
        if isinstance(write, slice):  # one row: a plain slice copy
            k_buf[:, :, write] = key
            v_buf[:, :, write] = value
        else:
            rows, slots = write
            # key: [batch, kv_heads, q, head_dim] -> indexed view [batch, q, kv_heads, head_dim]
            k_buf[rows, :, slots] = key.transpose(1, 2)
            v_buf[rows, :, slots] = value.transpose(1, 2)
        return k_buf[:, :, : self._width], v_buf[:, :, : self._width]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self.lengths.max())

    def commit(self, counts: torch.Tensor) -> None:
        """Advance each row by counts[b] tokens of the last block (a prefix of it)."""
        self.lengths += counts.to(self.lengths)

    def commit_paths(self, paths: list[list[int]]) -> None:
        """Keep, per row, the block nodes of an accepted tree path (block indices, in order).

        Node path[i] was written at slot length + path[i]; it moves to length + i.
        Chains (path == 0..m) need no copy.
        """
        moves = [
            (row, int(self.lengths[row]) + src, int(self.lengths[row]) + dst)
            for row, path in enumerate(paths)
            for dst, src in enumerate(path)
            if src != dst
        ]
        if moves:
            rows, src, dst = (torch.tensor(col, device=self.device) for col in zip(*moves, strict=True))
            # The buffers were allocated inside the runner's inference mode; torch refuses
            # in-place writes to such tensors outside it.
            with torch.inference_mode():
                for buf in (*self._keys, *self._values):
                    buf[rows, :, dst] = buf[rows, :, src]
        self.lengths += torch.tensor([len(p) for p in paths], dtype=torch.long)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values))

    def read_prefix(self, row: int, length: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of each layer's keys and values of a row's first ``length`` committed tokens
        ([kv_heads, length, head_dim] each)."""
        if length > int(self.lengths[row]):
            raise ValueError(f"row {row} holds {int(self.lengths[row])} committed tokens, not {length}")
        return (
            [k[row, :, :length].clone() for k in self._keys],
            [v[row, :, :length].clone() for v in self._values],
        )

    def write_prefix(self, row: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Commit ``keys``/``values`` (each layer's [kv_heads, n, head_dim], from ``read_prefix``)
        as an empty row's first n tokens."""
        if int(self.lengths[row]) != 0:
            raise ValueError(f"row {row} is not empty")
        n = keys[0].shape[1]
        with torch.inference_mode():
            for bufs, parts in ((self._keys, keys), (self._values, values)):
                for layer, part in enumerate(parts):
                    if layer == len(bufs):  # no forward pass yet: no buffer
                        shape = (self.slots, part.shape[0], self.capacity, part.shape[2])
                        bufs.append(torch.zeros(shape, device=self.device, dtype=part.dtype))
                    bufs[layer][row, :, :n] = part
        self.lengths[row] = n

    def take(self, rows: list[int]) -> StaticKVCache:
        """These rows only, in this order (continuous batching drops finished rows), in place:
        row ``rows[j]`` moves to slot j where they differ. Returns this cache."""
        moved = [(j, r) for j, r in enumerate(rows) if j != r]
        if moved:
            upto = max(int(self.lengths[r]) for _, r in moved)
            dst, src = (torch.tensor(col, device=self.device) for col in zip(*moved, strict=True))
            with torch.inference_mode():
                for buf in (*self._keys, *self._values):
                    # the sources are read (copied) before any is written
                    buf[dst, :, :upto] = buf[src, :, :upto]
        self.lengths = self.lengths[torch.tensor(rows, dtype=torch.long)].clone()
        self.batch = len(rows)
        return self

    def concat(self, other: StaticKVCache) -> StaticKVCache:
        """This cache's rows, then ``other``'s (continuous batching adds newly prefilled rows
        to a running batch): copied into the spare slots, the buffers grown first if they
        have too few rows or positions. Returns this cache."""
        rows = self.batch + other.batch
        if rows > self.slots or other.capacity > self.capacity:
            self._grow(
                max(rows, 2 * self.slots) if rows > self.slots else self.slots,
                max(other.capacity, 2 * self.capacity) if other.capacity > self.capacity else self.capacity,
            )
        upto = int(other.lengths.max()) if other.batch else 0
        for mine, theirs in ((self._keys, other._keys), (self._values, other._values)):
            for layer, part in enumerate(theirs):
                if layer == len(mine):  # this cache never ran a forward pass: no buffer yet
                    mine.append(part.new_zeros((self.slots, part.shape[1], self.capacity, part.shape[3])))
                with torch.inference_mode():
                    mine[layer][self.batch : rows, :, :upto] = part[: other.batch, :, :upto]
        self.lengths = torch.cat([self.lengths, other.lengths])
        self.batch = rows
        return self

    def _grow(self, slots: int, capacity: int) -> None:
        """Reallocate the buffers with room for ``slots`` rows of ``capacity`` positions."""
        upto = int(self.lengths.max()) if self.batch else 0
        with torch.inference_mode():
            for bufs in (self._keys, self._values):
                for layer, old in enumerate(bufs):
                    new = old.new_zeros((slots, old.shape[1], capacity, old.shape[3]))
                    new[: self.batch, :, :upto] = old[: self.batch, :, :upto]
                    bufs[layer] = new
        self.slots, self.capacity = slots, capacity
