"""``python -m rolloutcore.cli``."""

import sys

from rolloutcore.cli.entry import main

sys.exit(main())
