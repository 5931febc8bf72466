"""`parity adequacy`: the suite's power, measured (coverage of the scheduling code per
pin, generated mutants caught), what counts (scope), the mutation operators, the engine path's
catalog, the report and the command.
"""
