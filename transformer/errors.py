"""The project's exception for mistakes a user can fix. Imports nothing, so any module
(text I/O, scoring, the CLIs) can raise it without loading JAX."""


class ConfigError(ValueError):
  """A config value, path or input that cannot be used; the message is one line that names
  the key (or file, line) and what to do. The command-line tools print it without a
  traceback and exit with status 2."""


class Stopped(Exception):
  """Training stopped on a signal after saving a checkpoint; the message says which step was
  saved. `exit_code` is what the command exits with: 0 for SIGTERM (a scheduler's preemption
  notice: the job did what it should), 130 for SIGINT (Ctrl-C, as shells report it)."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


class Diverged(Exception):
  """The training loss or gradients became NaN or infinite; the message names the step and
  the last checkpoint, which is always finite."""
