"""OpenVLA-style policies: actions as 256 bins per dimension, decoded token by token or a chunk at once."""
