"""Cairn for Python: save and load training state through cairnd.

The extension cairn._cairn binds libcairn's public C++ API (StateDict,
Checkpointer, AgentCheckpointer, SaveFuture and the result types); errors
are the classes of cairn.errors, all subclasses of cairn.Error.
"""

from cairn import _torch_compat
from cairn.errors import *  # noqa: F401,F403  (every exception class)
from cairn.errors import Error, from_status  # noqa: F401
from cairn._cairn import (  # noqa: F401
    AgentCheckpointer, BytesEntrySummary, CheckpointInfo, CheckpointSummary,
    Checkpointer, SaveFuture, StateDict, TensorSummary)

_torch_compat.install()
