"""Tests of scalelong_edu.train: exact resume, seeds, NaN guard, checkpoints, callbacks, DDP."""

import errno
import os
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scalelong_edu.diffusion import cosine_schedule, linear_schedule
from scalelong_edu.models import build_model
from scalelong_edu.train import (Callback, Every, NonFiniteLossError, TrainConfig, Trainer, load_checkpoint,
                                 pick_device)

IMAGES = torch.rand(40, 1, 16, 16) * 2 - 1
PIXELS = torch.linspace(0, 255, 40 * 16 * 16).reshape(40, 1, 16, 16)  # 0..255, as a data loader may give


def make_trainer(config=None, method="ls", preset="uvit-ci", kappa=0.5, images=IMAGES, schedule=None,
                 spec=None, **kw):
    torch.manual_seed(0)
    model = build_model(preset, 1, 16, method, kappa)
    config = config or TrainConfig(steps=8, batch_size=8, warmup=3, lr=1e-3, ema_decay=0.9)
    spec = {"test": "resume", "method": method} if spec is None else spec
    return Trainer(model, images, schedule or linear_schedule(), config, device="cpu", progress=False, spec=spec,
                   **kw)


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
    with pytest.raises(NonFiniteLossError, match="loss became nan at step 3 .*No checkpoint was saved") as err:
        tr.fit()
    assert tr.step == 2 and err.value.step == 3 and err.value.checkpoint is None


def test_a_non_finite_gradient_never_reaches_the_weights():
    class PoisonGrad(Callback):
        every = 2

        def on_step_start(self, trainer, step):
            trainer.model.pos_embed.register_hook(lambda g: torch.full_like(g, float("inf")))

    tr = make_trainer(callbacks=[PoisonGrad()])
    with pytest.raises(NonFiniteLossError, match="gradient norm became (inf|nan) at step 2"):
        tr.fit()
    assert tr.step == 1 and tr._non_finite_state() == []


def test_non_finite_state_is_never_saved_and_the_message_names_the_safe_checkpoint(tmp_path):
    path = tmp_path / "run.pt"
    tr = make_trainer()
    tr.fit(until=2, checkpoint=path)
    good = path.read_bytes()
    with torch.no_grad():
        tr.model.pos_embed[0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match=f"model.pos_embed.*The last checkpoint, {path}, holds finite"):
        tr.save(path)
    assert path.read_bytes() == good


def test_a_diverged_run_resumes_from_its_last_checkpoint_with_safer_settings(tmp_path, capsys):
    """The issue's case: a run at lr=10 stops; its checkpoint is finite and resumable at a lower lr."""
    path = tmp_path / "run.pt"
    tr = make_trainer(TrainConfig(steps=30, batch_size=8, warmup=1, lr=10.0))
    with pytest.raises(NonFiniteLossError, match="new_settings=True") as err:
        tr.fit(checkpoint=path, checkpoint_every=1)
    assert err.value.checkpoint == path and str(path) in str(err.value)
    state = load_checkpoint(path)
    assert state["step"] == err.value.step - 1
    for part in ("model", "ema"):
        assert all(v.isfinite().all() for v in state[part].values() if v.is_floating_point())

    safer = TrainConfig(steps=state["step"] + 2, batch_size=8, warmup=1, lr=1e-4, grad_clip=1.0)
    with pytest.raises(ValueError, match=r"(?s)lr: 10.0 \(checkpoint\) vs 0.0001.*pass new_settings=True"):
        make_trainer(safer).fit(checkpoint=path)
    resumed = make_trainer(safer)
    resumed.load(path, new_settings=True)
    assert "with new settings: steps 30 -> " in capsys.readouterr().err
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [1e-4]
    assert resumed.resumes == [{"step": state["step"], "changed": {"steps": [30, safer.steps], "lr": [10.0, 1e-4],
                                                                   "grad_clip": [None, 1.0]}}]


def test_resuming_with_new_settings_uses_them_from_the_checkpoint_on(tmp_path):
    path = tmp_path / "run.pt"
    make_trainer().fit(until=4, checkpoint=path)
    config = TrainConfig(steps=8, batch_size=8, warmup=6, lr=5e-4, ema_decay=0.9, grad_clip=0.5)
    tr = make_trainer(config)
    tr.fit(checkpoint=path, new_settings=True)
    assert [h["lr"] for h in tr.history[4:]] == pytest.approx([5e-4 * 5 / 6, 5e-4, 5e-4, 5e-4])
    assert load_checkpoint(path)["resumes"] == [
        {"step": 4, "changed": {"lr": [1e-3, 5e-4], "warmup": [3, 6], "grad_clip": [None, 0.5]}}
    ]
    other = TrainConfig(steps=8, batch_size=4, warmup=3, lr=1e-3, ema_decay=0.9)  # not an optimisation setting
    with pytest.raises(ValueError, match="batch_size: 8 \\(checkpoint\\) vs 4"):
        make_trainer(other).fit(checkpoint=path, new_settings=True)


def test_a_checkpoint_knows_its_run_without_a_spec(tmp_path):
    path = tmp_path / "cs.pt"
    digits = torch.rand(40, 1, 16, 16) * 2 - 1
    make_trainer(method="cs", kappa=0.5, spec={}).fit(until=2, checkpoint=path)
    with pytest.raises(ValueError, match="different run") as err:
        make_trainer(method="cs", kappa=0.9, images=digits, schedule=cosine_schedule(), spec={}).fit(checkpoint=path)
    message = str(err.value)
    assert "skip scaling: \"method='cs', n_skips=2, kappa=0.5\"" in message and "kappa=0.9" in message
    assert "schedule:" in message and "data:" in message and "architecture" not in message
    with pytest.raises(ValueError, match="skip scaling") as err:
        make_trainer(method="none", spec={}).fit(checkpoint=path)
    with pytest.raises(ValueError, match="architecture: 'UViT, .*UNet") as err:
        make_trainer(method="cs", preset="unet-ci", spec={}).fit(checkpoint=path)
    assert "Missing key" not in str(err.value)


def test_an_unwritable_checkpoint_fails_before_training(tmp_path):
    occupied = tmp_path / "file"
    occupied.write_text("a file where a folder should be")
    tr = make_trainer()
    with pytest.raises(PermissionError, match=f"cannot write the checkpoint {occupied / 'run.pt'}"):
        tr.fit(checkpoint=occupied / "run.pt")
    assert tr.step == 0
    with pytest.raises(IsADirectoryError, match="is a folder"):
        tr.fit(checkpoint=tmp_path)


def test_a_killed_writers_temporary_file_is_removed_by_the_next_write(tmp_path):
    path = tmp_path / "run.pt"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".run.pt.{dead.stdout.strip()}.tmp"
    alive = tmp_path / f".run.pt.{os.getppid()}.tmp"  # a writer still running: left alone
    stale.write_bytes(b"half")
    alive.write_bytes(b"busy")
    make_trainer().save(path)
    assert path.exists() and not stale.exists() and alive.exists()


def test_checkpoint_writes_are_atomic(tmp_path, monkeypatch):
    tr = make_trainer()
    tr.fit(until=2)
    path = tmp_path / "ckpt.pt"
    tr.save(path)
    good = path.read_bytes()

    def crash(obj, f, *a, **k):
        f.write(b"half a file")
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
    old = torch.load(tmp_path / "ls.pt", weights_only=True) | {"format": 1}
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(ValueError, match="has format 1.*delete it"):
        load_checkpoint(tmp_path / "old.pt")


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=2.5), "steps must be a whole number.*2.5"),
    (dict(batch_size=4.0), "batch_size must be a whole number.*4.0"),
    (dict(steps=0), "steps must be >= 1, got 0"),
    (dict(warmup=-1), "warmup must be >= 0, got -1"),
    (dict(lr=-1.0), "lr must be a finite number > 0.*got -1.0"),
    (dict(lr=float("nan")), "lr must be .*got nan"),
    (dict(ema_decay=1.5), "ema_decay must be in \\[0, 1\\).*got 1.5"),
    (dict(grad_clip=0), "grad_clip must be .*got 0"),
    (dict(betas=(0.9, 1.2)), "betas must be two numbers in \\[0, 1\\).*1.2"),
    (dict(amp="fp8"), "amp must be True, False, 'float16' or 'bfloat16', got 'fp8'"),
])
def test_bad_config_names_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{"steps": 1, "batch_size": 8, **kwargs})


def test_bad_config_raises():
    with pytest.raises(ValueError, match="exceeds"):
        make_trainer(TrainConfig(steps=1, batch_size=64)).fit()


@pytest.mark.parametrize("images, message", [
    (PIXELS, "range over \\[0, 255\\].*x / 127.5 - 1"),
    (PIXELS.to(torch.uint8), "images are torch.uint8.*floats in \\[-1, 1\\]"),
    (PIXELS / 255 + 0.5, "range over \\[0.5, 1.5\\]"),
    (IMAGES[0], "must be \\(N, C, H, W\\)"),
])
def test_images_outside_minus_one_one_are_refused(images, message):
    with pytest.raises(ValueError, match=message):
        make_trainer(images=images)


def test_pick_device(monkeypatch):
    monkeypatch.setenv("SCALELONG_DEVICE", "cpu")
    assert pick_device() == torch.device("cpu")
    assert pick_device("meta") == torch.device("meta")
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        pick_device("gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="device 'cuda' is not available on this machine; use cpu"):
        pick_device("cuda")


DDP_WORKER = Path(__file__).with_name("ddp_worker.py")


def test_ddp_two_processes_match_one_process(tmp_path, monkeypatch):
    """torchrun with 2 gloo processes and the same global batch gives the single-process result."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(DDP_WORKER), str(tmp_path / "ddp.pt")],
        check=True, env=env, timeout=300, capture_output=True,
    )
    monkeypatch.setattr(sys, "argv", [str(DDP_WORKER), str(tmp_path / "single.pt")])
    runpy.run_path(str(DDP_WORKER), run_name="__main__")  # the single process: this one
    ddp, single = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "single.pt")
    assert ddp["world"] == 2 and single["world"] == 1
    assert ddp["losses"] == pytest.approx(single["losses"], rel=1e-4)
    for k in single["model"]:
        torch.testing.assert_close(ddp["model"][k], single["model"][k], atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_a_full_disk_names_the_checkpoint_and_keeps_the_previous_one(tmp_path):
    """The issue's case: fit(checkpoint=..., checkpoint_every=3) on a disk that is full at step 3.

    The checkpoint's temporary file is made a link to /dev/full, where every write fails with ENOSPC.
    """
    path = tmp_path / "run.pt"
    make_trainer().fit(until=2, checkpoint=path)
    good = path.read_bytes()
    (tmp_path / f".run.pt.{os.getpid()}.tmp").symlink_to("/dev/full")
    tr = make_trainer()
    with pytest.raises(OSError, match=f"could not write the checkpoint {re.escape(str(path))} at step 3 "
                                      r"\(No space left on device\); it needs about .* MB, .* free; the previous "
                                      "checkpoint .* is unchanged. Free some space or choose another path") as err:
        tr.fit(checkpoint=path, checkpoint_every=3)
    assert err.value.errno == errno.ENOSPC and "enforce fail" not in str(err.value)
    assert path.read_bytes() == good and load_checkpoint(path)["step"] == 2
    assert not list(tmp_path.glob(".*.tmp")) and tr.step == 3
    tr.save(tmp_path / "elsewhere.pt")  # the trainer kept its steps
    assert load_checkpoint(tmp_path / "elsewhere.pt")["step"] == 3


def test_too_little_free_space_is_found_before_training(tmp_path, monkeypatch):
    path = tmp_path / "run.pt"
    tr = make_trainer()
    needed = tr.checkpoint_size()
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=needed - 1))
    with pytest.raises(OSError, match=f"not enough space for the checkpoint in {re.escape(str(tmp_path))}: "
                                      f"about {needed / 1e6:.1f} MB needed") as err:
        tr.fit(checkpoint=path)
    assert err.value.errno == errno.ENOSPC and tr.step == 0 and not path.exists()
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=needed))
    tr.fit(checkpoint=path)
    assert needed >= path.stat().st_size > needed / 2  # the estimate bounds the file, and not loosely


def test_until_past_the_configured_steps_is_refused():
    with pytest.raises(ValueError, match=r"until must be a whole number in \[0, steps=8\], got 9"):
        make_trainer().fit(until=9)


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    """A checkpoint after 2 steps (so AdamW holds its moments), as a state to damage."""
    path = tmp_path_factory.mktemp("good") / "run.pt"
    make_trainer().fit(until=2, checkpoint=path)
    return path


def nan_at(field, key):
    def edit(state):
        state[field][key].view(-1)[0] = float("nan")
    return edit


def set_in(value, *keys):
    def edit(state):
        parent = state
        for key in keys[:-1]:
            parent = parent[key]
        parent[keys[-1]] = value
    return edit


def drop(*keys):
    def edit(state):
        parent = state
        for key in keys[:-1]:
            parent = parent[key]
        del parent[keys[-1]]
    return edit


def nan_moment(state):
    state["optimizer"]["state"][0]["exp_avg_sq"][...] = float("inf")


DAMAGES = {  # case 9: non-finite state and bad steps; case 12: wrong shapes, missing fields, bad order
    "nan model": (nan_at("model", "pos_embed"), "field 'model.pos_embed' holds NaN or infinite values"),
    "nan ema": (nan_at("ema", "pos_embed"), "field 'ema.pos_embed' holds NaN or infinite values"),
    "inf moment": (nan_moment, "field 'optimizer.state.0.exp_avg_sq' holds NaN or infinite values"),
    "negative step": (set_in(-5, "step"), r"field 'step' is -5, outside \[0, 8\] \(its config.steps\)"),
    "float step": (set_in(2.0, "step"), "field 'step' is 2.0 of type float, not int"),
    "format string": (set_in("2", "format"), "field 'format' is '2' of type str, not int"),
    "missing ema": (drop("ema"), "field 'ema' is missing"),
    "missing ema tensor": (drop("ema", "pos_embed"), "field 'ema.pos_embed' is missing"),
    "wrong shape": (set_in(torch.zeros(1, 3, 5), "model", "pos_embed"),
                    r"field 'model.pos_embed' has shape \(1, 3, 5\); this model's is \(1, \d+, \d+\)"),
    "extra tensor": (set_in(torch.zeros(1), "model", "stray"), "field 'model.stray' is not a tensor of this model"),
    "bad moment": (set_in(torch.zeros(3), "optimizer", "state", 0, "exp_avg"),
                   r"field 'optimizer.state.0.exp_avg' has shape \(3,\); its parameter's is \(1, \d+, \d+\)"),
    "moment of no parameter": (set_in({"exp_avg": torch.zeros(1)}, "optimizer", "state", 999),
                               r"field 'optimizer.state.999' names no parameter \(there are \d+\)"),
    "bad order": (set_in(torch.arange(100, 140), "data_order", "perm"),
                  "field 'data_order.perm' is not a permutation of the 40 training images"),
    "bad position": (set_in(99, "data_order", "pos"), r"field 'data_order.pos' is 99, outside \[0, 40\]"),
    "bad rng": (set_in(torch.zeros(3, dtype=torch.uint8), "rng", "generator"),
                r"field 'rng.generator' is a torch.uint8 tensor of shape \(3,\), not a torch.uint8 one of shape"),
    "bad schedule": (set_in({"last_epoch": 2}, "lr_schedule"), "field 'lr_schedule' does not load .*KeyError"),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_damaged_checkpoint_is_refused_naming_the_file_and_the_field(case, good_checkpoint, tmp_path):
    edit, message = DAMAGES[case]
    state = torch.load(good_checkpoint, weights_only=True)
    edit(state)
    path = tmp_path / "damaged.pt"
    torch.save(state, path)
    tr = make_trainer()
    before = params(tr.model)
    with pytest.raises(ValueError, match=f"^checkpoint {re.escape(str(path))}: {message}.*; delete it and train again"):
        tr.load(path)
    assert tr.step == 0 and tr.last_checkpoint is None  # so no divergence message vouches for it
    assert all(torch.equal(a, b) for a, b in zip(before, params(tr.model)))


def test_a_checkpoint_past_the_new_steps_is_refused(good_checkpoint):
    short = TrainConfig(steps=1, batch_size=8, warmup=3, lr=1e-3, ema_decay=0.9)
    message = r"at step 2, past steps=1 of this trainer: resume it with TrainConfig\(steps >= 2"
    with pytest.raises(ValueError, match=message):
        make_trainer(short).load(good_checkpoint, new_settings=True)
