"""`python -m router.loadgen` is `router bench`."""

from router.loadgen.cli import main

raise SystemExit(main())
