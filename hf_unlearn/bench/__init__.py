"""The benchmark harness: the methods' presets, runner and selection rule, reports, measurements and subjects.

The library core (everything in :mod:`hf_unlearn` outside this package) never imports from here, except the
command line's benchmark commands and the example scripts' ``tofu-tiny`` model shortcut; a test checks the import
graph.
"""
