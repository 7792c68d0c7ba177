"""The benchmark harness: method registry, runner and selection rule, reports, measurements and subjects.

The library core (everything in :mod:`hf_unlearn` outside this package) never imports from here; a test checks
the import graph.
"""
