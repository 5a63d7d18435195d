"""gasloc's inner optimizers for a Python loop: AdamW, GPA and Schedule-Free over one flat buffer
(src/gasloc/optim/), as torch.optim.Optimizer objects that gasloc.Run takes as its ``optimizer``.

    opt = gasloc.optim.adamw(model.parameters(), lr=3e-3)          # the job file's optim.* keys
    sched = gasloc.optim.Schedule(opt, total_steps=1000)           # warmup, then cosine decay
    ...
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()

A step is the CLI trainer's: the gradients' global norm clipped to ``grad_clip`` (default 1.0),
then one fused update of the whole buffer; weight decay applies to the matrices only. Keyword
settings are the ``[optim]`` keys of the job file with its defaults (``gasloc train
--help-config``): lr, beta1, beta2, eps, weight_decay, grad_clip, mu_x, mu_y, decay_on,
gpa_from_diloco, and for :class:`Schedule` warmup_steps, decay, min_lr_ratio. A bad key or value is
a ValueError naming it.

GPA and Schedule-Free train at a point y and evaluate the average x: evaluate inside
``with opt.evaluating():``. Under gasloc.Run the algorithm exchanges x, as the CLI trainer does.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator, Optional

import torch

from . import _core
from . import _overrides as settings_texts  # the job file's keys as --set texts

__all__ = ["AdamW", "GPA", "ScheduleFree", "Schedule", "adamw", "gpa", "schedule_free"]


def _named(params: Iterable[Any]) -> list[tuple[str, torch.Tensor]]:
    """Tensors, or (name, tensor) pairs as model.named_parameters() gives them, as named tensors."""
    items = list(params)
    if any(isinstance(p, dict) for p in items):
        raise ValueError("gasloc's optimizers step one flat buffer with one set of settings: "
                         "pass model.parameters(), not parameter groups")
    named = []
    for i, p in enumerate(items):
        name, t = p if isinstance(p, tuple) else (f"param{i}", p)
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"parameter {name}: a tensor, not {type(t).__name__}")
        named.append((name, t))
    if not named:
        raise ValueError("the optimizer got no parameters: hand it model.parameters()")
    return named


class _FlatOptimizer(torch.optim.Optimizer):
    """One of gasloc's inner optimizers (optim.name = ``_NAME``) over a flat buffer of its own,
    or of the gasloc.Run the optimizer is handed to."""

    _NAME = ""

    def __init__(self, params: Iterable[Any], **settings: Any) -> None:
        named = _named(params)
        self._settings = {f"optim.{k}": v for k, v in settings.items()}
        self._settings["optim.name"] = self._NAME
        self._cpp = _core._Optimizer(settings_texts(self._settings), named)
        self._run = None
        self.last_grad_norm: Optional[float] = None
        super().__init__([t for _, t in named], {"lr": float(self._cpp.lr)})

    def step(self, closure=None):  # type: ignore[override]
        """Clips the gradients' global norm (``grad_clip``) and updates the buffer with the
        ``lr`` of ``param_groups[0]`` (which :class:`Schedule` or a torch LR scheduler sets).
        ``last_grad_norm`` is the norm before clipping."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_grad_norm = self._cpp.step(float(self.param_groups[0]["lr"]))
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the flat gradient buffer in place, every ``.grad`` a view of it again (``set_to_none``
        is ignored: backward() then accumulates into the buffer, as in the CLI trainer)."""
        self._cpp.zero_grad()

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """The parameters hold the evaluation point (GPA's and Schedule-Free's average x) inside the
        block and the training point again after it, bit for bit; AdamW's are the same point."""
        self._cpp.enter_eval()
        try:
            yield
        finally:
            self._cpp.leave_eval()

    @property
    def steps(self) -> int:
        """Optimizer steps so far."""
        return self._cpp.steps

    def state_dict(self) -> dict:
        """The optimizer's state (moments, GPA's z and y, the step) as named tensors, taken at the
        evaluation point, and the settings of its one parameter group."""
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.param_groups[0]["params"])))
        return {"optimizer": self._cpp.name, "state": dict(self._cpp.state()), "param_groups": [group]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores :meth:`state_dict`'s output (the parameters already restored: GPA and
        Schedule-Free write their training point y back)."""
        if state_dict.get("optimizer") != self._cpp.name:
            raise ValueError(f"this state is of optimizer {state_dict.get('optimizer')!r}, not {self._cpp.name!r}: "
                             "load it into the optimizer that saved it")
        for k, v in state_dict["param_groups"][0].items():
            if k != "params":
                self.param_groups[0][k] = v
        self._cpp.load_state(state_dict["state"])

    def _gasloc_bind(self, core: Any, named: list) -> None:
        """gasloc.Run moved the parameters into its flat buffer: step that one from now on."""
        if {id(p) for p in self.param_groups[0]["params"]} != {id(p) for _, p in named}:
            raise ValueError("gasloc's optimizers step the whole model under gasloc.Run: create the optimizer over "
                             "model.parameters() of the model handed to gasloc.Run")
        self._cpp.bind(core.user_run, named)
        self._run = core  # the run's buffer lives as long as this optimizer steps it


class AdamW(_FlatOptimizer):
    """AdamW (optim.name = "adamw"): torch.optim.AdamW's update, decay on the matrices only."""

    _NAME = "adamw"


class GPA(_FlatOptimizer):
    """Generalized Primal Averaging (optim.name = "gpa"): mu_x, mu_y or gpa_from_diloco."""

    _NAME = "gpa"


class ScheduleFree(_FlatOptimizer):
    """The reference Schedule-Free AdamW (optim.name = "schedule_free")."""

    _NAME = "schedule_free"


def adamw(params: Iterable[Any], **settings: Any) -> AdamW:
    """:class:`AdamW` over ``params`` with the job file's ``optim.*`` keys."""
    return AdamW(params, **settings)


def gpa(params: Iterable[Any], **settings: Any) -> GPA:
    """:class:`GPA` over ``params`` with the job file's ``optim.*`` keys."""
    return GPA(params, **settings)


def schedule_free(params: Iterable[Any], **settings: Any) -> ScheduleFree:
    """:class:`ScheduleFree` over ``params`` with the job file's ``optim.*`` keys."""
    return ScheduleFree(params, **settings)


class Schedule:
    """The CLI trainer's learning-rate schedule: a linear warmup over ``warmup_steps`` (default 30),
    then ``decay`` (cosine) to ``min_lr_ratio`` (0.1) of ``lr`` at ``total_steps`` (train.steps).
    It sets the optimizer's lr for the next step: at creation for step 1, and at each
    :meth:`step` (call it after ``opt.step()``, as a torch LR scheduler). The settings default to
    the optimizer's own (``lr``, ``warmup_steps``, ...), then the job file's defaults."""

    def __init__(self, optimizer: _FlatOptimizer, total_steps: int, **settings: Any) -> None:
        if not isinstance(optimizer, _FlatOptimizer):
            raise ValueError("gasloc.optim.Schedule schedules gasloc.optim's optimizers; "
                             "use torch.optim.lr_scheduler for others")
        merged = {**optimizer._settings, **{f"optim.{k}": v for k, v in settings.items()}}
        self._schedule = _core._Schedule(settings_texts(merged), int(total_steps))
        self.optimizer = optimizer
        self.last_step = 0
        self._apply()

    def at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (1-based)."""
        return self._schedule.at(step)

    def _apply(self) -> None:
        lr = self.at(self.last_step + 1)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        """After an optimizer step: the lr of the next one."""
        self.last_step += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = int(state["last_step"])
        self._apply()
