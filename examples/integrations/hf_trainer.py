"""Hugging Face ``Trainer`` with trainvigil: a small GPT-2 built from a config (no download) learns
random token sequences; ``TrainerCallback`` logs every optimizer step, each Trainer log, evaluations
and checkpoint digests, and ends the run with training.

    vigil up &
    python examples/integrations/hf_trainer.py out/ --steps 20 --save-every 10 --eval-every 10
    python examples/integrations/hf_trainer.py out/ --without      # the same training without trainvigil

``tests/e2e/test_integrations.py`` runs this script against a real broker and daemon, and
``bench/integrations_overhead.py`` times it with and without the callback. The last line printed is
the step times and the Trainer's own ``train_runtime`` (``_common.py``).
"""

from __future__ import annotations

import argparse

import torch
from _common import StepTimes, add_arms, own_agent
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    """``size`` fixed random sequences of ``length`` tokens (each its own seed: the same every run)."""

    def __init__(self, size: int, length: int, vocab: int) -> None:
        self.size, self.length, self.vocab = size, length, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, self.vocab, (self.length,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class Clock(TrainerCallback):
    """Marks the end of every optimizer step (with or without trainvigil alike)."""

    def __init__(self, times: StepTimes) -> None:
        self.times = times

    def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
        self.times.mark()


def main() -> None:
    parser = argparse.ArgumentParser(description="GPT-2 on random tokens with trainvigil's TrainerCallback")
    parser.add_argument("output_dir")
    add_arms(parser, "hf-gpt2")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--width", type=int, default=16, help="embedding size (heads: width // 8)")
    parser.add_argument("--length", type=int, default=16, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--log-every", type=int, default=5)
    parser.add_argument("--save-every", type=int, default=0, help="0: no checkpoints")
    parser.add_argument("--eval-every", type=int, default=0, help="0: no evaluation")
    args = parser.parse_args()

    times = StepTimes()
    callbacks: list[TrainerCallback] = [Clock(times)]
    agent = own_agent(args)
    if not args.without:
        from trainvigil.integrations import TrainerCallback as VigilCallback

        callbacks.append(VigilCallback(run_id=args.run_id))

    torch.manual_seed(0)
    vocab = 64
    config = GPT2Config(
        n_layer=args.layers,
        n_head=max(1, args.width // 8),
        n_embd=args.width,
        vocab_size=vocab,
        n_positions=args.length,
        bos_token_id=0,
        eos_token_id=0,
    )
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        logging_steps=args.log_every,
        save_strategy="steps" if args.save_every else "no",
        save_steps=args.save_every or 500,
        eval_strategy="steps" if args.eval_every else "no",
        eval_steps=args.eval_every or None,
        per_device_train_batch_size=args.batch,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    data = Tokens(max(64, args.steps * args.batch), args.length, vocab)
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=data,
        eval_dataset=Tokens(64, args.length, vocab) if args.eval_every else None,
        callbacks=callbacks,
    )
    out = trainer.train()
    times.report(out.metrics["train_runtime"], agent)


if __name__ == "__main__":
    main()
