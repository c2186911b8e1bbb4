"""Train the GPT recipe with a plain Lightning Trainer and fastloop's callbacks.

    python -m fastloop.recipes.gpt.train --preset tiny --steps 300 --speedups bf16,fused_optimizer
    python -m fastloop.recipes.gpt.train --preset gpt2 --data-dir /data/openwebtext \
        --speedups tf32,bf16,fused_optimizer,compile

Checkpoints (``--ckpt-dir``) resume exactly: weights, optimizer, LR schedule and data position.
"""

from __future__ import annotations

import argparse

from fastloop._compat import Trainer
from fastloop.lightning import callbacks
from fastloop.recipes.gpt.data import TokenData
from fastloop.recipes.gpt.module import GPTModule


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--speedups", default="none")
    p.add_argument("--ckpt-dir", default=None)
    p.add_argument("--resume", default=None, help="checkpoint path to resume from")
    args = p.parse_args(argv)
    module = GPTModule(preset=args.preset, batch_size=args.batch_size, max_steps=args.steps)
    data = TokenData(
        args.data_dir, block_size=module.cfg.block_size, batch_size=args.batch_size, vocab_size=module.cfg.vocab_size
    )
    trainer = Trainer(
        max_steps=args.steps,
        gradient_clip_val=1.0,
        val_check_interval=min(100, args.steps),
        limit_val_batches=4,
        callbacks=callbacks(args.speedups),
        default_root_dir=args.ckpt_dir,
        logger=False,
        enable_checkpointing=args.ckpt_dir is not None,
    )
    trainer.fit(module, datamodule=data, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
