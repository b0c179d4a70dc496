from rlhub._proto.rlhub.v1 import reducer_pb2 as _reducer_pb2
from rlhub._proto.rlhub.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ARSTaskKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARS_TASK_KIND_UNSPECIFIED: _ClassVar[ARSTaskKind]
    ARS_TASK_KIND_DIRECTION: _ClassVar[ARSTaskKind]
    ARS_TASK_KIND_EVAL: _ClassVar[ARSTaskKind]
ARS_TASK_KIND_UNSPECIFIED: ARSTaskKind
ARS_TASK_KIND_DIRECTION: ARSTaskKind
ARS_TASK_KIND_EVAL: ARSTaskKind

class ARSRunSpec(_message.Message):
    __slots__ = ("env", "seed", "version", "directions", "top", "step_size", "noise", "shift", "hidden", "eval_every", "eval_episodes", "use_target", "target", "max_episodes", "max_iterations", "env_spec", "protocol", "confirm_episodes", "optimizer", "gradient_max")
    ENV_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIRECTIONS_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    STEP_SIZE_FIELD_NUMBER: _ClassVar[int]
    NOISE_FIELD_NUMBER: _ClassVar[int]
    SHIFT_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_FIELD_NUMBER: _ClassVar[int]
    EVAL_EVERY_FIELD_NUMBER: _ClassVar[int]
    EVAL_EPISODES_FIELD_NUMBER: _ClassVar[int]
    USE_TARGET_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    MAX_EPISODES_FIELD_NUMBER: _ClassVar[int]
    MAX_ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    ENV_SPEC_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_EPISODES_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_MAX_FIELD_NUMBER: _ClassVar[int]
    env: str
    seed: int
    version: str
    directions: int
    top: int
    step_size: float
    noise: float
    shift: float
    hidden: _containers.RepeatedScalarFieldContainer[int]
    eval_every: int
    eval_episodes: int
    use_target: bool
    target: float
    max_episodes: int
    max_iterations: int
    env_spec: ARSEnvSpec
    protocol: str
    confirm_episodes: int
    optimizer: _reducer_pb2.ReducerOptimizer
    gradient_max: float
    def __init__(self, env: _Optional[str] = ..., seed: _Optional[int] = ..., version: _Optional[str] = ..., directions: _Optional[int] = ..., top: _Optional[int] = ..., step_size: _Optional[float] = ..., noise: _Optional[float] = ..., shift: _Optional[float] = ..., hidden: _Optional[_Iterable[int]] = ..., eval_every: _Optional[int] = ..., eval_episodes: _Optional[int] = ..., use_target: _Optional[bool] = ..., target: _Optional[float] = ..., max_episodes: _Optional[int] = ..., max_iterations: _Optional[int] = ..., env_spec: _Optional[_Union[ARSEnvSpec, _Mapping]] = ..., protocol: _Optional[str] = ..., confirm_episodes: _Optional[int] = ..., optimizer: _Optional[_Union[_reducer_pb2.ReducerOptimizer, _Mapping]] = ..., gradient_max: _Optional[float] = ...) -> None: ...

class ARSEnvSpec(_message.Message):
    __slots__ = ("obs_dim", "discrete", "act_dim", "obs_keys")
    OBS_DIM_FIELD_NUMBER: _ClassVar[int]
    DISCRETE_FIELD_NUMBER: _ClassVar[int]
    ACT_DIM_FIELD_NUMBER: _ClassVar[int]
    OBS_KEYS_FIELD_NUMBER: _ClassVar[int]
    obs_dim: int
    discrete: int
    act_dim: int
    obs_keys: _containers.RepeatedCompositeFieldContainer[ARSObsKey]
    def __init__(self, obs_dim: _Optional[int] = ..., discrete: _Optional[int] = ..., act_dim: _Optional[int] = ..., obs_keys: _Optional[_Iterable[_Union[ARSObsKey, _Mapping]]] = ...) -> None: ...

class ARSObsKey(_message.Message):
    __slots__ = ("name", "dim")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIM_FIELD_NUMBER: _ClassVar[int]
    name: str
    dim: int
    def __init__(self, name: _Optional[str] = ..., dim: _Optional[int] = ...) -> None: ...

class ARSStartRunRequest(_message.Message):
    __slots__ = ("spec", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: ARSRunSpec
    request_id: str
    def __init__(self, spec: _Optional[_Union[ARSRunSpec, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ARSStartRunResponse(_message.Message):
    __slots__ = ("run_id", "model")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    model: str
    def __init__(self, run_id: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class ARSWatchRunRequest(_message.Message):
    __slots__ = ("run_id", "from_iteration")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_ITERATION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_iteration: int
    def __init__(self, run_id: _Optional[str] = ..., from_iteration: _Optional[int] = ...) -> None: ...

class ARSProgress(_message.Message):
    __slots__ = ("run_id", "iteration", "version", "episodes", "eval_episodes", "steps", "iteration_steps", "has_eval", "eval_mean", "eval_std", "sigma_r", "done", "reason", "model", "elapsed_seconds", "policy_episodes", "train_return", "confirm")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EPISODES_FIELD_NUMBER: _ClassVar[int]
    EVAL_EPISODES_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_STEPS_FIELD_NUMBER: _ClassVar[int]
    HAS_EVAL_FIELD_NUMBER: _ClassVar[int]
    EVAL_MEAN_FIELD_NUMBER: _ClassVar[int]
    EVAL_STD_FIELD_NUMBER: _ClassVar[int]
    SIGMA_R_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_SECONDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_EPISODES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_RETURN_FIELD_NUMBER: _ClassVar[int]
    CONFIRM_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    iteration: int
    version: int
    episodes: int
    eval_episodes: int
    steps: int
    iteration_steps: int
    has_eval: bool
    eval_mean: float
    eval_std: float
    sigma_r: float
    done: bool
    reason: str
    model: str
    elapsed_seconds: float
    policy_episodes: int
    train_return: float
    confirm: bool
    def __init__(self, run_id: _Optional[str] = ..., iteration: _Optional[int] = ..., version: _Optional[int] = ..., episodes: _Optional[int] = ..., eval_episodes: _Optional[int] = ..., steps: _Optional[int] = ..., iteration_steps: _Optional[int] = ..., has_eval: _Optional[bool] = ..., eval_mean: _Optional[float] = ..., eval_std: _Optional[float] = ..., sigma_r: _Optional[float] = ..., done: _Optional[bool] = ..., reason: _Optional[str] = ..., model: _Optional[str] = ..., elapsed_seconds: _Optional[float] = ..., policy_episodes: _Optional[int] = ..., train_return: _Optional[float] = ..., confirm: _Optional[bool] = ...) -> None: ...

class ARSStopRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ARSStopRunResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ARSAttachRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ARSAttachResponse(_message.Message):
    __slots__ = ("worker_id", "lease_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class ARSLeaseRequest(_message.Message):
    __slots__ = ("worker_id", "max_tasks", "wait_ms", "held_run_id", "held_version", "skip_runs")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_TASKS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    HELD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_VERSION_FIELD_NUMBER: _ClassVar[int]
    SKIP_RUNS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    max_tasks: int
    wait_ms: int
    held_run_id: str
    held_version: int
    skip_runs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., max_tasks: _Optional[int] = ..., wait_ms: _Optional[int] = ..., held_run_id: _Optional[str] = ..., held_version: _Optional[int] = ..., skip_runs: _Optional[_Iterable[str]] = ...) -> None: ...

class ARSTask(_message.Message):
    __slots__ = ("kind", "index")
    KIND_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    kind: ARSTaskKind
    index: int
    def __init__(self, kind: _Optional[_Union[ARSTaskKind, str]] = ..., index: _Optional[int] = ...) -> None: ...

class ARSLeaseResponse(_message.Message):
    __slots__ = ("run_id", "spec", "iteration", "model", "version", "tasks", "lease_ms", "policy")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    spec: ARSRunSpec
    iteration: int
    model: str
    version: int
    tasks: _containers.RepeatedCompositeFieldContainer[ARSTask]
    lease_ms: int
    policy: bytes
    def __init__(self, run_id: _Optional[str] = ..., spec: _Optional[_Union[ARSRunSpec, _Mapping]] = ..., iteration: _Optional[int] = ..., model: _Optional[str] = ..., version: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[ARSTask, _Mapping]]] = ..., lease_ms: _Optional[int] = ..., policy: _Optional[bytes] = ...) -> None: ...

class ARSFilterStats(_message.Message):
    __slots__ = ("count", "mean", "m2")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MEAN_FIELD_NUMBER: _ClassVar[int]
    M2_FIELD_NUMBER: _ClassVar[int]
    count: float
    mean: _containers.RepeatedScalarFieldContainer[float]
    m2: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, count: _Optional[float] = ..., mean: _Optional[_Iterable[float]] = ..., m2: _Optional[_Iterable[float]] = ...) -> None: ...

class ARSTaskResult(_message.Message):
    __slots__ = ("task", "r_plus", "r_minus", "steps", "stats")
    TASK_FIELD_NUMBER: _ClassVar[int]
    R_PLUS_FIELD_NUMBER: _ClassVar[int]
    R_MINUS_FIELD_NUMBER: _ClassVar[int]
    RETURN_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    task: ARSTask
    r_plus: float
    r_minus: float
    steps: int
    stats: ARSFilterStats
    def __init__(self, task: _Optional[_Union[ARSTask, _Mapping]] = ..., r_plus: _Optional[float] = ..., r_minus: _Optional[float] = ..., steps: _Optional[int] = ..., stats: _Optional[_Union[ARSFilterStats, _Mapping]] = ..., **kwargs) -> None: ...

class ARSReportRequest(_message.Message):
    __slots__ = ("worker_id", "run_id", "iteration", "results", "next")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    run_id: str
    iteration: int
    results: _containers.RepeatedCompositeFieldContainer[ARSTaskResult]
    next: ARSLeaseRequest
    def __init__(self, worker_id: _Optional[str] = ..., run_id: _Optional[str] = ..., iteration: _Optional[int] = ..., results: _Optional[_Iterable[_Union[ARSTaskResult, _Mapping]]] = ..., next: _Optional[_Union[ARSLeaseRequest, _Mapping]] = ...) -> None: ...

class ARSReportResponse(_message.Message):
    __slots__ = ("accepted", "duplicates", "stale", "next")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    duplicates: int
    stale: int
    next: ARSLeaseResponse
    def __init__(self, accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., stale: _Optional[int] = ..., next: _Optional[_Union[ARSLeaseResponse, _Mapping]] = ...) -> None: ...

class ARSDetachRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class ARSDetachResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ARSPullPolicyRequest(_message.Message):
    __slots__ = ("run_id", "version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ...) -> None: ...

class ARSPolicyPart(_message.Message):
    __slots__ = ("info", "chunk")
    INFO_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    info: _tensor_pb2.BlobInfo
    chunk: _tensor_pb2.Chunk
    def __init__(self, info: _Optional[_Union[_tensor_pb2.BlobInfo, _Mapping]] = ..., chunk: _Optional[_Union[_tensor_pb2.Chunk, _Mapping]] = ...) -> None: ...
