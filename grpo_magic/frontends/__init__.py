"""What a person touches: the magics, the `%grpo_train` form, the CLI, terminal progress, `%grpo_export`, the Colab install.

The views read the event stream and the run's public face; they never import the trainer or TRL (docs/architecture.md, "Layers")."""
