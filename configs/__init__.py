"""YAML presets by group (env/, policy/, algo/, engine/) and whole experiments (experiment/)."""
