"""A speculative-decoding family from a separately installed package: a test fixture.

It is discovered only through the `specops.families` entry point of its dist-info
(put this directory on PYTHONPATH); no specops file names it.
"""
