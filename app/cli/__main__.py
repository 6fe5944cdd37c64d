"""`python -m kvdeck.app.cli` is the `kvdeck` command (the tests and benchmarks start servers so)."""

import sys

from kvdeck.app.cli import main

sys.exit(main())
