"""gasloc from PyTorch: your model, data, inner optimizer and loop; gasloc's runtime between the workers.

    import torch, gasloc
    model = MyModel()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    with gasloc.Run(model, opt, config="job.toml", settings={"algo.name": "diloco", "algo.H": 30}) as run:
        for step in range(run.start_step, total_steps):
            loss = loss_fn(model, batch(run.rank, step))
            opt.zero_grad(); loss.backward(); opt.step()
            run.step(loss=loss.item())   # True when a round ended

Alone (python3 train.py) the process is one worker; under ``gasloc launch -n N -- python3 train.py``
each process is one rank of an N-worker job over Gloo; under ``gasloc launch --elastic -n N`` a
killed rank is restarted and healed from a donor (its ``gasloc.Run`` returns at the donor's step,
with the donor's optimizer state). docs/python.md says what is built.
"""
from __future__ import annotations

import json
import math
from typing import Any, Callable, Mapping, Optional, Tuple

import torch

from . import _build_info, _state


def _check_torch(running: str, built: str) -> None:
    """Refuses a torch other than the one gasloc._core was built against, before the module loads:
    its C++ ABI would not match, which crashes instead of failing."""
    if str(running) != str(built):
        raise ImportError(
            f"gasloc._core was built against torch {built}, but this interpreter runs torch {running}: "
            f"rebuild it for this torch with: {_build_info.REBUILD}"
        )


_check_torch(torch.__version__, _build_info.TORCH_VERSION)

from . import _core  # noqa: E402  (after the version check, on purpose)

__all__ = ["Run", "describe_settings"]


def describe_settings() -> str:
    """Every key of the job file with its type, default and doc (`gasloc train --help-config`)."""
    return _core.describe_settings()


def _setting_text(key: str, value: Any) -> str:
    """A Python value as the text of ``--set key=value`` (TOML; strings verbatim)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value) if not isinstance(value, float) else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(key, v) for v in value) + "]"
    if isinstance(value, Mapping):
        return _toml_value(key, value)
    raise ValueError(f"setting '{key}': a {type(value).__name__} is not a job-file value (bool, int, float, str, list, dict)")


def _toml_value(key: str, value: Any) -> str:
    """A value inside a TOML array or inline table (strings quoted)."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(key, v)}" for k, v in value.items()) + " }"
    return _setting_text(key, value)


def _overrides(settings: Optional[Mapping[str, Any]]) -> list[str]:
    if settings is None:
        return []
    if not isinstance(settings, Mapping):
        raise ValueError("settings must be a dict of the job file's keys, e.g. {'algo.name': 'diloco', 'algo.H': 30}")
    out = []
    for key, value in settings.items():
        if not isinstance(key, str) or "." not in key:
            raise ValueError(f"setting '{key}' is not a job-file key: write 'section.key', e.g. 'algo.H'")
        out.append(f"{key}={_setting_text(key, value)}")
    return out


def _check_optimizer(optimizer: torch.optim.Optimizer, named: list[tuple[str, torch.nn.Parameter]]) -> None:
    """The optimizer must step the model's parameters and hold no state yet: its state would not follow
    the parameters into the flat buffer."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer: a torch.optim.Optimizer, not {type(optimizer).__name__}")
    if any(len(s) > 0 for s in optimizer.state.values()):
        raise ValueError(
            "the optimizer already holds state (it has stepped): create gasloc.Run before the first optimizer step"
        )
    model_params = {id(p) for _, p in named}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in model_params:
                raise ValueError(
                    f"the optimizer steps a parameter of shape {tuple(p.shape)} that is not the model's: "
                    "hand gasloc.Run the model whose parameters the optimizer steps"
                )


def _resume_step(resume: Any) -> Optional[int]:
    """resume= as the runtime takes it: None (a new run), -1 (the newest checkpoint) or a step."""
    if resume is False or resume is None:
        return None
    if resume is True:
        return -1
    if isinstance(resume, int) and resume >= 1:
        return resume
    raise ValueError(f"resume={resume!r}: True (the newest checkpoint), a committed step number, or False")


class Run:
    """One worker of a gasloc job around your model and optimizer (a context manager).

    At the start the model's parameters become views of one flat fp32 buffer (the Parameter objects
    stay the same, so your optimizer keeps working), every rank checks that the others run the same
    job and model, and every rank takes rank 0's parameters. ``run.step()`` after each optimizer
    step lets the algorithm act (``algo.name``: ``diloco``, ``gasloc``, ``local_dadam``; ``allreduce``
    and ``dadam`` with ``run.sync_gradients()``; ``none`` alone). Leaving the ``with`` block closes the run.

    Args:
        model: the torch.nn.Module whose parameters the optimizer steps (fp32, on one device).
        optimizer: its inner optimizer, before its first step.
        config: a TOML job file (the [algo], [train], [cluster] and [network] keys apply).
        settings: the job file's keys, e.g. {"algo.name": "gasloc", "algo.H": 30,
            "train.run_dir": "runs/mine"}; a bad key or value is a ValueError naming it, and so is a
            key you own in PyTorch (model.*, data.*, optim.*, train.steps, ...).
        evaluate: a callable returning a loss (a float or a 0-d tensor), called every
            ``train.eval_every`` steps and at ``close()`` on every rank: first on the worker's own
            model, then (``train.eval_model = "average"``, several workers) with the workers' mean
            in the parameters' place; the eval line of metrics.jsonl holds both, and the consensus
            distance. It is called as given: switch to ``model.eval()`` and ``torch.no_grad()``
            inside it.
        state: ``(get, set)``: ``get()`` returns what else a checkpoint must hold (a data position, an
            LR scheduler's ``state_dict()``: dicts, lists, numbers, strings and tensors, nothing
            pickled); ``set(value)`` restores it on resume.
        resume: True continues from the newest checkpoint in ``train.run_dir``, a step number from
            that committed step (when the newest is damaged): the parameters, the algorithm's
            state, the optimizer's state, ``state`` and the step (``run.start_step``).

    Under ``gasloc launch --elastic`` a restarted rank's Run returns once it is healed: the donor's
    parameters, algorithm state, optimizer state and ``state`` are in place and ``run.start_step``
    is the donor's step. Ctrl+C at a rank, or an exception in the ``with`` block, makes that member
    leave with its checkpoint (not counted as a death; the others go on).

    Checkpoints: every ``train.checkpoint_every`` steps (default 100) and at ``close()``, each rank
    writes its file and commits it once every rank has written (docs/python.md).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Optional[str] = None,
        settings: Optional[Mapping[str, Any]] = None,
        evaluate: Optional[Callable[[], Any]] = None,
        state: Optional[Tuple[Callable[[], Any], Callable[[Any], None]]] = None,
        resume: "bool | int" = False,
    ) -> None:
        if state is not None and not (isinstance(state, tuple) and len(state) == 2 and all(map(callable, state))):
            raise ValueError("state must be a pair of callables (get, set): get() returns a value, set(value) restores it")
        named = list(model.named_parameters())
        _check_optimizer(optimizer, named)
        if evaluate is not None and not callable(evaluate):
            raise ValueError("evaluate must be a callable that returns a loss")
        self._optimizer = optimizer
        self._evaluate = evaluate
        self._state = state
        self._core = _core.Run(str(config or ""), _overrides(settings), named, type(optimizer).__name__,
                               _resume_step(resume))
        if hasattr(optimizer, "_gasloc_bind"):
            optimizer._gasloc_bind(self._core, named)  # gasloc.optim's: it steps the run's flat buffer from now on
        self._closed = False
        self._start_step = self._core.steps_done
        received = self._core.resumed()  # a resume's checkpoint, or an elastic joiner's donor's state
        if received is not None:
            self._restore(*received)

    def _restore(self, tensors: dict, text: str) -> None:
        """Puts a checkpoint's share of the user's back: the optimizer's state, then ``state``."""
        saved = json.loads(text)
        self._optimizer.load_state_dict(_state.unpack(saved["optimizer"], tensors))
        if "state" in saved:
            if self._state is None:
                raise ValueError("the checkpoint holds a state=(get, set) value: pass the same state= to resume it")
            self._state[1](_state.unpack(saved["state"], tensors))

    def _evaluation(self) -> None:
        """Every rank at the same step: its own model, then the average where there is one."""
        own = float(self._evaluate())
        average = float(self._evaluate()) if self._core.begin_evaluation() else None
        self._core.end_evaluation(own, average)

    def _user_share(self) -> tuple:
        """What a checkpoint, a clean leave and a joiner's heal carry of the user's: the optimizer's
        state_dict() and state's get(), as named tensors and a JSON text (nothing pickled)."""
        tensors: dict = {}
        saved = {"optimizer": _state.pack(self._optimizer.state_dict(), "optimizer.", tensors)}
        if self._state is not None:
            saved["state"] = _state.pack(self._state[0](), "state.", tensors)
        return tensors, _state.dumps(saved)

    def _checkpoint(self) -> None:
        self._core.checkpoint(*self._user_share())

    def _leave(self) -> None:
        """An elastic member leaves the job on purpose: its checkpoint, committed on its own, and
        its leave announced (the launcher does not count it as a death, nor restart it)."""
        if not self._closed:
            self._closed = True
            self._core.leave(*self._user_share())

    @property
    def rank(self) -> int:
        """This worker's rank (0 alone)."""
        return self._core.rank

    @property
    def world(self) -> int:
        """The number of workers of the job (WORLD_SIZE under gasloc launch; 1 alone)."""
        return self._core.world

    @property
    def start_step(self) -> int:
        """The step the loop starts from: 0 for a new run, the checkpoint's step after a resume."""
        return self._start_step

    @property
    def steps_done(self) -> int:
        """Calls of step() so far."""
        return self._core.steps_done

    @property
    def run_dir(self) -> str:
        """train.run_dir: run.json and metrics.jsonl, which `gasloc report` reads."""
        return self._core.run_dir

    def should_compute(self) -> bool:
        """Before a step's computation: False when the algorithm skips it (``algo.h_policy =
        "time_budget"``: a slower worker takes fewer local steps per round). Then compute nothing
        (no batch, backward or optimizer step) and still call ``run.step()``. Always True otherwise."""
        return self._core.should_compute()

    def sync_gradients(self) -> bool:
        """Between ``loss.backward()`` and ``opt.step()``: the exchange of the gradient-level
        algorithms (``allreduce``: the gradients' mean over the workers; ``dadam``: its mix of the
        parameters). Returns False, doing nothing, for the algorithms that mix in ``run.step()``,
        so one loop serves every algorithm."""
        return self._core.sync_gradients()

    def step(self, loss: Optional[float] = None) -> bool:
        """After every optimizer step: the algorithm's step (DiLoCo and GASLoC end a round every
        algo.H steps, replacing the parameters in place). `loss` (a float) goes to metrics.jsonl.
        Returns True when a round ended at this step."""
        if loss is not None:
            loss = float(loss)
            if not math.isfinite(loss):
                raise ValueError(f"run.step(loss={loss}): the loss is not finite; the worker diverged")
        lr = float(self._optimizer.param_groups[0].get("lr", 0.0))
        round_done = self._core.step(loss, lr)
        if self._core.heal_due():  # elastic: this rank is a joiner's donor at this round's end
            self._core.heal(*self._user_share())
        if self._evaluate is not None and self._core.eval_due():
            self._evaluation()
        if self._core.checkpoint_due():
            self._checkpoint()
        if self._core.stop_agreed() and self._core.elastic:
            step = self._core.steps_done
            self._leave()  # this member alone leaves; the others go on
            raise KeyboardInterrupt(
                f"gasloc: rank {self.rank} left the elastic job after step {step} (Ctrl+C or SIGTERM) with its "
                f"checkpoint in {self.run_dir}"
            )
        if self._core.stop_agreed():
            step = self._core.steps_done
            self.close()  # every rank stops after this step: a checkpoint of it, committed
            raise KeyboardInterrupt(
                f"gasloc: stopped after step {step} (Ctrl+C or SIGTERM) with a checkpoint in {self.run_dir}: "
                "continue with gasloc.Run(..., resume=True)"
            )
        return round_done

    def close(self) -> None:
        """Lands an overlapped round still in flight, checkpoints the last step, writes the last
        metrics line and frees the run directory. Every rank closes at the same step (the `with`
        block does it)."""
        if not self._closed:
            self._closed = True
            self._core.land()
            if self._evaluate is not None and self._core.steps_done > max(self._core.evaluated_step, 0):
                self._evaluation()
            if self._core.steps_done > max(self._core.checkpointed_step, 0):
                self._checkpoint()
            self._core.close()

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or (self.world == 1 and not self._closed):
            # Alone, an exception in the block leaves a checkpoint of the last step too.
            self.close()
        elif self._core.elastic:
            # An elastic member commits its checkpoint on its own and leaves: the others go on.
            self._leave()
        # With peers and no elastic membership, after an exception they may be elsewhere in the
        # loop: no collective (a checkpoint commits only once every rank wrote it), the process
        # ends; Ctrl+C instead stops every rank after the same step (step() above).


from . import data, models, optim  # noqa: E402  (gasloc's own parts: they use _core and _overrides)
