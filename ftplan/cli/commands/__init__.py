"""One module per `ftplan` subcommand; each exposes `command`, a thin click wrapper."""
