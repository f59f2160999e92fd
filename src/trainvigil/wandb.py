"""A drop-in for the part of ``wandb`` that training scripts log through: ``import trainvigil.wandb as wandb``.

``wandb.init(project=..., config=...)`` starts a trainvigil agent (``id=`` is its run id, else ``VIGIL_RUN_ID``,
else generated); ``wandb.log({...})`` logs each number under its own name and, for the common names
(``train/loss``, ``lr``, ``charts/episodic_return``, ...: :data:`trainvigil.schemas.names.DETECTOR_NAMES`),
under the name the detectors read as well. Steps are W&B's: an implicit counter that each committing ``log()``
advances (``commit`` defaults to ``True`` without ``step=``, ``False`` with it), ``step=`` to set it (a step
below the current one is dropped, as W&B drops it), several calls for one step merged into one row.
Values that are not numbers (strings, ``wandb.Image``, tables, histograms) are dropped, counted by name in
``run.dropped`` and sent as a ``compat_dropped`` event at ``finish()``, with one warning per name.

What W&B does besides logging (artifacts, sweeps, media, ``wandb.plot``) is not here: such an attribute
raises ``AttributeError`` naming the call, so a script finds out at its first use, never by losing data.
See ``docs/guides/compat.md`` for the table of calls. This module is the agent side: it never imports the daemon.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from types import TracebackType
from typing import Any

from trainvigil._compat import Rows
from trainvigil.agents.agent import Agent
from trainvigil.agents.agent import init as _start_agent
from trainvigil.errors import VigilError

_log = logging.getLogger("trainvigil.wandb")


def _refuse(where: str, name: str) -> AttributeError:
    return AttributeError(
        f"{where} has no {name!r}: trainvigil.wandb covers logging only (see docs/guides/compat.md); "
        f"keep the real wandb for this call, or drop it"
    )


class Settings:
    """``wandb.Settings(...)``: accepted and ignored (trainvigil's settings are ``init(vigil={...})``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


class _Media:
    """A W&B media or table object: accepted so a script runs, dropped (and counted) when logged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"wandb.{type(self).__name__} (not logged by trainvigil)"


class Image(_Media): ...


class Table(_Media):
    def add_data(self, *args: Any) -> None:
        pass


class Histogram(_Media): ...


class Video(_Media): ...


class Audio(_Media): ...


class Html(_Media): ...


class Object3D(_Media): ...


class Molecule(_Media): ...


class Plotly(_Media): ...


class AlertLevel:
    """``wandb.AlertLevel.WARN`` and the like: the ``level`` field of the ``alert`` event."""

    INFO = "INFO"
    WARN = "WARN"
    ERROR = "ERROR"


class Config(MutableMapping[str, Any]):
    """``run.config``: attribute and dict access. What is set after ``init()`` goes out as a ``config`` event
    (the ``run_start`` already carried the rest)."""

    def __init__(self, values: Mapping[str, Any], agent: Agent | None = None) -> None:
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_agent", agent)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __delitem__(self, key: str) -> None:
        del self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"wandb.config has no key {name!r}: set it in init(config=...) first") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self.update({name: value})

    def update(self, d: Any = None, /, allow_val_change: bool | None = None, **kwargs: Any) -> None:  # type: ignore[override]
        """Set keys from a dict, an ``argparse.Namespace`` or keyword arguments (``allow_val_change`` ignored)."""
        changes = {**_as_dict(d), **kwargs}
        self._values.update(changes)
        if changes and self._agent is not None:
            self._agent.event("config", **changes)

    def setdefaults(self, d: Mapping[str, Any]) -> None:
        """Set the keys of ``d`` that are not set yet."""
        self.update({k: v for k, v in d.items() if k not in self._values})

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def __repr__(self) -> str:
        return f"wandb.Config({self._values!r})"


def _as_dict(values: Any) -> dict[str, Any]:
    """A config as W&B takes it: a mapping, an ``argparse.Namespace`` (or any object's ``vars``), or ``None``."""
    if values is None:
        return {}
    if isinstance(values, Mapping):
        return {str(k): v for k, v in values.items()}
    return {str(k): v for k, v in vars(values).items()}


class Run:
    """What ``wandb.init()`` returns (also ``wandb.run``). ``id`` is the trainvigil run id."""

    def __init__(self, agent: Agent, name: str | None, config: Mapping[str, Any], rows: Rows, project: str | None):
        self._agent = agent
        self._rows = rows
        self._step = 0
        self._behind = 0
        self.id = agent.run_id
        self.name = name or agent.run_id
        self.project = project
        self.config = Config(config, agent)
        self.summary: dict[str, Any] = {}
        """Sent as a ``summary`` event at ``finish()``."""
        self._watches: list[Any] = []
        self._finished = False

    @property
    def agent(self) -> Agent:
        """The trainvigil agent under this run (for ``phase()``, ``checkpoint_saved()``, ``stats()``)."""
        return self._agent

    @property
    def step(self) -> int:
        """The step the next ``log()`` without ``step=`` lands on."""
        return self._step

    @property
    def dropped(self) -> dict[str, int]:
        """Values left out, by name: those that were not numbers, and ``step=`` calls behind the current step
        (``<behind current step>``)."""
        return dict(self._rows.dropped)

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        """Log ``data`` at the current step (W&B's rules: see the module's docstring). Never raises."""
        if step is not None and step != self._step:
            if type(step) is not int and not hasattr(step, "__index__"):
                self._rows.drop("<bad step>", step, "step= must be an int")
                return
            step = int(step)
            if step < self._step:
                self._rows.drop("<behind current step>", step, f"step {step} is behind the current step {self._step}")
                return
            self._step = step
        if not isinstance(data, Mapping):
            self._rows.drop("<not a dict>", data, "wandb.log takes a dict of name: value")
            return
        row = self._rows.row(data)
        if row:
            self._agent.log(self._step, **row)
        if commit or (commit is None and step is None):
            self._step += 1

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        """End the run: its summary and drop counts as events, then the agent closed (``error`` for a non-zero
        ``exit_code``). Safe to call twice."""
        global run
        if self._finished:
            return
        self._finished = True
        if self.summary:
            self._agent.event("summary", step=self._step, **self.summary)
        if self._rows.dropped:
            self._agent.event("compat_dropped", step=self._step, shim="wandb", dropped=dict(self._rows.dropped))
        self._agent.close(status="error" if exit_code else "ok")
        if run is self:
            run = None

    def alert(self, title: str, text: str, level: Any = None, wait_duration: Any = None) -> None:
        """An ``alert`` event at the current step (``title``, ``text``, ``level``): a row of ``events`` in SQL
        (``select * from events where kind = 'alert'``) and on the run's page; it pages no one by itself, as the
        daemon's detectors do (``vigil alerts``)."""
        level = getattr(level, "value", level)
        self._agent.event("alert", step=self._step, title=str(title), text=str(text), level=str(level or "INFO"))

    def watch(
        self,
        models: Any,
        criterion: Any = None,
        log: str | None = "gradients",
        log_freq: int = 1000,
        idx: int | None = None,
        log_graph: bool = False,
        *,
        optimizer: Any = None,
    ) -> None:
        """``trainvigil.torch.watch(model, optimizer)`` under this run: grad norm, lr and step time at every
        optimizer step. It hooks the optimizer, which W&B's signature lacks: pass ``optimizer=``; without it
        this warns once and watches nothing. ``criterion``, ``log``, ``log_freq``, ``log_graph`` are ignored."""
        if optimizer is None:
            _log.warning(
                "trainvigil.wandb: watch() needs optimizer=...: nothing is watched (see docs/guides/compat.md)"
            )
            return
        import trainvigil.torch

        model = models[0] if isinstance(models, list | tuple) else models
        self._watches.append(trainvigil.torch.watch(model, optimizer, agent=self._agent))

    def unwatch(self, models: Any = None) -> None:
        """Accepted; a watch stays until the run ends."""

    def define_metric(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Accepted and ignored: trainvigil's rows are keyed by the step this shim counts."""

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.finish(exit_code=1 if exc is not None else 0)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise _refuse("trainvigil.wandb.Run", name)


run: Run | None = None
"""The run ``init()`` started, until it finishes."""
config: Config = Config({})
"""The current run's config (an empty one before ``init()``)."""
summary: dict[str, Any] = {}
"""The current run's summary."""


def init(
    project: str | None = None,
    entity: str | None = None,
    config: Any = None,
    name: str | None = None,
    id: str | None = None,
    tags: list[str] | tuple[str, ...] | None = None,
    notes: str | None = None,
    group: str | None = None,
    job_type: str | None = None,
    mode: str | None = None,
    dir: str | None = None,
    resume: Any = None,
    reinit: Any = None,
    settings: Any = None,
    *,
    names: Mapping[str, str] | None = None,
    vigil: Mapping[str, Any] | None = None,
    **ignored: Any,
) -> Run:
    """Start a run: a trainvigil agent with ``config`` (a dict or ``argparse.Namespace``) as its config and
    ``project``, ``name``, ``tags``, ``notes``, ``group``, ``job_type`` under its ``wandb`` key.

    Args:
        id: the run id (every rank of a job shares it); default ``VIGIL_RUN_ID``, else generated.
        mode: default ``WANDB_MODE``; ``"disabled"`` makes every call a no-op (as ``VIGIL_DISABLED=1`` does);
            ``"offline"`` and ``"online"`` both log through the agent, which keeps on disk what the broker does
            not take.
        reinit: a second ``init()`` returns the running run, unless ``reinit`` is truthy: then it finishes it
            and starts another.
        names: your own ``{logged name: detector name}`` (``"-entropy"``: negated), before the built-in ones.
        vigil: agent options (``trainvigil.init``'s), e.g. ``{"nats_url": ..., "flush_interval": 0.5}``.
        **ignored: W&B's other arguments (``anonymous``, ``save_code``, ``sync_tensorboard``, ...), accepted.
    """
    current = run
    if current is not None:
        if not reinit:
            return current
        current.finish()
    given = _as_dict(config)
    values = dict(given)
    about = {"project": project, "entity": entity, "name": name, "tags": list(tags) if tags else None,
             "notes": notes, "group": group, "job_type": job_type}  # fmt: skip
    values.setdefault("wandb", {k: v for k, v in about.items() if v is not None})
    options = dict(vigil or {})
    if (mode or os.environ.get("WANDB_MODE")) == "disabled":
        options["enabled"] = False
    agent = _start_agent(id, config=values, **options)
    if names:  # the web view's table of which detector each logged name feeds reads them from this event
        agent.event("compat_names", shim="wandb", names=dict(names))
    started = Run(agent, name, given, Rows("trainvigil.wandb", names), project)
    _set_current(started)
    return started


def _set_current(started: Run) -> None:
    global run, config, summary
    run, config, summary = started, started.config, started.summary


def _current(call: str) -> Run:
    if run is None:
        raise VigilError(f"trainvigil.wandb.{call}() before wandb.init(): call wandb.init(project=...) first")
    return run


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    """``wandb.log``: the current run's :meth:`Run.log`."""
    _current("log").log(data, step=step, commit=commit)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """``wandb.finish``: ends the current run, if any."""
    if run is not None:
        run.finish(exit_code=exit_code)


def alert(title: str, text: str, level: Any = None, wait_duration: Any = None) -> None:
    """``wandb.alert``: the current run's :meth:`Run.alert`."""
    _current("alert").alert(title, text, level)


def watch(models: Any, criterion: Any = None, log: str | None = "gradients", log_freq: int = 1000,
          idx: int | None = None, log_graph: bool = False, *, optimizer: Any = None) -> None:  # fmt: skip
    """``wandb.watch``: the current run's :meth:`Run.watch` (pass ``optimizer=``)."""
    _current("watch").watch(models, criterion, log, log_freq, idx, log_graph, optimizer=optimizer)


def unwatch(models: Any = None) -> None:
    """Accepted."""


def define_metric(name: str, *args: Any, **kwargs: Any) -> None:
    """Accepted and ignored."""


def login(*args: Any, **kwargs: Any) -> bool:
    """Accepted: there is no account to log in to."""
    return True


def setup(*args: Any, **kwargs: Any) -> None:
    """Accepted and ignored."""


def termlog(string: str = "", *args: Any, **kwargs: Any) -> None:
    _log.info("%s", string)


def termwarn(string: str = "", *args: Any, **kwargs: Any) -> None:
    _log.warning("%s", string)


def termerror(string: str = "", *args: Any, **kwargs: Any) -> None:
    _log.error("%s", string)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise _refuse("trainvigil.wandb", name)
