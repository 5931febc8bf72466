"""From a trace and a golden to a verdict: each layer's comparison, the verdict, the
golden store (the only owner of goldens/), waivers and requirement rows.
"""
