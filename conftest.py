"""pytest's set-up for the chapters' notebooks under nbval (``make test``, ``book/evidence_check.py``).

Kernels started side by side (one per pytest-xdist worker) each pick free TCP ports, and two can pick
the same one: the second dies before it replies (``zmq.error.ZMQError: Address already in use``), and
nbval would fail every cell of its notebook. Such a kernel is started again, up to ``KERNEL_STARTS``
times; ``book/execute.py`` does the same for the build.
"""

KERNEL_STARTS = 3


def _started_again_if_it_dies(init):
    def start(self, *args, **kwargs):
        for attempt in range(1, KERNEL_STARTS + 1):
            try:
                return init(self, *args, **kwargs)
            except RuntimeError as exc:  # jupyter_client: "Kernel died before replying to kernel_info"
                if "died" not in str(exc) or attempt == KERNEL_STARTS:
                    raise

    start.starts_again, start.__wrapped__ = True, init
    return start


def pytest_configure(config):
    try:
        from nbval.kernel import RunningKernel
    except ImportError:  # nbval is not installed: no notebooks are collected
        return
    if not getattr(RunningKernel.__init__, "starts_again", False):
        RunningKernel.__init__ = _started_again_if_it_dies(RunningKernel.__init__)
