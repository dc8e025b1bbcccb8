"""``python -m drover.orchestrator.cli``: the ``drover`` command without its script."""

import sys

from drover.orchestrator.cli.commands import main

sys.exit(main())
