"""``python -m grpo_magic train ...``: the same as the ``grpo-magic`` command."""

import sys

from .frontends.cli import main

sys.exit(main())
