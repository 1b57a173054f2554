"""Run supervision: what keeps a training run alive and ends it with one line, apart from the
loop that trains.

`Supervisor`, open around a run, holds
- the workdir's lock (`workdir.TrainerLock`: one trainer per workdir, on process 0);
- stop signals (`preemption.StopRequests`: SIGTERM or SIGINT save a checkpoint after the step
  in flight and end the run with `errors.Stopped`);
- the other processes of a multi-process run and the stuck-step clock (`peer_watch`): a
  process that fails, is lost or is stuck ends them all, each with one line;
- a full disk (`errors.DiskFull`, one line naming what was being written and the checkpoint
  the next run resumes from), and, in a single process, a save under way finished when an
  error ends the run (`Checkpointer.finishing_on_error`);
- the persistent compilation cache (`compilation.persistent_cache`).

The loop calls it at a few named points:

  with Supervisor(config, workdir) as supervisor:
    ...                                       # build; restore or initialise
    supervisor.watch_checkpoints(ckpt, state)
    with supervisor.training():
      while step < num_steps and not supervisor.should_stop(step):
        ...                                   # a step
        supervisor.step_done()
        with supervisor.not_stepping():
          ...                                 # evaluation, decoding, compiling
      supervisor.stop_if_asked(step, save, flush)
    supervisor.finished()

and every failure leaves it as an exception: the error itself, or, where this process of a
multi-process run failed alone and has told the others, `errors.FailedAlone` raised from it,
with the process's line and its way out past JAX's shutdown barrier (the launcher,
`cli.run`, turns each into one line and an exit status).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import jax

from transformer import errors
from transformer.run import checkpoint
from transformer.run import checkpoint_layout
from transformer.run import compilation
from transformer.run import disk
from transformer.run import workdir as workdir_lib
from transformer.training import peer_watch
from transformer.training import preemption


class Supervisor:
  """Around a training run in `workdir` (see the module docstring).

  Args:
    config: the run's config: its timeouts, checkpoints kept and compilation cache are read.
    workdir: the run folder.
  """

  def __init__(self, config, workdir: str):
    self.workdir = workdir
    self._lock = workdir_lib.TrainerLock(workdir) if jax.process_index() == 0 else None
    self._peers = peer_watch.PeerWatch(config.heartbeat_timeout_seconds, self._on_end,
                                       step_timeout=config.step_timeout_seconds)
    self._cache_dir = config.compilation_cache_dir
    self._keep = (config.keep_checkpoints, config.keep_full_checkpoints)
    self._ckpt: checkpoint.Checkpointer | None = None
    self._stops: preemption.StopRequests | None = None
    self._open = contextlib.ExitStack()

  def __enter__(self) -> "Supervisor":
    with contextlib.ExitStack() as stack:
      stack.enter_context(errors.writing("a file of the run", self.workdir))
      if self._lock is not None:
        stack.enter_context(self._lock)
      stack.enter_context(self._peers)
      stack.enter_context(compilation.persistent_cache(self._cache_dir))
      self._open = stack.pop_all()
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    came_in = exc
    try:
      self._open.__exit__(exc_type, exc, tb)
    except BaseException as e:  # another error instead (`DiskFull` for an OSError, say)
      exc = e
    if exc is None:
      return
    if isinstance(exc, errors.DiskFull):
      exc.next_run = next_run(checkpoint_layout.resume_step(self.workdir), after_disk_full=True)
    failure = None if isinstance(exc, SystemExit) else self._peers.failed_alone()
    if failure is not None:
      raise failure from exc
    if exc is not came_in:
      raise exc

  def _on_end(self) -> str:
    """Tidies up as this process ends because a process failed or is stuck (the lock goes
    with it); returns where the next run resumes, for its line."""
    if self._lock is not None:
      self._lock.release()
    every_host = " (the same command on every host)" if jax.process_count() > 1 else ""
    step = checkpoint_layout.resume_step(self.workdir)
    # A save under way when a process fails completes or not as the other processes leave.
    under_way = [s for s in checkpoint_layout.unfinished_steps(self.workdir)
                 if step is None or s > step]
    or_later = (f" (or from checkpoint {under_way[-1]}, should its save under way complete)"
                if under_way else "")
    return f"{next_run(step)}{or_later}{every_host}"

  def watch_checkpoints(self, ckpt: checkpoint.Checkpointer, state: Any) -> None:
    """The run saves through `ckpt` a train state shaped as `state` (arrays or shape
    structs): what its checkpoints need on disk is logged, with a warning where the disk has
    less room; a save that fails in the background stops the run at the next step."""
    self._ckpt = ckpt
    if jax.process_index() == 0:
      disk.report(ckpt.directory, state, *self._keep)

  @contextlib.contextmanager
  def training(self) -> Iterator[None]:
    """Around the training loop: SIGTERM and SIGINT ask it to stop (`should_stop`); an error
    leaving it is told to the other processes at once, before anything waits (in a single
    process, the save under way is then finished: across processes it completes only with
    every process, and the others are leaving)."""
    finishing = (self._ckpt.finishing_on_error() if jax.process_count() == 1
                 else contextlib.nullcontext())
    self._stops = preemption.StopRequests()
    with self._stops, finishing, self._peers.failing_together():
      yield

  def step_done(self) -> None:
    """After every training step: the step clock starts again, and a save that ran out of
    disk space in the background stops the run now (`errors.DiskFull`)."""
    self._peers.step_done()
    self._ckpt.poll()

  def not_stepping(self) -> contextlib.AbstractContextManager[None]:
    """Around work that is not a training step (evaluation, decoding, compiling): the step
    clock stops meanwhile and starts again after it."""
    return self._peers.not_stepping()

  def should_stop(self, step: int) -> bool:
    """Whether a stop was asked for, to take after `step` (every process agrees)."""
    return self._stops.stop_after(step)

  def stop_if_asked(self, step: int, save: Callable[[int], None],
                    flush: Callable[[], None]) -> None:
    """After the loop: where a signal asked to stop, saves checkpoint `step` now and
    synchronously (`save(step)`, unless the newest save is of it), `flush`es the logs and
    raises `errors.Stopped`. Further signals meanwhile are noted and ignored."""
    stops = self._stops
    if stops.signum is None:
      return
    self._ckpt.wait()  # a save already under way completes first
    if self._ckpt.latest_step() != step:
      save(step)
      self._ckpt.wait()
    flush()
    raise errors.Stopped(f"stopped by {stops.name} after step {step}: checkpoint {step} is "
                         f"saved in {self._ckpt.directory}; run the same command to resume",
                         stops.exit_code)

  def finished(self) -> None:
    """The last step is done and saved: the step clock stops for good."""
    self._peers.steps_over()


def next_run(step: int | None, after_disk_full: bool = False) -> str:
  """Where the same command, run again, starts: `step` is `checkpoint_layout.resume_step`'s."""
  if step is None:
    return "no checkpoint is complete yet, so the next run starts from step 0"
  return (f"{'nothing complete was deleted: ' if after_disk_full else ''}the next run resumes "
          f"from checkpoint {step}")
