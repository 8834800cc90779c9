"""The rollout engine: env and inference workers, channels between them, and the schedules that drive them."""
