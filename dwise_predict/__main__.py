"""``python -m dwise_predict`` is the same as the ``dwise-predict`` command."""

import sys

from .cli import main

sys.exit(main())
