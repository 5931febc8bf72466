"""`parity bisect`: the port queue of an upstream commit range (search.py, command.py)."""
