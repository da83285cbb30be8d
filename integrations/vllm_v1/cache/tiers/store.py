"""The worker side of the tiered KV connector: `KVBlockStore` (CPU memory and disk files)
and `PagedKV` (block copies in and out of the engine's paged KV cache).

The store holds data and carries out `policies.TierMove` decisions; it never
decides anything (the scheduler-side `TierPlacement` does). One block's data is
a tuple of tensors, one per attention layer, in the paged cache's own layout.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

CPU, DISK = "cpu", "disk"


class KVBlockStore:
    """Block data by key: a dict of CPU tensors and one ``<key hex>.pt`` file per disk block."""

    def __init__(self, directory: str | None, *, pin_memory: bool = False) -> None:
        """``directory=None``: a temporary directory, removed by `close`."""
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="kv_tier_"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self._pin_memory = pin_memory
        self._cpu: dict[bytes, tuple[torch.Tensor, ...]] = {}
        self._on_disk: set[bytes] = set()

    def put(self, key: bytes, data: tuple[torch.Tensor, ...]) -> None:
        """Keep ``data`` (CPU tensors) in CPU memory under ``key``."""
        self._cpu[key] = tuple(t.pin_memory() for t in data) if self._pin_memory else data

    def get(self, key: bytes) -> tuple[torch.Tensor, ...] | None:
        """The data of ``key`` from CPU memory or disk; ``None`` if the store lost it."""
        if key in self._cpu:
            return self._cpu[key]
        if key in self._on_disk:
            try:
                return tuple(torch.load(self._path(key), weights_only=True))
            except OSError:
                self._on_disk.discard(key)
        return None

    def move(self, key: bytes, source: str, target: str | None) -> None:
        """Move ``key`` between tiers (``target=None``: delete); a key already gone is skipped."""
        data = self._take(key, source)
        if data is None or target is None:
            return
        if target == CPU:
            self._cpu[key] = data
        else:
            torch.save(data, self._path(key))
            self._on_disk.add(key)

    def blocks(self, tier: str) -> int:
        """Blocks held in ``tier``."""
        return len(self._cpu) if tier == CPU else len(self._on_disk)

    def close(self) -> None:
        """Forget everything; remove the directory if the store created it."""
        self._cpu.clear()
        self._on_disk.clear()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _take(self, key: bytes, source: str) -> tuple[torch.Tensor, ...] | None:
        if source == CPU:
            return self._cpu.pop(key, None)
        data = self.get(key)
        if key in self._on_disk:
            self._on_disk.discard(key)
            self._path(key).unlink(missing_ok=True)
        return data

    def _path(self, key: bytes) -> Path:
        return self.directory / f"{key.hex()}.pt"


class PagedKV:
    """The engine's paged KV tensors, read and written a whole block (every layer) at a time.

    The block dimension is found per tensor: the first of dims 0 and 1 whose size
    is a multiple of ``num_blocks`` (dim 0 on CPU; dim 1 for ``(2, blocks, ...)``
    GPU layouts); kernel blocks smaller than the scheduler's block are grouped.
    Tensors shared by several layers are handled once.
    """

    def __init__(self, kv_caches: dict[str, torch.Tensor], num_blocks: int) -> None:
        self._views: list[tuple[torch.Tensor, int]] = []
        seen: set[int] = set()
        for name, tensor in kv_caches.items():
            if tensor.data_ptr() in seen:
                continue
            seen.add(tensor.data_ptr())
            dim = next((d for d in (0, 1) if tensor.shape[d] % num_blocks == 0), None)
            if dim is None:
                raise ValueError(f"KV cache {name} of shape {tuple(tensor.shape)} has no "
                                 f"dimension of {num_blocks} blocks")
            ratio = tensor.shape[dim] // num_blocks
            self._views.append((tensor.unflatten(dim, (num_blocks, ratio)), dim))

    def read(self, block_ids: list[int]) -> list[tuple[torch.Tensor, ...]]:
        """CPU copies of ``block_ids``: per block, one tensor per layer."""
        if not block_ids:
            return []
        per_layer = []
        for view, dim in self._views:
            index = torch.tensor(block_ids, device=view.device)
            per_layer.append(view.index_select(dim, index).to("cpu"))
        return [tuple(layer.select(dim, j).clone() for layer, (_, dim)
                      in zip(per_layer, self._views, strict=True))
                for j in range(len(block_ids))]

    def write(self, block_ids: list[int], blocks: list[tuple[torch.Tensor, ...]]) -> None:
        """Overwrite ``block_ids`` with ``blocks`` (as returned by `read`)."""
        if not block_ids:
            return
        for layer, (view, dim) in enumerate(self._views):
            index = torch.tensor(block_ids, device=view.device)
            source = torch.stack([block[layer] for block in blocks], dim=dim)
            view.index_copy_(dim, index, source.to(view.device))
