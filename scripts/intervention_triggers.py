"""How often each simulated-intervention trigger would take over from a policy left to act alone: play
episodes with a checkpoint (deterministic unless --stochastic) in the env of its run, execute the policy's
actions only, and report per episode its success, the trips of the `deviation` and the `stall` rule at the
run's `intervention.*` settings (a trip restarts the count, as a takeover would), the mean |policy - expert|
of each action element, and the task progress at each stall trip.

    python scripts/intervention_triggers.py runs/pick_image_sac/RUN/checkpoints/best/policy --episodes 20
    python scripts/intervention_triggers.py CKPT intervention.patience=6 intervention.min_progress=0.01
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from embodrl.config import compose, run_config_file
from embodrl.policies.loading import load_policy
from embodrl.sims.interventions import ScriptedIntervener
from embodrl.sims.registry import make_env
from embodrl.train.evaluation import in_eval_mode


class Decision:
    """One decision's expert action and task progress, read from the env once: reading the expert advances
    its stages, so both rules must see the same read."""

    def __init__(self, env) -> None:
        self.expert, self.progress = env.expert_actions(), env.task_progress()

    def expert_actions(self) -> torch.Tensor:
        return self.expert

    def task_progress(self) -> torch.Tensor:
        return self.progress


def one_step_rule(cfg, trigger: str) -> ScriptedIntervener:
    """The run's rule with `trigger`, whose takeovers last one decision: each trip is counted, then the
    count starts again."""
    rule = dataclasses.replace(cfg.intervention, mode="expert", trigger=trigger, steps=1)
    return ScriptedIntervener(rule, 1, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("checkpoint", help="policy folder inside a run folder (the run's env is used)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. intervention.patience=6")
    parser.add_argument("--episodes", type=int, default=20, help="episodes to play (default 20)")
    parser.add_argument("--first-state", type=int, default=0, help="initial state of the first episode")
    parser.add_argument("--stochastic", action="store_true", help="sample actions instead of the mode")
    args = parser.parse_intermixed_args(argv)
    saved = run_config_file(args.checkpoint)
    cfg = compose(str(saved) if saved else None, [*args.overrides, "env.num_envs=1"])
    policy = load_policy(args.checkpoint, device=cfg.device)
    env = make_env(cfg.env, device=cfg.device)
    torch.manual_seed(cfg.seed)
    trips = {"deviation": [], "stall": []}
    wins = []
    with in_eval_mode(policy):
        for episode in range(args.episodes):
            obs = env.reset_to(torch.tensor([args.first_state + episode]))
            rules = {trigger: one_step_rule(cfg, trigger) for trigger in trips}
            gaps, stall_levels, won = [], [], False
            while True:
                with torch.no_grad():
                    actions = policy.act(obs, deterministic=not args.stochastic).actions
                decision = Decision(env)
                gaps.append((actions.flatten() - decision.expert.flatten().to(actions)).abs())
                for trigger, rule in rules.items():
                    if rule.choose(actions, decision)[1].item() and trigger == "stall":
                        stall_levels.append(round(float(decision.progress[0]), 2))
                result = env.step(actions)
                obs, won = result.obs, won or bool(result.success[0])
                if bool(result.done[0]):
                    break
            wins.append(won)
            for trigger, rule in rules.items():
                trips[trigger].append(rule.takeovers)
            gap = " ".join(f"{g:.2f}" for g in torch.stack(gaps).mean(0).tolist())
            print(
                f"state {args.first_state + episode}: {'success' if won else 'failure'} after {len(gaps)} "
                f"decisions; trips: deviation {trips['deviation'][-1]}, stall {trips['stall'][-1]} "
                f"(progress {stall_levels}); mean |policy - expert| per element: {gap}"
            )
    for outcome, label in ((True, "successes"), (False, "failures")):
        picked = [i for i, w in enumerate(wins) if w == outcome]
        if picked:
            per = {t: sum(trips[t][i] for i in picked) / len(picked) for t in trips}
            print(
                f"{label} ({len(picked)}): trips per episode, "
                + ", ".join(f"{t} {n:.1f}" for t, n in per.items())
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
