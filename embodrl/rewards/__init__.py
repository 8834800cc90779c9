"""Learned rewards: a success classifier on camera images and proprioception, from labelled episodes."""
