"""Ctrl-C during a tiny-bd training stage: the run ends at a step boundary and is saved.

A real Lightning run on a tiny model is interrupted by a real SIGINT sent to this process, so
the handler, the callback and Lightning's stop path are all the ones `train` uses.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import torch
from _tiny_bd_helpers import BS, CONFIG, examples, quick_config, training_set
from dwise_predict.zoo.tiny_bd.card import model_card
from dwise_predict.zoo.tiny_bd.recipe.data import DataConfig
from dwise_predict.zoo.tiny_bd.recipe.train import train


def test_first_ctrl_c_stops_at_a_step_boundary_and_keeps_the_weights(tmp_path: Path) -> None:
    """The first SIGINT asks the run to stop; it stops at the end of a step (well before its
    step budget), reports it, returns finite weights, and puts the caller's SIGINT handler
    back. The card then says the stage was stopped by hand."""
    config = quick_config(max_steps=100_000)
    train_set = training_set(examples(400, seed=0))
    before = signal.getsignal(signal.SIGINT)
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        model, result = train(
            CONFIG, config, DataConfig(block_size=BS), tmp_path / "log.csv", train_set
        )
    finally:
        timer.cancel()
    assert result.stopped_by_hand and not result.stopped_by_time
    assert 1 <= result.steps < config.max_steps
    assert signal.getsignal(signal.SIGINT) is before
    assert all(torch.isfinite(p).all() for p in model.parameters())
    stage = {
        "command": "train --seed 0",
        "train_config": {"lr": config.lr, "pad_weight": config.pad_weight},
        "result": {
            "steps": result.steps,
            "seconds": result.seconds,
            "final_loss": result.final_loss,
            "stopped_by_time": result.stopped_by_time,
            "stopped_by_hand": result.stopped_by_hand,
        },
    }
    assert f"steps: {result.steps}" in model_card(CONFIG, stage)
    assert "stopped by hand (Ctrl-C)" in model_card(CONFIG, stage)
