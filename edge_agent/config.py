"""Agent settings: defaults < YAML file < FL_AGENT_* environment < CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from protocol.mqtt import BrokerAddress
from protocol.topics import check_identifier


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FL_AGENT_", extra="forbid", validate_default=True)

    federation: str = "default"
    broker_url: str = "mqtt://localhost:1883"
    broker_username: str | None = None
    broker_password: SecretStr | None = None
    device: Literal["jetson", "rpi", "phone", "cpu"] = "cpu"
    agent_id: str | None = Field(default=None, description="default: kept in the state dir, made once")
    state_dir: Path = Path("agent-state")
    family: str | None = Field(default=None, description="model family; default: the device profile's")

    data: str = Field(default="digits", description="digits, synthetic, or a path to an .npz")
    partition: Literal["none", "iid", "dirichlet", "classes"] = "none"
    num_partitions: int = Field(default=1, ge=1)
    partition_index: int = Field(default=0, ge=0)
    alpha: float = Field(default=0.5, gt=0.0)
    min_size: int = Field(default=10, ge=1)
    classes_per_client: int = Field(default=2, ge=1)
    data_seed: int = 0
    eval_fraction: float = Field(default=0.15, ge=0.0, lt=1.0)

    # FOR TESTS AND BENCHMARKS ONLY: make this agent Byzantine (edge_agent/attacks).
    attack: Literal["none", "sign_flip", "scaling", "gaussian_noise", "label_flip", "alie"] = Field(
        default="none", description="TESTS/BENCHMARKS ONLY: send malicious updates")
    attack_scale: float | None = Field(default=None, gt=0.0, allow_inf_nan=False, description=(
        "sign_flip: send -s x delta (default 4); scaling: poisoned delta x s (default 10); "
        "gaussian_noise: sigma = s x RMS of the delta (default 100)"))
    attack_z: float | None = Field(default=None, ge=0.0, allow_inf_nan=False, description=(
        "alie: send mean - z x std of the colluders' benign updates (default 1)"))

    threads: int | None = Field(default=None, ge=0)
    batch_size: int | None = Field(default=None, ge=1)
    heartbeat_s: float = Field(default=15.0, gt=0.0)
    max_message_bytes: int = Field(default=0, ge=0, description="split updates above this size; 0 never")
    exit_when_finished: bool = False
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("federation")
    @classmethod
    def _federation(cls, value: str) -> str:
        return check_identifier(value, "federation")

    @field_validator("agent_id")
    @classmethod
    def _agent_id(cls, value: str | None) -> str | None:
        return None if value is None else check_identifier(value, "agent_id")

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, value: str) -> str:
        BrokerAddress.parse(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> AgentSettings:
        if self.partition_index >= self.num_partitions:
            raise ValueError(f"partition_index {self.partition_index} must be below num_partitions {self.num_partitions}")
        if self.partition == "none" and self.num_partitions != 1:
            raise ValueError("num_partitions > 1 needs a partition kind (iid, dirichlet, classes)")
        if self.attack_scale is not None and self.attack not in ("sign_flip", "scaling", "gaussian_noise"):
            raise ValueError(f"attack_scale has no effect with attack {self.attack!r}")
        if self.attack_z is not None and self.attack != "alie":
            raise ValueError(f"attack_z has no effect with attack {self.attack!r}")
        if 0 < self.max_message_bytes < 4096:
            raise ValueError("max_message_bytes must be 0 (no chunking) or at least 4096")
        return self

    def broker_address(self) -> BrokerAddress:
        address = BrokerAddress.parse(self.broker_url)
        username = self.broker_username or address.username
        password = self.broker_password.get_secret_value() if self.broker_password else address.password
        return BrokerAddress(address.host, address.port, address.tls, username, password)
