"""`python -m ftplan.planner` runs the ftplan CLI (for machines where the console script is not installed)."""

from ftplan.planner.cli import main

main()
