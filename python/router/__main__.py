"""`python -m router` is the `router` command."""

from router.cli import main

raise SystemExit(main())
