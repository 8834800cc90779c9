"""Diffusion Policy with the DPPO likelihood: the last denoising steps as a Gaussian MDP."""
