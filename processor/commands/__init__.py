"""The shipped commands of `python -m processor <command>` (and the `dpcount` script).

main.py is the one dispatcher (the command table, `--help` and `--version`, one error
policy); each command is a module with its entry `main_<command>(argv) -> exit code`:
count.py (with offline.py, the tick file reader and runner), keygen.py, plan.py and
audit.py here, worker, replay, view and demo in the layer they run (processor/stream,
processor/view, processor/devtools). No shipped command imports processor/experiments,
the research code behind `experiment` (tests/test_structure.py checks it).
"""
