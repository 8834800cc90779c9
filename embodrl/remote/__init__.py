"""Off-policy RL over the network (SERL-style): a learner process trains from the transitions that actors
stream to it and serves them versioned weights (docs/remote.md).

`client` and `protocol` need only numpy, msgpack and websockets (what a robot PC runs); `actor` adds a
simulator and a policy; `learner` is the training side.
"""
