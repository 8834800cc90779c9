"""Public VLA checkpoint layouts (OpenVLA, OpenVLA-OFT, pi0) mapped onto embodrl's policy families."""
