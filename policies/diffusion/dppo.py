"""The denoising chain as a Gaussian MDP (DPPO): per-step means and stds from a diffusers schedule.

For denoising step i at timestep t with previous timestep t' (alpha-bar a_t, a_t'):
  x0_hat = clip(sqrt(1/a_t) x_t - sqrt(1/a_t - 1) eps, +-1)
  DDPM:  mean = sqrt(a_t') b_t / (1 - a_t) x0_hat + sqrt(alpha_t) (1 - a_t') / (1 - a_t) x_t,
         var = (1 - a_t') / (1 - a_t) b_t,  with alpha_t = a_t / a_t', b_t = 1 - alpha_t
  DDIM:  std = eta sqrt((1 - a_t') / (1 - a_t) (1 - a_t / a_t')),
         mean = sqrt(a_t') x0_hat + sqrt(1 - a_t' - std^2) eps_hat  (eps re-derived from the clipped x0_hat)
These are the formulas of diffusers' DDPMScheduler.step / DDIMScheduler.step (and DPPO's diffusion.py),
written out because RL needs the mean and std, not a sample.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import DDIMScheduler, DDPMScheduler

from embodrl.policies.diffusion.configuration import DiffusionConfig

# eps_model(x_t [N, C, A], training timestep t [N] int64) -> predicted noise [N, C, A]
EpsModel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def make_scheduler(cfg: DiffusionConfig) -> DDPMScheduler | DDIMScheduler:
    """The diffusers scheduler whose alpha-bars and timesteps define training and sampling."""
    common = dict(
        num_train_timesteps=cfg.num_train_timesteps, beta_schedule=cfg.beta_schedule, clip_sample=True
    )
    scheduler = (
        DDIMScheduler(**common, set_alpha_to_one=True) if cfg.scheduler == "ddim" else DDPMScheduler(**common)
    )
    scheduler.set_timesteps(cfg.num_inference_steps)
    return scheduler


class DenoisingMDP:
    """Means/stds of every sampling step, the sampler, and the log-prob of the last K' steps' chain."""

    def __init__(self, cfg: DiffusionConfig) -> None:
        self.cfg = cfg
        self.scheduler = make_scheduler(cfg)
        timesteps = self.scheduler.timesteps.long()  # [K] from noisy to clean
        alpha_bar = self.scheduler.alphas_cumprod.double()
        prev = timesteps - cfg.num_train_timesteps // cfg.num_inference_steps
        final = torch.tensor(1.0, dtype=torch.float64)  # alpha-bar "before" the first timestep: clean data
        self.timesteps = timesteps
        self.alpha_bar = alpha_bar[timesteps].float()  # [K]
        self.alpha_bar_prev = torch.where(prev >= 0, alpha_bar[prev.clamp(min=0)], final).float()  # [K]
        ratio = self.alpha_bar / self.alpha_bar_prev
        if cfg.scheduler == "ddpm":
            variance = (1 - self.alpha_bar_prev) / (1 - self.alpha_bar) * (1 - ratio)
        else:
            variance = cfg.ddim_eta**2 * (1 - self.alpha_bar_prev) / (1 - self.alpha_bar) * (1 - ratio)
        self.std = variance.clamp(min=0).sqrt()  # [K] the schedule's own std (0 at DDPM's last step)
        self.num_steps = len(timesteps)
        self.first_ft_step = self.num_steps - cfg.ft_denoising_steps

    def step_mean(self, x: torch.Tensor, eps: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
        """Mean of x_{i+1} given x_i [N, C, A], predicted noise [N, C, A] and step indices i [N]."""
        view = (-1,) + (1,) * (x.dim() - 1)
        a, a_prev = (
            self.alpha_bar.to(x.device)[step].view(view),
            self.alpha_bar_prev.to(x.device)[step].view(view),
        )
        x0 = ((x - (1 - a).sqrt() * eps) / a.sqrt()).clamp(-1.0, 1.0)
        if self.cfg.scheduler == "ddpm":
            alpha = a / a_prev
            return (a_prev.sqrt() * (1 - alpha) * x0 + alpha.sqrt() * (1 - a_prev) * x) / (1 - a)
        eps_hat = (x - a.sqrt() * x0) / (1 - a).sqrt()
        std = self.std.to(x.device)[step].view(view)
        return a_prev.sqrt() * x0 + (1 - a_prev - std**2).clamp(min=0).sqrt() * eps_hat

    @torch.no_grad()
    def sample(
        self, eps_model: EpsModel, shape: tuple[int, ...], device, deterministic: bool
    ) -> torch.Tensor:
        """Run all K steps from x_T ~ N(0, I) (deterministic: every step takes its mean); returns the chain
        of the last K' steps [N, K'+1, C, A]."""
        x = torch.randn(shape, device=device)
        chain = []
        for i in range(self.num_steps):
            if i >= self.first_ft_step:
                chain.append(x)
            step = torch.full(shape[:1], i, dtype=torch.long, device=device)
            mean = self.step_mean(x, eps_model(x, self.timesteps.to(device)[step]), step)
            if deterministic:
                x = mean
            else:
                floor = (
                    self.cfg.min_sampling_std if i >= self.first_ft_step else 0.0
                )  # DPPO floors fine-tuned steps
                std = self.std[i].clamp(min=floor).item()
                x = mean + std * torch.randn_like(x).clamp(-self.cfg.noise_clip, self.cfg.noise_clip)
        chain.append(x)
        return torch.stack(chain, dim=1)

    def chain_logprob(self, eps_model: EpsModel, chain: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-element log-probs [N, C, A] of the chain [N, K'+1, C, A] (clamped, then summed or averaged
        over the K' steps) and the per-step Gaussian entropy [N] (mean over steps and elements)."""
        n, k = chain.shape[0], chain.shape[1] - 1
        steps = (self.first_ft_step + torch.arange(k, device=chain.device)).repeat(n)  # [N*K'] (env-major)
        x, x_next = chain[:, :-1].flatten(0, 1), chain[:, 1:].flatten(0, 1)  # [N*K', C, A]
        mean = self.step_mean(x, eps_model(x, self.timesteps.to(chain.device)[steps]), steps)
        std = self.std.to(chain.device)[steps].clamp(min=self.cfg.min_logprob_std).view(-1, 1, 1)
        dist = torch.distributions.Normal(mean, std)
        per_step = (
            dist.log_prob(x_next)
            .clamp(self.cfg.logprob_min, self.cfg.logprob_max)
            .view(n, k, *chain.shape[2:])
        )
        logprob = per_step.sum(1) if self.cfg.chain_reduction == "sum" else per_step.mean(1)
        entropy = dist.entropy().view(n, -1).mean(-1)
        return logprob, entropy

    def sft_loss_terms(self, actions: torch.Tensor, eps_model: EpsModel) -> torch.Tensor:
        """Squared noise-prediction error [B, C, A] at uniformly drawn training timesteps (DDPM loss)."""
        t = torch.randint(0, self.cfg.num_train_timesteps, actions.shape[:1], device=actions.device)
        noise = torch.randn_like(actions)
        noisy = self.scheduler.add_noise(actions, noise, t)
        return (eps_model(noisy, t) - noise).pow(2)
