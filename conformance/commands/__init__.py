"""`parity`'s commands, one module each (the stages' own commands live in their packages:
fuzz/command.py, adequacy/command.py, regenerate/command.py, bump/command.py,
bisect/command.py). Each module's `register(subparsers)` adds its subparser, its arguments and
its handler; conformance/cli.py only assembles them."""
