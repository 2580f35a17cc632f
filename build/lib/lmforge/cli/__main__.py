"""``python -m lmforge.cli ...`` (what torchrun runs): the same as the ``lmforge`` command."""

from lmforge.cli.main import main

raise SystemExit(main())
