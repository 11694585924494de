"""The user's env: load, validate and register it; agent envs; episodes; ``score_episode`` as TRL's reward; hot swap."""
