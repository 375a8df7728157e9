"""``python -m viz DIR -o OUT/``: see ``viz/cli.py``."""

import sys

from viz.cli import main

sys.exit(main())
