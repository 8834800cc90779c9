"""SFT per policy family: training throughput of every family's state and image forms, and success after SFT.

Throughput (always): each family/form is built by `SFTRunner` from the same experiment config that
`embodrl sft` composes (base `pick_flow_noise` with 7-D `ee_delta` actions, `env.obs_mode=rgb` with 64 px
images for the image forms), on a small scripted-expert dataset, then timed over a fixed number of
optimizer steps (`SFTRunner.train_step`: data loading, loss, backward, clipping, AdamW) after warm-up
steps, with one torch thread. Batch 256 for the MLP forms, 32 for the transformer/CNN forms.

Success (with --demos): per task and form, `--demos` scripted demos are collected once (from initial
states 50,000+), then `SFTRunner(...).learn()` trains on the first k episodes for each k and evaluates
deterministically on initial states 0..eval_episodes-1, exactly as `embodrl sft ... sft.max_episodes=k`.

    python benchmarks/sft_families.py                       # throughput only, ~3 minutes
    python benchmarks/sft_families.py --forms state --demos 10 50 200 --data-dir data/sft_families \\
        --run-root runs/sft_families                        # success of the state forms on pick
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from embodrl.config import ExperimentConfig, compose
from embodrl.train.collect import CollectConfig, collect_demos
from embodrl.train.sft_runner import SFTRunner

BASE_EXPERIMENT = "pick_flow_noise"  # sparse-reward tabletop-basic task, 80-step episodes, eval on ids 0+
BASE_OVERRIDES = ("env.control_mode=ee_delta", "policy.action_dim=7", "train.tensorboard=false")
RGB_OVERRIDES = ("env.obs_mode=rgb", "env.image_size=64")
FORMS = ("state", "image")


@dataclass(frozen=True)
class FamilyForm:
    """One family in one observation form: the policy overrides and the SFT batch size it is timed at."""

    family: str
    form: str  # "state": proprio + object poses; "image": 64 px camera (+ state, instruction)
    description: str
    overrides: tuple[str, ...]
    batch_size: int

    @property
    def rgb(self) -> bool:
        return self.form == "image"


FAMILY_FORMS = (
    FamilyForm("gaussian", "state", "Gaussian MLP 2x256, C=1", ("policy=gaussian_state",), 256),
    FamilyForm(
        "gaussian",
        "image",
        "Gaussian on a small CNN (no VLA form), C=1",
        ("policy=gaussian_state", "policy.obs_keys=[rgb,state]", "policy.value_obs_keys=[]"),
        32,
    ),
    FamilyForm("flow", "state", "velocity MLP 3x256, C=4, K=4", ("policy=flow_state",), 256),
    FamilyForm("flow", "image", "pi0-style nano VLA, action expert, C=4", ("policy=flow_vla_nano",), 32),
    FamilyForm(
        "autoregressive",
        "state",
        "OFT nano transformer, no camera (state + prompt), C=8",
        ("policy=openvla_oft_nano", "policy.obs_keys=[state]"),
        32,
    ),
    FamilyForm("autoregressive", "image", "OFT nano VLA, C=8, 256 bins", ("policy=openvla_oft_nano",), 32),
    FamilyForm(
        "diffusion",
        "state",
        "epsilon MLP 3x256, C=4, DDPM 20 steps",
        ("policy=flow_state", "policy.family=diffusion", "policy.action_normalization=quantile"),
        256,
    ),
    FamilyForm(
        "diffusion",
        "image",
        "nano VLA prefix -> epsilon MLP, C=4, DDPM 20 steps",
        (
            "policy=flow_vla_nano",
            "policy.family=diffusion",
            "policy.diffusion.conditioning=vla",
            "policy.action_normalization=quantile",
        ),
        32,
    ),
)


def experiment_config(spec: FamilyForm, task: str, extra: tuple[str, ...] = ()) -> ExperimentConfig:
    """The config `embodrl sft BASE_EXPERIMENT <overrides>` would compose for this family/form and task."""
    overrides = (*BASE_OVERRIDES, f"env.task={task}", *spec.overrides, f"sft.batch_size={spec.batch_size}")
    return compose(BASE_EXPERIMENT, [*overrides, *(RGB_OVERRIDES if spec.rgb else ()), *extra])


def demo_dataset(data_dir: Path, spec: FamilyForm, task: str, episodes: int) -> Path:
    """A folder of `episodes` scripted demos for the task in the form's observation mode (collected once)."""
    root = data_dir / f"{task}_{'rgb' if spec.rgb else 'state'}{episodes}"
    if not (root / "meta" / "info.json").is_file():
        cfg = experiment_config(spec, task)
        print(f"collecting {episodes} demos of {task} ({spec.form}) into {root}", flush=True)
        stats = collect_demos(cfg.env, root, CollectConfig(episodes_per_task=episodes, seed=cfg.seed))
        print(stats.summary())
    return root


def measure_throughput(spec: FamilyForm, dataset: Path, warmup: int, steps: int, run_dir: Path) -> float:
    """Training samples per second of `SFTRunner.train_step` over `steps` steps after `warmup` steps."""
    cfg = experiment_config(spec, "pick", (f"sft.dataset={dataset}",))
    runner = SFTRunner(cfg, run_dir)
    runner.policy.train()
    batches = runner.batches()
    for _ in range(warmup):
        runner.train_step(next(batches))
    samples, started = 0, time.perf_counter()
    for _ in range(steps):
        batch = next(batches)
        runner.train_step(batch)
        samples += batch.batch_size[0]
    return samples / (time.perf_counter() - started)


def sft_success(spec: FamilyForm, dataset: Path, task: str, demos: int, args, run_dir: Path) -> dict:
    """`embodrl sft` on the first `demos` episodes; the final evaluation's summary."""
    steps = args.state_steps if spec.batch_size >= 256 else args.image_steps
    extra = (
        f"sft.dataset={dataset}",
        f"sft.max_episodes={demos}",
        f"sft.steps={steps}",
        f"sft.eval_episodes={args.eval_episodes}",
        "sft.eval_every=0",
        *args.override,
    )
    cfg = experiment_config(spec, task, extra)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    summary = SFTRunner(cfg, run_dir).learn()
    return {"steps": steps, "seconds": time.perf_counter() - started, **summary}


def selected(args) -> list[FamilyForm]:
    return [s for s in FAMILY_FORMS if s.family in args.families and s.form in args.forms]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--families", nargs="+", default=[s.family for s in FAMILY_FORMS[::2]])
    parser.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before timing")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per family/form")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--demos", type=int, nargs="*", default=[], help="demo counts for success runs")
    parser.add_argument("--tasks", nargs="+", default=["pick"])
    parser.add_argument("--state-steps", type=int, default=3000, help="SFT steps of the batch-256 forms")
    parser.add_argument("--image-steps", type=int, default=500, help="SFT steps of the batch-32 forms")
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--data-dir", default=None, help="demo datasets (reused); default: a temp folder")
    parser.add_argument("--run-root", default=None, help="SFT run folders; default: a temp folder")
    parser.add_argument("--override", nargs="*", default=[], help="extra key=value for the success runs")
    parser.add_argument("--tag", default="", help="suffix of the success runs' folders and rows")
    parser.add_argument("--out", default=None, help="append one JSON line per result to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    scratch = tempfile.TemporaryDirectory()
    data_dir = Path(args.data_dir or Path(scratch.name) / "data")
    run_root = Path(args.run_root or Path(scratch.name) / "runs")
    specs = selected(args)

    def record(row: dict) -> None:
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")

    if not args.skip_throughput:
        rows = []
        for spec in specs:
            dataset = demo_dataset(data_dir, spec, "pick", 10)
            rate = measure_throughput(spec, dataset, args.warmup, args.steps, run_root / "throughput")
            rows.append((spec, rate))
            record({"kind": "throughput", "family": spec.family, "form": spec.form, "samples_per_s": rate})
        print(f"\nSFT throughput, 1 torch thread, {args.steps} steps after {args.warmup} warm-up steps")
        print("| family | form | policy | batch | samples/s | ms/step |\n|---|---|---|---|---|---|")
        for spec, rate in rows:
            ms = 1000 * spec.batch_size / rate
            cells = (spec.family, spec.form, spec.description, spec.batch_size, f"{rate:.0f}", f"{ms:.0f}")
            print("| " + " | ".join(map(str, cells)) + " |")

    if args.demos:
        rows = []
        for task in args.tasks:
            for spec in specs:
                dataset = demo_dataset(data_dir, spec, task, max(args.demos))
                for demos in args.demos:
                    run_dir = run_root / f"{task}_{spec.family}_{spec.form}_{demos}{args.tag}"
                    result = sft_success(spec, dataset, task, demos, args, run_dir)
                    row = {"kind": "success", "task": task, "family": spec.family, "form": spec.form}
                    row.update(demos=demos, tag=args.tag, overrides=args.override, **result)
                    rows.append(row)
                    record(row)
                    lo, hi = result["success_ci95"]
                    print(
                        f"{task} {spec.family}/{spec.form}{args.tag} {demos} demos: "
                        f"{result['success_rate']:.0%} ({lo:.0%}-{hi:.0%}) in {result['seconds']:.0f}s",
                        flush=True,
                    )
        print(f"\nsuccess after SFT, {args.eval_episodes} deterministic evaluation episodes")
        print("| task | family | form | demos | SFT steps | success (95% CI) |\n|---|---|---|---|---|---|")
        for r in rows:
            lo, hi = r["success_ci95"]
            print(
                f"| {r['task']} | {r['family']}{r['tag']} | {r['form']} | {r['demos']} | {r['steps']} | "
                f"{r['success_rate']:.0%} ({lo:.0%}-{hi:.0%}) |"
            )


if __name__ == "__main__":
    main()
