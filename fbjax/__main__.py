"""``python -m fbjax`` is the ``fbjax`` command."""

import sys

from .cli import main

sys.exit(main())
