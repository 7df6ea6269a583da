"""Training: distillation losses, offline drafter training, the length head, the training worker."""
