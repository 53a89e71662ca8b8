"""`python -m tuneup` is the `tuneup` command (DDP's launcher re-runs the demo this way too)."""

import sys

from tuneup.cli import main

sys.exit(main())
