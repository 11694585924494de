"""``python -m grpo_magic train ...``: the same as the ``grpo-magic`` command."""

import sys

from .cli import main

sys.exit(main())
