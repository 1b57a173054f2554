"""Lines of a stream (standard input) in batches as they come, for translation in a pipe or
at a terminal: a batch ends when it is full, when the stream ends, or once no line has come
for a short wait after its first one. A reader thread reads ahead while a batch is decoded.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import BinaryIO, Iterator

from transformer.data import textio

# How long a batch waits for more lines after its first: short enough to answer a person
# typing, long enough that lines piped in a burst share a batch.
WAIT_S = 0.05
_END = object()


def batches(stream: BinaryIO, batch_size: int, wait_s: float = WAIT_S,
            name: str = "<stdin>") -> Iterator[list[str]]:
  """The lines of `stream` (UTF-8, without their line ends) in batches of at most
  `batch_size`, each yielded as soon as it ends (see the module docstring).

  Raises:
    ConfigError: naming the line, at a line that is not valid UTF-8.
  """
  lines: queue.Queue = queue.Queue()
  threading.Thread(target=_read, args=(stream, lines), daemon=True,
                   name="stream-reader").start()
  number = 0
  while True:
    batch, ended = [], False
    item = lines.get()  # the first line of a batch: as long as it takes
    deadline = time.monotonic() + wait_s
    while item is not _END:
      number += 1
      batch.append(_decoded(item, name, number))
      if len(batch) == batch_size:
        break
      try:
        item = lines.get(timeout=max(deadline - time.monotonic(), 0))
      except queue.Empty:
        break
    else:
      ended = True
    if batch:
      yield batch
    if ended:
      return


def _read(stream: BinaryIO, lines: queue.Queue) -> None:
  for line in stream:
    lines.put(line)
  lines.put(_END)


def _decoded(line: bytes, name: str, number: int) -> str:
  try:
    text = line.decode("utf-8")
  except UnicodeDecodeError as e:
    raise textio.invalid_utf8(name, line, e, number - 1) from None
  return text.removesuffix("\n").removesuffix("\r")
