"""Copies between an engine's KV cache tensors and tierkvd's host slots with
torch, on whatever device the tensors live (a GPU's memory included).

tierkv's own copy engine (RegisteredDevice) reads and writes host memory
only. For tensors elsewhere the engine copies itself: its client is opened
with copies="caller", and this class moves one event's blocks through the
host slots' shared memory (Client.host_block) with torch's gather, scatter
and device copies, then the caller completes the event.

A host slot holds one block in tierkv's geometry (KvLayout): per layer the K
plane then the V plane, each [block_size][num_kv_heads][head_dim]. A
tensor-parallel rank holds heads [rank * h, (rank + 1) * h) of every token,
h = num_kv_heads / num_ranks, and copies only those.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

import tierkv

_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# Bytes of one rank's blocks staged at once: bounds what a copy takes of
# the device's memory (beside the engine's cache: one chunk, and one layer's
# plane of it while a store gathers) and of the host's.
_CHUNK_BYTES = 64 << 20


class TorchCopier:
    """One rank's block copies between its K and V planes and host slots.

    `planes`: per layer, the (K, V) views of the engine's cache, each
    [num_blocks, block_size, heads of this rank, head_dim] (vLLM's paged
    layout gives cache[0] and cache[1]; FlashInfer's cache[:, 0] and
    cache[:, 1]). InvalidArgumentError naming the mismatch when they do not
    fit `layout`'s rank shard.
    """

    def __init__(self, layout: Any, planes: Sequence[tuple[Any, Any]],
                 rank: int = 0, num_ranks: int = 1) -> None:
        if num_ranks < 1 or not 0 <= rank < num_ranks:
            raise tierkv.InvalidArgumentError(
                f"rank {rank} is outside [0, {num_ranks})")
        if layout.num_kv_heads % num_ranks != 0:
            raise tierkv.InvalidArgumentError(
                f"{layout.num_kv_heads} KV heads do not split over "
                f"{num_ranks} ranks")
        heads = layout.num_kv_heads // num_ranks
        self._dtype = _DTYPES[layout.dtype]
        self._host_shape = (layout.num_layers, 2, layout.block_size,
                            layout.num_kv_heads, layout.head_dim)
        self._heads = slice(rank * heads, (rank + 1) * heads)
        if len(planes) != layout.num_layers:
            raise tierkv.InvalidArgumentError(
                f"{len(planes)} layers of KV cache for a layout of "
                f"{layout.num_layers}")
        want = (layout.block_size, heads, layout.head_dim)
        first = planes[0][0]
        self.num_blocks = int(first.shape[0]) if first.dim() == 4 else 0
        for l, pair in enumerate(planes):
            for name, t in zip("KV", pair):
                if (t.dim() != 4 or tuple(t.shape[1:]) != want or
                        int(t.shape[0]) != self.num_blocks):
                    raise tierkv.InvalidArgumentError(
                        f"layer {l} {name}: shape {tuple(t.shape)} is not "
                        f"[{self.num_blocks or 'blocks'}, {want[0]}, "
                        f"{want[1]}, {want[2]}] (block_size, this rank's "
                        f"heads, head_dim)")
                if t.dtype != self._dtype:
                    raise tierkv.InvalidArgumentError(
                        f"layer {l} {name}: dtype {t.dtype} is not the "
                        f"layout's {layout.dtype}")
                if t.device != first.device:
                    raise tierkv.InvalidArgumentError(
                        f"layer {l} {name} is on {t.device}, layer 0 on "
                        f"{first.device}")
        if first.device.type != "meta":
            # Each plane is memory of its own: one tensor given for two
            # layers, or for K and V, would be stored and served as both
            # (RegisteredDeviceTier refuses it the same way).
            run = heads * layout.head_dim * first.element_size()
            starts = sorted((t.data_ptr(), l, name)
                            for l, pair in enumerate(planes)
                            for name, t in zip("KV", pair))
            for (a, la, na), (b, lb, nb) in zip(starts, starts[1:]):
                if b < a + run:
                    raise tierkv.InvalidArgumentError(
                        f"layer {la} {na} and layer {lb} {nb} overlap: each "
                        "layer's K and V must be memory of its own (the same "
                        "tensor given twice?)")
        self._planes = list(planes)
        self.device = first.device
        self._shard_bytes = (layout.num_layers * 2 * layout.block_size *
                             heads * layout.head_dim *
                             torch.tensor([], dtype=self._dtype).element_size())

    def _slot(self, client: Any, slot: int) -> torch.Tensor:
        """Host slot `slot` as [layers, 2, block_size, heads, head_dim]."""
        view = client.host_block(slot)
        return torch.frombuffer(view, dtype=self._dtype).view(
            self._host_shape)

    def _chunks(self, event: Any):
        """The event's (device blocks index, host slots) in runs of at most
        _CHUNK_BYTES of this rank's bytes: a whole prefix hit staged at
        once could take gigabytes of the device's memory."""
        blocks = list(event.device_blocks)
        if len(blocks) != len(event.host_blocks):
            raise tierkv.InvalidArgumentError(
                f"the event names {len(blocks)} device blocks and "
                f"{len(event.host_blocks)} host blocks")
        for b in blocks:
            if not 0 <= b < self.num_blocks:
                raise tierkv.InvalidArgumentError(
                    f"device block {b} is outside this rank's "
                    f"{self.num_blocks} blocks")
        per_chunk = max(1, _CHUNK_BYTES // self._shard_bytes)
        for first in range(0, len(blocks), per_chunk):
            index = torch.tensor(blocks[first:first + per_chunk],
                                 dtype=torch.long, device=self.device)
            yield index, list(event.host_blocks[first:first + per_chunk])

    def _synchronize(self) -> None:
        """Waits for every stream of a CUDA device: the engine may write
        its cache on streams other than the current one, and a copy must
        not read blocks before they are written, nor be reported done
        before it is."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def store(self, client: Any, event: Any) -> None:
        """Copies the event's device blocks into its host slots (this
        rank's heads); returns once the bytes are in the slots."""
        self._synchronize()
        layers = len(self._planes)
        for index, slots in self._chunks(event):
            # [blocks, layers, 2, block_size, heads, head_dim]: one chunk,
            # filled a layer's plane at a time.
            data = torch.empty((len(slots), layers, 2) +
                               tuple(self._planes[0][0].shape[1:]),
                               dtype=self._dtype, device=self.device)
            for l, (k, v) in enumerate(self._planes):
                data[:, l, 0].copy_(k.index_select(0, index))
                data[:, l, 1].copy_(v.index_select(0, index))
            data = data.cpu()  # Blocks until the bytes are on the host.
            for j, slot in enumerate(slots):
                self._slot(client, slot)[:, :, :, self._heads].copy_(data[j])

    def load(self, client: Any, event: Any) -> None:
        """Copies the event's host slots (this rank's heads) into its device
        blocks; returns once they are there, so that tierkvd may reuse the
        slots and any stream of the engine may read the blocks. A load cut
        short before its first block copies nothing."""
        for index, slots in self._chunks(event):
            data = torch.stack([self._slot(client, slot)[:, :, :, self._heads]
                                for slot in slots]).to(self.device)
            for l, (k, v) in enumerate(self._planes):
                k.index_copy_(0, index, data[:, l, 0])
                v.index_copy_(0, index, data[:, l, 1])
        self._synchronize()
