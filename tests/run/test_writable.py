"""The one writability check behind the workdir, the compilation cache, evaluate.py's
--output and the benchmarks' profile folder."""

from transformer.run import writable


def test_a_folder_is_created_and_proven_leaving_nothing_behind(tmp_path):
  folder = tmp_path / "a" / "b"
  assert writable.cannot_write(str(folder)) is None
  assert folder.is_dir() and not list(folder.iterdir())


def test_a_folder_that_cannot_be_made_says_why(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("")
  assert writable.cannot_write(str(blocker / "run")) == "Not a directory"


def test_a_file_needs_its_folder_and_is_left_as_it_was(tmp_path):
  assert writable.cannot_write(str(tmp_path / "missing" / "out.txt"), folder=False) == (
      "No such file or directory")
  assert not (tmp_path / "missing").exists()
  assert writable.cannot_write(str(tmp_path / "new.txt"), folder=False) is None
  assert not (tmp_path / "new.txt").exists() and not list(tmp_path.iterdir())
  existing = tmp_path / "old.txt"
  existing.write_text("kept\n")
  assert writable.cannot_write(str(existing), folder=False) is None
  assert existing.read_text() == "kept\n"
  assert writable.cannot_write(str(tmp_path), folder=False) == "Is a directory"


def test_a_file_that_cannot_be_opened_says_why(tmp_path, monkeypatch):
  """The system's reason comes back as it is (a read-only file: 'Permission denied'), and the
  file is not touched. Simulated, as root would open a read-only file anyway."""
  existing = tmp_path / "old.txt"
  existing.write_text("kept\n")

  def refuse(path, mode="r", *args, **kwargs):
    raise PermissionError(13, "Permission denied", path)

  monkeypatch.setattr(writable, "open", refuse, raising=False)
  assert writable.cannot_write(str(existing), folder=False) == "Permission denied"
  monkeypatch.undo()
  assert existing.read_text() == "kept\n"
