"""Type stub of mend._config, generated from the key table by mend._config.stub()."""
from typing import Any, Dict, Optional


class MendConfig:
    job_id: str
    token_file: str
    tls_cert_file: str
    tls_key_file: str
    tls_ca_file: str
    lighthouse: str
    bind: str
    http: str
    quorum_min_learners: int
    grace_window_ms: int
    grace_window_adaptive: bool
    grace_window_min_ms: int
    heartbeat_ms: int
    heartbeat_timeout_ms: int
    quorum_timeout_ms: int
    lighthouse_wait_ms: int
    rpc_timeout_ms: int
    failslow_zscore_threshold: float
    failslow_window_steps: int
    rack_aware: bool
    rack: str
    group_size: int
    group_rank: int
    group_generation: int
    group_store: str
    control_plane: str
    sync_period_steps: int
    token_weighted_merge: bool
    outer_lr: float
    outer_momentum: float
    outer_warmup_steps: int
    fragments: int
    concurrent_outer_step: bool
    overlap_steps: int
    rounds_in_flight: int
    total_steps: int
    final_merge: bool
    train_through_lighthouse_outage: bool
    outer_apply: str
    mixing_alpha: float
    sync_buffers: bool
    exchange_frozen_parameters: bool
    desloc: bool
    heal_inner_optimizer: bool
    momentum_sync_period_steps: int
    second_moment_sync_period_steps: int
    codec: str
    codec_block_size: int
    topk_chunk_size: int
    topk_k: int
    error_feedback_beta: float
    collective_timeout_ms: int
    connect_timeout_ms: int
    round_threads: int
    host_staging: str
    dataplane_host: str
    dataplane_encrypt: bool
    link_latency_ms: int
    link_rate_mbit: float
    checkpoint_dir: str
    checkpoint_every_rounds: int
    checkpoint_keep: int
    checkpoint_authenticate: bool
    resume_from: str
    resume: bool
    diagnostics_dir: str
    log_level: str

    def __init__(self, _file: str = ..., *, job_id: str = ..., token_file: str = ..., tls_cert_file: str = ..., tls_key_file: str = ..., tls_ca_file: str = ..., lighthouse: str = ..., bind: str = ..., http: str = ..., quorum_min_learners: int = ..., grace_window_ms: int = ..., grace_window_adaptive: bool = ..., grace_window_min_ms: int = ..., heartbeat_ms: int = ..., heartbeat_timeout_ms: int = ..., quorum_timeout_ms: int = ..., lighthouse_wait_ms: int = ..., rpc_timeout_ms: int = ..., failslow_zscore_threshold: float = ..., failslow_window_steps: int = ..., rack_aware: bool = ..., rack: str = ..., group_size: int = ..., group_rank: int = ..., group_generation: int = ..., group_store: str = ..., control_plane: str = ..., sync_period_steps: int = ..., token_weighted_merge: bool = ..., outer_lr: float = ..., outer_momentum: float = ..., outer_warmup_steps: int = ..., fragments: int = ..., concurrent_outer_step: bool = ..., overlap_steps: int = ..., rounds_in_flight: int = ..., total_steps: int = ..., final_merge: bool = ..., train_through_lighthouse_outage: bool = ..., outer_apply: str = ..., mixing_alpha: float = ..., sync_buffers: bool = ..., exchange_frozen_parameters: bool = ..., desloc: bool = ..., heal_inner_optimizer: bool = ..., momentum_sync_period_steps: int = ..., second_moment_sync_period_steps: int = ..., codec: str = ..., codec_block_size: int = ..., topk_chunk_size: int = ..., topk_k: int = ..., error_feedback_beta: float = ..., collective_timeout_ms: int = ..., connect_timeout_ms: int = ..., round_threads: int = ..., host_staging: str = ..., dataplane_host: str = ..., dataplane_encrypt: bool = ..., link_latency_ms: int = ..., link_rate_mbit: float = ..., checkpoint_dir: str = ..., checkpoint_every_rounds: int = ..., checkpoint_keep: int = ..., checkpoint_authenticate: bool = ..., resume_from: str = ..., resume: bool = ..., diagnostics_dir: str = ..., log_level: str = ...) -> None: ...
    @classmethod
    def from_file(cls, path: str, **keys: Any) -> MendConfig: ...
    def replace(self, **keys: Any) -> MendConfig: ...
    def as_dict(self) -> Dict[str, Any]: ...
    def to_toml(self) -> str: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
