"""RL algorithms as math on tensors: advantage estimators (GAE, GRPO) and the clipped PPO loss.

config.py (AlgoConfig, torch-free), registry.py (estimators and losses by name), advantage.py
(AdvantageOut, compute_advantages), gae.py, grpo.py, ppo_loss.py, ppo.py (the update loop).
Imports neither sims nor policies; this file imports nothing, so the experiment config can load
AlgoConfig without torch.
"""
