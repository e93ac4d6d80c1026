"""One module per subcommand: the orchestration of `nmt <command>` (locks, resume, input and output, reporting),
between the capabilities below and cli/ (CONTRIBUTING.md, "Where things live")."""
