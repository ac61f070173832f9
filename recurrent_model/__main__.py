"""``python -m recurrent_model``: the generation command line (see :mod:`recurrent_model.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
