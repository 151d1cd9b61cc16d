"""`python -m ftplan` runs the ftplan CLI (for machines where the console script is not installed)."""

from ftplan.cli.main import main

main()
