"""Grouping per-element log-probs by `logprob_type` (RLinf's token/action/chunk levels)."""

import torch


def reduce_logprob(per_element: torch.Tensor, logprob_type: str) -> torch.Tensor:
    """[N, C, A] -> token [N, C, A] | action [N, C] (sum over A) | chunk [N] (sum over C and A)."""
    if logprob_type == "token":
        return per_element
    if logprob_type == "action":
        return per_element.sum(-1)
    return per_element.sum((-2, -1))
