"""``python -m tests.chaos --cycles N`` (``make chaos``): the crash suite as a soak."""

from tests.chaos.chaos import main

raise SystemExit(main())
