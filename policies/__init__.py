"""Policy families behind one contract (`act`, `evaluate`, `sft_loss`, save/load)."""
