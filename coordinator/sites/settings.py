"""A site aggregator's settings: the coordinator's (the same run, admission and aggregation settings as the root),
plus who the site is, when it closes, and the root's key to verify announcements with."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from coordinator.settings import CoordinatorSettings
from protocol.topics import check_identifier


class SiteSettings(CoordinatorSettings):
    model_config = SettingsConfigDict(env_prefix="FL_SITE_", extra="forbid", validate_default=True)

    site_id: str = Field(description="this site's id: enrolled at the root like an agent, with the site's key")
    site_deadline_fraction: float = Field(default=0.8, gt=0.0, lt=1.0, description=(
        "the site closes a round at this fraction of the round's deadline, so its partial reaches the root in time"))
    roster_interval_s: float = Field(default=10.0, gt=0.0, le=3600.0, allow_inf_nan=False, description=(
        "how often the site sends the root the ids of the agents it heard from since (its roster's present list, "
        "which keeps them live there: their statuses do not cross the bridge); at most a third of agent_timeout_s"))
    http_port: int | None = Field(default=None, ge=0, le=65535, description=(  # type: ignore[assignment]
        "port of the site aggregator's /metrics, /healthz and /readyz; unset: none served (several sites often share "
        "a machine in a lab); 0: any free port"))
    coordinator_key: Path | None = Field(default=None, description=(
        "the root coordinator's public key file (ed25519:...): announcements are acted on only if it signed them; "
        "unset: unwrapped unverified (warned)"))

    @field_validator("site_id")
    @classmethod
    def _site_id(cls, value: str) -> str:
        return check_identifier(value, "site_id")

    @model_validator(mode="after")
    def _site_can_fold(self) -> SiteSettings:
        if self.mode != "sync" or self.algorithm not in ("fedavg", "fedprox", "scaffold", "fedproto") or \
                self.secure_aggregation:
            raise ValueError("a site aggregator folds synchronous rounds of fedavg, fedprox, scaffold or fedproto (not mode "
                             f"{self.mode}, {self.algorithm}, secure_aggregation {self.secure_aggregation}: secure "
                             "aggregation is the root's setting, and a site serves the sessions its announcements give it)")
        if 3 * self.roster_interval_s > self.agent_timeout_s:
            raise ValueError(f"roster_interval_s {self.roster_interval_s:g} must be at most a third of agent_timeout_s "
                             f"{self.agent_timeout_s:g}: the root counts an agent gone when no roster names it for that long")
        if self.weighting != "samples" or self.compression != "none":
            raise ValueError("a site aggregator weighs by samples, uncompressed (KL weighting needs the federation's "
                             "label distribution; compressed deltas unpack against global states it does not hold)")
        return self

    @property
    def mqtt_client_id(self) -> str:
        return self.client_id or f"site-{self.site_id}"

    @property
    def signing_key_path(self) -> Path:
        return self.signing_key_file or Path(self.state_dir) / "site_key.pem"
