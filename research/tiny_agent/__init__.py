"""How the offline ``tiny-agent`` is built: its hand-set circuit, its corpus and its recipe (not in the wheel)."""
