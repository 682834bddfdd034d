"""Cairn for Python: save and load training state through cairnd.

cairn.Checkpointer saves and loads the nested state_dict a training job has
(model, optimizer, scheduler, step, RNG states; tensors, ShardedTensors,
DTensors, numpy arrays and picklable objects), resharding across world
sizes; async_save returns a cairn.SaveFuture. cairn.torch holds the
torch.distributed.checkpoint storage layer. The extension cairn._cairn
binds libcairn's public C++ API (StateDict, AgentCheckpointer, ... and the
result types); errors are the classes of cairn.errors, all subclasses of
cairn.Error.
"""

from cairn import _torch_compat
from cairn.errors import *  # noqa: F401,F403  (every exception class)
from cairn.errors import Error, from_status  # noqa: F401
from cairn._cairn import (  # noqa: F401
    AgentCheckpointer, BytesEntrySummary, CheckpointInfo, CheckpointSummary,
    StateDict, TensorSummary)
from cairn.checkpointer import Checkpointer, SaveFuture  # noqa: F401

_torch_compat.install()
