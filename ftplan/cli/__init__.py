"""The command line: click commands, their options, the rich tables and the plots, over the planner library."""
