"""The deployment profile as typed models.

A profile (deploy/profiles/*.yml) says what to run; the inventory says where. Models forbid
unknown keys so a typo is an error, not a silently ignored setting.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from pdctl.model.revisions import revision_dir
from pdctl.roles import Role as Role  # pdctl.spec exports it
from pdctl.spec.text import arg_problem, env_key_problem, host_problem, value_problem

Port = Annotated[int, Field(ge=1, le=65535)]
GpuId = Annotated[int, Field(ge=0)]
NAME_PATTERN = r"^[a-z0-9][a-z0-9-]{0,30}$"
# PEP 440 characters only: versions land in pip requirement lines.
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$"
# SGLang 0.5.23 refuses a context_length above the model's own unless this is true
# (srt/configs/model_config.py; EnvBool: true/1/yes/y, any case).
LONG_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
TRUE_WORDS = ("true", "1", "yes", "y")
# Environment keys pdstack sets itself, and what to do instead.
OWNED_ENV = {
    "CUDA_VISIBLE_DEVICES": "set layout.pairs[].prefill.gpus and layout.pairs[].decode.gpus",
    "PYTHONUNBUFFERED": "remove it (always 1, so engine logs reach the journal at once)",
    "PDSIM_GPU_MEM_GIB": "set hardware.gpu_memory_mib, or sim.PDSIM_GPU_MEM_GIB",
    "PDSIM_WEIGHTS_GIB": "set model.weights_gib_per_gpu, or sim.PDSIM_WEIGHTS_GIB",
    "PDSIM_KV_BYTES_PER_TOKEN": "set model.kv_bytes_per_token, or sim.PDSIM_KV_BYTES_PER_TOKEN",
}


def _checked(problem: Callable[[str], str | None]) -> AfterValidator:
    def check(value: str) -> str:
        message = problem(value)
        if message:
            raise ValueError(message)
        return value

    return AfterValidator(check)


def _owned_env_problem(key: str) -> str | None:
    if key in OWNED_ENV:
        return f"pdstack sets {key} itself: {OWNED_ENV[key]}"
    return None


def _sim_key_problem(key: str) -> str | None:
    if not key.startswith("PDSIM_"):
        return f"{key!r} is not a sim knob: sim keys are PDSIM_* variables (docs/sim.md)"
    return None


Host = Annotated[str, _checked(host_problem)]
Value = Annotated[str, _checked(value_problem)]
Arg = Annotated[str, _checked(arg_problem)]
EnvKey = Annotated[str, _checked(env_key_problem), _checked(_owned_env_problem)]
SimKey = Annotated[str, _checked(env_key_problem), _checked(_sim_key_problem)]
Version = Annotated[str, Field(pattern=VERSION_PATTERN)]


def long_context_allowed(env: dict[str, str]) -> bool:
    return env.get(LONG_CONTEXT_ENV, "").lower() in TRUE_WORDS


def _starts_with_flag(args: list[str]) -> list[str]:
    if args and not args[0].startswith("--"):
        raise ValueError(f"{args[0]!r} is a value with no flag before it: start with a --flag")
    return args


Args = Annotated[list[Arg], AfterValidator(_starts_with_flag)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineKind(StrEnum):
    SGLANG = "sglang"
    SIM = "sim"


# A revision and a staged model's served name become directory names on every host.
DIR_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
DirName = Annotated[str, Field(pattern=DIR_NAME_PATTERN)]


class SourceKind(StrEnum):
    CONTROLLER = "controller"  # a directory on the machine running ansible-playbook
    STAGING = "staging"  # HOST:/path on a staging host the GPU hosts reach over ssh
    SHARED = "shared"  # a path every GPU host already sees (NFS): copied to local disk


class ModelSource(Strict):
    """Where site.yml copies a revision from (docs/models.md)."""

    kind: SourceKind
    path: Value = Field(description="The revision's directory; staging: HOST:/absolute/path.")

    @model_validator(mode="after")
    def _path_fits_kind(self) -> ModelSource:
        host, colon, path = self.path.partition(":")
        if self.kind is SourceKind.STAGING:
            if not (colon and host and path.startswith("/")):
                raise ValueError(f"path {self.path!r}: a staging source is HOST:/absolute/path")
        elif not self.path.startswith("/"):
            raise ValueError(f"path {self.path!r}: a {self.kind.value} source is an absolute path")
        return self


class Staging(Strict):
    """How site.yml stages a revision on the GPU hosts (docs/models.md)."""

    root: Value = Field(
        default="/var/lib/pdstack/models", pattern=r"^/", description="Revision directories."
    )
    free_margin_gib: float = Field(default=10.0, ge=0, description="Disk left free after copy.")
    concurrency: int = Field(default=4, ge=1, description="Hosts copying at once, fleet-wide.")


class Model(Strict):
    path: Value = Field(
        description="Model directory on every GPU host (or a hub id); with a source, the "
        "staged revision's directory, which is its default."
    )
    served_name: Value
    source: ModelSource | None = None
    revision: DirName | None = Field(default=None, description="The source's revision name.")
    staging: Staging = Staging()
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

    @model_validator(mode="before")
    @classmethod
    def _path_of_the_staged_revision(cls, data: object) -> object:
        """With a source, engines read the staged revision: model.path is its directory
        (pdctl.model.revisions.revision_dir), given or not."""
        if not isinstance(data, dict) or data.get("source") is None:
            return data
        name, revision = data.get("served_name"), data.get("revision")
        if not isinstance(revision, str):
            raise ValueError("source needs a revision: the name its directory takes on hosts")
        if not isinstance(name, str) or not re.fullmatch(DIR_NAME_PATTERN, name):
            raise ValueError(
                f"served_name {name!r}: with a source it names a directory on every host "
                "(letters, digits, . _ -)"
            )
        staging = data.get("staging") or {}
        root = staging.root if isinstance(staging, Staging) else staging.get("root")
        staged = revision_dir(root or Staging().root, name, revision)
        if data.get("path", staged) != staged:
            raise ValueError(
                f"path {data['path']!r}: with a source, engines read the staged revision "
                f"{staged}; leave path out"
            )
        return {**data, "path": staged}

    @property
    def staged(self) -> bool:
        return self.source is not None


class Versions(Strict):
    """Pinned versions installed on GPU hosts; the launch lines are checked against `sglang`."""

    sglang: Version = "0.5.23"
    gateway: Version = "1.13.0"
    gateway_package: Literal["smg", "sglang-router"] = "smg"
    nixl: Version = "1.5.1"
    nixl_package: Literal["nixl", "nixl-cu12", "nixl-cu13"] = "nixl-cu12"


class Hardware(Strict):
    gpu_count: int = Field(ge=1)
    gpu_memory_mib: int = Field(gt=0, description="As nvidia-smi reports total memory.")
    numa_gpus: dict[GpuId, list[GpuId]] | None = Field(
        default=None, description="GPU ids attached to each NUMA node, when known."
    )
    rdma_nics: list[str] = Field(default_factory=list, description="RDMA NICs on the host.")


class Tuning(Strict):
    """SGLang launch settings; in a profile every key is optional and merged common -> role."""

    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    max_running_requests: int | None = Field(default=None, gt=0)
    context_length: int | None = Field(default=None, gt=0)
    page_size: int | None = Field(default=None, gt=0)
    kv_cache_dtype: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_]+$")
    chunked_prefill_size: int | None = None
    cuda_graph_max_bs: int | None = Field(default=None, gt=0)
    cuda_graph_bs: list[int] | None = None
    disable_cuda_graph: bool | None = None
    extra_args: Args = Field(default_factory=list)
    env: dict[EnvKey, str] = Field(default_factory=dict)

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

    def tuning_key(self, role: Role, field: str) -> str:
        """The role's key if its section sets it, else common's if set there, else the role's."""
        role_sets = field in getattr(self, role.value).model_fields_set
        if not role_sets and field in self.common.model_fields_set:
            return f"engine.common.{field}"
        return f"engine.{role.value}.{field}"


class InstanceSpec(Strict):
    numa_node: int = Field(ge=0)
    gpus: list[GpuId] = Field(min_length=1)
    port: Port
    bootstrap_port: Port | None = None
    tp: int | None = Field(default=None, ge=1, description="Defaults to the number of GPUs.")


def _bootstrap_problem(role: Role, spec: InstanceSpec) -> str | None:
    if role is Role.PREFILL and spec.bootstrap_port is None:
        return "bootstrap_port is required (the decode fetches KV routes there)"
    if role is Role.DECODE and spec.bootstrap_port is not None:
        return "bootstrap_port is not used: only a prefill serves bootstrap"
    return None


class PairSpec(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    prefill: InstanceSpec
    decode: InstanceSpec

    @model_validator(mode="after")
    def _prefill_needs_bootstrap(self) -> PairSpec:
        for role in Role:
            if problem := _bootstrap_problem(role, getattr(self, role.value)):
                raise ValueError(f"{role.value}.{problem}")
        return self


class MemberSpec(InstanceSpec):
    """One prefill or decode of a group: a pair's side, plus the host it lives on."""

    host: Host | None = Field(
        default=None,
        description="An inventory [pd_hosts] host: the group then exists once in the fleet, "
        "each member on its host (every member names one, or none does).",
    )


class GroupSpec(Strict):
    """Any number of prefills and decodes that serve as one unit (xPyD): the gateway may pair
    any prefill of the group with any decode of it, and none outside (docs/spec.md)."""

    name: str = Field(pattern=NAME_PATTERN)
    prefill: list[MemberSpec] = Field(default_factory=list)
    decode: list[MemberSpec] = Field(default_factory=list)
    allow_tcp_kv: bool = Field(
        default=False,
        description="A group across hosts without RDMA on each: KV moves over TCP (a lint "
        "warning says what that costs).",
    )

    @model_validator(mode="after")
    def _members(self) -> GroupSpec:
        for role in Role:
            members: list[MemberSpec] = getattr(self, role.value)
            if not members:
                raise ValueError(
                    f"group {self.name!r} has no {role.value}: a group needs at least one "
                    f"prefill and one decode; add one under {role.value}"
                )
            for n, m in enumerate(members):
                where = f"group {self.name!r} {role.value}[{n}]"
                if problem := _bootstrap_problem(role, m):
                    raise ValueError(f"{where}: {problem}")
        placed = [(r.value, n, m) for r in Role for n, m in enumerate(self.members(r))]
        hosted = [(r, n) for r, n, m in placed if m.host is not None]
        if hosted and len(hosted) < len(placed):
            r, n = next((r, n) for r, n, m in placed if m.host is None)
            raise ValueError(
                f"group {self.name!r} {r}[{n}] has no host while {hosted[0][0]}"
                f"[{hosted[0][1]}] names one: give every member of the group a host (it then "
                "exists once in the fleet), or none (it repeats on every [pd_hosts] host)"
            )
        if self.allow_tcp_kv and not hosted:
            raise ValueError(
                f"group {self.name!r}: allow_tcp_kv is for a group whose members name hosts; "
                "remove it (a host-local group moves KV inside one host)"
            )
        return self

    @property
    def placed(self) -> bool:
        """Its members name their hosts: it exists once in the fleet (docs/spec.md)."""
        return self.prefill[0].host is not None

    def hosts(self) -> list[str]:
        """The hosts its members name, in member order (prefills first), once each."""
        return list(dict.fromkeys(m.host for r in Role for m in self.members(r) if m.host))

    def members(self, role: Role) -> list[MemberSpec]:
        return list(getattr(self, role.value))


def _unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"duplicate {kind} name {name!r}")
        seen.add(name)


class Layout(Strict):
    """`pairs` are the shorthand for 1P1D groups; pair and group names share one namespace
    (they name the units). pdctl.spec.groups resolves both into groups."""

    pairs: list[PairSpec] = Field(default_factory=list)
    groups: list[GroupSpec] = Field(default_factory=list)

    @field_validator("pairs")
    @classmethod
    def _unique_pairs(cls, pairs: list[PairSpec]) -> list[PairSpec]:
        _unique("pair", [p.name for p in pairs])
        return pairs

    @field_validator("groups")
    @classmethod
    def _unique_groups(cls, groups: list[GroupSpec]) -> list[GroupSpec]:
        _unique("group", [g.name for g in groups])
        return groups

    @model_validator(mode="after")
    def _some_and_distinct(self) -> Layout:
        if not self.pairs and not self.groups:
            raise ValueError("no pairs and no groups: give layout.pairs or layout.groups")
        shared = {p.name for p in self.pairs} & {g.name for g in self.groups}
        if shared:
            raise ValueError(
                f"{', '.join(map(repr, sorted(shared)))} names both a pair and a group: "
                "rename one (pair and group names name the units)"
            )
        return self


class Router(Strict):
    host: Host = "0.0.0.0"
    port: Port = 8000
    metrics_port: Port = 29000
    policy: Literal[
        "random", "round_robin", "cache_aware", "power_of_two", "least_load", "consistent_hashing"
    ] = "round_robin"
    health_check_interval_secs: int = Field(
        default=10, ge=1, description="How often smg probes each engine's /health."
    )
    # smg's own default is 1800 s. The timeout bounds the whole request, a stream included:
    # a client of a hung engine waits this long at most, and a longer generation is cut
    # (docs/gateway.md, "The gateway's request timeout").
    request_timeout_secs: int = Field(
        default=600,
        ge=1,
        description="How long the gateway lets one request run (smg --request-timeout-secs).",
    )
    # The worker lifecycle (docs/gateway.md, "The gateway's worker lifecycle": what smg
    # 1.13 does with each, measured against the binary).
    health_failure_threshold: int = Field(
        default=3,
        ge=1,
        description="Failed health checks in a row before smg stops routing to a worker.",
    )
    health_success_threshold: int = Field(
        default=2, ge=1, description="Passed health checks in a row before it routes again."
    )
    # Above SGLang's own verdict: its /health answers 503 only after SGLANG_HEALTH_CHECK_TIMEOUT
    # (20 s) without a token, so a busy engine is not counted failed by smg's clock first.
    health_check_timeout_secs: int = Field(
        default=25, ge=1, description="How long smg waits for one /health answer."
    )
    cb_failure_threshold: int = Field(
        default=10, ge=1, description="Failed requests in the window that open a breaker."
    )
    cb_success_threshold: int = Field(
        default=3, ge=1, description="Requests that pass half-open before a breaker closes."
    )
    # smg opens both sides' breakers when one side of a pair dies; the side whose health never
    # failed is let through again only after this long (smg's own default is 60 s).
    cb_timeout_duration_secs: int = Field(
        default=15, ge=1, description="How long an open breaker refuses before it tries again."
    )
    cb_window_duration_secs: int = Field(
        default=120, ge=1, description="The window in which a breaker counts failures."
    )
    # smg polls a registered engine until it answers, for this long, then drops it for good.
    worker_startup_timeout_secs: int = Field(
        default=3600,
        ge=60,
        description="How long smg waits for a registered engine to load (smg's default 1800).",
    )
    extra_args: Args = Field(default_factory=list)

    @model_validator(mode="after")
    def _workers_stay_registered(self) -> Router:
        # smg without service discovery never adds back a worker it removed.
        for flag in REMOVAL_FLAGS:
            if flag in self.extra_args:
                raise ValueError(
                    f"router.extra_args: {flag} removes an engine smg saw fail and nothing adds it "
                    "back (pdstack registers workers, smg discovers none): drop the flag; smg "
                    "keeps a failed worker and routes to it again once its /health passes"
                )
        return self

    @model_validator(mode="before")
    @classmethod
    def _lock_moved_to_etcd(cls, data: object) -> object:
        # The home-made lock server is gone (issue 19): say where its settings went.
        if isinstance(data, dict):
            for key, instead in MOVED_ROUTER_KEYS.items():
                if key in data:
                    raise ValueError(
                        f"router.{key} is gone: the restart lock is a lease in etcd now; "
                        f"remove it ({instead})"
                    )
        return data


# smg flags that remove a worker after failed health checks (docs/gateway.md, "The
# gateway's worker lifecycle").
REMOVAL_FLAGS = ("--remove-unhealthy-workers", "--worker-auto-recovery")

# Router keys of the lock server that issue 19 replaced with the etcd store, and what to use.
MOVED_ROUTER_KEYS = {
    "lock_port": "the store listens on etcd.client_port, 2379, on the [etcd] hosts",
    "lock_ttl_s": "set etcd.lock_ttl_s",
}


class Etcd(Strict):
    """The coordination store on the inventory's [etcd] hosts (docs/etcd.md): the restart
    lock's lease, the gateways' liveness keys, the history."""

    client_port: Port = 2379
    peer_port: Port = 2380
    # Plain HTTP, /metrics and /health only: Prometheus scrapes it without a client cert.
    metrics_port: Port = 2381
    lock_ttl_s: float = Field(
        default=15.0, ge=3, le=3600, description="A lock holder that stops renewing loses it."
    )
    gateway_ttl_s: float = Field(
        default=15.0, ge=3, le=3600, description="A gateway whose host stops renewing is gone."
    )
    snapshot_interval_s: int = Field(
        default=3600, ge=60, description="How often each member saves an etcdctl snapshot."
    )
    snapshot_keep: int = Field(default=24, ge=1, description="Snapshots kept per member.")

    @model_validator(mode="after")
    def _distinct_ports(self) -> Etcd:
        ports = {"client_port": self.client_port, "peer_port": self.peer_port,
                 "metrics_port": self.metrics_port}  # fmt: skip
        if len(set(ports.values())) < len(ports):
            raise ValueError(
                "client_port, peer_port and metrics_port must differ (one etcd listens on all "
                f"three): got {', '.join(f'{k}={v}' for k, v in ports.items())}"
            )
        return self


class Rollout(Strict):
    """The gate after each wave of `pdctl rollout` (docs/rollout.md): the wave's groups are
    compared with the groups still on the release before, over the same soak window."""

    soak_s: float = Field(
        default=300.0, ge=1, le=86400, description="Seconds a wave serves before its gate."
    )
    max_ttft_p90_ratio: float = Field(
        default=1.2, ge=1.0, description="A new group's TTFT p90 over the old groups', at most."
    )
    max_itl_p90_ratio: float = Field(
        default=1.2, ge=1.0, description="A new group's ITL p90 over the old groups', at most."
    )
    max_error_ratio_points: float = Field(
        default=0.5,
        ge=0,
        le=100,
        description="A new group's failed-request percentage above the old groups', at most.",
    )
    max_kv_transfer_failures: int = Field(
        default=0, ge=0, description="KV transfer and bootstrap failures per new group, at most."
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        description="Requests each side must finish in the window for the gate to judge it.",
    )


class HostOverride(Strict):
    hardware: Hardware | None = None
    layout: Layout | None = None

    @field_validator("layout")
    @classmethod
    def _no_placed_groups(cls, layout: Layout | None) -> Layout | None:
        for n, g in enumerate(layout.groups if layout else []):
            if g.placed:
                raise ValueError(
                    f"groups[{n}]: group {g.name!r} names its members' hosts: move it to the "
                    "top-level layout.groups (a group across hosts exists once in the fleet)"
                )
        return layout


class Planner(Strict):
    """Memory model calibration (docs/spec.md, "`pdctl plan` — the per-GPU memory budget")."""

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
    etcd: Etcd = Etcd()
    rollout: Rollout = Rollout()
    hosts: dict[str, HostOverride] = Field(default_factory=dict)
    planner: Planner = Planner()
    sim: dict[SimKey, str | int | float] = Field(
        default_factory=dict, description="PDSIM_* knobs for engine kind sim."
    )
