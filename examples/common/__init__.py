"""Helpers shared by the example recipes: resumable steps, downloads, verification, WMT14 prep.

The example scripts put ``examples/`` on ``sys.path`` and import ``common.recipe`` etc.; nothing
here is part of the installed ``nmt`` package.
"""
