"""``python -m mpkit`` is the same as the ``mpkit`` console script (and the torchrun entry)."""
from mpkit.cli import main

raise SystemExit(main())
