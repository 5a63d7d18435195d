"""The user's share of a checkpoint without pickle: an object of dicts, lists, tuples, numbers,
strings, None and tensors (an optimizer's state_dict(), what ``state=(get, set)`` gets) becomes
JSON with every tensor replaced by a name, plus the tensors by name. Loading it runs no code."""
from __future__ import annotations

import json
import math
from typing import Any

import torch

_TENSOR, _TUPLE, _DICT, _FLOAT = "__tensor__", "__tuple__", "__dict__", "__float__"


def pack(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """``obj`` as JSON-able values; its tensors go into ``tensors`` under names that start with ``prefix``."""
    if isinstance(obj, torch.Tensor):
        name = f"{prefix}{len(tensors)}"
        tensors[name] = obj.detach().cpu().clone()
        return {_TENSOR: name}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {_FLOAT: repr(obj)}
    if isinstance(obj, (list, tuple)):
        items = [pack(v, prefix, tensors) for v in obj]
        return items if isinstance(obj, list) else {_TUPLE: items}
    if isinstance(obj, dict):
        # Keys keep their type (an optimizer's state is keyed by parameter index).
        for k in obj:
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                raise ValueError(f"a checkpoint's dict key must be a str or an int, not {type(k).__name__} ({k!r})")
        return {_DICT: [[k, pack(v, prefix, tensors)] for k, v in obj.items()]}
    raise ValueError(
        f"a {type(obj).__name__} cannot go into a checkpoint (nothing is pickled): use dicts, lists, tuples, "
        "numbers, strings, None and tensors"
    )


def unpack(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of pack()."""
    if isinstance(obj, list):
        return [unpack(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if _TENSOR in obj:
            return tensors[obj[_TENSOR]]
        if _TUPLE in obj:
            return tuple(unpack(v, tensors) for v in obj[_TUPLE])
        if _FLOAT in obj:
            return float(obj[_FLOAT])
        if _DICT in obj:
            return {k: unpack(v, tensors) for k, v in obj[_DICT]}
        raise ValueError(f"not a packed checkpoint value: {sorted(obj)}")
    return obj


def dumps(obj: Any) -> str:
    return json.dumps(obj, allow_nan=False)
