"""A drop-in for ``torch.utils.tensorboard.SummaryWriter`` that logs its scalars through trainvigil:
``from trainvigil.tensorboard import SummaryWriter``.

``add_scalar(tag, value, global_step)`` logs the value at ``global_step`` under ``tag`` and, for the common
tags (``Loss/train``, ``train/loss``, ``charts/learning_rate``, ...), under the name the detectors read too
(:data:`trainvigil.schemas.names.DETECTOR_NAMES`). Several calls for one step merge into one row. Without
``global_step`` a value lands on the last step logged (0 before any). ``add_scalars`` logs ``main_tag/key``
names, ``add_hparams`` and ``add_text`` send events. The other calls (histograms, images, graphs, figures,
embeddings, ...) are accepted and dropped, counted by call in ``writer.dropped`` with one warning each, or,
with ``tee=True``, also passed on to a real ``SummaryWriter`` (imported then, never before) so TensorBoard
still gets everything. Any other attribute raises ``AttributeError`` naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from trainvigil._compat import Rows
from trainvigil.agents._values import as_step
from trainvigil.agents.agent import Agent, current_agent
from trainvigil.agents.agent import init as _start_agent

_log = logging.getLogger("trainvigil.tensorboard")

DROPPED_CALLS = (
    "add_histogram", "add_histogram_raw", "add_image", "add_images", "add_image_with_boxes", "add_figure",
    "add_video", "add_audio", "add_graph", "add_embedding", "add_pr_curve", "add_pr_curve_raw",
    "add_custom_scalars", "add_custom_scalars_multilinechart", "add_custom_scalars_marginchart", "add_mesh",
    "add_onnx_graph", "add_tensor",
)  # fmt: skip
"""``SummaryWriter`` calls that log no scalar: accepted, dropped (or passed on with ``tee=True``)."""


class SummaryWriter:
    """Logs TensorBoard scalars through a trainvigil agent (see the module's docstring).

    Args:
        log_dir, comment, purge_step, max_queue, flush_secs, filename_suffix: TensorBoard's; passed on to the
            real writer with ``tee=True``, otherwise ignored.
        run_id: the run's id; default the running agent's (``trainvigil.init``), else ``VIGIL_RUN_ID``, else
            generated.
        tee: also write everything to a real ``torch.utils.tensorboard.SummaryWriter``.
        names: your own ``{tag: detector name}`` (``"-entropy"``: negated), before the built-in ones.
        config: the run's config when this writer starts the agent.
        vigil: agent options (``trainvigil.init``'s) when this writer starts the agent.
    """

    def __init__(
        self,
        log_dir: str | None = None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
        *,
        run_id: str | None = None,
        tee: bool = False,
        names: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        vigil: Mapping[str, Any] | None = None,
    ) -> None:
        running = current_agent()
        self._owned = running is None or (run_id is not None and run_id != running.run_id)
        self.agent: Agent = _start_agent(run_id, config=config, **dict(vigil or {})) if self._owned else running  # type: ignore[assignment]
        self._rows = Rows("trainvigil.tensorboard", names)
        if names:  # the web view's table of which detector each logged name feeds reads them from this event
            self.agent.event("compat_names", shim="tensorboard", names=dict(names))
        self._step = 0
        self._closed = False
        self.log_dir = log_dir
        self._tee: Any = None
        if tee:
            try:
                from torch.utils.tensorboard import SummaryWriter as TensorBoardWriter
            except ImportError as exc:
                raise ImportError(
                    f"SummaryWriter(tee=True) needs torch and tensorboard: pip install tensorboard ({exc})"
                ) from exc
            self._tee = TensorBoardWriter(log_dir, comment, purge_step, max_queue, flush_secs, filename_suffix)

    @property
    def dropped(self) -> dict[str, int]:
        """What was not logged, by tag or call (non-scalar calls, values that are not numbers)."""
        return dict(self._rows.dropped)

    @property
    def step(self) -> int:
        """The step a value logged without ``global_step`` lands on: the last one given (0 before any)."""
        return self._step

    def _at(self, global_step: Any) -> int:
        if type(global_step) is int:  # the common case, on the training thread: the agent's thread checks its range
            self._step = global_step
            return global_step
        if global_step is not None:
            step = as_step(global_step)
            if step is None:  # a 0-d tensor or a float step: TensorBoard takes those too
                try:
                    step = int(global_step)
                except Exception:
                    return self._step
            self._step = step
        return self._step

    def add_scalar(
        self,
        tag: str,
        scalar_value: Any,
        global_step: Any = None,
        walltime: float | None = None,
        new_style: bool = False,
        double_precision: bool = False,
    ) -> None:
        """Log ``scalar_value`` at ``global_step`` under ``tag`` (and the detectors' name for it). Never raises."""
        row: dict[str, Any] = {}
        self._rows.add(row, tag if type(tag) is str else str(tag), scalar_value)
        if row:
            self.agent.log(self._at(global_step), **row)
        if self._tee is not None:
            self._tee.add_scalar(tag, scalar_value, global_step, walltime, new_style, double_precision)

    def add_scalars(
        self, main_tag: str, tag_scalar_dict: Mapping[str, Any], global_step: Any = None, walltime: float | None = None
    ) -> None:
        """Log each ``key: value`` as ``main_tag/key`` at ``global_step``."""
        row = self._rows.row(tag_scalar_dict, main_tag + "/")
        if row:
            self.agent.log(self._at(global_step), **row)
        if self._tee is not None:
            self._tee.add_scalars(main_tag, tag_scalar_dict, global_step, walltime)

    def add_hparams(
        self,
        hparam_dict: Mapping[str, Any],
        metric_dict: Mapping[str, Any],
        hparam_domain_discrete: Any = None,
        run_name: str | None = None,
        global_step: Any = None,
    ) -> None:
        """An ``hparams`` event: ``hparams`` and ``metrics`` fields (the ``events`` table in SQL)."""
        self.agent.event("hparams", step=self._step, hparams=dict(hparam_dict), metrics=dict(metric_dict))
        if self._tee is not None:
            self._tee.add_hparams(hparam_dict, metric_dict, hparam_domain_discrete, run_name, global_step)

    def add_text(self, tag: str, text_string: str, global_step: Any = None, walltime: float | None = None) -> None:
        """A ``text`` event at ``global_step``: ``tag`` and ``text`` fields."""
        self.agent.event("text", step=self._at(global_step), tag=str(tag), text=str(text_string))
        if self._tee is not None:
            self._tee.add_text(tag, text_string, global_step, walltime)

    def flush(self) -> None:
        """Accepted: the agent sends on its own (``agent.flush(timeout)`` waits for delivery)."""
        if self._tee is not None:
            self._tee.flush()

    def close(self) -> None:
        """Send the drop counts (a ``compat_dropped`` event) and close the agent if this writer started it."""
        if self._closed:
            return
        self._closed = True
        if self._rows.dropped:
            self.agent.event("compat_dropped", step=self._step, shim="tensorboard", dropped=dict(self._rows.dropped))
        if self._tee is not None:
            self._tee.close()
        if self._owned:
            self.agent.close()

    def get_logdir(self) -> str | None:
        return self.log_dir

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name in DROPPED_CALLS:
            return _Dropped(self, name)
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"trainvigil.tensorboard.SummaryWriter has no {name!r}: only scalars, hparams and text are logged "
            f"(see docs/guides/compat.md); use torch.utils.tensorboard for this call, or SummaryWriter(tee=True)"
        )


class _Dropped:
    """A non-scalar call: counted (one warning per call), passed on to the real writer with ``tee=True``."""

    def __init__(self, writer: SummaryWriter, call: str) -> None:
        self.writer, self.call = writer, call

    def __call__(self, tag: Any = None, *args: Any, **kwargs: Any) -> None:
        writer = self.writer
        writer._rows.drop(self.call, tag, "trainvigil logs scalars only" + ("; passed on (tee)" if writer._tee else ""))
        if writer._tee is not None:
            getattr(writer._tee, self.call)(tag, *args, **kwargs)
