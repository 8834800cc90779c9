import json

from safetensors.torch import load_file

from embodrl.config import compose, make_run_dir
from embodrl.policies.checkpoint import WEIGHTS_FILE
from embodrl.policies.lora_config import LoRAConfig
from embodrl.train.collect import CollectConfig, collect_demos
from embodrl.train.sft_then_rl import SFT_DIR, sft_stage, train


def test_sft_then_rl_in_one_run_folder(tmp_path):
    data = tmp_path / "demos"
    cfg = compose(
        None,
        [
            "policy=flow_state",
            "algo=flow_noise_ppo",
            "env.task=reach",
            "env.num_envs=4",
            "env.max_episode_steps=40",
            f"sft.dataset={data}",
            "sft.steps=10",
            "sft.batch_size=32",
            "sft.eval_every=0",
            "sft.eval_episodes=4",
            "train.iterations=2",
            "train.eval_every=0",
            "train.eval_episodes=4",
            "train.tensorboard=false",
            "algo.minibatch_size=32",
            "policy.lora.action_head=frozen",  # for RL: the SFT stage trains everything
            f"run_root={tmp_path}",
        ],
    )
    collect_demos(cfg.env, data, CollectConfig(episodes_per_task=2), progress=False)
    run_dir = make_run_dir(cfg)
    summary = train(cfg, run_dir)
    assert 0.0 <= summary["sft/success"] <= 1.0 and 0.0 <= summary["eval/success"] <= 1.0
    assert json.loads((run_dir / SFT_DIR / "final_eval.json").read_text())["episodes"] == 4
    # RL started from the SFT checkpoint: its normalization stats (from the demos) came along.
    rl_policy = json.loads((run_dir / "checkpoints/last/policy/config.json").read_text())
    assert rl_policy["family"] == "flow"
    sft_weights = load_file(run_dir / SFT_DIR / "checkpoints/last/policy" / WEIGHTS_FILE)
    rl_weights = load_file(run_dir / "checkpoints/last/policy" / WEIGHTS_FILE)
    velocity = [k for k in sft_weights if k.startswith("velocity_net.")]
    assert velocity and all(sft_weights[k].equal(rl_weights[k]) for k in velocity)  # frozen in RL
    assert any(not sft_weights[k].equal(rl_weights[k]) for k in rl_weights if k.startswith("critic."))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2]
    # A resumed run whose SFT stage finished does not repeat it.
    before = (run_dir / SFT_DIR / "final_eval.json").stat().st_mtime_ns
    train(compose(str(run_dir / "config.yaml"), ["train.iterations=3"]), run_dir, resume=True)
    assert (run_dir / SFT_DIR / "final_eval.json").stat().st_mtime_ns == before
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["iteration"] == 3


def test_the_sft_stage_trains_every_weight_and_rl_keeps_the_finetuning_settings():
    cfg = compose(None, ["policy.lora.vision=frozen", "policy.lora.action_head=lora"])
    stage = sft_stage(cfg)
    assert stage.policy.lora == LoRAConfig() and not stage.policy.train_expert_only
    assert cfg.policy.lora.vision == "frozen" and stage.env == cfg.env and stage.sft == cfg.sft
