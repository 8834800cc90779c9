"""embodrl: RL fine-tuning of robot VLA policies."""

__version__ = "0.1.0"
