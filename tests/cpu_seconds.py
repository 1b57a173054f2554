"""A pytest plugin: the CPU seconds of each test, its subprocesses' included, summed by worker
group at the end of the session (docs/testing.md, "Where the time goes").

  python -m pytest -q -p tests.cpu_seconds --cpu_seconds=cpu.jsonl

Each test's user + system time is read from `getrusage` before and after it runs: the
process's own (`self`) and that of the subprocesses it waited for (`children`: multi-host
processes, train.py runs, the reference tests' child). One JSON line per test goes to the
file, emptied when the session starts (the workers append to it); the main process prints the
groups, most CPU first.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import time

import pytest

_GROUPS_SHOWN = 20


def pytest_addoption(parser):
  parser.addoption("--cpu_seconds", metavar="PATH", default=None,
                   help="Append each test's CPU seconds to PATH (JSON lines) and print them "
                        "by worker group at the end.")


def _worker(config) -> bool:
  return hasattr(config, "workerinput")  # set by pytest-xdist in its workers


def pytest_sessionstart(session):
  path = session.config.getoption("cpu_seconds")
  if path and not _worker(session.config) and os.path.exists(path):
    os.remove(path)  # one session's tests, not the runs before


def _cpu() -> tuple[float, float]:
  own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                         resource.RUSAGE_CHILDREN))
  return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  path = item.config.getoption("cpu_seconds")
  if not path:
    yield
    return
  (own0, children0), wall0 = _cpu(), time.monotonic()
  yield
  (own1, children1), wall1 = _cpu(), time.monotonic()
  group = item.get_closest_marker("xdist_group")
  line = dict(test=item.nodeid, group=group.args[0] if group else item.nodeid.split("::")[0],
              self=round(own1 - own0, 3), children=round(children1 - children0, 3),
              wall=round(wall1 - wall0, 3))
  with open(path, "a") as f:  # one short appending write a line, as the workers share the file
    f.write(json.dumps(line) + "\n")


def summarize(path: str | os.PathLike) -> list[tuple[str, float, float, int]]:
  """`(group, CPU seconds, wall seconds, tests)` of each group in the file, most CPU first."""
  cpu, wall, tests = collections.Counter(), collections.Counter(), collections.Counter()
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      cpu[record["group"]] += record["self"] + record["children"]
      wall[record["group"]] += record["wall"]
      tests[record["group"]] += 1
  return [(group, cpu[group], wall[group], tests[group]) for group, _ in cpu.most_common()]


def pytest_terminal_summary(terminalreporter, config):
  path = config.getoption("cpu_seconds")
  if not path or _worker(config) or not os.path.exists(path):
    return
  groups = summarize(path)
  total = sum(cpu for _, cpu, _, _ in groups)
  terminalreporter.section(f"CPU seconds by group (tests and their subprocesses): {total:.0f}")
  for group, cpu, wall, tests in groups[:_GROUPS_SHOWN]:
    terminalreporter.write_line(f"{cpu:8.1f} s CPU {wall:8.1f} s wall {tests:4d} tests  {group}")
  if len(groups) > _GROUPS_SHOWN:
    rest = groups[_GROUPS_SHOWN:]
    terminalreporter.write_line(f"{sum(g[1] for g in rest):8.1f} s CPU in {len(rest)} more groups")
