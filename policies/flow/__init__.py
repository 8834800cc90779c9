"""Flow-matching policy (pi0-style action expert) with Flow-Noise and Flow-SDE likelihood heads."""
