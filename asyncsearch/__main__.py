"""``python -m asyncsearch``: the ``asyncsearch`` command."""

from __future__ import annotations

import sys

from asyncsearch._cli import main

if __name__ == "__main__":
    sys.exit(main())
