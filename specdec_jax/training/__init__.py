"""Training: optimizer, jitted steps (label and distillation losses), length-bucketed
batches, Orbax checkpoints, evaluation (validation loss, BLEU, ROUGE-L)."""
