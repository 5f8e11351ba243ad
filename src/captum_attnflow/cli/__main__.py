"""``python -m captum_attnflow.cli``: the ``captum-attnflow`` command."""

import sys

from captum_attnflow.cli import main

if __name__ == "__main__":
    sys.exit(main())
