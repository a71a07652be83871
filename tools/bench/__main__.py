"""``python -m softhca.tools.bench ROLE ...``: the helper processes of the ceilings."""

import sys

from .ceilings import helper_main

sys.exit(helper_main(sys.argv[1:]))
