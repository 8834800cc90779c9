"""The suite registry: which suites are made of named tasks, and what those tasks are."""

from embodrl.sims.registry import suite_tasks


def test_a_multi_task_suite_names_its_tasks_and_a_single_env_suite_none():
    tasks = suite_tasks("tabletop-lang")
    assert tasks and all(isinstance(task, str) for task in tasks)
    assert suite_tasks("tabletop-basic") == tasks
    assert suite_tasks("gym") is None
    assert suite_tasks("maniskill") is None
