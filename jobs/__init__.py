"""Entry points of the ``gyre`` command, one module per subcommand; each reads top to bottom."""
