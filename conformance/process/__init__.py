"""Engine processes and the pins' environments: what starts an engine, the protocol
client, the reaper, the environments and their fidelity check, runs under coverage.py, the
self-check, the mutant server, progress on stderr.
"""
