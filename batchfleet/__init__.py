"""batchfleet: asynchronous micro-batching PyTorch inference workers.

This package holds only the command line (``batchfleet ...``); the runtime is
in ``workers``, the SDK in ``producers`` and the wire contract in ``schemas``.
"""

__version__ = "0.1.0"
