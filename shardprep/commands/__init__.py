"""One module per subcommand; each defines ``command`` (a click command)."""
