"""Estimate the peak GPU memory of a `gpu`-profile training run, measured on the CPU.

No GPU is at hand, so the estimate adds up what a training step keeps alive, each part measured
on the CPU with the run's own model, batch and mixed precision:

* **state**: weights, gradients and AdamW's two moments in float32, plus the EMA copy:
  ``(4 + 4 + 8 + 4) * parameters`` bytes;
* **activations**: the bytes of every tensor autograd saves for the backward pass in one
  forward pass under float16 autocast (what the Trainer runs on CUDA), counted with
  ``torch.autograd.graph.saved_tensors_hooks`` (each storage once). They grow linearly with the
  batch, so they are measured at two small batches and extrapolated to the profile's batch;
* **workspace**: a margin for what the count cannot see (the CUDA context, about 0.3-0.5 GB,
  cuBLAS/cuDNN workspaces, the caching allocator's fragmentation): 25% of the rest plus 0.5 GiB.

A T4 has 16 GB (15.1 GiB usable). Run: ``python benchmarks/gpu_memory.py [--profile gpu]``.
"""

from __future__ import annotations

import argparse

import torch

from scalelong_edu.data import dataset_info
from scalelong_edu.diffusion import eps_loss, linear_schedule
from scalelong_edu.models import build_model, count_parameters
from scalelong_edu.profiles import PROFILES, Profile

GIB = 2**30
T4_USABLE_GIB = 15.1
STATE_BYTES_PER_PARAMETER = 4 + 4 + 8 + 4  # weight, gradient, Adam m and v, EMA (all float32)


def saved_activation_bytes(model: torch.nn.Module, channels: int, size: int, batch: int) -> int:
    """Bytes autograd saves in one float16-autocast forward pass at ``batch`` (each storage once)."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    x0 = torch.rand(batch, channels, size, size) * 2 - 1
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", torch.float16):
        loss = eps_loss(model, x0, linear_schedule())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def estimate(preset: str, method: str, profile: Profile, batches: tuple[int, int] = (4, 8)) -> dict[str, float]:
    """GiB of state, activations (extrapolated to the profile's batch), workspace and the peak."""
    channels = dataset_info(profile.dataset).channels
    torch.manual_seed(0)
    model = build_model(preset, channels, profile.image_size, method)
    small, large = (saved_activation_bytes(model, channels, profile.image_size, b) for b in batches)
    per_image = (large - small) / (batches[1] - batches[0])
    activations = small + per_image * (profile.batch_size - batches[0])
    state = STATE_BYTES_PER_PARAMETER * count_parameters(model)
    workspace = 0.25 * (state + activations) + 0.5 * GIB
    return {"parameters": count_parameters(model), "state": state / GIB, "activations": activations / GIB,
            "workspace": workspace / GIB, "peak": (state + activations + workspace) / GIB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=list(PROFILES), default="gpu")
    parser.add_argument("--methods", nargs="+", default=["none", "ls-per-skip"],
                        help="skip-scaling methods to measure (LS per skip has the most parameters)")
    args = parser.parse_args()
    profile = PROFILES[args.profile]
    print(f"profile {profile.name}: {profile.dataset} at {profile.image_size} px, batch {profile.batch_size}, "
          f"float16 autocast; a T4 has {T4_USABLE_GIB} GiB usable")
    print(f"{'preset':10s} {'method':12s} {'params':>11s} {'state':>7s} {'activ.':>7s} {'margin':>7s} "
          f"{'peak GiB':>9s} {'of a T4':>8s}")
    for preset in (profile.unet, profile.uvit):
        for method in args.methods:
            e = estimate(preset, method, profile)
            print(f"{preset:10s} {method:12s} {e['parameters']:>11,d} {e['state']:7.2f} {e['activations']:7.2f} "
                  f"{e['workspace']:7.2f} {e['peak']:9.2f} {e['peak'] / T4_USABLE_GIB:8.0%}")


if __name__ == "__main__":
    main()
