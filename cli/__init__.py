"""The `strata` command line: one module per subcommand, imported only when it runs."""
