"""The packages the tests of an extra need (export, export-test, wandb), or one line saying which
extra installs them."""

import importlib
import os

# Set by CI (.ci/run): there, a test whose extra's package is missing fails instead of skipping.
REQUIRE_EXPORT_ENV = "TRANSFORMER_REQUIRE_EXPORT"


def require(name: str, extra: str = "export"):
  """The module `name`, imported; otherwise skips the calling test with one line naming the
  extra that installs it, or fails it when TRANSFORMER_REQUIRE_EXPORT=1."""
  import pytest

  try:
    return importlib.import_module(name)
  except ImportError:
    message = f"needs the {name} package: pip install -e '.[{extra}]'"
    if os.environ.get(REQUIRE_EXPORT_ENV, "") not in ("", "0"):
      pytest.fail(f"{message} ({REQUIRE_EXPORT_ENV} is set: a failure, not a skip)",
                  pytrace=False)
    pytest.skip(message)
