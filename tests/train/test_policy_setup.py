"""A run's starting policy, and any loaded checkpoint: one from other tasks reads its prompts through
this env's instruction table."""

from embodrl.config import compose
from embodrl.policies.loading import load_policy
from embodrl.sims.registry import make_env
from embodrl.train.policy_setup import build_policy, read_prompts_through


def _cfg(*overrides):
    return compose(
        "openvla_oft_grpo_nano",
        ["env.num_envs=2", "env.task=null", "device=cpu", "train.tensorboard=false", *overrides],
    )


def test_a_checkpoint_from_other_tasks_reads_this_envs_instructions(tmp_path):
    base_cfg = _cfg()  # every task of the suite: a multi-task base
    base_env = make_env(base_cfg.env)
    base = build_policy(base_cfg, base_env)
    base.save_pretrained(tmp_path)
    assert len(base.cfg.instruction_table) > 8

    cfg = _cfg("env.task=pick", f"policy.init_from={tmp_path}")
    env = make_env(cfg.env)
    policy = build_policy(cfg, env)
    # obs["task_id"] indexes the pick env's own table, so the prompts must come from it
    assert policy.cfg.instruction_table == tuple(env.instruction_table)
    obs = env.reset()
    out = policy.act(obs, deterministic=True)
    assert out.actions.shape[0] == 2
    evaluated = load_policy(tmp_path)  # as `embodrl eval` and `play` load it
    read_prompts_through(evaluated, env.instruction_table)
    assert evaluated.cfg.instruction_table == tuple(env.instruction_table)
    base_env.close()
    env.close()


def test_a_fine_tuning_run_groups_a_checkpoints_logprobs_as_it_asks(tmp_path):
    """The SFT checkpoint's log-prob grouping (`token`) is not a weight: the RL run's `chunk` applies."""
    cfg = compose("pick_flow_noise", ["env.num_envs=2", "device=cpu", "policy.logprob_type=token"])
    env = make_env(cfg.env)
    build_policy(cfg, env).save_pretrained(tmp_path)

    cfg = compose(
        "pick_flow_noise",
        ["env.num_envs=2", "device=cpu", "policy.logprob_type=chunk", f"policy.init_from={tmp_path}"],
    )
    policy = build_policy(cfg, env)
    assert policy.cfg.logprob_type == "chunk"
    assert policy.act(env.reset()).logprob.shape == (2,)  # one log-prob per decision, not [2, C, A]
    env.close()


def test_a_fine_tuning_run_sets_its_own_auxiliary_weight_and_keeps_the_checkpoints_state_noise(
    tmp_path, caplog
):
    """A base pretrained with policy.sft_aux_keys is fine-tuned with its own sft_aux_weight (0 drops the
    auxiliary loss); state_noise_std is built into the encoders, so the checkpoint's value stays, named in
    the warning as image_shift would be."""
    overrides = ["env.num_envs=2", "device=cpu", "policy.sft_aux_keys=[privileged]"]
    cfg = compose("pick_flow_noise", [*overrides, "policy.state_noise_std=0.2"])
    env = make_env(cfg.env)
    build_policy(cfg, env).save_pretrained(tmp_path)
    cfg = compose(
        "pick_flow_noise",
        [*overrides, "policy.sft_aux_weight=0", "policy.state_noise_std=0.5", f"policy.init_from={tmp_path}"],
    )
    policy = build_policy(cfg, env)
    assert policy.cfg.sft_aux_weight == 0.0 and policy.cfg.state_noise_std == 0.2
    assert "state_noise_std=0.5 (checkpoint: 0.2)" in caplog.text
    env.close()
