"""`embodrl reward train`: its help, and a missing dataset or bad setting as one-line errors."""

import pytest

from embodrl.cli import main


def test_reward_train_has_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["reward", "train", "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "held_out" in out and "reward.model" in out and "%%" not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nowhere"], "dataset nowhere not found"),
        (["nowhere", "model=value"], "model='value' is not valid"),
        (["nowhere", "obs_keys=[state]"], "must name at least one camera"),
    ],
)
def test_bad_input_is_one_line(args, message, capsys):
    assert main(["reward", "train", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
