"""The ``softhca`` subcommands whose work lives in a module too heavy to load for
``softhca --help`` (the daemon, the demo, the bench) or in the client (faults).

Each module here, like each subcommand module of tools/ itself (trace, explain,
capture, crypto_test_info, pyverbs, soak), exports ``add_parser(subparsers)``, which
registers the subcommand with ``func=run``, and ``run(args) -> int``, its exit status.
``run`` imports the work when the subcommand runs, so building the parser stays fast
and a daemon never loads the bench.
"""

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
# A command ended by Ctrl-C: 128 + SIGINT, as the shell reports it.
EXIT_INTERRUPTED = 130
