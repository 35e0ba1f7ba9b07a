"""`python -m autoresearch` is the `autoresearch` command."""

import sys

from autoresearch.cli import main

sys.exit(main())
