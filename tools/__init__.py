"""softhca.tools: the programs a person runs, each a client of daemons.

The ``softhca`` command line (``cli.py``), the man page demo and its fault walk-through,
bench, trace, explain, the HTML report and the client half of capture. They reach a
daemon only through :mod:`softhca.client`, like any application.
"""
