"""``python -m trainvigil.daemon.cli``: the ``vigil`` command."""

import sys

from .main import main

sys.exit(main())
