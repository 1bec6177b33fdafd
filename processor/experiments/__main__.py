"""`python -m processor.experiments ...` (same as `python -m processor experiment ...`)."""

import sys

from processor.experiments.cli import main_experiment

raise SystemExit(main_experiment(sys.argv[1:]))
