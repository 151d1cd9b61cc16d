"""`python -m planner` runs the ftplan CLI (for machines where the console script is not installed)."""

from planner.cli import main

main()
