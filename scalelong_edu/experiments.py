"""Named experiments: the training runs the chapters show, cached with their provenance.

An :class:`Experiment` is a list of :class:`RunSpec` (backbone, skip-scaling method, kappa,
learning rate, ...) measured the same way; the profile (:mod:`scalelong_edu.profiles`) fills
in dataset, model size, batch and steps. :func:`run_experiment` returns the cached result when
one exists for exactly this spec and otherwise trains every run, records the probes
(:mod:`scalelong_edu.probes`) every ``eval_every`` steps, draws samples from the EMA model, and
writes the result atomically to ``results_dir()/<name>-<profile>-<hash>.json``. The hash covers
the full spec, so changing any setting can never pick up a stale result, and a file is checked
on load (its schema, and that its stored spec hashes to its name). Each finished run is kept in
``<name>-<profile>-<hash>.runs/`` until the experiment completes, so an interrupted experiment
continues where it stopped.

From the shell: ``python -m scalelong_edu list`` and ``python -m scalelong_edu run NAME``.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from . import __version__
from .data import data_root, load_dataset
from .diffusion import cosine_schedule, ddim_sample, linear_schedule
from .files import atomic_write, check_writable
from .models import build_model, count_parameters
from .probes import ProbeRecorder, robustness, to_frame
from .profiles import Profile, get_profile
from .train import Callback, NonFiniteLossError, TrainConfig, Trainer, init_distributed, pick_device

CACHE_VERSION = 1
SCHEDULES: dict[str, Callable] = {"linear": linear_schedule, "cosine": cosine_schedule}


@dataclass(frozen=True)
class RunSpec:
    """One training run of an experiment.

    Attributes:
        label: the legend entry, e.g. ``"CS (kappa=0.5)"``.
        backbone: ``"uvit"`` or ``"unet"``: the profile's preset of that family.
        method, kappa: the skip scaling (:func:`scalelong_edu.scaling.make_scaling`).
        lr: peak learning rate.
        grad_clip: global gradient-norm clip, or ``None``.
        model_overrides: preset arguments to replace, e.g. ``(("depth", 20),)``.
        seed: weight initialisation and data order.
    """

    label: str
    backbone: str = "uvit"
    method: str = "none"
    kappa: float = 0.5
    lr: float = 2e-4
    grad_clip: float | None = None
    model_overrides: tuple[tuple[str, Any], ...] = ()
    seed: int = 0


@dataclass(frozen=True)
class Experiment:
    """A named set of runs measured alike.

    Attributes:
        name, description: what ``python -m scalelong_edu list`` shows.
        runs: the runs, in legend order.
        schedule: ``"linear"`` or ``"cosine"`` (T = 1000).
        robustness_sigmas: sigma_delta values of the end-of-training robustness probe (Thm 3.4).
        adam_stats: record Adam's moments at every evaluation.
    """

    name: str
    description: str
    runs: tuple[RunSpec, ...]
    schedule: str = "linear"
    robustness_sigmas: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2)
    adam_stats: bool = True

    def spec(self, profile: Profile) -> dict[str, Any]:
        """The full, JSON-able description that keys the cache."""
        return {"cache_version": CACHE_VERSION, "experiment": asdict(self), "profile": profile.as_dict()}


def _methods(kappa: float = 0.5, **common) -> tuple[RunSpec, ...]:
    return (
        RunSpec("none", method="none", **common),
        RunSpec("1/sqrt(2)-CS", method="sqrt2-cs", **common),
        RunSpec(f"CS (kappa={kappa:g})", method="cs", kappa=kappa, **common),
        RunSpec("LS", method="ls", **common),
    )


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment("uvit-methods", "U-ViT: no scaling vs 1/sqrt(2)-CS vs CS vs LS (feature/gradient stability)",
                   _methods()),
        Experiment("unet-methods", "conv UNet: no scaling vs 1/sqrt(2)-CS vs CS vs LS", _methods(backbone="unet")),
        Experiment("uvit-lr-stress", "U-ViT at a 15x learning rate (3e-3): where stability differences show",
                   _methods(lr=3e-3)),
        Experiment("kappa-sweep", "U-ViT with CS at kappa = 0.3 .. 1.0 (the paper suggests 0.5 to 0.95)",
                   tuple(RunSpec(f"kappa={k:g}", method="cs", kappa=k) for k in (0.3, 0.5, 0.7, 0.85, 1.0))),
        Experiment("depth-sweep", "U-ViT with N = 2, 6, 10 long skips: none vs 1/sqrt(2)-CS vs CS (reviewer Q3)",
                   tuple(RunSpec(f"{label}, N={d // 2}", method=m, model_overrides=(("depth", d),))
                         for d in (4, 12, 20) for label, m in (("none", "none"), ("1/sqrt(2)-CS", "sqrt2-cs"),
                                                               ("CS", "cs")))),
        Experiment("block-output", "U-ViT: CS on the skips vs Hanin-Rolnick scaling of the block outputs",
                   (RunSpec("none"), RunSpec("CS (kappa=0.5)", method="cs"),
                    RunSpec("block-output (eta=0.5)", method="block-output"))),
        Experiment("ls-per-skip", "U-ViT: LS with one shared calibration network vs one per skip",
                   (RunSpec("LS shared", method="ls"), RunSpec("LS per skip", method="ls-per-skip"))),
    )
}


def results_dir() -> Path:
    """``$SCALELONG_RESULTS``, else ``data_root()/results``."""
    return Path(os.environ.get("SCALELONG_RESULTS") or data_root() / "results")


def get_experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; `python -m scalelong_edu list` shows: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]


def spec_hash(spec: dict[str, Any]) -> str:
    """First 12 hex digits of the SHA-256 of the canonical JSON of ``spec``."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def cache_path(experiment: Experiment, profile: Profile) -> Path:
    return results_dir() / f"{experiment.name}-{profile.name}-{spec_hash(experiment.spec(profile))}.json"


@dataclass
class ExperimentResult:
    """A finished experiment: its spec, provenance and one record per run."""

    spec: dict[str, Any]
    provenance: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    path: Path | None = None

    def history(self):
        """Per-step training curves of every run: ``label, step, loss, grad_norm, lr``."""
        import pandas as pd

        frames = [pd.DataFrame(r["history"]).assign(label=r["label"]) for r in self.runs]
        frame = pd.concat(frames, ignore_index=True)
        return frame[["label", *(c for c in frame.columns if c != "label")]]

    def probes(self):
        """All probe rows (:data:`scalelong_edu.probes.COLUMNS`) with a ``label`` column."""
        import pandas as pd

        frames = [to_frame(_rows(r["probes"])).assign(label=r["label"]) for r in self.runs]
        return pd.concat(frames, ignore_index=True)

    def samples(self, label: str) -> torch.Tensor:
        """The run's EMA samples as float images in [-1, 1], (n, C, H, W)."""
        run = next((r for r in self.runs if r["label"] == label), None)
        if run is None:
            raise KeyError(f"no run labelled {label!r}; labels: {[r['label'] for r in self.runs]}")
        if run["diverged_at"] is not None:
            raise ValueError(f"run {label!r} diverged at step {run['diverged_at']}: it has no samples")
        return torch.tensor(run["samples"], dtype=torch.float32) / 127.5 - 1

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec, "provenance": self.provenance, "runs": self.runs}

    def describe(self) -> str:
        """Where the result came from: e.g. ``computed 2026-11-29 10:00:00 on cpu in 489 s``."""
        p = self.provenance
        return f"computed {p.get('started', '?')} on {p.get('device', '?')} in {p.get('wall_time_s', 0):.0f} s"


class _ProbeEvery(Callback):
    """Feature norms and kappas, gradient norms and Adam moments every ``every`` steps."""

    def __init__(self, recorder: ProbeRecorder, every: int, adam: bool):
        self.recorder, self.every, self.adam = recorder, every, adam
        self._capture = None

    def on_step_start(self, trainer: Trainer, step: int) -> None:
        self._capture = self.recorder.capture(step)
        self._capture.__enter__()

    def on_backward_end(self, trainer: Trainer, step: int) -> None:
        self._capture.__exit__(None, None, None)
        self.recorder.after_backward(step)

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        if self.adam:
            self.recorder.after_step(step)


def train_run(
    run: RunSpec, experiment: Experiment, profile: Profile, device: torch.device | None = None, progress: bool = True
) -> dict[str, Any]:
    """Train one run and measure it; returns its JSON-able record."""
    train = load_dataset(profile.dataset, "train", image_size=profile.image_size)
    images = train.tensors()[0]
    torch.manual_seed(run.seed)
    preset = profile.uvit if run.backbone == "uvit" else profile.unet
    model = build_model(preset, train.channels, profile.image_size, run.method, run.kappa, **dict(run.model_overrides))
    schedule = SCHEDULES[experiment.schedule]()
    config = TrainConfig(steps=profile.steps, batch_size=profile.batch_size, lr=run.lr, warmup=profile.warmup,
                         ema_decay=profile.ema_decay, grad_clip=run.grad_clip, seed=run.seed)
    trainer = Trainer(model, images, schedule, config, device=device, progress=progress,
                      spec={"run": asdict(run), "experiment": experiment.name, "profile": profile.name})
    recorder = ProbeRecorder(trainer.model, trainer.optimizer)
    trainer.callbacks.append(_ProbeEvery(recorder, profile.eval_every, experiment.adam_stats))

    start, diverged_at = time.perf_counter(), None
    try:
        trainer.fit()
    except NonFiniteLossError:
        diverged_at = trainer.step + 1
    wall = time.perf_counter() - start

    record: dict[str, Any] = {"label": run.label, "run": asdict(run), "parameters": count_parameters(model),
                              "diverged_at": diverged_at, "wall_time_s": wall, "history": _columns(trainer.history)}
    if diverged_at is None:
        test = load_dataset(profile.dataset, "test", image_size=profile.image_size).tensors()[0]
        x0 = test[: profile.batch_size].to(trainer.device)
        t = torch.linspace(0, schedule.T - 1, len(x0)).round().long().to(trainer.device)
        recorder.rows += robustness(trainer.ema, x0, t, schedule, experiment.robustness_sigmas, seed=run.seed,
                                    step=trainer.step)
        gen = torch.Generator(trainer.device).manual_seed(run.seed)
        samples = ddim_sample(trainer.ema, schedule, (profile.n_samples, *images.shape[1:]),
                              steps=profile.sample_steps, device=trainer.device, generator=gen)
        record["samples"] = ((samples.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).cpu().tolist()
    record["probes"] = _columns(recorder.rows)
    return record


def _columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Rows as one list per column: the cached JSON stays compact."""
    return {key: [row[key] for row in rows] for key in (rows[0] if rows else {})}


def _rows(columns: dict[str, list]) -> list[dict[str, Any]]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def runs_dir(path: Path) -> Path:
    """The folder that keeps the finished runs of an unfinished experiment cached at ``path``."""
    return path.with_suffix(".runs")


def finished_runs(experiment: Experiment, path: Path) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """The runs of ``experiment`` already trained towards ``path``, by index, and why any partial
    file was unusable (a damaged file is skipped: its run is trained again)."""
    done, damaged = {}, []
    for i, run in enumerate(experiment.runs):
        file = runs_dir(path) / f"{i}.json"
        if not file.exists():
            continue
        try:
            saved = json.loads(file.read_text())
            if saved["run"] != json.loads(json.dumps(asdict(run))):
                raise ValueError("it belongs to another run")
            done[i] = _check_record(saved["record"])
        except (ValueError, KeyError, TypeError) as e:
            damaged.append(f"ignoring the damaged partial result {file} ({e}); training it again")
    return done, damaged


def run_experiment(
    name: str, profile: str | Profile | None = None, force: bool = False, device: str | None = None,
    progress: bool = True,
) -> ExperimentResult:
    """The experiment's result: from the cache when its spec matches, else trained now and cached.

    Every finished run is kept (``runs_dir``) until all are done, so a rerun after an
    interruption trains only the missing ones; ``force=True`` trains everything again.
    """
    experiment = get_experiment(name)
    profile = profile if isinstance(profile, Profile) else get_profile(profile)
    path = cache_path(experiment, profile)
    rank = init_distributed()[0]

    def say(text: str) -> None:
        if progress and rank == 0:
            print(f"[{experiment.name}] {text}", flush=True)

    if path.exists() and not force:
        result = load_result(path, experiment.name)
        say(f"loaded from the cache {path}, {result.describe()}")
        return result
    dev = pick_device(device)
    if rank == 0:  # fail now, not after hours of training
        check_writable(path, "the experiment result")
    done, damaged = ({}, []) if force else finished_runs(experiment, path)
    for message in damaged:
        say(message)
    result = ExperimentResult(
        spec=experiment.spec(profile),
        provenance={"package_version": __version__, "torch": torch.__version__, "python": platform.python_version(),
                    "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else dev.type,
                    "platform": platform.platform(), "started": time.strftime("%Y-%m-%d %H:%M:%S")},
    )
    if done:
        say(f"{len(done)} of {len(experiment.runs)} runs already done in {runs_dir(path)}; continuing")
    start = time.perf_counter()
    for i, run in enumerate(experiment.runs):
        if i in done:
            result.runs.append(done[i])
            continue
        say(f"run {i + 1}/{len(experiment.runs)}: {run.label}")
        record = train_run(run, experiment, profile, dev, progress)
        if rank == 0:
            saved = {"run": asdict(run), "record": record}
            atomic_write(runs_dir(path) / f"{i}.json", lambda tmp: tmp.write_text(json.dumps(saved)))
        result.runs.append(record)
    result.provenance["wall_time_s"] = time.perf_counter() - start + sum(r["wall_time_s"] for r in done.values())
    if rank == 0:  # under torchrun only rank 0 writes
        atomic_write(path, lambda tmp: tmp.write_text(json.dumps(result.to_json(), separators=(",", ":"))))
        shutil.rmtree(runs_dir(path), ignore_errors=True)
        result.path = path
    return result


class DamagedResultError(ValueError):
    """A cached result file that cannot be trusted; the message says how to recompute it."""


RECORD_FIELDS = {"label": str, "run": dict, "parameters": int, "wall_time_s": (int, float), "history": dict,
                 "probes": dict}


def _check_record(record: Any) -> dict[str, Any]:
    """Raise a ValueError unless ``record`` has the fields and types :func:`train_run` writes."""
    if not isinstance(record, dict):
        raise ValueError(f"a run is a {type(record).__name__}, not an object")
    for key, kind in RECORD_FIELDS.items():
        if not isinstance(record.get(key), kind):
            raise ValueError(f"run field {key!r} is missing or not {getattr(kind, '__name__', kind)}")
    if not (record.get("diverged_at") is None or isinstance(record["diverged_at"], int)):
        raise ValueError("run field 'diverged_at' must be null or a step")
    if record["diverged_at"] is None and not isinstance(record.get("samples"), list):
        raise ValueError(f"run {record['label']!r} finished but has no samples")
    return record


def load_result(path: str | Path, name: str | None = None) -> ExperimentResult:
    """Read a cached result, checking its schema and that its stored spec hashes to its file name.

    A damaged file raises :class:`DamagedResultError`, whose message says how to recompute it
    (``name``, default from the file name, is the experiment to name there).
    """
    path = Path(path)
    name = name or path.name.rsplit("-", 2)[0]
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not isinstance(data.get("spec"), dict):
            raise ValueError("no 'spec' object")
        if not isinstance(data.get("provenance"), dict) or not isinstance(data.get("runs"), list):
            raise ValueError("no 'provenance' object or 'runs' list")
        for record in data["runs"]:
            _check_record(record)
        if path.stem.rsplit("-", 1)[-1] != spec_hash(data["spec"]):
            raise ValueError("its stored spec does not hash to its file name (edited?)")
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise DamagedResultError(
            f"cached result {path} is damaged: {e}; recompute it with "
            f"`python -m scalelong_edu run {name} --force` (or run_experiment({name!r}, force=True))"
        ) from e
    return ExperimentResult(data["spec"], data["provenance"], data["runs"], path)


def cache_status(experiment: Experiment, profile: Profile) -> str:
    """One phrase for ``python -m scalelong_edu list``: cached, damaged, partly done or nothing."""
    path = cache_path(experiment, profile)
    if path.exists():
        try:
            return f"cached, {load_result(path, experiment.name).describe()}"
        except DamagedResultError as e:
            return f"DAMAGED ({e})"
    done = len(finished_runs(experiment, path)[0]) if runs_dir(path).is_dir() else 0
    return f"{done} of {len(experiment.runs)} runs done" if done else "not cached"
