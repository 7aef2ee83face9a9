"""The deployment profile as typed models.

A profile (deploy/profiles/*.yml) says what to run; the inventory says where. Models forbid
unknown keys so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Port = Annotated[int, Field(ge=1, le=65535)]
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,30}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


class EngineKind(StrEnum):
    SGLANG = "sglang"
    SIM = "sim"


class Model(Strict):
    path: str = Field(description="Model directory on every GPU host (or a hub id).")
    served_name: str
    family: str | None = Field(
        default=None, description="Known model family for pitfall hints, e.g. deepseek-v4."
    )
    native_context_length: int | None = Field(
        default=None, gt=0, description="The model's own maximum context (uncapped default)."
    )
    weights_gib_per_gpu: float = Field(
        gt=0, description="Weights resident on each GPU at the TP size."
    )
    kv_bytes_per_token: int = Field(gt=0, description="KV cache bytes per token on one GPU.")


class Versions(Strict):
    """Pinned versions installed on GPU hosts; the launch lines are checked against `sglang`."""

    sglang: str = "0.5.23"
    gateway: str = "1.13.0"
    gateway_package: Literal["smg", "sglang-router"] = "smg"
    nixl: str = "1.5.1"
    nixl_package: Literal["nixl", "nixl-cu12", "nixl-cu13"] = "nixl-cu12"


class Hardware(Strict):
    gpu_count: int = Field(ge=1)
    gpu_memory_mib: int = Field(gt=0, description="As nvidia-smi reports total memory.")
    numa_gpus: dict[int, list[int]] | None = Field(
        default=None, description="GPU ids attached to each NUMA node, when known."
    )
    rdma_nics: list[str] = Field(default_factory=list, description="RDMA NICs on the host.")


class Tuning(Strict):
    """SGLang launch settings; in a profile every key is optional and merged common -> role."""

    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    max_running_requests: int | None = Field(default=None, gt=0)
    context_length: int | None = Field(default=None, gt=0)
    page_size: int | None = Field(default=None, gt=0)
    kv_cache_dtype: str | None = None
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = Field(default=None, gt=0)
    cuda_graph_bs: list[int] | None = None
    disable_cuda_graph: bool | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @field_validator("env", mode="before")
    @classmethod
    def _env_values_as_text(cls, v: object) -> object:
        # YAML turns 0/1/true into numbers and booleans; an env file needs their text.
        if isinstance(v, dict):
            return {k: _env_text(x) for k, x in v.items()}
        return v

    def merged(self, override: Tuning) -> Tuning:
        """`override` wins key by key; env maps merge, extra args append."""
        data = self.model_dump(exclude={"env", "extra_args"})
        data.update(override.model_dump(exclude_none=True, exclude={"env", "extra_args"}))
        return Tuning(
            **data,
            env={**self.env, **override.env},
            extra_args=[*self.extra_args, *override.extra_args],
        )


def _env_text(v: object) -> object:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int | float):
        return str(v)
    return v


class Engine(Strict):
    kind: EngineKind = EngineKind.SGLANG
    transfer_backend: Literal["nixl", "mooncake", "mooncake_tcp", "mori", "fake"] = "nixl"
    common: Tuning = Tuning()
    prefill: Tuning = Tuning()
    decode: Tuning = Tuning()

    def tuning(self, role: Role) -> Tuning:
        return self.common.merged(self.prefill if role is Role.PREFILL else self.decode)


class InstanceSpec(Strict):
    numa_node: int = Field(ge=0)
    gpus: list[int] = Field(min_length=1)
    port: Port
    bootstrap_port: Port | None = None
    tp: int | None = Field(default=None, ge=1, description="Defaults to the number of GPUs.")


class PairSpec(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    prefill: InstanceSpec
    decode: InstanceSpec

    @model_validator(mode="after")
    def _prefill_needs_bootstrap(self) -> PairSpec:
        if self.prefill.bootstrap_port is None:
            raise ValueError(
                "prefill.bootstrap_port is required (the decode fetches KV routes there)"
            )
        if self.decode.bootstrap_port is not None:
            raise ValueError("decode.bootstrap_port is not used: only a prefill serves bootstrap")
        return self


class Layout(Strict):
    pairs: list[PairSpec] = Field(min_length=1)

    @field_validator("pairs")
    @classmethod
    def _unique_names(cls, pairs: list[PairSpec]) -> list[PairSpec]:
        seen: set[str] = set()
        for p in pairs:
            if p.name in seen:
                raise ValueError(f"duplicate pair name {p.name!r}")
            seen.add(p.name)
        return pairs


class Router(Strict):
    host: str = "0.0.0.0"
    port: Port = 8000
    metrics_port: Port = 29000
    policy: Literal[
        "random", "round_robin", "cache_aware", "power_of_two", "least_load", "consistent_hashing"
    ] = "round_robin"
    health_check_interval_secs: int = Field(default=10, ge=1)
    extra_args: list[str] = Field(default_factory=list)


class HostOverride(Strict):
    hardware: Hardware | None = None
    layout: Layout | None = None


class Planner(Strict):
    """Memory model calibration (see README, "Memory planner")."""

    runtime_overhead_gib: float = Field(
        default=3.5, ge=0, description="CUDA context, NCCL, allocator."
    )
    activation_peak_gib: float = Field(default=4.0, ge=0)
    graph_gib_per_batch: float = Field(
        default=0.3, ge=0, description="CUDA-graph pool per batch slot."
    )


class Profile(Strict):
    model: Model
    versions: Versions = Versions()
    engine: Engine = Engine()
    hardware: Hardware
    layout: Layout
    router: Router = Router()
    hosts: dict[str, HostOverride] = Field(default_factory=dict)
    planner: Planner = Planner()
    sim: dict[str, str | int | float] = Field(
        default_factory=dict, description="PDSIM_* knobs for engine kind sim."
    )

    @field_validator("sim")
    @classmethod
    def _sim_keys(cls, sim: dict[str, str | int | float]) -> dict[str, str | int | float]:
        bad = [k for k in sim if not k.startswith("PDSIM_")]
        if bad:
            raise ValueError(f"sim keys must be PDSIM_* environment variables, got {bad}")
        return sim
