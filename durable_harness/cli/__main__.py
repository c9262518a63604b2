"""``python -m durable_harness.cli``: the command, as the installed script runs it."""

import sys

from durable_harness.cli import main

sys.exit(main())
