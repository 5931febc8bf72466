"""The gate's view of its verdicts, computed once, and every report rendered from it;
what the goldens say across pins; the docs' generated tables.
"""
