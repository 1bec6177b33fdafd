"""Section 8 of the paper, reproduced fast on the vectorised simulator of the counters
(processor/simulator): the distinguishing attack (attack.py), the sweeps, figures and Table 1
(figures.py) and the command line (cli.py, `main_experiment(argv)`)."""

from processor.experiments.cli import main_experiment

__all__ = ["main_experiment"]
