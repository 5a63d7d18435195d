"""A prepared dataset (``gasloc prepare``, or a directory of llm.c shards) for a Python loop: each
rank's training batches as the CLI trainer's sampler draws them, and the fixed validation set.

    dataset = gasloc.data.open("data/default")
    batches = dataset.sampler(rank=run.rank, world=run.world, batch_size=16, seq_len=128)
    inputs, targets = batches.next()          # [B, T] int64 each; targets are inputs shifted by one

Rank r draws windows with seed ``seed + r`` (``train.seed``, default 1337): with the CLI trainer's
settings, the very batches its rank r trains on. ``sampling="disjoint"`` confines each rank to its
own slice of the training stream (``data.sampling``).
"""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import torch

from . import _core

__all__ = ["Dataset", "Sampler", "open"]

Batch = Tuple[torch.Tensor, torch.Tensor]


class Sampler:
    """A rank's stream of training batches. Its whole state is :attr:`position` (windows drawn), so
    a checkpoint holds it: ``gasloc.Run(..., state=(lambda: batches.position, batches.set_position))``."""

    def __init__(self, impl) -> None:
        self._impl = impl

    def next(self) -> Batch:
        """The next batch: (inputs, targets), [batch_size, seq_len] int64 each."""
        return self._impl.next()

    __next__ = next

    def __iter__(self) -> Iterator[Batch]:
        return self

    @property
    def position(self) -> int:
        """Windows drawn so far (batch_size per batch)."""
        return self._impl.position

    def set_position(self, windows: int) -> None:
        """Continues from ``windows`` drawn (a checkpoint's :attr:`position`)."""
        self._impl.position = int(windows)


class Dataset:
    """An opened dataset (memory-mapped shards)."""

    def __init__(self, impl) -> None:
        self._impl = impl

    @property
    def vocab_size(self) -> int:
        """The vocabulary (``gasloc.models.llama(..., vocab_size=)`` takes it, as the CLI trainer does)."""
        return self._impl.vocab_size

    @property
    def train_tokens(self) -> int:
        return self._impl.train_tokens

    @property
    def val_tokens(self) -> int:
        return self._impl.val_tokens

    @property
    def fingerprint(self) -> str:
        """What ranks of one job agree on: a checksum of dataset.json and the shards' names and sizes."""
        return self._impl.fingerprint

    def sampler(self, rank: int = 0, world: int = 1, batch_size: int = 16, seq_len: int = 128,
                seed: Optional[int] = None, sampling: str = "shared") -> Sampler:
        """Rank ``rank`` of ``world``'s training batches (``data.batch_size``, ``data.seq_len``,
        ``train.seed`` (None: 1337), ``data.sampling``: the CLI trainer's defaults)."""
        return Sampler(_core._Sampler(self._impl, rank, world, batch_size, seq_len, seed, sampling))

    def validation(self, batch_size: int = 16, seq_len: int = 128, max_batches: int = 8) -> list[Batch]:
        """The fixed validation set: consecutive windows from the start of the validation stream
        (``data.val_batches`` batches; 0: as many as fit), as the CLI trainer evaluates on."""
        return self._impl.validation(batch_size, seq_len, max_batches)


def open(dir: str, vocab_size: int = 0, verify: bool = False) -> Dataset:  # noqa: A001 (as io.open)
    """Opens a prepared dataset (``data.dir``). ``vocab_size`` > 0 overrides the dataset's
    (``data.vocab_size``); ``verify`` checks every shard's sha256 (``data.verify_shards``)."""
    return Dataset(_core._Dataset(str(dir), int(vocab_size), bool(verify)))
