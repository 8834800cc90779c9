"""Runner loops (RL, SFT), episodes and videos, checkpoints, logging, evaluation."""
