"""The project's exception for mistakes a user can fix. Imports nothing, so any module
(text I/O, scoring, the CLIs) can raise it without loading JAX."""


class ConfigError(ValueError):
  """A config value, path or input that cannot be used; the message is one line that names
  the key (or file, line) and what to do. The command-line tools print it without a
  traceback and exit with status 2."""
