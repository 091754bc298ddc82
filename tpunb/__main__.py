"""``python -m tpunb doctor``."""

import sys

from tpunb.cli import main

sys.exit(main())
