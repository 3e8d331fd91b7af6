"""The browser tests: a package, so that conftest.py's package-scoped stack and Chromium stop
after its last test instead of at the end of the whole session."""
