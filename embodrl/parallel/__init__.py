"""Training parallelism: torchrun's process group, DDP/FSDP actors, the gather of a sharded actor's whole
state, and the offload of what one phase of an iteration leaves idle."""
