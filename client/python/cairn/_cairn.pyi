"""Type stubs of the extension cairn._cairn (client/python/src/*.cc).

libcairn's public C++ API for Python. Every blocking call releases the GIL;
errors are raised as cairn.errors classes (never RuntimeError) whose message
names the job, step, rank and tensor (fqn).

The constructors' keyword defaults are libcairn's options
(CheckpointerOptions, AgentCheckpointerOptions), so this stub writes them as
`...`: Checkpointer.default_options() and AgentCheckpointer.default_options()
give their values.
"""

from typing import Dict, List, Optional, Sequence, Tuple, Union

# A keyword default: a number, a name, a flag, or None (from the environment).
OptionValue = Union[int, float, str, bool, None]

class StateDict:
    """What one rank saves or loads: tensor chunks in caller-owned memory
    (borrowed: keep the owners alive, unchanged for a save and writable for a
    load, until the call returns) and bytes entries (owned copies).
    While a save or load uses it, add_chunks/add_bytes (and get_bytes
    during a load) raise FailedPreconditionError."""

    def __init__(self) -> None: ...
    def add_chunks(
        self, fqn: str, dtype: str, global_shape: Sequence[int],
        chunks: Sequence[Tuple[Sequence[int], Sequence[int], int, int]]
    ) -> None:
        """Adds tensor `fqn`: each chunk is (offsets, sizes, ptr, nbytes), its
        box in global coordinates and a contiguous row-major buffer of
        exactly prod(sizes) * itemsize bytes (ptr 0 only if nbytes is 0).
        InvalidArgumentError naming fqn for a bad dtype, box or size;
        AlreadyExistsError for a repeated fqn."""
    def add_bytes(self, fqn: str, data: Optional[bytes] = None) -> None:
        """Adds bytes entry `fqn`: `data` to save, None to load into."""
    def get_bytes(self, fqn: str) -> bytes:
        """The entry's current (after a load: loaded) value; NotFoundError if
        there is no bytes entry `fqn`."""
    def __len__(self) -> int: ...

class CheckpointInfo:
    """cairnd's record of one checkpoint (read-only; picklable)."""

    @property
    def job(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def state(self) -> str:
        """"WRITING", "COMMITTED", "ABORTED", "DELETING" or "UNKNOWN"."""
    @property
    def world_size(self) -> int: ...
    @property
    def bytes(self) -> int: ...
    @property
    def num_tensors(self) -> int: ...
    @property
    def num_bytes_entries(self) -> int: ...
    @property
    def created(self) -> Optional[float]:
        """When its save began, Unix seconds."""
    @property
    def committed(self) -> Optional[float]:
        """When it was committed, Unix seconds (None unless COMMITTED)."""
    @property
    def storage_uri(self) -> str: ...
    @property
    def abort_reason(self) -> str:
        """ABORTED only: which rank aborted the save and why."""

class TensorSummary:
    """One tensor of a committed checkpoint."""

    @property
    def fqn(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> List[int]: ...
    @property
    def bytes(self) -> int: ...
    @property
    def chunks(self) -> List[Tuple[List[int], List[int]]]:
        """(offsets, sizes) of every stored chunk, sorted."""

class BytesEntrySummary:
    """One bytes entry of a committed checkpoint."""

    @property
    def fqn(self) -> str: ...
    @property
    def bytes(self) -> int: ...

class CheckpointSummary:
    """What a committed checkpoint holds (Checkpointer.describe)."""

    @property
    def info(self) -> CheckpointInfo: ...
    @property
    def tensors(self) -> List[TensorSummary]: ...
    @property
    def bytes_entries(self) -> List[BytesEntrySummary]: ...

class Checkpointer:
    """One rank's connection to cairnd in direct mode. One call at a time
    per object (FailedPreconditionError otherwise), except cancel().
    Ctrl-C during save/load cancels it and raises KeyboardInterrupt."""

    def __init__(self, coordinator: str, job: str, rank: int, world_size: int,
                 *, io_threads: int = ..., rpc_timeout: float = ...,
                 collective_timeout: float = ..., max_retries: int = ...,
                 first_contact_timeout: float = ...,
                 partial_chunk_check: str = ...,
                 use_odirect: bool = ...,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None,
                 token: Optional[str] = None) -> None:
        """partial_chunk_check: "collective" | "read_whole" | "none";
        durations in seconds; defaults: default_options().
        InvalidArgumentError naming job and rank for a bad option."""
    @staticmethod
    def default_options() -> Dict[str, OptionValue]:
        """The keyword defaults (libcairn's CheckpointerOptions), by
        keyword; None for tls_ca, tls_cert, tls_key, token."""
    def save(self, step: int, state: StateDict) -> CheckpointInfo:
        """Collective save of `state` as `step`; returns the committed
        record. Ctrl-C cancels it (aborted at cairnd; the previous checkpoint
        stays the latest) and raises KeyboardInterrupt. CancelledError
        (cancel() from another thread), AbortedError, AlreadyExistsError,
        InvalidArgumentError, UnavailableError."""
    def load(self, state: StateDict, step: Optional[int] = None) -> int:
        """Fills `state` from `step` (None: the latest), resharding; returns
        the step loaded. Ctrl-C cancels it (KeyboardInterrupt). NotFoundError,
        InvalidArgumentError, DataLossError, UnavailableError."""
    def list(self, include_uncommitted: bool = False) -> List[CheckpointInfo]:
        ...
    def latest_step(self) -> int:
        """NotFoundError naming the job if it has no committed checkpoint."""
    def describe(self, step: int) -> CheckpointSummary:
        """NotFoundError (no record), FailedPreconditionError (not
        committed)."""
    def cancel(self) -> None:
        """Cancels the save/load in progress (or the next one); thread-safe.
        The cancelled call raises CancelledError."""
    @property
    def last_stats(self) -> Dict[str, Union[int, float, bool]]:
        """bytes, bytes_storage, items, chunks_verified_by_cairnd,
        chunks_verified_locally, plan_from_cache, sent_fingerprint_only,
        plan_time, io_time, commit_time (seconds)."""
    @property
    def job(self) -> str: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def coordinator(self) -> str: ...
    @property
    def incarnation(self) -> int: ...

class SaveFuture:
    """Durability of one AgentCheckpointer.async_save."""

    @property
    def step(self) -> int: ...
    def wait(self, timeout: Optional[float] = None) -> CheckpointInfo:
        """Waits (GIL released) for the commit; DeadlineExceededError after
        `timeout` seconds, the save's error if it failed. Ctrl-C interrupts
        the wait (not the save); the AgentCheckpointer's cancel() cancels
        the save (CancelledError)."""
    def done(self) -> bool:
        """True once the outcome is known; does not block."""

class AgentCheckpointer:
    """One rank's connection to its node's cairn-agent (agent mode). One
    call at a time per object, except cancel(). Ctrl-C during save,
    async_save or load cancels it and raises KeyboardInterrupt."""

    def __init__(self, agent_socket: str, coordinator: str, job: str,
                 rank: int, world_size: int, *, copy_threads: int = ...,
                 wait_for_space: float = ..., allow_streaming: bool = ...,
                 io_threads: int = ..., rpc_timeout: float = ...,
                 collective_timeout: float = ..., max_retries: int = ...,
                 first_contact_timeout: float = ...,
                 partial_chunk_check: str = ...,
                 use_odirect: bool = ...,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None,
                 token: Optional[str] = None) -> None:
        """Defaults: default_options()."""
    @staticmethod
    def default_options() -> Dict[str, OptionValue]:
        """The keyword defaults (libcairn's AgentCheckpointerOptions and
        CheckpointerOptions), by keyword; None for tls_ca, tls_cert,
        tls_key, token."""
    def async_save(self, step: int, state: StateDict,
                   tier: str = ...) -> SaveFuture:
        """Returns once `state` is copied into the agent's staging memory.
        CancelledError after cancel()."""
    def save_future(self, step: int) -> SaveFuture:
        """The future of this rank's save of `step` staged by an async_save
        of this job and rank, in this process or another."""
    def save(self, step: int, state: StateDict,
             tier: str = ...) -> CheckpointInfo:
        """async_save, then the wait for its commit, as one call: Ctrl-C
        cancels the save (aborted at cairnd once the agent joined it) and
        raises KeyboardInterrupt."""
    def load(self, state: StateDict, step: Optional[int] = None) -> int:
        """Agent memory first, storage otherwise; returns the step loaded.
        Ctrl-C cancels it (KeyboardInterrupt)."""
    def cancel(self) -> None:
        """Cancels the save, async_save, load or SaveFuture wait in progress
        (or the next one); thread-safe. The cancelled call raises
        CancelledError; a cancelled save is aborted at cairnd once the
        agent joined it."""
    @property
    def last_load_source(self) -> str:
        """"agent_memory", "storage" or "none"."""
    @property
    def last_save_stats(self) -> Dict[str, Union[int, float]]:
        """bytes, blocked, copy_time, begin_time, streamed_buckets."""
