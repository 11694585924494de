"""environment."""
