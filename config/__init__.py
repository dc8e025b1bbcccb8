"""Settings and the Celery configuration built from them."""

from drover.config.settings import (
    GatewayKey,
    ModelLimits,
    PoolKey,
    Settings,
    SettingsError,
    get_settings,
    load_settings,
)

__all__ = ["GatewayKey", "ModelLimits", "PoolKey", "Settings", "SettingsError", "get_settings",
           "load_settings"]
