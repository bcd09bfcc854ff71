"""Tests of scalelong_edu.diffusion: schedules, the closed-form forward process, Eq. (2), samplers."""

import math

import pytest
import torch

from scalelong_edu.diffusion import (
    VPSDE,
    DiscreteSchedule,
    cosine_schedule,
    ddim_sample,
    ddpm_sample,
    eps_loss,
    linear_schedule,
    q_sample,
)


def test_linear_schedule_matches_ddpm():
    s = linear_schedule(1000)
    assert s.T == 1000
    torch.testing.assert_close(s.betas[[0, -1]], torch.tensor([1e-4, 0.02], dtype=torch.float64))
    assert s.alpha_bars[-1] < 1e-4  # x_T is almost pure noise
    assert (s.alpha_bars[1:] < s.alpha_bars[:-1]).all()


def test_cosine_schedule_shape():
    s = cosine_schedule(1000)
    ab = s.alpha_bars
    assert ab[0] > 0.9999 and ab[-1] < 1e-4
    # abar(0.5) of the cosine schedule is cos^2(0.5 pi / 2) up to the offset s
    assert abs(ab[499].item() - math.cos((0.5 + 0.008) / 1.008 * math.pi / 2) ** 2) < 1e-2


def test_vpsde_closed_form_and_discretization():
    sde = VPSDE()
    t = torch.tensor([0.0, 0.5, 1.0])
    expected = torch.exp(-0.1 * t - 0.5 * 19.9 * t**2).double()
    torch.testing.assert_close(sde.alpha_bar(t), expected)
    torch.testing.assert_close(sde.model_time(t), torch.tensor([0.0, 499.5, 999.0]))
    d = sde.discretize(100)
    assert d.T == 100 and d.model_times[-1] == pytest.approx(999.0)
    torch.testing.assert_close(d.alpha_bars[-1], expected[-1])


@pytest.mark.parametrize("make", [linear_schedule, cosine_schedule])
def test_q_sample_agrees_with_iterating_the_chain(make):
    """x_t from the closed form has the law of T steps of x_t = sqrt(1-beta) x_{t-1} + sqrt(beta) z."""
    s = make(1000)
    gen = torch.Generator().manual_seed(0)
    n, x0 = 40_000, torch.tensor([0.8, -0.5, 0.0])
    x = x0.expand(n, 3).clone()
    betas = s.betas.float()
    for step in range(300):
        x = (1 - betas[step]).sqrt() * x + betas[step].sqrt() * torch.randn(x.shape, generator=gen)
        if step in (9, 99, 299):
            t = torch.full((n,), step)
            closed = q_sample(x0.expand(n, 3), t, s, torch.randn(n, 3, generator=gen))
            abar = s.alpha_bars[step].item()
            for sample in (x, closed):  # both match the analytic moments ...
                torch.testing.assert_close(sample.mean(0), math.sqrt(abar) * x0, atol=0.02, rtol=0)
                torch.testing.assert_close(sample.std(0), torch.full((3,), math.sqrt(1 - abar)), atol=0.02, rtol=0)
            torch.testing.assert_close(x.mean(0), closed.mean(0), atol=0.025, rtol=0)  # ... and each other


def test_q_sample_checks_shapes_and_keeps_dtype():
    s = linear_schedule()
    x0 = torch.zeros(4, 1, 8, 8, dtype=torch.float64)
    assert q_sample(x0, torch.tensor([0, 1, 2, 999]), s).dtype == torch.float64
    with pytest.raises(ValueError, match="batch"):
        q_sample(x0, torch.tensor([0, 1]), s)
    with pytest.raises(ValueError, match="noise shape"):
        q_sample(x0, torch.tensor([0, 1, 2, 3]), s, torch.zeros(4, 1, 8, 7))


def _oracle(schedule: DiscreteSchedule, center: torch.Tensor):
    """The exact eps-predictor when all data sit at one point ``center``."""

    def model(x_t, time):
        abar = schedule.alpha_bars.to(x_t.dtype)[time.round().long()].view(-1, 1, 1, 1)
        return (x_t - abar.sqrt() * center) / (1 - abar).sqrt()

    return model


def test_eps_loss_is_zero_for_the_exact_predictor_and_one_for_zero():
    s = linear_schedule()
    center = torch.full((1, 1, 4, 4), 0.3)
    x0 = center.expand(256, 1, 4, 4)
    assert eps_loss(_oracle(s, center), x0, s).item() < 1e-6
    zero = eps_loss(lambda x, t: torch.zeros_like(x), x0, s, generator=torch.Generator().manual_seed(1))
    assert zero.item() == pytest.approx(1.0, abs=0.05)  # E||eps||^2 / dim = 1


def test_eps_loss_repeats_with_a_seeded_generator_and_reduces_per_sample():
    s = VPSDE()
    model = torch.nn.Conv2d(1, 1, 3, padding=1)
    x0 = torch.randn(8, 1, 8, 8)
    a = eps_loss(lambda x, t: model(x), x0, s, generator=torch.Generator().manual_seed(3), reduce=False)
    b = eps_loss(lambda x, t: model(x), x0, s, generator=torch.Generator().manual_seed(3), reduce=False)
    assert a.shape == (8,) and torch.equal(a, b)
    with pytest.raises(ValueError, match="model returned shape"):
        eps_loss(lambda x, t: x[:, :, :4], x0, s)


@pytest.mark.parametrize("sampler", ["ddpm", "ddim"])
def test_samplers_recover_a_point_mass(sampler):
    """With the exact predictor for data at one point, sampling must land on that point."""
    s = linear_schedule(200, beta_end=0.1)
    center = torch.linspace(-0.9, 0.9, 16).view(1, 1, 4, 4)
    gen = torch.Generator().manual_seed(0)
    if sampler == "ddpm":
        out = ddpm_sample(_oracle(s, center), s, (3, 1, 4, 4), generator=gen)
    else:
        out = ddim_sample(_oracle(s, center), s, (3, 1, 4, 4), steps=20, generator=gen)
    torch.testing.assert_close(out, center.expand(3, 1, 4, 4), atol=1e-3, rtol=0)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_samplers_return_finite_tensors_of_the_right_shape(eta):
    s = VPSDE().discretize(50)
    net = torch.nn.Conv2d(3, 3, 3, padding=1).double()
    model = lambda x, t: net(x.double()).to(x.dtype) * (t.view(-1, 1, 1, 1) / 999)  # noqa: E731
    for out, dtype in (
        (ddpm_sample(model, s, (2, 3, 8, 8)), torch.float32),
        (ddim_sample(model, s, (2, 3, 8, 8), steps=10, eta=eta, dtype=torch.float64), torch.float64),
    ):
        assert out.shape == (2, 3, 8, 8) and out.dtype == dtype and torch.isfinite(out).all()


def test_ddim_is_deterministic_with_eta_zero():
    s = linear_schedule(100)
    model = lambda x, t: 0.5 * x  # noqa: E731
    a = ddim_sample(model, s, (2, 1, 4, 4), steps=10, generator=torch.Generator().manual_seed(5))
    b = ddim_sample(model, s, (2, 1, 4, 4), steps=10, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


def test_bad_inputs_raise():
    with pytest.raises(TypeError, match="discretize"):
        ddpm_sample(lambda x, t: x, VPSDE(), (1, 1, 4, 4))
    with pytest.raises(ValueError, match="steps"):
        ddim_sample(lambda x, t: x, linear_schedule(10), (1, 1, 4, 4), steps=11)
    with pytest.raises(ValueError, match="beta"):
        linear_schedule(10, beta_start=0.1, beta_end=0.01)
    with pytest.raises(ValueError, match="decreasing"):
        DiscreteSchedule(torch.tensor([0.5, 0.9]))
