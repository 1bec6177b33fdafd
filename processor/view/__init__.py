"""The live view (`python -m processor view`): a small web page plotting each counter's
private count over time with its error band, updated live.

It reads the two public topics only (private counts and the privacy ledger): `feed` tails
them, `server` serves the page (`static/`) and the JSON it polls, `overlay` reads the
demo's local-only file (its own true counts and dead-letter counts) in demo mode.
"""
