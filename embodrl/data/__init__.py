"""Rollout storage and demonstration datasets; importing the package loads nothing heavy."""
