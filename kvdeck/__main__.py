"""`python -m kvdeck` is the `kvdeck` command."""

import sys

from kvdeck.app.cli import main

sys.exit(main())
