"""Search the setup space with the fitted models and answer: what to run, how fast, at what cost."""
