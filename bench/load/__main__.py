"""`python -m bench.load --url ... --concurrency ... --duration ...` is `router bench`."""

from router.loadgen.cli import main

raise SystemExit(main())
