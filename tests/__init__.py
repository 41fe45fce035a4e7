"""lengthgen's tests. A package, so that pytest puts the checkout on sys.path when it loads
tests/conftest.py (as tests.conftest) and every test file imports the shared helpers as
`tests.helpers.<module>`, from whatever folder pytest is started in. The test folders
themselves (tests/<layer>/) are not packages."""
