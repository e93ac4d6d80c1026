"""One module per subcommand: the orchestration of `nmt <command>` (locks, resume, input and output, reporting).

The layer between the capabilities (search, train, parsing, export, plot, serve) and cli/, which only turns
options into a typed config and calls one function here. Layers: CONTRIBUTING.md, "Where things live".
"""
