"""Tests of scalelong_edu.train: exact resume, seeds, NaN guard, checkpoints, callbacks, DDP."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelong_edu.diffusion import linear_schedule
from scalelong_edu.models import build_model
from scalelong_edu.train import Callback, Every, NonFiniteLossError, TrainConfig, Trainer, load_checkpoint, pick_device

IMAGES = torch.rand(40, 1, 16, 16) * 2 - 1


def make_trainer(config=None, method="ls", **kw):
    torch.manual_seed(0)
    model = build_model("uvit-ci", 1, 16, method)
    config = config or TrainConfig(steps=8, batch_size=8, warmup=3, lr=1e-3, ema_decay=0.9)
    return Trainer(model, IMAGES, linear_schedule(), config, device="cpu", progress=False,
                   spec={"test": "resume", "method": method}, **kw)


def params(module):
    return [p.detach().clone() for p in module.state_dict().values()]


def test_resume_is_exact_bit_for_bit(tmp_path):
    full = make_trainer()
    full.fit()
    first = make_trainer()
    first.fit(until=4, checkpoint=tmp_path / "run.pt")
    resumed = make_trainer()  # a fresh process would rebuild the same way
    resumed.fit(checkpoint=tmp_path / "run.pt")
    assert resumed.step == full.step == 8
    for a, b in zip(params(full.model), params(resumed.model)):
        assert torch.equal(a, b)
    for a, b in zip(params(full.ema), params(resumed.ema)):
        assert torch.equal(a, b)
    assert full.history == resumed.history
    assert not list(tmp_path.glob(".*.tmp"))


def test_seeds_repeat_and_differ():
    a, b = make_trainer(), make_trainer()
    a.fit(until=3)
    b.fit(until=3)
    assert a.history == b.history
    c = make_trainer(TrainConfig(steps=3, batch_size=8, warmup=3, lr=1e-3, ema_decay=0.9, seed=1))
    c.fit()
    assert c.history[0]["loss"] != a.history[0]["loss"]


def test_warmup_ema_and_history():
    cfg = TrainConfig(steps=5, batch_size=8, warmup=4, lr=1e-3, ema_decay=0.0)
    tr = make_trainer(cfg)
    hist = tr.fit()
    assert [h["lr"] for h in hist] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert all(h["loss"] > 0 and h["grad_norm"] > 0 for h in hist)
    for e, p in zip(tr.ema.parameters(), tr.model.parameters()):  # decay 0: EMA equals the model
        assert torch.equal(e, p)


def test_gradient_clipping_bounds_the_norm():
    norms = []

    class Measure(Callback):
        def on_backward_end(self, trainer, step):
            norms.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in trainer.model.parameters()])).item())

    cfg = TrainConfig(steps=3, batch_size=8, warmup=1, grad_clip=1e-3)
    tr = make_trainer(cfg, callbacks=[Measure()])
    hist = tr.fit()
    assert all(h["grad_norm"] > 1e-3 for h in hist)  # the norm before clipping is reported
    assert max(norms) <= 1e-3 * 1.0001


def test_callbacks_run_at_their_steps_and_at_the_end():
    seen = []

    class End(Callback):
        every = 100

        def on_fit_end(self, trainer):
            seen.append(("end", trainer.step))

    tr = make_trainer(callbacks=[Every(3, lambda trainer, step: seen.append((step, trainer.step))), End()])
    tr.fit()
    assert seen == [(3, 3), (6, 6), ("end", 8)]


def test_nan_loss_stops_the_run_naming_the_step():
    class Poison(Callback):
        every = 3

        def on_step_start(self, trainer, step):
            with torch.no_grad():
                trainer.model.pos_embed.fill_(float("nan"))

    tr = make_trainer(callbacks=[Poison()])
    with pytest.raises(NonFiniteLossError, match="at step 3; try a lower learning rate"):
        tr.fit()
    assert tr.step == 2


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    tr = make_trainer()
    tr.fit(until=2)
    path = tmp_path / "ckpt.pt"
    tr.save(path)
    good = path.read_bytes()

    def crash(obj, f, *a, **k):
        Path(f).write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        tr.save(path)
    assert path.read_bytes() == good and not list(tmp_path.glob(".*.tmp"))


def test_bad_checkpoints_raise_clear_errors(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="corrupt or incomplete"):
        load_checkpoint(bad)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")
    tr = make_trainer()
    tr.save(tmp_path / "ls.pt")
    other = make_trainer(method="none")
    with pytest.raises(ValueError, match="different run"):
        other.load(tmp_path / "ls.pt")


def test_bad_config_raises():
    with pytest.raises(ValueError):
        TrainConfig(steps=0, batch_size=8)
    with pytest.raises(ValueError, match="grad_clip"):
        TrainConfig(steps=1, batch_size=8, grad_clip=0)
    with pytest.raises(ValueError, match="exceeds"):
        make_trainer(TrainConfig(steps=1, batch_size=64)).fit()


def test_pick_device(monkeypatch):
    monkeypatch.setenv("SCALELONG_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")
    assert pick_device("meta") == torch.device("meta")


DDP_WORKER = Path(__file__).with_name("ddp_worker.py")


def test_ddp_two_processes_match_one_process(tmp_path):
    """torchrun with 2 gloo processes and the same global batch gives the single-process result."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(DDP_WORKER), str(tmp_path / "ddp.pt")],
        check=True, env=env, timeout=300, capture_output=True,
    )
    subprocess.run([sys.executable, str(DDP_WORKER), str(tmp_path / "single.pt")], check=True, env=env, timeout=300)
    ddp, single = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "single.pt")
    assert ddp["world"] == 2 and single["world"] == 1
    assert ddp["losses"] == pytest.approx(single["losses"], rel=1e-4)
    for k in single["model"]:
        torch.testing.assert_close(ddp["model"][k], single["model"][k], atol=1e-5, rtol=1e-4)
