"""The rollout engine: env and rollout workers, channels between them, and the schedules that drive them."""
