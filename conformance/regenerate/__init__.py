"""`parity goldens` (which `make goldens` calls): the golden front door, from the pinned oracles'
own runs or a gate's results folder (lifecycle), and its command.
"""
