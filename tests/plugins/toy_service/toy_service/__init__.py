"""A bus service from a separately installed package: a test fixture.

It is discovered only through the `specops.services` entry point of its dist-info
(put this directory on PYTHONPATH); no specops file names it.
"""
