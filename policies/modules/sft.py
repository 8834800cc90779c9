"""Input checks and masking shared by the families' behaviour-cloning losses."""

import torch
from tensordict import TensorDict

from embodrl.errors import UserError


def check_action_batch(batch: TensorDict, chunk_shape: tuple[int, int]) -> torch.Tensor:
    """The batch's `action` [B, C, A] as float, after checking it exists and has the policy's shape."""
    if "action" not in batch.keys():
        raise UserError(
            f"an SFT batch needs an 'action' entry [B, C, A]; present keys: {sorted(batch.keys())}"
        )
    action = batch["action"]
    if tuple(action.shape[1:]) != chunk_shape:
        raise UserError(
            f"SFT batch actions have shape [B, {', '.join(map(str, action.shape[1:]))}]; the policy expects "
            f"[B, C={chunk_shape[0]}, A={chunk_shape[1]}] (policy.chunk_size / policy.action_dim)"
        )
    return action.float()


def masked_mean(per_element: torch.Tensor, is_pad: torch.Tensor | None) -> torch.Tensor:
    """Mean of [B, C, A] over the elements whose chunk step is not padding (`is_pad` [B, C] bool)."""
    if is_pad is None:
        return per_element.mean()
    weights = (~is_pad).to(per_element.dtype).unsqueeze(-1).expand_as(per_element)
    return (per_element * weights).sum() / weights.sum().clamp_min(1.0)


def zero_padded_steps(action: torch.Tensor, is_pad: torch.Tensor | None) -> torch.Tensor:
    """Zero the padded chunk steps of normalized actions [B, C, A], so models that read the whole chunk
    (flow x_t, diffusion x_k) see nothing of whatever the dataset put there."""
    return action if is_pad is None else action.masked_fill(is_pad.unsqueeze(-1), 0.0)
