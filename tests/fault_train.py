"""`python -m exp.train`, run as a user runs it, with a fault at a point the test chooses, so fault
tests need no race.

Usage: python tests/fault_train.py READY MODE [exp.train's options ...]
MODE:
  pause          after the checkpoint of epoch 0 is written, create the file READY and wait
                 (for the test's signal)
  pause-in-save  while the checkpoint of epoch 1 is written, its temporary file complete but not
                 yet renamed: create READY and wait (for the test's SIGKILL)
  enospc         the write of the checkpoint of epoch 1 fails as on a full disk (ENOSPC at its
                 fsync)
  die-rank1      under torchrun: rank 1 exits at the 2nd training batch of epoch 1, as a crashed
                 process would (after the 1st batch's gradient all-reduce, which rank 0 joins
                 only once epoch 0's checkpoint is written)
  kill-rank1     under torchrun: rank 1 SIGKILLs itself at the 10th training batch of epoch 2,
                 in torchrun's first attempt only (TORCHELASTIC_RESTART_COUNT 0): the restarted
                 workers then run to the end
  stop-rank1     under torchrun: rank 1 stops itself (SIGSTOP, a hung process) at the 5th
                 training batch of epoch 1
"""

import errno
import os
import pathlib
import runpy
import sys
import time

import exp.learner

ready, mode, args = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]


def wait_here():
    ready.touch()
    time.sleep(300)  # the test signals long before; if it does not, its own timeout ends it


saves = []
save = exp.learner.SaveModelCallback.after_epoch


def after_epoch(self):
    saves.append(self.epoch)
    save(self)
    if mode == 'pause' and self.epoch == 0:
        wait_here()


exp.learner.SaveModelCallback.after_epoch = after_epoch

if mode == 'pause-in-save':
    replace = os.replace

    def replace_or_wait(src, dst, *a, **k):
        if str(dst).endswith('model.pth') and saves == [0, 1]:
            wait_here()
        return replace(src, dst, *a, **k)

    os.replace = replace_or_wait
elif mode == 'enospc':
    fsync = os.fsync

    def fsync_or_full(fd):
        if '.model.pth.' in os.readlink(f'/proc/self/fd/{fd}') and saves == [0, 1]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)

    os.fsync = fsync_or_full
elif mode in ('die-rank1', 'kill-rank1', 'stop-rank1'):
    import signal
    from exp.callbacks import Runner

    one_batch, seen = Runner.one_batch, []
    epoch, batch, fault = {
        'die-rank1': (1, 2, lambda: os._exit(1)),
        'kill-rank1': (2, 10, lambda: os.kill(os.getpid(), signal.SIGKILL)),
        'stop-rank1': (1, 5, lambda: os.kill(os.getpid(), signal.SIGSTOP)),
    }[mode]

    def one_batch_or_die(self, xb, yb):
        if self.in_train and self.epoch == epoch:
            seen.append(1)
        if (
            os.environ.get('RANK') == '1'
            and os.environ.get('TORCHELASTIC_RESTART_COUNT') == '0'
            and len(seen) == batch
        ):
            fault()
        one_batch(self, xb, yb)

    Runner.one_batch = one_batch_or_die
elif mode != 'pause':
    sys.exit(f'unknown mode {mode}')

sys.argv = ['exp.train', *args]
runpy.run_module('exp.train', run_name='__main__')
