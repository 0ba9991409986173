"""`python -m dilstore`: the same as the `dilstore` command."""

import sys

from dilstore.runners.cli import command

sys.exit(command())
