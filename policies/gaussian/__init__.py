"""Gaussian MLP/CNN actor-critic: the state and small-image baseline and the PPO reference."""
