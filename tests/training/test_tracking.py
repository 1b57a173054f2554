"""Weights & Biases beside TensorBoard (`config.wandb`, transformer/training/tracking.py), in
W&B's offline mode: what it wrote is read back from its run files, a transaction log whose
records are W&B's protocol buffers (`wandb.proto.wandb_internal_pb2.Record`) framed as
LevelDB's log is (32 KiB blocks, a 7-byte header per fragment), after a 7-byte file header
(":W&B", a magic number, a version)."""

import json
import pathlib
import struct

import pytest

from tests.export import packages
from transformer.training import tracking
from transformer.training import train_lib

_BLOCK = 32768
_FULL, _LAST = 1, 4  # LevelDB's fragment types that end a record


def _records(path: pathlib.Path) -> list:
  from wandb.proto import wandb_internal_pb2

  data = path.read_bytes()
  assert data[:4] == b":W&B", data[:7]
  pos, pending, records = 7, b"", []
  while pos + 7 <= len(data):
    length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
    if _BLOCK - pos % _BLOCK < 7 or kind == 0:  # a block's zero-filled tail
      pos += _BLOCK - pos % _BLOCK
      continue
    pending += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (_FULL, _LAST):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      records.append(record)
      pending = b""
  return records


def _runs(workdir: pathlib.Path) -> list[dict]:
  """Each W&B run file of `workdir`, in the order written: its run record and history rows."""
  runs = []
  for path in sorted((workdir / "wandb").glob("offline-run-*/run-*.wandb")):
    run, rows = None, []
    for record in _records(path):
      kind = record.WhichOneof("record_type")
      if kind == "run":
        run = record.run
      elif kind == "history":
        items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                 for item in record.history.item}
        rows.append({k: v for k, v in items.items() if not k.startswith("_")})  # W&B's own
    runs.append({"run": run, "rows": rows})
  return runs


def test_a_resumed_run_logs_every_scalar_to_the_same_wandb_run(copy_of_trained, tmp_path,
                                                                 monkeypatch):
  packages.require("wandb", extra="wandb")
  for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"),
                      ("WANDB_CONFIG_DIR", tmp_path / "wandb-config"),
                      ("WANDB_CACHE_DIR", tmp_path / "wandb-cache"),
                      ("WANDB_DATA_DIR", tmp_path / "wandb-data")):
    monkeypatch.setenv(name, str(value))
  config, source = copy_of_trained
  config.data.cache_dir = str(source / "data")  # its vocabulary and tokenized splits
  config.wandb.update(project="tests", group="rows")
  config.num_train_steps = config.checkpoint_every_steps = 4
  config.log_every_steps, config.eval_every_steps, config.bleu_every_steps = 1, 4, 0
  workdir = tmp_path / "run"
  train_lib.train_and_evaluate(config, str(workdir))
  config.num_train_steps = 6
  train_lib.train_and_evaluate(config, str(workdir), allow_config_changes=True)

  first, resumed = _runs(workdir)
  run_id = (workdir / tracking.RUN_ID_FILE).read_text().strip()
  for run in (first, resumed):
    assert run["run"].run_id == run_id and run["run"].run_group == "rows"
    assert run["run"].display_name == f"{tmp_path.name}/run"
  # Every line of metrics.jsonl, and nothing else, under its step.
  logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  expected = [{k: v for k, v in line.items() if k != "time"} for line in logged]
  assert first["rows"] + resumed["rows"] == expected
  assert {row["step"] for row in resumed["rows"]} == {5, 6}  # the resume logs its own steps
  assert {"train/loss", "dev/loss"} <= set().union(*first["rows"])


def test_no_project_is_no_tracker(copy_of_trained):
  config, _ = copy_of_trained
  assert config.wandb.project == "" and tracking.create(config, "unused") is None
