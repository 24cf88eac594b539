"""``python -m source_backfill.cli``: the ``source-backfill`` command."""

from source_backfill.cli import main

raise SystemExit(main())
