"""Engine configuration: vLLM's knob names and defaults, strict loading and validation."""

from aisim.config.engine import EngineConfig, TimeModel, load_engine_config

__all__ = ["EngineConfig", "TimeModel", "load_engine_config"]
