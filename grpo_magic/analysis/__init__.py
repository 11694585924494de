"""What answers "did it help, and why": an env checked before training, held-out evaluation, a run log scored again."""
