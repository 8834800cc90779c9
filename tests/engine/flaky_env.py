"""Gym suites whose `step` raises once or hangs once, at a chosen global step, to test env worker faults."""

import time

from embodrl.sims.gym_adapter import GymVecEnv, make_gym


class FlakyVecEnv(GymVecEnv):
    fail_at = 12  # the n-th step of any instance raises; set to -1 once it has (the restart must not)
    steps = 0

    def step(self, actions):
        FlakyVecEnv.steps += 1
        if FlakyVecEnv.steps == FlakyVecEnv.fail_at:
            FlakyVecEnv.fail_at = -1
            raise RuntimeError("simulated physics blow-up")
        return super().step(actions)


def make_flaky(cfg, device="cpu"):
    env = make_gym(cfg, device=device)
    env.__class__ = FlakyVecEnv
    return env


class StallingVecEnv(GymVecEnv):
    stall_at = 2  # the n-th step of any instance hangs for `seconds`
    seconds = 5.0
    steps = 0

    def step(self, actions):
        StallingVecEnv.steps += 1
        if StallingVecEnv.steps == StallingVecEnv.stall_at:
            time.sleep(StallingVecEnv.seconds)
        return super().step(actions)


def make_stalling(cfg, device="cpu"):
    env = make_gym(cfg, device=device)
    env.__class__ = StallingVecEnv
    return env
