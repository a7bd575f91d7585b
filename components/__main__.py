"""``python -m components STEP [options]``: the same as ``paddle-mlops STEP``."""

import sys

from components.kernel.cli import main

sys.exit(main())
