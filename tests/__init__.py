"""A package, so that pytest loads tests/conftest.py as `tests.conftest`, the module the tests
import from: as a plain `conftest` it would run a second time when they do, and that copy made
a second compilation-cache folder that no one removed."""
