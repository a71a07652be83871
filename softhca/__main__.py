"""``python -m softhca``: the ``softhca`` command (softhca.tools.cli)."""

import sys

from softhca.tools.cli import main

sys.exit(main())
