"""`parity fuzz`: differential fuzzing of a candidate against the live oracle (search),
the scenarios it draws (strategies), and its command.
"""
