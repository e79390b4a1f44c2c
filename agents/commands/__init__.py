"""The `morca` subcommands of the agents package (registered in pyproject.toml's `morca_gym.commands`)."""
