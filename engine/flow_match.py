"""Flow-matching schedule of Wan / Self Forcing / CausVid.

sigmas = shift*s / (1 + (shift-1)*s) for s = linspace(sigma_max, sigma_min, T+1)[:-1], timesteps =
1000 * sigmas (all float32). A timestep t maps to the sigma of the nearest grid point (so t = 0,
the context pass, maps to the last grid point, not to sigma 0). The model predicts the flow
`noise - x0`, so x0 = x_t - sigma * flow (in float64, as the reference).
"""

from __future__ import annotations

import torch
from torch import Tensor

from inferix.spec.sampling import FlowMatchConfig, SamplingConfig


class FlowMatchSchedule:
    def __init__(self, config: FlowMatchConfig | None = None) -> None:
        self.config = config or FlowMatchConfig()
        cfg = self.config
        base = torch.linspace(cfg.sigma_max, cfg.sigma_min, cfg.num_train_timesteps + 1)[:-1]
        self.sigmas = cfg.shift * base / (1 + (cfg.shift - 1) * base)
        self.timesteps = self.sigmas * cfg.num_train_timesteps
        # sigma per (timestep values, dtype) on a CPU: a block's few timesteps recur in every block
        # of every session, and the nearest-grid search costs more than the step's arithmetic.
        self._sigma_cache: dict[tuple[tuple[float, ...], torch.dtype], Tensor] = {}

    def _nearest(self, t: Tensor, dtype: torch.dtype) -> Tensor:
        grid = self.timesteps.to(device=t.device, dtype=dtype)
        return torch.argmin((grid.unsqueeze(0) - t.reshape(-1, 1).to(dtype)).abs(), dim=1)

    def sigma(self, t: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """sigma of the grid point nearest to each timestep in t (flattened)."""
        if t.device.type != "cpu":  # a cache key would wait for the device
            return self.sigmas.to(device=t.device, dtype=dtype)[self._nearest(t, dtype)]
        key = (tuple(t.flatten().tolist()), dtype)
        if key not in self._sigma_cache:
            if len(self._sigma_cache) >= 256:
                self._sigma_cache.clear()
            self._sigma_cache[key] = self.sigmas.to(dtype=dtype)[self._nearest(t, dtype)]
        return self._sigma_cache[key]

    def x0_from_flow(self, x_t: Tensor, flow: Tensor, t: Tensor) -> Tensor:
        """x0 = x_t - sigma(t) * flow, per frame; x_t/flow [B, F, C, h, w], t [B, F]."""
        sigma = self.sigma(t, torch.float64).view(*t.shape, 1, 1, 1)
        return (x_t.double() - sigma * flow.double()).to(flow.dtype)

    def add_noise(self, x0: Tensor, noise: Tensor, t: Tensor) -> Tensor:
        """(1 - sigma) * x0 + sigma * noise in float32; t [B, F] per frame."""
        sigma = self.sigma(t, torch.float32).view(*t.shape, 1, 1, 1)
        return ((1 - sigma) * x0 + sigma * noise).type_as(noise)

    def denoising_timesteps(self, sampling: SamplingConfig) -> Tensor:
        """The per-step timesteps a block is denoised with, in the dtype the model is fed.

        Self Forcing (`warp`): step s becomes timesteps[T - s] of the shifted grid (with a trailing
        0 so that s = 0 is allowed). CausVid: the raw values, as int64.
        """
        steps = torch.tensor(sampling.denoising_steps, dtype=torch.float64)
        total = self.config.num_train_timesteps
        if ((steps < 0) | (steps > total)).any():
            raise ValueError(f"denoising_steps must lie in [0, {total}], got {list(sampling.denoising_steps)}")
        if sampling.warp:
            grid = torch.cat([self.timesteps, torch.zeros(1)])
            values = grid[(total - steps).long()]
        else:
            values = steps
        dtype = torch.float32 if sampling.timestep_dtype == "float32" else torch.int64
        return values.to(dtype)
