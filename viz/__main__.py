"""``python -m viz DIR -o OUT/``: see ``viz/report_cli.py``."""

import sys

from viz.report_cli import main

sys.exit(main())
