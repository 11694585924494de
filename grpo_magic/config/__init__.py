"""``GRPOParams`` (every parameter declared once), TRL's other settings, recipes, the memory estimate."""
