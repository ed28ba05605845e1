"""``python -m tflgpu``: the ``tflgpu`` command (where the environment's scripts directory is not on PATH)."""

import sys

from .cli import main

sys.exit(main())
