"""Run supervision on its own: what an error leaving a run becomes, and the lock it leaves.

The loop's side (the step clock paused while evaluating) is tested where `train_lib` calls
it (tests/training/test_train_lib.py); stop signals end to end in test_preemption.py; several
processes in test_multihost_faults.py.
"""

import errno

import pytest

from tests import support
from transformer import errors
from transformer.errors import ConfigError
from transformer.run import coordination
from transformer.training import supervision


def _config():
  config = support.in_memory_config(2)
  config.compilation_cache_dir = ""
  return config


def test_an_error_leaves_as_it_is_and_takes_the_lock_with_it(tmp_path):
  with pytest.raises(ConfigError, match="^a bad value$"):
    with supervision.Supervisor(_config(), str(tmp_path)):
      assert (tmp_path / "train.lock").is_file()
      raise ConfigError("a bad value")
  assert not (tmp_path / "train.lock").exists()


def test_a_full_disk_is_one_line_naming_where_the_next_run_starts(tmp_path):
  with pytest.raises(errors.DiskFull) as full:
    with supervision.Supervisor(_config(), str(tmp_path)):
      raise OSError(errno.ENOSPC, "No space left on device")
  assert str(full.value) == (
      f"No space left on device while writing a file of the run to {tmp_path}; no checkpoint "
      "is complete yet, so the next run starts from step 0; make room there (or point the run "
      "at another disk) and run the same command again")


class _Store:
  """JAX's coordination store, in memory: what a run of one process with a store sees."""

  def __init__(self):
    self.values = {}

  def key_value_set(self, key, value, allow_overwrite=False):
    self.values[key] = value

  def key_value_dir_get(self, prefix):
    return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]

  def key_value_try_get(self, key):
    return self.values[key]


@pytest.mark.parametrize("error, cause", [
    (RuntimeError("the data loader broke"), RuntimeError),
    (OSError(errno.ENOSPC, "No space left on device"), errors.DiskFull),
], ids=["an error", "a full disk"])
def test_a_failure_told_to_the_other_processes_leaves_as_failed_alone(tmp_path, monkeypatch,
                                                                      error, cause):
  """Once this process has told the others that it failed, its error leaves as
  `errors.FailedAlone` raised from it (what the launcher prints, and its way out past JAX's
  shutdown barrier), the lock released first."""
  store = _Store()
  monkeypatch.setattr(coordination, "client", lambda: store)
  with pytest.raises(errors.FailedAlone) as failed:
    with supervision.Supervisor(_config(), str(tmp_path)):
      raise error
  assert isinstance(failed.value.__cause__, cause)
  (told,) = [v for k, v in store.values.items() if "/failed/" in k]
  assert failed.value.line == (f"process 0 of 1 failed: {told}; every process of the run "
                               "stops; no checkpoint is complete yet, so the next run starts "
                               "from step 0")
  assert callable(failed.value.leave)
  assert not (tmp_path / "train.lock").exists()
