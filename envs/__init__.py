"""Example environments for grpo_magic: plain modules of the kind a user writes.

They do not import grpo_magic, so that each one shows the whole env contract on its own
(``build_dataset``, ``score_episode``, ``get_tools``; see docs/architecture.md, "The environment interface"):

- ``envs.hotel_env.HotelEnv``: a multi-turn tool-using hotel booking agent.
- ``envs.arithmetic.ArithmeticEnv``: single-turn reasoning with an ``<answer>`` tag.
- ``envs.addition.AdditionEnv``: "What is 23 + 45?", exact match; the SFT-then-GRPO lesson with ``tiny-math``.
"""
