"""PyTorch Lightning with trainvigil: an MLP learns a linear function; ``LightningLogger`` sends what
the module logs (``train_loss`` as ``loss``, ``val_loss``), the hyper-parameters and checkpoints;
``GradNormCallback`` logs the pre-clip gradient norm and the step time at every optimizer step.

    vigil up &
    python examples/integrations/lightning_regression.py out/ --epochs 2 --batches 16
    python examples/integrations/lightning_regression.py out/ --without   # the same training without trainvigil

``tests/e2e/test_integrations.py`` runs this script against a real broker and daemon, and
``bench/integrations_overhead.py`` times it with and without the integration. The last line printed
is the step times and the seconds ``Trainer.fit`` took (``_common.py``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import lightning as L
import torch
from _common import StepTimes, add_arms, own_agent


class Regression(L.LightningModule):
    """``features -> hidden -> 1`` (one linear layer when ``hidden`` is 0), AdamW."""

    def __init__(self, features: int = 8, hidden: int = 0, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        layers = (
            [torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)]
            if hidden
            else [torch.nn.Linear(features, 1)]
        )
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch: Any, i: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, i: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


class Clock(L.Callback):
    """Marks the end of every training batch (with or without trainvigil alike)."""

    def __init__(self, times: StepTimes) -> None:
        self.times = times

    def on_train_batch_end(self, *args: Any) -> None:
        self.times.mark()


def main() -> None:
    parser = argparse.ArgumentParser(description="A Lightning regression with trainvigil's logger and callback")
    parser.add_argument("root_dir")
    add_arms(parser, "pl-regression")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", type=int, default=16, help="batches per epoch")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--features", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=0, help="0: one linear layer")
    parser.add_argument("--log-every", type=int, default=4)
    parser.add_argument("--clip", type=float, default=1.0, help="gradient clipping norm (0: none)")
    parser.add_argument(
        "--grad-every",
        type=int,
        default=0,
        help="GradNormCallback(every=N): log every N optimizer steps (0: as its budget allows)",
    )
    args = parser.parse_args()

    times = StepTimes()
    # Without trainvigil, Lightning's default logger (CSV or TensorBoard): what a user has before adding ours,
    # and Lightning turns logged tensors into numbers only when some logger is there.
    kwargs: dict[str, Any] = {"logger": True, "callbacks": [Clock(times)]}
    agent = own_agent(args)
    if not args.without:
        from trainvigil.integrations import GradNormCallback, LightningLogger

        grad_norms = GradNormCallback(every=args.grad_every or None)
        kwargs = {"logger": LightningLogger(run_id=args.run_id), "callbacks": [Clock(times), grad_norms]}

    torch.manual_seed(0)
    x = torch.randn(args.batches * args.batch, args.features)
    rows = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    data = torch.utils.data.DataLoader(rows, batch_size=args.batch)
    held_out = torch.utils.data.DataLoader(torch.utils.data.Subset(rows, range(4 * args.batch)), batch_size=args.batch)
    trainer = L.Trainer(
        max_epochs=args.epochs,
        log_every_n_steps=args.log_every,
        gradient_clip_val=args.clip or None,
        accelerator="auto",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.root_dir,
        **kwargs,
    )
    began = time.perf_counter()
    trainer.fit(Regression(args.features, args.hidden), data, held_out)
    seconds = time.perf_counter() - began
    times.report(seconds, agent)


if __name__ == "__main__":
    main()
