"""gasloc's Llama as a torch.nn.Module: the CLI trainer's model (src/gasloc/model/llama.hpp, its
fused CPU kernels included) for a Python loop.

    model = gasloc.models.llama("nano", vocab_size=dataset.vocab_size)
    loss = model.loss(inputs, targets)       # mean next-token cross-entropy
    logits = model(tokens)                   # [B, T] int64 -> [B, T, V]

Its parameters are the C++ model's own tensors (Hugging Face's names, in the CLI trainer's order),
so an optimizer over ``model.parameters()``, ``gasloc.Run`` (which moves them into its flat buffer)
and ``model.to()`` act on what the C++ forward reads.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from . import _core
from . import _overrides as settings_texts  # the job file's keys as --set texts

__all__ = ["Llama", "llama"]


def _as_parameter(t: torch.Tensor) -> torch.Tensor:
    """The C++ model's tensor, the same object, made an ``nn.Parameter`` so that code checking for
    parameters finds one (a new Parameter would be another tensor, which the C++ forward never reads)."""
    try:
        t.__class__ = torch.nn.Parameter
    except TypeError:
        t._is_param = True  # torch 2.x: isinstance(t, nn.Parameter) reads this flag
    return t


class Llama(torch.nn.Module):
    """gasloc's Llama-3-style decoder (docs/design.md), built by :func:`llama`."""

    def __init__(self, impl: Any) -> None:
        super().__init__()
        self._impl = impl
        # Hugging Face's module tree (model.layers.0.self_attn.q_proj, ...) of plain containers, each
        # leaf holding its C++ tensor: named_parameters() and state_dict() give the C++ names in the
        # C++ order, which is the flat buffer's (parameters live in the leaves only).
        named = impl.named_parameters()
        for name, p in named:
            *path, leaf = name.split(".")
            node: torch.nn.Module = self
            for part in path:
                if part not in node._modules:
                    node.add_module(part, torch.nn.Module())
                node = node._modules[part]
            node.register_parameter(leaf, _as_parameter(p))
        if [n for n, _ in self.named_parameters()] != [n for n, _ in named]:
            raise RuntimeError("gasloc.models.Llama: the module tree does not list the parameters in the C++ order")

    @property
    def config(self) -> dict:
        """The resolved shape: dim, n_layers, n_heads, n_kv_heads, vocab_size, ffn_hidden,
        max_seq_len, tie_embeddings, num_params."""
        return self._impl.config

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B, T] int64 -> logits [B, T, vocab_size]."""
        return self._impl.forward(tokens)

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The mean cross-entropy of next-token prediction (the CLI trainer's training loss);
        inputs and targets [B, T] int64, as gasloc.data's batches are."""
        return self._impl.loss(inputs, targets)

    def __setstate__(self, state):  # pragma: no cover - a pickled C++ model cannot come back
        raise TypeError("gasloc.models.Llama cannot be unpickled: build it again and load_state_dict()")


def llama(preset: str = "tiny", vocab_size: Optional[int] = None, seed: Optional[int] = None, **shape: Any) -> Llama:
    """gasloc's Llama of the job file's ``model.preset`` (nano, micro, tiny, small, 134m, 160m,
    551m, 1b), initialized as the CLI trainer initializes it.

    Args:
        preset: ``model.preset``.
        vocab_size: the dataset's vocabulary (``gasloc.data.open(dir).vocab_size``, as the CLI
            trainer takes it); None keeps the preset's.
        seed: ``train.seed`` (None: its default, 1337, as ``gasloc train``): the same seed, the same
            initial weights as the CLI trainer's.
        **shape: other ``model.*`` keys of the job file (dim, n_layers, n_heads, n_kv_heads,
            multiple_of, ffn_dim_multiplier, rope_theta, norm_eps, max_seq_len, tie_embeddings,
            init_std, fused); a bad one is a ValueError naming it.
    """
    settings = {f"model.{k}": v for k, v in shape.items()}
    settings["model.preset"] = preset
    if seed is not None:
        settings["train.seed"] = seed
    if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size < 1):
        raise ValueError(f"vocab_size={vocab_size!r}: a positive int (the dataset's vocab_size) or None")
    return Llama(_core._Llama(settings_texts(settings), vocab_size or 0))
